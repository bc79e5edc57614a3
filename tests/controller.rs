//! `fleet-retire controller` with real processes (issue 53 §2): real
//! SQLite files, controllers as child processes, workers registered by
//! `fleet-retire register` from a shell that then becomes a `sleep` (the
//! registered process), killed to make them dead. Every child is killed on
//! drop, so a failing assertion leaves nothing running. Lease times are
//! short (ttl 3 s, renew deadline 2 s, retry 0.5 s) to keep the tests fast.

mod common;

use common::{bin, text, KillOnDrop, Stores};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);
const LEASE_TIMES: [&str; 8] = [
    "--lease-ttl",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
    "--interval",
    "1s",
];

/// Stores whose registry `registry create` made (with its row versions).
fn stores() -> Stores {
    let stores = Stores::new(&[]);
    std::fs::remove_file(&stores.registry).unwrap();
    let out = bin()
        .args(["registry", "create", "--registry"])
        .arg(&stores.registry)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    stores
}

/// A worker registered by `fleet-retire register` as a launcher's server
/// would be (its own client instance), whose registered process is the
/// `sleep` its shell becomes; killing it makes the worker dead. Its
/// heartbeat TTL is one second.
fn worker(stores: &Stores, n: usize) -> KillOnDrop {
    let script = format!(
        "{} register --namespace author --registry \"$1\" --ttl 1 \
         --repository-binding prgs/gitea-tools >/dev/null && exec sleep 300",
        env!("CARGO_BIN_EXE_fleet-retire")
    );
    let child = std::process::Command::new("sh")
        .args(["-c", &script, "sh"])
        .arg(&stores.registry)
        .env("GITEA_MCP_WORKER_IDENTITY", format!("w-{n}"))
        .env("GITEA_MCP_PROFILE", "author-prgs")
        .env("GITEA_MCP_NAMESPACE", "author")
        .env("GITEA_CLIENT_MANAGED", "1")
        .env("GITEA_MCP_CLIENT", "codex")
        .env(
            "GITEA_MCP_CLIENT_INSTANCE",
            format!("inst-codex-20261205T132348Z-3f1eceb9{n:04}"),
        )
        .env("GITEA_MCP_INSTANCE_PROVENANCE", "trusted_launcher")
        .env(
            "GITEA_MCP_CLIENT_SESSION",
            format!("launch-58d4d79184600f3b7526{n:04}"),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let child = KillOnDrop(child);
    wait_for(Duration::from_secs(20), "the worker to register", || {
        status(&stores.registry, &format!("w-{n}")).as_deref() == Some("active")
    });
    child
}

/// A worker's status, if it has a row.
fn status(registry: &Path, worker: &str) -> Option<String> {
    let conn = rusqlite::Connection::open(registry).ok()?;
    conn.query_row(
        "SELECT status FROM worker_registrations WHERE worker_identity = ?1",
        [worker],
        |r| r.get(0),
    )
    .ok()
}

/// A controller child, its JSON log in a file.
struct Controller {
    child: KillOnDrop,
    log: PathBuf,
}

impl Controller {
    fn start(stores: &Stores, name: &str, extra: &[&str]) -> Controller {
        let log = stores.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = bin()
            .arg("controller")
            .arg("--registry")
            .arg(&stores.registry)
            .arg("--leases")
            .arg(&stores.leases)
            .arg("--profiles")
            .arg(&stores.profiles)
            .args(["--profile", "controller-prgs"])
            .args(["--canonical-repository", "prgs/gitea-tools"])
            .args(["--listen", "none", "--log-format", "json"])
            .args(LEASE_TIMES)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Controller {
            child: KillOnDrop(child),
            log,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, s: Signal) {
        kill(Pid::from_raw(self.pid() as i32), s).unwrap();
    }

    /// Its log, one JSON object per line.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The outcomes of its ticks, in order.
    fn outcomes(&self) -> Vec<String> {
        self.lines()
            .iter()
            .filter_map(|l| l["fields"]["outcome"].as_str().map(str::to_string))
            .collect()
    }

    fn says(&self, message: &str) -> bool {
        self.lines()
            .iter()
            .any(|l| l["fields"]["message"].as_str() == Some(message))
    }

    /// The terms it logged taking the lease under.
    fn terms_taken(&self) -> Vec<i64> {
        self.lines()
            .iter()
            .filter(|l| l["fields"]["message"] == "leading: took the controller lease")
            .filter_map(|l| l["fields"]["term"].as_i64())
            .collect()
    }
}

/// The unexpired lease holder's pid and term, on the host's clock.
fn leader(registry: &Path) -> Option<(u32, i64)> {
    let conn = rusqlite::Connection::open(registry).ok()?;
    let (holder, term, expires): (String, i64, i64) = conn
        .query_row(
            "SELECT holder, term, expires_at_ms FROM fleet_retire_controller_leases",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let pid = holder.split(':').nth(1)?.parse().ok()?;
    (expires > now).then_some((pid, term))
}

fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
    started.elapsed()
}

/// Two controllers on one registry: at every sample at most one holds the
/// lease unexpired, every term was taken by one process only, and the dead
/// workers are retired once, each audit row's apply recorded under a term
/// its leader held.
#[test]
fn two_controllers_at_most_one_leads_and_each_term_has_one_holder() {
    let stores = stores();
    let mut workers: Vec<KillOnDrop> = (1..=3).map(|n| worker(&stores, n)).collect();
    let a = Controller::start(&stores, "a", &[]);
    let b = Controller::start(&stores, "b", &[]);
    wait_for(Duration::from_secs(20), "a leader", || {
        leader(&stores.registry).is_some()
    });
    for w in &mut workers {
        w.0.kill().unwrap();
        w.0.wait().unwrap();
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        if let Some((pid, _)) = leader(&stores.registry) {
            assert!(pid == a.pid() || pid == b.pid(), "a stranger leads: {pid}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for n in 1..=3 {
        assert_eq!(
            status(&stores.registry, &format!("w-{n}")).as_deref(),
            Some("retired")
        );
    }
    let (ta, tb) = (a.terms_taken(), b.terms_taken());
    assert!(
        ta.iter().all(|t| !tb.contains(t)),
        "a term held by both: {ta:?} {tb:?}"
    );
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    let recorded: Vec<(String, i64, i64)> = conn
        .prepare(
            "SELECT a.worker_identity, c.controller_term, c.controller_tick FROM retirement_audit a \
             JOIN fleet_retire_controller_applies c USING (apply_id)",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(recorded.len(), 3, "{recorded:?}");
    for (_, term, _) in &recorded {
        assert!(
            ta.contains(term) || tb.contains(term),
            "{term} was never taken"
        );
    }
}

/// SIGKILL of the leader: the other takes the lease within ttl + retry
/// period (plus this test's polling and a loaded machine's second).
#[test]
fn when_the_leader_is_killed_another_leads_within_ttl_and_a_retry() {
    let stores = stores();
    let mut cs = vec![
        Controller::start(&stores, "a", &[]),
        Controller::start(&stores, "b", &[]),
    ];
    let (pid, term) = wait_for_leader(&stores);
    let at = cs.iter().position(|c| c.pid() == pid).unwrap();
    let mut dead = cs.remove(at);
    dead.signal(Signal::SIGKILL);
    let _ = dead.child.0.wait();
    let took = wait_for(Duration::from_secs(30), "a new leader", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == cs[0].pid())
    });
    eprintln!("took over {took:?} after SIGKILL");
    assert!(took <= TTL + RETRY + Duration::from_secs(1), "{took:?}");
    assert!(leader(&stores.registry).unwrap().1 > term, "the term grows");
}

/// SIGTERM of the leader: it releases the lease and exits 0 within 5 s,
/// and the other leads within 2 s.
#[test]
fn when_the_leader_is_stopped_it_releases_and_another_leads_within_two_seconds() {
    let stores = stores();
    let mut cs = vec![
        Controller::start(&stores, "a", &[]),
        Controller::start(&stores, "b", &[]),
    ];
    let (pid, _) = wait_for_leader(&stores);
    let at = cs.iter().position(|c| c.pid() == pid).unwrap();
    let mut stopped = cs.remove(at);
    stopped.signal(Signal::SIGTERM);
    let sent = Instant::now();
    let took = wait_for(Duration::from_secs(30), "a new leader", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == cs[0].pid())
    });
    eprintln!("took over {took:?} after SIGTERM");
    assert!(took <= Duration::from_secs(2), "{took:?}");
    let status = loop {
        if let Some(s) = stopped.child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "still running 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(25));
    };
    assert_eq!(status.code(), Some(0));
    assert!(stopped.says("released the controller lease"));
}

fn wait_for_leader(stores: &Stores) -> (u32, i64) {
    wait_for(Duration::from_secs(20), "a leader", || {
        leader(&stores.registry).is_some()
    });
    leader(&stores.registry).unwrap()
}

/// The deposed leader (issue 53 §2): the leader's apply waits for the
/// registry's write lock; it is frozen (SIGSTOP) past its lease's ttl
/// while another controller takes the lease over (a dry run, which
/// retires nothing, so that the workers are still there to retire); then
/// thawed, its apply gets the lock and is refused inside its transaction
/// (`leadership_lost`): nothing committed, the workers still active.
#[test]
fn a_deposed_leader_frozen_while_waiting_for_the_lock_commits_nothing() {
    let trials: usize = std::env::var("FLEET_RETIRE_CONTROLLER_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for trial in 0..trials {
        deposed_once(trial);
    }
}

fn deposed_once(trial: usize) {
    let stores = stores();
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(&stores, n)).collect();
    let a = Controller::start(&stores, "a", &[]);
    wait_for(Duration::from_secs(20), "a to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == a.pid())
    });
    let b = Controller::start(&stores, "b", &["--dry-run"]);
    let lock = rusqlite::Connection::open(&stores.registry).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    for w in &mut workers {
        w.0.kill().unwrap();
        w.0.wait().unwrap();
    }
    wait_for(Duration::from_secs(10), "a's apply to start", || {
        a.says("applying")
    });
    // Apply reads outside the lock first, then waits in BEGIN IMMEDIATE.
    std::thread::sleep(Duration::from_millis(500));
    a.signal(Signal::SIGSTOP);
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    wait_for(Duration::from_secs(20), "b to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == b.pid())
    });
    wait_for(
        Duration::from_secs(10),
        "b's dry run to see the candidates",
        || b.outcomes().iter().any(|o| o == "dry_run"),
    );
    a.signal(Signal::SIGCONT);
    wait_for(Duration::from_secs(20), "a's apply to end", || {
        a.outcomes().iter().any(|o| o != "idle")
    });
    let ended: Vec<String> = a.outcomes().into_iter().filter(|o| o != "idle").collect();
    assert_eq!(ended[0], "leadership_lost", "trial {trial}: {ended:?}");
    for n in 1..=2 {
        assert_eq!(
            status(&stores.registry, &format!("w-{n}")).as_deref(),
            Some("active"),
            "trial {trial}"
        );
    }
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    let applies: i64 = conn
        .query_row(
            "SELECT count(*) FROM fleet_retire_controller_applies",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        applies, 0,
        "trial {trial}: a deposed leader recorded an apply"
    );
}

/// `--once` ends with apply's exit code, and without the retire
/// capability the controller refuses to start with apply's words (2).
#[test]
fn once_exits_with_applys_code_and_a_profile_without_retire_is_refused() {
    let stores = stores();
    let mut w = worker(&stores, 1);
    w.0.kill().unwrap();
    w.0.wait().unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let run = |profile: &str, extra: &[&str]| {
        bin()
            .arg("controller")
            .arg("--registry")
            .arg(&stores.registry)
            .arg("--leases")
            .arg(&stores.leases)
            .arg("--profiles")
            .arg(&stores.profiles)
            .args([
                "--profile",
                profile,
                "--canonical-repository",
                "prgs/gitea-tools",
            ])
            .args(["--listen", "none", "--once"])
            .args(LEASE_TIMES)
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = run("reader", &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        text(&refused).contains("apply refused"),
        "{}",
        text(&refused)
    );
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("active"));
    let dry = run("controller-prgs", &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("active"));
    let once = run("controller-prgs", &[]);
    assert_eq!(once.status.code(), Some(0), "{}", text(&once));
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("retired"));
}

/// The budget is kept in the registry (issue 53 §4): a controller allowed
/// 2 retirements an hour retires 2 of 4 dead workers, and a restart (a new
/// process, as after a crash or a failover) inherits the spent budget and
/// retires nothing more.
#[test]
fn the_budget_survives_a_restart() {
    let stores = stores();
    let mut workers: Vec<KillOnDrop> = (1..=4).map(|n| worker(&stores, n)).collect();
    for w in &mut workers {
        w.0.kill().unwrap();
        w.0.wait().unwrap();
    }
    std::thread::sleep(Duration::from_millis(1100));
    let once = || {
        bin()
            .arg("controller")
            .arg("--registry")
            .arg(&stores.registry)
            .arg("--leases")
            .arg(&stores.leases)
            .arg("--profiles")
            .arg(&stores.profiles)
            .args([
                "--profile",
                "controller-prgs",
                "--canonical-repository",
                "prgs/gitea-tools",
            ])
            .args([
                "--listen",
                "none",
                "--once",
                "--budget",
                "2/1h",
                "--log-format",
                "json",
            ])
            .args(LEASE_TIMES)
            .output()
            .unwrap()
    };
    let retired = || {
        (1..=4)
            .filter(|n| status(&stores.registry, &format!("w-{n}")).as_deref() == Some("retired"))
            .count()
    };
    let first = once();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert_eq!(retired(), 2);
    let second = once();
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    assert!(
        text(&second).contains("budget_exhausted"),
        "{}",
        text(&second)
    );
    assert_eq!(retired(), 2, "a restart reset the budget");
}

/// The brake (issue 53 §4): twelve workers of this host die at once; the
/// first tick retires none of them (more than half the host's active rows),
/// and they are retired only by a tick at least a heartbeat TTL (here one
/// second) later that finds them still dead.
#[test]
fn a_mass_death_engages_the_brake_until_a_ttl_later() {
    let stores = stores();
    let mut workers: Vec<KillOnDrop> = (1..=12).map(|n| worker(&stores, n)).collect();
    for w in &mut workers {
        w.0.kill().unwrap();
        w.0.wait().unwrap();
    }
    let c = Controller::start(&stores, "c", &[]);
    wait_for(Duration::from_secs(30), "the workers to be retired", || {
        (1..=12).all(|n| status(&stores.registry, &format!("w-{n}")).as_deref() == Some("retired"))
    });
    let outcomes: Vec<String> = c.outcomes().into_iter().filter(|o| o != "idle").collect();
    assert_eq!(
        outcomes.first().map(String::as_str),
        Some("braked"),
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&"applied".to_string()), "{outcomes:?}");
}

/// "I cannot see" means "stop" (issue 53 §4): with a `/proc` whose
/// process table cannot be read (this host's name and boot id can), the
/// tick retires nothing and `--once` exits 1.
#[test]
fn a_tick_that_cannot_read_proc_retires_nothing() {
    let stores = stores();
    let mut w = worker(&stores, 1);
    w.0.kill().unwrap();
    w.0.wait().unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let fake = stores.dir.path().join("proc");
    for file in ["sys/kernel/hostname", "sys/kernel/random/boot_id"] {
        let to = fake.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(Path::new("/proc").join(file), &to).unwrap();
    }
    let out = bin()
        .arg("controller")
        .arg("--registry")
        .arg(&stores.registry)
        .arg("--leases")
        .arg(&stores.leases)
        .arg("--profiles")
        .arg(&stores.profiles)
        .arg("--proc-root")
        .arg(&fake)
        .args([
            "--profile",
            "controller-prgs",
            "--canonical-repository",
            "prgs/gitea-tools",
        ])
        .args(["--listen", "none", "--once"])
        .args(LEASE_TIMES)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("cannot see"), "{}", text(&out));
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("active"));
}
