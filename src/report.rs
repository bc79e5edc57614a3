//! Human rendering: short tables a person reads in a terminal.

use crate::plan::Plan;
use crate::text::esc;
use std::fmt::Write;

fn cut(s: &str, width: usize) -> String {
    let s = esc(s);
    if s.chars().count() <= width {
        s.into_owned()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('~');
        t
    }
}

/// How many of each list a human report shows unless told (`--limit N`,
/// `--all`): a screen, whatever the registry's size.
pub const LIST_DEFAULT: usize = 20;

/// At most `cap` (all with `None`) of `items`, one line each by `line`,
/// then how many were left out and how to see them.
fn listed<T>(
    out: &mut String,
    items: &[T],
    cap: Option<usize>,
    what: &str,
    mut line: impl FnMut(&mut String, &T),
) {
    let shown = cap.unwrap_or(usize::MAX).min(items.len());
    for item in &items[..shown] {
        line(out, item);
    }
    if shown < items.len() {
        let _ = writeln!(
            out,
            "  … and {} more {what} (--all lists them, --limit N the first N; --format json has \
             every one)",
            items.len() - shown
        );
    }
}

/// Blockers (JSON objects with `classification` and `detail`) counted per
/// class, most first: one line.
fn blocker_classes(blockers: &[serde_json::Value]) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for b in blockers {
        *counts
            .entry(b["classification"].as_str().unwrap_or(""))
            .or_default() += 1;
    }
    let mut by_count: Vec<(&str, usize)> = counts.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    by_count
        .iter()
        .map(|(c, n)| format!("{} {n}", esc(c)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One blocker's line.
fn blocker_line(out: &mut String, b: &serde_json::Value) {
    let _ = writeln!(
        out,
        "  - {}: {}",
        esc(b["classification"].as_str().unwrap_or("")),
        esc(b["detail"].as_str().unwrap_or(""))
    );
}

/// The plan as a person reads it: the counts, the preserved rows' counts
/// per reason, one line per candidate, at most `preserved_limit` preserved
/// rows (all of them with `None`; a large registry has tens of thousands),
/// then the tokens and the policy set that decided (`built-in`, or a folder
/// with its fingerprint).
pub fn plan_table(
    plan: &Plan,
    policy_source: &str,
    preserved_limit: Option<usize>,
    candidate_limit: Option<usize>,
) -> String {
    let mut out = String::new();
    let candidates = plan.candidates().count();
    let preserved = plan.entries.len() - candidates;
    let _ = writeln!(
        out,
        "{} rows assessed: {} may be retired, {} preserved",
        plan.entries.len(),
        candidates,
        preserved
    );
    let other_hosts = plan.other_host_rows();
    if other_hosts > 0 {
        let _ = writeln!(
            out,
            "{other_hosts} of them registered on other hosts: kept here whatever this host's \
             process table says; each host plans and retires its own"
        );
    }
    let counts = plan.reason_counts();
    if !counts.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "{:<42} ROWS", "PRESERVED BECAUSE");
        let mut by_count: Vec<(&str, usize)> = counts.into_iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (code, n) in by_count {
            let _ = writeln!(out, "{code:<42} {n}");
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{:<32} {:<9} REASON", "WORKER", "VERDICT");
    let listed_preserved = preserved_limit.unwrap_or(usize::MAX).min(preserved);
    let listed_candidates = candidate_limit.unwrap_or(usize::MAX).min(candidates);
    let shown = plan
        .candidates()
        .take(listed_candidates)
        .chain(plan.preserved().take(listed_preserved));
    for e in shown {
        let verdict = if e.is_candidate() { "retire" } else { "keep" };
        let codes: Vec<&str> = if e.is_candidate() {
            vec![e.reason().code()]
        } else {
            e.reason_codes().iter().map(|r| r.code()).collect()
        };
        let mut reason = codes.first().copied().unwrap_or("").to_string();
        if codes.len() > 1 {
            let _ = write!(reason, " (+{})", codes[1..].join(", "));
        }
        let _ = writeln!(
            out,
            "{:<32} {:<9} {}",
            cut(&plan.identity(e), 32),
            verdict,
            reason
        );
    }
    if listed_candidates < candidates {
        let _ = writeln!(
            out,
            "({} candidate(s) not listed: --all lists every row, --limit N the first N; \
             --format json and plan --out have every one)",
            candidates - listed_candidates
        );
    }
    if listed_preserved < preserved {
        let _ = writeln!(
            out,
            "({} preserved row(s) not listed: --all lists every row, --limit N the first N)",
            preserved - listed_preserved
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "registry_fingerprint  {}", plan.registry_fingerprint);
    let _ = writeln!(out, "candidate_fingerprint {}", plan.candidate_fingerprint);
    let _ = writeln!(out, "policy_fingerprint    {}", plan.policy_fingerprint);
    let _ = writeln!(out, "policy set            {}", esc(policy_source));
    out
}

/// An apply report in a few lines: at most `cap` of each list (all with
/// `None`), the residual blockers counted per class.
pub fn apply_summary(report: &crate::apply::Report, cap: Option<usize>) -> String {
    let mut out = String::new();
    let outcome = serde_json::to_value(report.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let _ = writeln!(out, "outcome: {outcome} ({} retired)", report.retired_count);
    let _ = writeln!(out, "{}", esc(&report.detail));
    listed(&mut out, &report.retired, cap, "retired", |out, r| {
        let _ = writeln!(
            out,
            "  retired {:<32} at {} by {}",
            cut(&r.worker_identity, 32),
            r.retired_at,
            esc(&r.retired_by)
        );
    });
    listed(&mut out, &report.preserved, cap, "kept", |out, k| {
        let _ = writeln!(
            out,
            "  kept    {:<32} {}: {}",
            cut(&k.worker_identity, 32),
            k.reason_code,
            esc(&k.detail)
        );
    });
    if let Some(p) = &report.post_apply {
        out.push_str(&after_summary(p, report.residual.as_ref(), cap));
    }
    match (report.left, report.next_command.as_deref()) {
        (Some(left), next) => {
            let _ = writeln!(out, "{}", left_line(left, next));
        }
        (None, Some(next)) => {
            let _ = writeln!(out, "next: {next}");
        }
        (None, None) => {}
    }
    out
}

/// The fleet after an apply (its `post_apply`): its counts, then what
/// still blocks it in the plan's words (a line per reason, with what
/// happens next), each blocker listed only with `--all`.
pub fn after_summary(
    p: &serde_json::Value,
    residual: Option<&crate::apply::residual::Residual>,
    cap: Option<usize>,
) -> String {
    let mut out = String::new();
    let out = &mut out;
    let count = |key: &str| crate::text::count(p[key].as_u64().unwrap_or(0) as usize);
    let _ = writeln!(
        out,
        "after: {} live, {} stale, {} historical; live fleet {} ({} residual blocker(s))",
        count("live_worker_count"),
        count("stale_worker_count"),
        count("historical_worker_count"),
        if p["live_fleet_safe"] == true {
            "SAFE"
        } else {
            "NOT SAFE"
        },
        count("residual_blocker_count")
    );
    let blockers = p["residual_blockers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    match residual {
        Some(r) => {
            for line in r.lines() {
                let _ = writeln!(out, "  {line}");
            }
            if cap.is_none() {
                listed(out, &blockers, None, "blockers", blocker_line);
            }
        }
        None => {
            if !blockers.is_empty() {
                let _ = writeln!(out, "  by class: {}", blocker_classes(&blockers));
            }
            listed(out, &blockers, cap, "blockers", blocker_line);
        }
    }
    std::mem::take(out)
}

/// What is left of a saved plan after an apply, and the command for the
/// next batch.
pub fn left_line(left: usize, next: Option<&str>) -> String {
    match (left, next) {
        (0, _) => "none of the plan's candidates left to retire".into(),
        (n, Some(next)) => format!(
            "{} of the plan's candidates left; next: {next}",
            crate::text::count(n)
        ),
        (n, None) => format!(
            "{} of the plan's candidates left, none of them retirable now (see `kept`): plan again",
            crate::text::count(n)
        ),
    }
}

/// How a snapshot's report speaks of its stale rows: in the plan's words
/// (grouped by the reason code the plan keeps each for, with what happens
/// next, as after an apply), or as the snapshot's own findings, with why
/// the plan's words are missing (empty: nothing to say).
pub enum PlanWords {
    /// A plan of the same read, grouped.
    Grouped(crate::apply::residual::Residual),
    /// No plan, and why.
    Not(String),
}

/// A snapshot: one line per instance, then the blockers (its stale rows
/// in the plan's words when `words` has them).
pub fn snapshot_summary(snap: &serde_json::Value, cap: Option<usize>, words: &PlanWords) -> String {
    let mut out = String::new();
    let _ =
        writeln!(
        out,
        "fleet at {}: {} live, {} stale, {} historical workers in {} instance(s); live fleet {}",
        esc(snap["snapshot_at"].as_str().unwrap_or("")),
        snap["live_worker_count"],
        snap["stale_worker_count"],
        snap["historical_worker_count"],
        snap["instance_count"],
        if snap["live_fleet_safe"] == true { "SAFE" } else { "NOT SAFE" }
    );
    let instances = snap["instances"].as_array().cloned().unwrap_or_default();
    listed(&mut out, &instances, cap, "instances", |out, inst| {
        let namespaces: Vec<&str> = inst["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str())
            .collect();
        let _ = writeln!(
            out,
            "  {:<48} {:<12} {} worker(s) [{}] {}",
            esc(inst["client_instance_id"].as_str().unwrap_or("")),
            esc(inst["client_type"].as_str().unwrap_or("mixed")),
            inst["worker_count"],
            esc(&namespaces.join(",")),
            if inst["trusted_instance_identity"] == true {
                "trusted"
            } else {
                "UNTRUSTED"
            }
        );
    });
    let blockers = snap["active_blockers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if blockers.is_empty() {
        let _ = writeln!(out, "no blockers");
    } else {
        let _ = writeln!(
            out,
            "blockers: {} ({})",
            blockers.len(),
            blocker_classes(&blockers)
        );
        match words {
            PlanWords::Grouped(residual) => {
                for line in residual.lines() {
                    let _ = writeln!(out, "  {line}");
                }
                if cap.is_none() {
                    listed(&mut out, &blockers, None, "blockers", blocker_line);
                }
            }
            PlanWords::Not(why) => {
                listed(&mut out, &blockers, cap, "blockers", blocker_line);
                if !why.is_empty() {
                    let _ = writeln!(out, "  ({})", esc(why));
                }
            }
        }
    }
    if let Some(c) = snap.get("comparison") {
        let _ = writeln!(
            out,
            "continuity with the earlier snapshot: {} ({} shared, {} dropped, {} new)",
            if c["stable_ownership"] == true {
                "stable"
            } else {
                "NOT stable"
            },
            c["shared_live_workers"].as_array().map_or(0, Vec::len),
            c["dropped_workers"].as_array().map_or(0, Vec::len),
            c["new_workers"].as_array().map_or(0, Vec::len)
        );
    }
    out
}
