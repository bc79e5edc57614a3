//! What the benchmarks share. Each bench includes this module and uses
//! part of it.
#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

/// Run a command to completion; its wall time and peak RSS in KiB.
// The child is reaped by `wait4`, which also reports its peak memory.
#[allow(clippy::zombie_processes)]
pub fn measure(cmd: &mut Command) -> (Duration, i64, bool) {
    let started = Instant::now();
    let child = cmd.spawn().expect("start fleet-retire");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into the locals above.
    let pid = unsafe { nix::libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4 failed");
    let ok = nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0;
    (started.elapsed(), usage.ru_maxrss, ok)
}

/// A database of its own, dropped at the end.
pub struct Db {
    admin: String,
    name: String,
    /// Its URL.
    pub url: String,
}

impl Db {
    /// A fresh database named after `tag` on the cluster at `admin`.
    pub fn new(admin: &str, tag: &str) -> Db {
        let name = format!("fr_bench_{tag}_{}", std::process::id());
        let mut c = postgres::Client::connect(admin, postgres::NoTls).unwrap();
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
        Db {
            admin: admin.into(),
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// The `p` quantile of sorted durations, in milliseconds.
pub fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// Apply's context for a bench: the `controller-prgs` profile of
/// `profiles`, this host's `/proc`, a 5 s busy timeout.
pub fn apply_context<'a>(
    registry: &'a std::path::Path,
    leases: &'a std::path::Path,
    profiles: &'a std::path::Path,
    policies: &'a fleet_retire::policy::Policies,
    probe: &'a fleet_retire::evidence::probe::SystemProbe,
) -> fleet_retire::apply::Context<'a> {
    fleet_retire::apply::Context {
        registry,
        leases,
        profiles,
        profile: "controller-prgs",
        proc_root: std::path::Path::new("/proc"),
        policies,
        probe,
        busy_timeout: Duration::from_secs(5),
    }
}

/// A plan of the stores (canonical repository `prgs/gitea-tools`) and an
/// apply request for its candidates as a saved plan makes it (its planned
/// rows kept): every one, or the `first` N; at most `max_retire`.
pub fn plan_and_request(
    registry: &std::path::Path,
    leases: &std::path::Path,
    policies: &fleet_retire::policy::Policies,
    max_retire: usize,
    first: Option<usize>,
) -> fleet_retire::apply::Request {
    let p = fleet_retire::plan::plan_from_files(
        registry,
        leases,
        std::path::Path::new("/proc"),
        "prgs/gitea-tools".into(),
        policies,
    )
    .unwrap();
    let mut req = request_for(&p, max_retire);
    req.planned = Some(std::sync::Arc::new(
        fleet_retire::plan::planned::PlannedRows::of(&p),
    ));
    req.first = first;
    req
}

/// An apply request for every candidate of `p` with its tokens (no
/// planned rows, no `first`), at most `max_retire`.
pub fn request_for(
    p: &fleet_retire::plan::Plan,
    max_retire: usize,
) -> fleet_retire::apply::Request {
    fleet_retire::apply::Request {
        registry_fingerprint: p.registry_fingerprint.clone(),
        candidate_fingerprint: p.candidate_fingerprint.clone(),
        policy_fingerprint: p.policy_fingerprint.clone(),
        workers: p.candidates().map(|e| p.identity(e)).collect(),
        canonical_repository: Some("prgs/gitea-tools".into()),
        max_retire,
        planned: None,
        first: None,
        scope: None,
        skip_fleet_summary: false,
        controller: None,
    }
}
