//! Part `hosts` (issue 54 §3): `n` hosts apply at once. Each host is its
//! own UTS namespace (its node name its host id), as in
//! `tests/multi_host.rs`: it plans its scope and saves the plan (all at
//! once), then, when every plan is saved, all apply at the same moment,
//! each its whole plan in one transaction. A host refused plans again and
//! applies again, up to `tries` times in all (as `tests/multi_host.rs`
//! lets its hosts); every refusal is printed. The apply itself runs its
//! transaction again after a serialization failure: how many times each
//! did is printed.

use crate::hosts::{apply, save_plan, Stores};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// One apply of a host.
struct Try {
    candidates: usize,
    outcome: String,
    detail: String,
    lock: Duration,
    wall: Duration,
    /// How many times the apply ran its transaction (`transaction_attempts`).
    attempts: u64,
}

fn attempt(s: &Stores, name: &str, dir: &std::path::Path, ready: Option<&Barrier>) -> Try {
    let plan = dir.join(format!("{name}.json"));
    let candidates = save_plan(name, s, &plan);
    if let Some(ready) = ready {
        ready.wait();
    }
    let started = Instant::now();
    let report = apply(name, s, &plan, candidates.max(1));
    Try {
        candidates,
        outcome: report["outcome"].as_str().unwrap_or("?").into(),
        detail: report["detail"].as_str().unwrap_or("").into(),
        lock: Duration::from_millis(report["lock_held_ms"].as_u64().unwrap_or(0)),
        wall: started.elapsed(),
        attempts: report["transaction_attempts"].as_u64().unwrap_or(1),
    }
}

/// A host's tries: the first at the barrier, the others at once.
fn host(
    s: &Stores,
    name: String,
    dir: &std::path::Path,
    ready: &Barrier,
    tries: usize,
) -> Vec<Try> {
    let mut done = vec![attempt(s, &name, dir, Some(ready))];
    while done.last().unwrap().outcome != "applied" && done.len() < tries {
        done.push(attempt(s, &name, dir, None));
    }
    for t in done.iter().filter(|t| t.outcome != "applied") {
        println!("hosts   {name} refused: {}: {}", t.outcome, t.detail);
    }
    done
}

/// Hosts `h-10` … (`n` of them, none the plan or apply part's) at once.
pub fn run(s: &Stores, n: usize, hosts: u64, tries: usize, dir: &std::path::Path) {
    assert!(
        10 + n as u64 <= hosts,
        "HOST_SCALE_APPLYING: at most hosts - 10"
    );
    let ready = Barrier::new(n);
    let done: Vec<Vec<Try>> = std::thread::scope(|sc| {
        let runs: Vec<_> = (0..n)
            .map(|i| {
                let ready = &ready;
                sc.spawn(move || host(s, format!("h-{}", 10 + i), dir, ready, tries))
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let first = done.iter().filter(|d| d[0].outcome == "applied").count();
    let last = done
        .iter()
        .filter(|d| d.last().unwrap().outcome == "applied")
        .count();
    let mut locks: Vec<Duration> = done.iter().flatten().map(|t| t.lock).collect();
    let mut walls: Vec<Duration> = done.iter().flatten().map(|t| t.wall).collect();
    locks.sort();
    walls.sort();
    let p = crate::common::percentile;
    let attempts: Vec<u64> = done.iter().flatten().map(|t| t.attempts).collect();
    println!(
        "hosts   transaction attempts per apply: {} once, {} more than once, at most {}",
        attempts.iter().filter(|&&a| a == 1).count(),
        attempts.iter().filter(|&&a| a > 1).count(),
        attempts.iter().max().unwrap_or(&0)
    );
    println!(
        "hosts   {n} hosts at once: {first} applied at the first try, {last} within {tries} \
         ({} candidates at first); transaction p50 {:.0} ms, p99 {:.0} ms; apply command p50 \
         {:.0} ms, p99 {:.0} ms (every try)",
        done.iter().map(|d| d[0].candidates).sum::<usize>(),
        p(&locks, 0.5),
        p(&locks, 0.99),
        p(&walls, 0.5),
        p(&walls, 0.99)
    );
}
