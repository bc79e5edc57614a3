//! `fleet-retire controller`'s leadership with real processes (issue 53
//! §2): real SQLite files, controllers as child processes, workers
//! registered by `fleet-retire register` from a shell that then becomes a
//! `sleep` (the registered process), killed to make them dead. Every child
//! is killed on drop, so a failing assertion leaves nothing running. Lease
//! times are short (ttl 3 s, renew deadline 2 s, retry 0.5 s).

mod common;

use common::controller::*;
use common::{text, KillOnDrop};
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

/// Two controllers on one registry: at every sample at most one holds the
/// lease unexpired and at most one's `/metrics` says it leads (under the
/// lease row's term), every term was taken by one process only, and the dead
/// workers are retired once, each audit row's apply recorded under a term
/// its leader held.
#[test]
fn two_controllers_at_most_one_leads_and_each_term_has_one_holder() {
    let stores = stores();
    let mut workers: Vec<KillOnDrop> = (1..=3).map(|n| worker(&stores, n)).collect();
    let (a, port_a) = start_listening(&stores, "a");
    let (b, port_b) = start_listening(&stores, "b");
    let ports = [port_a, port_b];
    wait_for(Duration::from_secs(20), "a leader", || {
        leader(&stores.registry).is_some()
    });
    for w in &mut workers {
        w.0.kill().unwrap();
        let _ = w.0.wait();
    }
    let started = Instant::now();
    let mut led = [0, 0];
    while started.elapsed() < Duration::from_secs(6) {
        if let Some((pid, term)) = leader(&stores.registry) {
            assert!(pid == a.pid() || pid == b.pid(), "a stranger leads: {pid}");
            // What each process's /metrics says agrees with the lease row.
            let says = ports.map(|p| {
                sample(
                    &get(p, "/metrics", None).1,
                    "fleet_retire_controller_leader",
                )
            });
            assert!(
                says.iter().filter(|l| **l == Some(1.0)).count() <= 1,
                "{says:?}"
            );
            let at = usize::from(pid == b.pid());
            if says[at] == Some(1.0) {
                led[at] += 1;
                let t = sample(
                    &get(ports[at], "/metrics", None).1,
                    "fleet_retire_controller_term",
                );
                assert_eq!(t, Some(term as f64));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(led.iter().sum::<usize>() > 0, "no /metrics said it led");
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
    let (_, term) = wait_for_leader(&stores);
    let took = kill_the_leader(&stores, &mut cs);
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
    let status = exit_within(&mut stopped.child, sent, Duration::from_secs(5));
    assert_eq!(status.code(), Some(0));
    assert!(stopped.says("released the controller lease"));
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
    let (a, lock) = leader_waiting_for_the_lock(&stores);
    // It cannot take the lease while the lock is held.
    let b = Controller::start(&stores, "b", &["--dry-run"]);
    freeze_outside_any_lock(&a);
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
        a.outcomes()
            .iter()
            .any(|o| !matches!(o.as_str(), "idle" | "unchanged"))
    });
    let ended: Vec<String> = a
        .outcomes()
        .into_iter()
        .filter(|o| !matches!(o.as_str(), "idle" | "unchanged"))
        .collect();
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
    kill_and_expire(&mut [worker(&stores, 1)]);
    let refused = once(&stores, "reader", &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        text(&refused).contains("apply refused"),
        "{}",
        text(&refused)
    );
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("active"));
    let dry = once(&stores, "controller-prgs", &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("active"));
    let applied = once(&stores, "controller-prgs", &[]);
    assert_eq!(applied.status.code(), Some(0), "{}", text(&applied));
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("retired"));
}

/// SIGTERM while the leader's apply waits for the registry's write lock:
/// the process ends within 5 s with exit 0, having committed nothing (its
/// lease, which it cannot write while the lock is held, expires by itself).
#[test]
fn sigterm_while_an_apply_waits_for_the_lock_exits_within_five_seconds() {
    let stores = stores();
    let (a, lock) = leader_waiting_for_the_lock(&stores);
    a.signal(Signal::SIGTERM);
    let sent = Instant::now();
    let mut a = a;
    let status = exit_within(&mut a.child, sent, Duration::from_secs(5));
    eprintln!("exited {:?} after SIGTERM", sent.elapsed());
    assert_eq!(status.code(), Some(0));
    lock.execute_batch("ROLLBACK").unwrap();
    for n in 1..=2 {
        assert_eq!(status_of_worker(&stores, n), Some("active".into()));
    }
    assert!(a.says("controller stopped"), "{:?}", a.outcomes());
}

/// A leader (with the default lease times of these tests) whose apply of
/// two dead workers waits for the registry's write lock, which the
/// returned connection holds.
fn leader_waiting_for_the_lock(stores: &common::Stores) -> (Controller, rusqlite::Connection) {
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(stores, n)).collect();
    let a = Controller::start(stores, "a", &[]);
    wait_for(Duration::from_secs(20), "a to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == a.pid())
    });
    let lock = rusqlite::Connection::open(&stores.registry).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    for w in &mut workers {
        w.0.kill().unwrap();
        let _ = w.0.wait();
    }
    wait_for(Duration::from_secs(10), "a's apply to start", || {
        a.says("applying")
    });
    // Apply reads outside the lock first, then waits in BEGIN IMMEDIATE.
    std::thread::sleep(Duration::from_millis(500));
    (a, lock)
}

/// Whether `pid` holds a POSIX lock on any file (SQLite's locks are
/// byte-range locks, listed in /proc/locks).
fn holds_a_file_lock(pid: u32) -> bool {
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(&pid.to_string()))
}

/// SIGSTOP `c` while it holds no SQLite lock: in its wait for the write
/// lock, not in the read outside it that precedes it (a process frozen
/// holding a read lock keeps every writer out, its successor included,
/// until it is thawed: SQLite has no server to end it).
fn freeze_outside_any_lock(c: &Controller) {
    loop {
        wait_for(
            Duration::from_secs(10),
            "the read outside the lock to end",
            || {
                (0..3).all(|_| {
                    std::thread::sleep(Duration::from_millis(20));
                    !holds_a_file_lock(c.pid())
                })
            },
        );
        c.signal(Signal::SIGSTOP);
        std::thread::sleep(Duration::from_millis(50));
        if !holds_a_file_lock(c.pid()) {
            return;
        }
        c.signal(Signal::SIGCONT);
    }
}

fn status_of_worker(stores: &common::Stores, n: usize) -> Option<String> {
    status(&stores.registry, &format!("w-{n}"))
}

/// Hand applies beside a controller (issue 53 §2): on a registry that
/// holds the controller's tables, `apply` of a saved plan needs no lease,
/// is accepted by the schema checks, and its audit rows have no controller
/// term or tick (NULL through the join docs/controller.md gives).
#[test]
fn a_hand_apply_beside_the_controllers_tables_works_and_has_no_term() {
    let stores = stores();
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(&stores, n)).collect();
    let dry = once(&stores, "controller-prgs", &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
    kill_and_expire(&mut workers);
    let (plan, _) = common::save_plan(&stores);
    let (code, report) = common::apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["outcome"], "applied", "{report}");
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    let terms: Vec<Option<i64>> = conn
        .prepare(
            "SELECT c.controller_term FROM retirement_audit a \
             LEFT JOIN fleet_retire_controller_applies c USING (apply_id)",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(terms, vec![None, None]);
}

/// Attack (review of issue 53): someone who may write the registry file
/// plants the controller's lease table, its columns exactly ours, with a
/// trigger that retires every worker. The controller's lease writes (made
/// every retry period, even in a dry run) would run it outside apply's
/// guard, with no audit row. The controller refuses the lease write and
/// retires nothing.
#[test]
fn a_trigger_on_the_controllers_lease_table_is_refused_before_any_lease_write() {
    let stores = stores();
    let _w = worker(&stores, 1);
    wait_for(Duration::from_secs(10), "the worker to register", || {
        status(&stores.registry, "w-1").is_some()
    });
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    conn.execute_batch(
        "CREATE TABLE fleet_retire_controller_leases (scope TEXT PRIMARY KEY, \
           holder TEXT NOT NULL, term BIGINT NOT NULL, acquired_at_ms BIGINT NOT NULL, \
           renewed_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL); \
         CREATE TRIGGER retire_all AFTER INSERT ON fleet_retire_controller_leases \
         BEGIN UPDATE worker_registrations SET status = 'retired'; END;",
    )
    .unwrap();
    drop(conn);
    let out = once(&stores, "controller-prgs", &["--dry-run"]);
    let said = text(&out);
    assert_eq!(
        status(&stores.registry, "w-1").as_deref(),
        Some("active"),
        "{said}"
    );
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("trigger \"retire_all\""), "{said}");
}

/// Attack (review of issue 53): the same trigger planted while a
/// controller runs, on UPDATE, then SIGTERM at once: its next renewal or
/// its release at exit would run it. Neither may: the release checks
/// under the write lock as a renewal does.
#[test]
fn a_trigger_planted_while_it_runs_never_fires_at_renewal_or_release() {
    let stores = stores();
    let _w = worker_with_ttl(&stores, 1, 600);
    wait_for(Duration::from_secs(10), "the worker to register", || {
        status(&stores.registry, "w-1").is_some()
    });
    let c = Controller::start(&stores, "c", &[]);
    wait_for(Duration::from_secs(10), "c to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == c.pid())
    });
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER retire_all AFTER UPDATE ON fleet_retire_controller_leases \
         BEGIN UPDATE worker_registrations SET status = 'retired'; END;",
    )
    .unwrap();
    c.signal(Signal::SIGTERM);
    let mut c = c;
    let _ = c.child.0.wait();
    assert_eq!(
        status(&stores.registry, "w-1").as_deref(),
        Some("active"),
        "{:?}",
        c.lines()
    );
}
