//! A Patroni leader frozen whole (SIGSTOP of its patroni and every
//! process of its server, as a paused machine: the kernel keeps the
//! sockets open and acknowledges what is sent) in the middle of an
//! apply's COMMIT, while `serve` heartbeats, a worker heartbeats and a
//! controller leads (issue 53 §4). Measured from the freeze: apply ends
//! (`outcome_unknown` or `transaction_failed`) within 30 s; the worker's
//! heartbeat, `serve`'s and a controller's tick are back on the new leader
//! within 30 s. The controller's first tick after the freeze retires
//! nothing, nor its first on the new leader (its server changed), and every
//! apply it makes is recorded under a term it took. The figures are
//! printed.

mod common;

use common::controller::{install_versions, worker, Controller};
use common::patroni::*;
use common::*;
use fleet_retire::apply::{Hooks, Outcome};
use std::path::{Path, PathBuf};
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
fn a_frozen_leader_is_left_within_seconds_by_apply_workers_serve_and_the_controller() {
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
    // A controller, serve and a worker heartbeating on another, with
    // two workers alive.
    let mut ctl = Stores::new(&[]);
    let ctl_url = database(&cluster, "frozenctl");
    ctl.registry = PathBuf::from(&ctl_url);
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(&ctl, n)).collect();
    install_versions(&ctl);
    let _serve = serve_heartbeating(&ctl, "w-serve-frozen", "sess-frozen");
    let deadline = Instant::now() + Duration::from_secs(20);
    while heartbeat_of(&ctl_url, "w-serve-frozen").is_none() {
        assert!(Instant::now() < deadline, "serve did not register");
        std::thread::sleep(Duration::from_millis(200));
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    add_beating_worker(&ctl_url);
    let beats = beat(ctl_url.clone(), "w-beat", stop.clone());
    let a = Controller::start(&ctl, "a", &[]);
    common::controller::wait_for(Duration::from_secs(30), "a controller to tick", || {
        a.outcomes().iter().any(|o| saw(o))
    });
    cluster.wait_sync(Duration::from_secs(60));

    // The apply, the leader frozen as its COMMIT goes out.
    let lib = Lib::new(stores);
    let req = lib.request();
    let old = cluster.leader().expect("a leader");
    let frozen = std::cell::Cell::new(None);
    let ticks_before = std::cell::Cell::new(0);
    let mut freeze = || {
        ticks_before.set(a.outcomes().len());
        cluster.freeze(old);
        frozen.set(Some(Instant::now()));
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
    let ctl_url = cluster.url_without(&ctl_url, old);
    ctl.registry = PathBuf::from(&ctl_url);
    let (worker_back, serve_back, ctl_back) =
        back_after(frozen, &beats, &ctl_url, &a, ticks_before.get());
    let new = cluster.leader();
    let secs = |t: Option<Instant>| t.map(|t| (t - frozen).as_secs_f64());
    eprintln!(
        "figures: member {old} frozen at COMMIT; new leader {new:?}; apply ended {:.1} s after \
         the freeze ({:?}); back on the new leader after: worker heartbeat {:?} s, serve {:?} s, \
         controller {:?} s",
        apply_ended.as_secs_f64(),
        report.outcome,
        secs(worker_back),
        secs(serve_back),
        secs(ctl_back),
    );
    assert!(
        apply_ended <= BACK_WITHIN,
        "apply ended after {apply_ended:?}"
    );
    for (what, back) in [
        ("the worker's heartbeat", worker_back),
        ("serve's heartbeat", serve_back),
        ("a controller's tick", ctl_back),
    ] {
        let back = back.unwrap_or_else(|| panic!("{what} not back: {}", cluster.logs()));
        assert!(
            back - frozen <= BACK_WITHIN,
            "{what} back after {:?}",
            back - frozen
        );
    }

    ticks_across_the_freeze(&a, ticks_before.get());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    retired_under_its_terms(&ctl.registry, &mut workers, &a);
    drop(live);
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

/// The controller's first tick after the freeze (its `before`-th)
/// retired nothing, and one before its first that saw said its server
/// changed.
fn ticks_across_the_freeze(a: &Controller, before: usize) {
    let after: Vec<String> = a.lines().iter().map(|l| l.to_string()).collect();
    let later = a.outcomes().split_off(before);
    assert!(later.first().is_some_and(|o| !saw(o)), "{after:#?}");
    let first_seeing = later.iter().position(|o| saw(o)).unwrap();
    assert!(
        later[..first_seeing].iter().any(|o| o == "blind"),
        "{after:#?}"
    );
    assert!(
        after
            .iter()
            .any(|l| l.contains("the registry's server changed")),
        "{after:#?}"
    );
    eprintln!("the controller's ticks across the freeze: {later:?}");
}

/// The workers die: the controller retires them, each apply recorded
/// under a term it took.
fn retired_under_its_terms(registry: &Path, workers: &mut [KillOnDrop], a: &Controller) {
    for w in workers.iter_mut() {
        w.0.kill().unwrap();
        w.0.wait().unwrap();
    }
    common::controller::wait_for(Duration::from_secs(40), "the workers to be retired", || {
        (1..=2).all(|n| {
            common::controller::status(registry, &format!("w-{n}")).as_deref() == Some("retired")
        })
    });
    let mut client = connect(registry.to_str().unwrap());
    let terms: Vec<i64> = client
        .query(
            "SELECT c.controller_term FROM retirement_audit a \
             JOIN fleet_retire_controller_applies c USING (apply_id)",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let taken = a.terms_taken();
    assert_eq!(terms.len(), 2, "{terms:?}");
    assert!(
        terms.iter().all(|t| taken.contains(t)),
        "{terms:?} {taken:?}"
    );
    eprintln!("audited under terms {terms:?}, taken {taken:?}");
}

/// When, after `frozen`, the worker's heartbeat, `serve`'s and a tick of
/// `a` that saw (after its `before`-th) were back, polled for 45 s.
fn back_after(
    frozen: Instant,
    beats: &Mutex<Vec<Instant>>,
    ctl_url: &str,
    a: &Controller,
    before: usize,
) -> (Option<Instant>, Option<Instant>, Option<Instant>) {
    let serve_at = heartbeat_of(ctl_url, "w-serve-frozen");
    let (mut worker_back, mut serve_back, mut ctl_back) = (None, None, None);
    let mut serve_seen = serve_at.clone();
    while frozen.elapsed() < BACK_WITHIN + Duration::from_secs(15)
        && (worker_back.is_none() || serve_back.is_none() || ctl_back.is_none())
    {
        if worker_back.is_none() {
            worker_back = beats.lock().unwrap().iter().find(|t| **t > frozen).copied();
        }
        if serve_back.is_none() {
            let now = heartbeat_of(ctl_url, "w-serve-frozen");
            if now.is_some() && serve_seen.is_some() && now != serve_seen {
                serve_back = Some(Instant::now());
            }
            serve_seen = serve_seen.or(now);
        }
        if ctl_back.is_none() && a.outcomes().iter().skip(before).any(|o| saw(o)) {
            ctl_back = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (worker_back, serve_back, ctl_back)
}
