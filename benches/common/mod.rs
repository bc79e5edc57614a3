//! What the benchmarks share.

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
