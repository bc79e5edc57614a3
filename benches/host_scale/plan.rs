//! Part `plan` (issue 54 §3): one host's scoped plan against the plan of
//! the whole registry, run as host `h-7`; median wall time and peak RSS.

use crate::hosts::{measure_plan, Stores};
use std::time::Duration;

/// The measuring host: one of many, no apply of its own.
const HOST: &str = "h-7";

/// Median time and RSS of a plan, or `None` when it was not run.
pub struct Figures {
    pub scoped: (Duration, i64),
    pub whole: Option<(Duration, i64)>,
}

fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn medians(v: &[(Duration, i64)]) -> (Duration, i64) {
    (
        median(v.iter().map(|m| m.0).collect()),
        median(v.iter().map(|m| m.1).collect()),
    )
}

/// `runs` plans of each kind; the whole plan only when `whole`.
pub fn run(s: &Stores, runs: usize, whole: bool) -> Figures {
    let mut scoped = Vec::new();
    let mut all = Vec::new();
    for _ in 0..runs {
        scoped.push(measure_plan(HOST, s, true));
        if whole {
            all.push(measure_plan(HOST, s, false));
        }
    }
    Figures {
        scoped: medians(&scoped),
        whole: whole.then(|| medians(&all)),
    }
}

/// One line of the report.
pub fn print(rows: u64, f: &Figures) {
    let show = |(t, rss): (Duration, i64)| {
        format!("{:.3} s, {:.1} MB", t.as_secs_f64(), rss as f64 / 1024.0)
    };
    println!(
        "plan    {rows:>10} rows: scoped {}; whole {}",
        show(f.scoped),
        f.whole
            .map_or("not run (HOST_SCALE_WHOLE_MAX)".into(), show)
    );
}
