//! A Patroni leader frozen whole (SIGSTOP of its patroni and every
//! process of its server, as a paused machine: the kernel keeps the
//! sockets open and acknowledges what is sent) in the middle of an
//! apply's COMMIT, while `serve` heartbeats, a worker heartbeats and two
//! controllers of one host share the registry on the cluster (issue 53 §2
//! and §4). Measured from the freeze: apply ends (`outcome_unknown` or
//! `transaction_failed`) within 30 s; the worker's heartbeat, `serve`'s
//! and a controller's tick are back on the new leader within 30 s.
//!
//! Both controllers' `/metrics` are read every 150 ms all through: at no
//! sample do two say they lead, nor two ever lead under one term, and the
//! leader at the freeze stops saying it leads within 3 s of it (renew
//! deadline 2 s), though its loop waits on the frozen server for 15 s. It
//! retires nothing on its first tick after the freeze, nor on its first
//! on the new leader (its server changed), although a worker died as the
//! server froze. After the failover exactly one leads, under a new term,
//! as the lease row says too, and it retires that worker and two killed
//! after the failover under its term. Then it is SIGKILLed: the other
//! leads, and retires a fourth worker under its own term, within 17 s of
//! the kill (ttl + retry period at the defaults; the test's lease is 3 s
//! and 500 ms). The audit agrees: every retirement carries a term its
//! holder took and its `/metrics` showed, terms grow in the audit's
//! order, and none was recorded after a later term was taken (a deposed
//! leader commits nothing). The figures, takeover times among them, are
//! printed.

mod common;
#[path = "patroni_freeze/leaders.rs"]
mod leaders;

use common::controller::{install_versions, start_listening, worker, Controller};
use common::patroni::*;
use common::*;
use fleet_retire::apply::{Hooks, Outcome};
use leaders::{Ctl, Watch};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bound every figure is held to.
const BACK_WITHIN: Duration = Duration::from_secs(30);

/// A fresh database `db` on the cluster: its URL.
fn database(cluster: &Cluster, db: &str) -> String {
    cluster
        .client()
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .unwrap();
    cluster.url_of(db)
}

/// The serve row's heartbeat stamp, read on the leader (None while none
/// answers).
fn heartbeat_of(url: &str, worker: &str) -> Option<String> {
    let mut client = ::postgres::Client::connect(url, ::postgres::NoTls).ok()?;
    client
        .query_opt(
            "SELECT last_heartbeat_at FROM worker_registrations WHERE worker_identity = $1",
            &[&worker],
        )
        .ok()?
        .map(|r| r.get(0))
}

/// Heartbeat `worker` every 200 ms until `stop`, noting when each one
/// succeeded.
fn beat(
    url: String,
    worker: &str,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Arc<Mutex<Vec<Instant>>> {
    let done = Arc::new(Mutex::new(Vec::new()));
    let (worker, noted) = (worker.to_string(), done.clone());
    std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let ok = fleet_retire::worker::heartbeat(
                Path::new(&url),
                &worker,
                fleet_retire::worker::Writer::Owner,
            );
            if ok.is_ok() {
                noted.lock().unwrap().push(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    done
}

/// Outcomes a tick that saw everything ends with.
fn saw(outcome: &str) -> bool {
    !matches!(
        outcome,
        "blind"
            | "registry_unavailable"
            | "lease_store_unavailable"
            | "transaction_failed"
            | "outcome_unknown"
            | "leadership_lost"
    )
}

#[test]
#[cfg_attr(
    not(fr_patroni),
    ignore = "needs Debian's patroni, etcd-server and curl (.ci/run installs them)"
)]
fn a_frozen_leader_is_left_within_seconds_by_apply_workers_serve_and_two_controllers() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(cluster) = Cluster::start() else {
        return;
    };
    // The apply's fleet, in a database of its own (heartbeats beside it
    // would move its plan's fingerprint).
    let admin = database(&cluster, "frozen");
    let (mut stores, live) = fleet();
    let url = common::roles::copied_as_documented(&stores, &admin).apply;
    stores.registry = PathBuf::from(&url);
    stores.leases = stores.registry.clone();
    let mut scene = Scene::start(&cluster);
    cluster.wait_sync(Duration::from_secs(60));
    let before = scene.leading_now();

    // The apply, the leader frozen as its COMMIT goes out; a worker of the
    // controllers dies as it freezes (not before: a tick could retire it
    // in between).
    let lib = Lib::new(stores);
    let req = lib.request();
    let old = cluster.leader().expect("a leader");
    let (frozen, ticks_before) = (Cell::new(None), RefCell::new(Vec::new()));
    let mut freeze = || {
        *ticks_before.borrow_mut() = scene.ctls.iter().map(|c| c.c.outcomes().len()).collect();
        cluster.freeze(old);
        frozen.set(Some(Instant::now()));
        let w3 = &mut scene.workers[2].0;
        w3.kill().unwrap();
        w3.wait().unwrap();
    };
    let report = lib.run(
        &req,
        Hooks {
            before_commit: Some(&mut freeze),
            ..Default::default()
        },
    );
    let frozen = frozen.get().unwrap_or_else(|| {
        panic!(
            "the apply ended before its COMMIT: {:?}: {}",
            report.outcome, report.detail
        )
    });
    let apply_ended = frozen.elapsed();
    assert!(
        matches!(
            report.outcome,
            Outcome::OutcomeUnknown | Outcome::TransactionFailed
        ),
        "{:?}: {}",
        report.outcome,
        report.detail
    );

    // Everyone back on the new leader. The test's own connections leave
    // the frozen member out.
    scene.url = cluster.url_without(&scene.url, old);
    scene.ctl.registry = PathBuf::from(&scene.url);
    let ticks_before = ticks_before.take();
    let backs = back_after(frozen, &scene, &ticks_before);
    let secs = |t: Option<Instant>| t.map(|t| (t - frozen).as_secs_f64());
    eprintln!(
        "figures: member {old} frozen at COMMIT; new leader {:?}; apply ended {:.1} s after \
         the freeze ({:?}); back on the new leader after: worker heartbeat {:?} s, serve {:?} s, \
         controller {:?} s",
        cluster.leader(),
        apply_ended.as_secs_f64(),
        report.outcome,
        secs(backs[0]),
        secs(backs[1]),
        secs(backs[2]),
    );
    assert!(
        apply_ended <= BACK_WITHIN,
        "apply ended after {apply_ended:?}"
    );
    for (what, back) in [
        "the worker's heartbeat",
        "serve's heartbeat",
        "a controller's tick",
    ]
    .into_iter()
    .zip(backs)
    {
        let back = back.unwrap_or_else(|| panic!("{what} not back: {}", cluster.logs()));
        assert!(
            back - frozen <= BACK_WITHIN,
            "{what} back after {:?}",
            back - frozen
        );
    }
    scene.stop.store(true, Ordering::SeqCst);
    let after = scene.led_again(before, frozen);
    ticks_across_the_freeze(&scene.ctls[before.0].c, ticks_before[before.0]);
    scene.after_the_failover(after);
    drop(live);
}

/// The bound the other controller leads within after the leader's
/// SIGKILL: the lease's ttl and retry period at their defaults (15 s and
/// 2 s; the test's are 3 s and 500 ms).
const KILLED_WITHIN: Duration = Duration::from_secs(17);

/// The controllers' registry on the cluster, its workers, `serve`, a
/// worker heartbeating, the two controllers and the watch on them.
struct Scene {
    ctl: Stores,
    url: String,
    workers: Vec<KillOnDrop>,
    _serve: KillOnDrop,
    stop: Arc<AtomicBool>,
    beats: Arc<Mutex<Vec<Instant>>>,
    ctls: Vec<Ctl>,
    watch: Watch,
}

impl Drop for Scene {
    /// On a failure, the controllers' logs (their temporary folder goes).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for c in &self.ctls {
            let log = std::fs::read_to_string(&c.c.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!("-- controller {}'s log\n{}", c.name, tail.join("\n"));
        }
    }
}

impl Scene {
    /// Four workers alive, `serve` and a worker heartbeating, and two
    /// controllers, one of which has ticked.
    fn start(cluster: &Cluster) -> Scene {
        let mut ctl = Stores::new(&[]);
        let url = database(cluster, "frozenctl");
        ctl.registry = PathBuf::from(&url);
        let workers: Vec<KillOnDrop> = (1..=4).map(|n| worker(&ctl, n)).collect();
        install_versions(&ctl);
        let serve = serve_heartbeating(&ctl, "w-serve-frozen", "sess-frozen");
        let deadline = Instant::now() + Duration::from_secs(20);
        while heartbeat_of(&url, "w-serve-frozen").is_none() {
            assert!(Instant::now() < deadline, "serve did not register");
            std::thread::sleep(Duration::from_millis(200));
        }
        let stop = Arc::new(AtomicBool::new(false));
        add_beating_worker(&url);
        let beats = beat(url.clone(), "w-beat", stop.clone());
        let ctls: Vec<Ctl> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let (c, port) = start_listening(&ctl, name);
                Ctl { name, c, port }
            })
            .collect();
        let watch = Watch::start(ctls.iter().map(|c| c.port).collect());
        common::controller::wait_for(Duration::from_secs(30), "a controller to tick", || {
            ctls.iter().any(|c| c.c.outcomes().iter().any(|o| saw(o)))
        });
        Scene {
            ctl,
            url,
            workers,
            _serve: serve,
            stop,
            beats,
            ctls,
            watch,
        }
    }

    /// Once exactly one controller says it leads and the lease row names
    /// it under that term: which one, and the term.
    fn leading_now(&self) -> (usize, i64) {
        let mut found = None;
        common::controller::wait_for(Duration::from_secs(45), "exactly one leader", || {
            let Some(s) = self.watch.last() else {
                return false;
            };
            let [(i, term)] = s.leaders()[..] else {
                return false;
            };
            let row = common::controller::leader(&self.ctl.registry);
            found = Some((i, term));
            row == Some((self.ctls[i].c.pid(), term))
        });
        found.unwrap()
    }

    /// After the failover: exactly one leads, under a term the leader at
    /// the freeze did not hold; when it did (from the samples).
    fn led_again(&self, before: (usize, i64), frozen: Instant) -> (usize, i64) {
        let after = self.leading_now();
        assert!(after.1 > before.1, "{before:?} then {after:?}");
        let samples = self.watch.samples();
        let secs = |s: &leaders::Sample| (s.at - frozen).as_secs_f64();
        let last_old = samples
            .iter()
            .rfind(|s| s.leaders().iter().any(|(_, t)| *t <= before.1))
            .map(secs);
        let first_new = samples
            .iter()
            .find(|s| s.leaders().iter().any(|(_, t)| *t > before.1))
            .map(secs);
        eprintln!(
            "takeover across the failover: {} led under term {} until {last_old:?} s after the \
             freeze; {} leads under term {} from {first_new:?} s",
            self.ctls[before.0].name, before.1, self.ctls[after.0].name, after.1
        );
        // No renewal succeeds once the server froze: the leader stops
        // saying it leads at the renew deadline (2 s), its loop blocked or
        // not.
        let said = last_old.unwrap_or_default();
        assert!(said < 3.0, "it said it led {said} s after the freeze");
        after
    }

    /// Kill the given workers (1-based; those already dead are left) and
    /// wait until they are retired: each under a term `leader` took, not
    /// below `leader`'s term.
    fn retired_under(&mut self, workers: &[usize], leader: (usize, i64)) {
        for n in workers {
            let w = &mut self.workers[n - 1].0;
            let _ = w.kill();
            w.wait().unwrap();
        }
        let registry = self.ctl.registry.clone();
        let retired = common::controller::wait_for(
            Duration::from_secs(40),
            "the workers to be retired",
            || {
                workers.iter().all(|n| {
                    common::controller::status(&registry, &format!("w-{n}")).as_deref()
                        == Some("retired")
                })
            },
        );
        let holder = leaders::holder_of(&self.ctls[leader.0].c);
        let took = leaders::took(&self.ctls[leader.0].c);
        for r in leaders::audited(&self.url) {
            if workers.iter().any(|n| r.worker == format!("w-{n}")) {
                assert_eq!(r.holder.as_ref(), Some(&holder), "{r:?}");
                let term = r.term.unwrap();
                assert!(term >= leader.1, "{r:?} under {leader:?}");
                assert!(took.iter().any(|(t, _)| *t == term), "{r:?} {took:?}");
            }
        }
        eprintln!(
            "workers {workers:?} retired by {} {retired:?} after the wait began",
            self.ctls[leader.0].name
        );
    }

    /// SIGKILL the leader: the other leads within [`KILLED_WITHIN`], under
    /// a later term, as the lease row says too. The leader, and when it
    /// was killed.
    fn kill_the_leader(&mut self, leader: (usize, i64)) -> ((usize, i64), Instant) {
        let dead = &mut self.ctls[leader.0].c;
        dead.signal(nix::sys::signal::Signal::SIGKILL);
        let killed = Instant::now();
        let _ = dead.child.0.wait();
        let other = 1 - leader.0;
        let port = self.ctls[other].port;
        let took = common::controller::wait_for(KILLED_WITHIN, "the other to lead", || {
            leaders::scrape(port).is_some_and(|(l, t)| l && t > leader.1)
        });
        let now = self.leading_now();
        assert_eq!(now.0, other, "{now:?}");
        eprintln!(
            "takeover after SIGKILL: {} leads under term {} {:.2} s after {} was killed",
            self.ctls[other].name,
            now.1,
            took.as_secs_f64(),
            self.ctls[leader.0].name
        );
        (now, killed)
    }

    /// Workers retired by the leader after the failover; its SIGKILL and
    /// the other's turn; then the samples and the audit checked whole.
    fn after_the_failover(&mut self, after: (usize, i64)) {
        self.retired_under(&[3], after);
        self.retired_under(&[1, 2], after);
        let (survivor, killed) = self.kill_the_leader(after);
        self.retired_under(&[4], survivor);
        let acted = killed.elapsed();
        eprintln!("the survivor retired its first worker {acted:?} after the leader's SIGKILL");
        assert!(acted <= KILLED_WITHIN, "{acted:?}");
        let samples = self.watch.stop();
        let from = samples.first().map(|s| s.at).unwrap();
        leaders::one_leader_at_a_time(&samples, &self.ctls, from);
        let rows = leaders::audited(&self.url);
        assert_eq!(rows.len(), 4, "{rows:#?}");
        leaders::audit_agrees(&rows, &self.ctls, &samples);
        let terms: Vec<(String, Option<i64>)> =
            rows.into_iter().map(|r| (r.worker, r.term)).collect();
        eprintln!(
            "{} samples of both /metrics over {:.1} s, never two leaders; audited {terms:?}; \
             terms taken: a {:?}, b {:?}",
            samples.len(),
            (samples.last().unwrap().at - from).as_secs_f64(),
            leaders::took(&self.ctls[0].c),
            leaders::took(&self.ctls[1].c),
        );
    }
}

/// A worker row of this process (its pid), in an instance slot of its own,
/// for [`beat`]. The connection is closed before the freeze: a driver's
/// connection to a frozen server waits for ever to close.
fn add_beating_worker(url: &str) {
    let me = std::process::id();
    let row = stale_row("w-beat", i64::from(me), &start_time(me));
    let mut c = connect(url);
    c.execute(
        "INSERT INTO worker_registrations SELECT * FROM \
         jsonb_populate_record(NULL::worker_registrations, $1::text::jsonb)",
        &[&row.to_string()],
    )
    .unwrap();
    c.execute(
        "UPDATE worker_registrations SET client_instance_id = $1 WHERE worker_identity = 'w-beat'",
        &[&"inst-codex-20261205T000000Z-00000000beef"],
    )
    .unwrap();
}

/// The first tick after the freeze of the controller that led then (its
/// `before`-th) retired nothing, nor did any before its first that saw,
/// one of which said its server changed.
fn ticks_across_the_freeze(c: &Controller, before: usize) {
    let lines: Vec<String> = c.lines().iter().map(|l| l.to_string()).collect();
    let later = c.outcomes().split_off(before);
    eprintln!("the ticks across the freeze of the controller that led: {later:?}");
    assert!(later.first().is_none_or(|o| !saw(o)), "{lines:#?}");
    if let Some(first_seeing) = later.iter().position(|o| saw(o)) {
        assert!(
            later[..first_seeing].iter().any(|o| o == "blind"),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("the registry's server changed")),
            "{lines:#?}"
        );
    }
}

/// When, after `frozen`, the worker's heartbeat, `serve`'s and a tick of
/// either controller that saw (after its `before`-th) were back, polled
/// for 45 s.
fn back_after(frozen: Instant, scene: &Scene, before: &[usize]) -> [Option<Instant>; 3] {
    let url = &scene.url;
    let serve_at = heartbeat_of(url, "w-serve-frozen");
    let (mut worker_back, mut serve_back, mut ctl_back) = (None, None, None);
    let mut serve_seen = serve_at.clone();
    while frozen.elapsed() < BACK_WITHIN + Duration::from_secs(15)
        && (worker_back.is_none() || serve_back.is_none() || ctl_back.is_none())
    {
        if worker_back.is_none() {
            let beats = scene.beats.lock().unwrap();
            worker_back = beats.iter().find(|t| **t > frozen).copied();
        }
        if serve_back.is_none() {
            let now = heartbeat_of(url, "w-serve-frozen");
            if now.is_some() && serve_seen.is_some() && now != serve_seen {
                serve_back = Some(Instant::now());
            }
            serve_seen = serve_seen.or(now);
        }
        let seeing = |(c, n): (&Ctl, &usize)| c.c.outcomes().iter().skip(*n).any(|o| saw(o));
        if ctl_back.is_none() && scene.ctls.iter().zip(before).any(seeing) {
            ctl_back = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    [worker_back, serve_back, ctl_back]
}
