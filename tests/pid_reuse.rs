//! Pid reuse, forced for real: a process is placed on a dead worker's pid
//! number by steering the kernel's next pid. It lives in its own test binary
//! because rewinding the pid counter would hand other tests' dead pids to new
//! processes; the counter is restored afterwards.

mod common;

use common::*;
use fleet_retire::apply::{Hooks, Outcome};
use std::path::Path;
use std::process::Child;
use std::sync::Mutex;

/// The kernel's pid counter is one for the machine: one test steers it at
/// a time.
static STEERING: Mutex<()> = Mutex::new(());

/// Move the pid counter well past every number a test placed a process on,
/// so the dead pids the tests made are not handed out again soon.
fn restore_counter(counter: Option<String>, placed: i64) {
    if let Some(c) = counter {
        let high = c.trim().parse::<i64>().unwrap_or(0).max(placed) + 1000;
        let _ = std::fs::write("/proc/sys/kernel/ns_last_pid", high.to_string());
    }
}

/// Which apply test of pid reuse between plan and apply: whose pid.
#[derive(Clone, Copy, PartialEq)]
enum Whose {
    Target,
    Bystander,
}

/// Two candidates, `w-target` and `w-bystander`, each on a dead pid; a
/// plan saved; then a new process placed on one of their pids; then an
/// apply of `w-target` alone. The bystander's verdict moving
/// (`eligible_stale_orphan` → `pid_reuse_detected`) is reported and refuses
/// nothing (semantics §13, "Churn beside the targets"); the target's own
/// refuses the apply.
fn pid_reused_between_plan_and_apply(engine: Engine, whose: Whose) {
    let _steering = STEERING.lock().unwrap_or_else(|e| e.into_inner());
    let counter = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").ok();
    let (target_pid, target_start) = dead_process();
    let (bystander_pid, bystander_start) = dead_process();
    let stores = Stores::new(&[
        stale_row("w-target", target_pid, &target_start),
        stale_row("w-bystander", bystander_pid, &bystander_start),
    ]);
    let tag = if whose == Whose::Target {
        "reuse_target"
    } else {
        "reuse_bystander"
    };
    let Some((stores, access)) = onto(engine, tag, stores) else {
        return;
    };
    let (plan_path, plan) = save_plan(&stores);
    let mut candidates: Vec<String> =
        serde_json::from_value(plan["candidate_worker_identities"].clone()).unwrap();
    candidates.sort();
    assert_eq!(candidates, ["w-bystander", "w-target"]);
    let pid = if whose == Whose::Target {
        target_pid
    } else {
        bystander_pid
    };
    let Some(reused) = respawn_on(pid).map(KillOnDrop) else {
        eprintln!("skipped: could not place a process on pid {pid} (needs root and a writable ns_last_pid)");
        return;
    };
    let (code, report) = apply_cli(
        &stores,
        &plan_path,
        "controller-prgs",
        &["--workers", "w-target"],
    );
    drop(reused);
    restore_counter(counter, pid);
    let moved = &report["verdicts_moved"][0];
    assert_eq!(moved["now"], "pid_reuse_detected", "{report}");
    assert_eq!(access.status_of("w-bystander"), "active");
    if whose == Whose::Bystander {
        assert_eq!(code, Some(0), "{report}");
        assert_eq!(report["outcome"], "applied");
        assert_eq!(report["retired_count"], 1);
        assert_eq!(moved["worker_identity"], "w-bystander");
        assert_eq!(access.status_of("w-target"), "retired");
    } else {
        assert_eq!(code, Some(2), "{report}");
        assert_eq!(report["outcome"], "candidate_set_moved");
        assert_eq!(moved["worker_identity"], "w-target");
        assert_eq!(access.status_of("w-target"), "active");
    }
}

#[test]
fn a_bystanders_pid_reused_between_plan_and_apply_refuses_nothing_on_sqlite() {
    pid_reused_between_plan_and_apply(Engine::Sqlite, Whose::Bystander);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_bystanders_pid_reused_between_plan_and_apply_refuses_nothing_on_postgres() {
    pid_reused_between_plan_and_apply(Engine::Postgres, Whose::Bystander);
}

#[test]
fn a_targets_pid_reused_between_plan_and_apply_refuses_it_on_sqlite() {
    pid_reused_between_plan_and_apply(Engine::Sqlite, Whose::Target);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_targets_pid_reused_between_plan_and_apply_refuses_it_on_postgres() {
    pid_reused_between_plan_and_apply(Engine::Postgres, Whose::Target);
}

fn status(path: &Path) -> String {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("SELECT status FROM worker_registrations", [], |r| r.get(0))
        .unwrap()
}

/// Put a new process on `pid` by steering the kernel's next pid; `None`
/// where this machine does not allow it (not root, or another process took
/// the number first every time).
fn respawn_on(pid: i64) -> Option<Child> {
    for _ in 0..50 {
        if std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).is_err() {
            return None;
        }
        let child = spawn_sleeper();
        if child.id() as i64 == pid {
            return Some(child);
        }
        let mut c = child;
        c.kill().ok();
        c.wait().ok();
    }
    None
}

#[test]
fn a_pid_reused_before_the_write_is_refused_by_the_reprobe() {
    let _steering = STEERING.lock().unwrap_or_else(|e| e.into_inner());
    let counter = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").ok();
    let (pid, start) = dead_process();
    let stores = Stores::new(&[stale_row("w-reused", pid, &start)]);
    let lib = Lib::new(stores);
    let req = lib.request();
    assert_eq!(req.workers, vec!["w-reused".to_string()]);
    let mut reused: Option<Child> = None;
    let slot = &mut reused;
    let mut hook = || *slot = respawn_on(pid);
    let report = lib.run(
        &req,
        Hooks {
            before_first_write: Some(&mut hook),
            fail_commit: false,
            ..Default::default()
        },
    );
    let Some(mut child) = reused else {
        eprintln!("skipped: could not place a process on pid {pid} (needs root and a writable ns_last_pid)");
        return;
    };
    assert_ne!(start_time(child.id()), start, "a new incarnation");
    assert_eq!(report.outcome, Outcome::Applied);
    assert_eq!(report.retired_count, 0, "{report:?}");
    assert_eq!(report.preserved[0].reason_code, "liveness_reprobe_refused");
    assert_eq!(status(&lib.stores.registry), "active");
    child.kill().unwrap();
    child.wait().unwrap();

    // And a plan made while the number is reused refuses it outright.
    let mut again = respawn_on(pid).expect("placed once, placeable again");
    let plan = lib.stores.plan_json();
    assert_eq!(plan["preserved"][0]["reason_code"], "pid_reuse_detected");
    again.kill().unwrap();
    again.wait().unwrap();
    restore_counter(counter, pid);
}
