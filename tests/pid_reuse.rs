//! Pid reuse, forced for real: a process is placed on a dead worker's pid
//! number by steering the kernel's next pid. It lives in its own test binary
//! because rewinding the pid counter would hand other tests' dead pids to new
//! processes; the counter is restored afterwards.

mod common;

use common::*;
use fleet_retire::apply::{Hooks, Outcome};
use std::path::Path;
use std::process::Child;

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
    if let Some(c) = counter {
        let high = c.trim().parse::<i64>().unwrap_or(0).max(pid) + 1000;
        let _ = std::fs::write("/proc/sys/kernel/ns_last_pid", high.to_string());
    }
}
