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
