//! Part `hosts` (issue 54 §3): `n` hosts apply at once. Each host is its
//! own UTS namespace (its node name its host id), as in
//! `tests/multi_host.rs`: it plans its scope and saves the plan (all at
//! once), then, when every plan is saved, all apply at the same moment,
//! each its whole plan in one transaction.

use crate::hosts::{apply, save_plan, Stores};
use std::sync::Barrier;
use std::time::{Duration, Instant};

struct Done {
    host: String,
    candidates: usize,
    outcome: String,
    detail: String,
    lock: Duration,
    wall: Duration,
}

fn host(s: &Stores, name: String, dir: &std::path::Path, ready: &Barrier) -> Done {
    let plan = dir.join(format!("{name}.json"));
    let candidates = save_plan(&name, s, &plan);
    ready.wait();
    let started = Instant::now();
    let report = apply(&name, s, &plan, candidates.max(1));
    Done {
        candidates,
        outcome: report["outcome"].as_str().unwrap_or("?").into(),
        detail: report["detail"].as_str().unwrap_or("").into(),
        lock: Duration::from_millis(report["lock_held_ms"].as_u64().unwrap_or(0)),
        wall: started.elapsed(),
        host: name,
    }
}

/// Hosts `h-10` … (`n` of them, none the plan or apply part's) at once.
pub fn run(s: &Stores, n: usize, hosts: u64, dir: &std::path::Path) {
    assert!(
        10 + n as u64 <= hosts,
        "HOST_SCALE_APPLYING: at most hosts - 10"
    );
    let ready = Barrier::new(n);
    let done: Vec<Done> = std::thread::scope(|sc| {
        let runs: Vec<_> = (0..n)
            .map(|i| {
                let ready = &ready;
                sc.spawn(move || host(s, format!("h-{}", 10 + i), dir, ready))
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let applied = done.iter().filter(|d| d.outcome == "applied").count();
    for d in done.iter().filter(|d| d.outcome != "applied") {
        println!("hosts   {} refused: {}: {}", d.host, d.outcome, d.detail);
    }
    let mut locks: Vec<Duration> = done.iter().map(|d| d.lock).collect();
    let mut walls: Vec<Duration> = done.iter().map(|d| d.wall).collect();
    locks.sort();
    walls.sort();
    let p = crate::common::percentile;
    println!(
        "hosts   {n} hosts at once: {applied} applied ({} candidates in all); transaction p50 \
         {:.0} ms, p99 {:.0} ms; apply command p50 {:.0} ms, p99 {:.0} ms",
        done.iter().map(|d| d.candidates).sum::<usize>(),
        p(&locks, 0.5),
        p(&locks, 0.99),
        p(&walls, 0.5),
        p(&walls, 0.99)
    );
}
