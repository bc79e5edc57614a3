//! Churn beside the targets for `apply_scale` (issue 44 §2): new processes
//! taking pids that rows of the registry hold, while a plan is applied.

use fleet_retire::row::Col;
use fleet_retire::value::Val;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A thread starting a short-lived process every 20 ms until stopped.
pub struct Churn {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<usize>,
}

impl Churn {
    /// Start churning.
    pub fn start() -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut started = 0;
            while !flag.load(Ordering::SeqCst) {
                if Command::new("true").status().is_ok() {
                    started += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            started
        });
        Churn { stop, handle }
    }

    /// Stop; how many processes were started.
    pub fn stop(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().unwrap()
    }
}

/// A process killed (and reaped) on drop.
pub struct Placed(Child);

impl Drop for Placed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plan of the stores and an apply request for its candidates (planned
/// rows kept, at most `targets` retired by one apply); and the pids of the
/// candidates after the first `skip` (the applies' targets), below the
/// kernel's `pid_max`, that no one of those first `skip` holds too.
pub fn plan_with_bystanders(
    registry: &Path,
    leases: &Path,
    policies: &fleet_retire::policy::Policies,
    skip: usize,
) -> (fleet_retire::apply::Request, Vec<i64>) {
    let p = fleet_retire::plan::plan_from_files(
        registry,
        leases,
        Path::new("/proc"),
        "prgs/gitea-tools".into(),
        policies,
    )
    .unwrap();
    let mut req = crate::common::request_for(&p, skip);
    req.planned = Some(Arc::new(fleet_retire::plan::planned::PlannedRows::of(&p)));
    let pid_max: i64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    let pid = |e: &fleet_retire::plan::Entry| match p.rows[e.index].get(Col::Pid) {
        Val::Int(i) => Some(i),
        _ => None,
    };
    let candidates: Vec<_> = p.candidates().collect();
    let taken: std::collections::HashSet<i64> = candidates
        .iter()
        .take(skip)
        .filter_map(|e| pid(e))
        .collect();
    let bystanders = candidates
        .iter()
        .skip(skip)
        .filter_map(|e| pid(e))
        .filter(|p| *p > 300 && *p < pid_max && !taken.contains(p))
        .collect();
    (req, bystanders)
}

/// Place a long-lived process on each of the first `n` of `pids` it can
/// (by steering the kernel's next pid: root only; none where it cannot).
pub fn place_on(pids: &[i64], n: usize) -> Vec<Placed> {
    let mut placed = Vec::new();
    for &pid in pids {
        if placed.len() == n {
            break;
        }
        for _ in 0..20 {
            if std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).is_err() {
                println!("  churn: cannot steer the next pid here (not root), placed none");
                return placed;
            }
            let child = Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            let child = Placed(child);
            if i64::from(child.0.id()) == pid {
                placed.push(child);
                break;
            }
        }
    }
    placed
}
