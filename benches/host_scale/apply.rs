//! Part `apply` (issue 54 §3): host `APPLY_HOST`'s scoped apply of about
//! 2,000 candidates in one transaction, while writers heartbeat other
//! hosts' live rows flat out. Before each run, that many dead launches of
//! the host are registered (so each run has its own candidates); the host
//! plans its scope, saves the plan, and applies it whole (one batch: its
//! `--max-retire` holds every candidate).

use crate::beats::{live_rows, Writers};
use crate::fleet::{add_dead, APPLY_HOST};
use crate::hosts::{apply, save_plan, Stores};
use std::sync::Arc;

/// The knobs of the part.
pub struct Params {
    pub candidates: u64,
    pub runs: usize,
    pub writers: usize,
    /// Each writer's interval between heartbeats (zero: flat out).
    pub every: std::time::Duration,
}

/// One run's result.
struct Run {
    candidates: usize,
    outcome: String,
    retired: u64,
    lock_ms: u64,
    detail: String,
}

fn one(s: &Stores, p: &Params, seed: u64, dir: &std::path::Path) -> Run {
    add_dead(s.url, APPLY_HOST, p.candidates, seed);
    let plan = dir.join(format!("apply-{seed}.json"));
    let candidates = save_plan(APPLY_HOST, s, &plan);
    let report = apply(APPLY_HOST, s, &plan, candidates.max(1));
    Run {
        candidates,
        outcome: report["outcome"].as_str().unwrap_or("?").into(),
        retired: report["retired_count"].as_u64().unwrap_or(0),
        lock_ms: report["lock_held_ms"].as_u64().unwrap_or(0),
        detail: report["detail"].as_str().unwrap_or("").into(),
    }
}

/// `p.runs` runs beside `p.writers` writers; a line each, then a summary.
pub fn run(s: &Stores, p: &Params, dir: &std::path::Path) {
    let rows = Arc::new(live_rows(s.url, APPLY_HOST));
    let writers = Writers::start(s.url, p.writers, rows, p.every);
    let mut locks = Vec::new();
    let mut refused = 0;
    for i in 0..p.runs {
        let r = one(s, p, 1000 + i as u64, dir);
        println!(
            "apply   run {:>2}: {} candidates, {} ({} retired), transaction {} ms{}",
            i + 1,
            r.candidates,
            r.outcome,
            r.retired,
            r.lock_ms,
            if r.outcome == "applied" {
                String::new()
            } else {
                format!(": {}", r.detail)
            }
        );
        if r.outcome == "applied" {
            locks.push(std::time::Duration::from_millis(r.lock_ms));
        } else {
            refused += 1;
        }
    }
    let beats = writers.stop();
    locks.sort();
    println!(
        "apply   {} of {} applied, {refused} refused; transaction median {:.0} ms, max {:.0} ms; \
         beside {} writers ({} ms apart): {:.0} heartbeats/s, p99 {:.2} ms, {} failed",
        locks.len(),
        p.runs,
        crate::common::percentile(&locks, 0.5),
        crate::common::percentile(&locks, 1.0),
        p.writers,
        p.every.as_millis(),
        beats.rate,
        beats.p99_ms,
        beats.failed
    );
}
