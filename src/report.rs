//! Human rendering: short tables a person reads in a terminal.

use crate::plan::Plan;
use std::fmt::Write;

fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('~');
        t
    }
}

/// The plan as a table: one line per row, then the tokens.
pub fn plan_table(plan: &Plan) -> String {
    let mut out = String::new();
    let candidates = plan.candidates().count();
    let _ = writeln!(
        out,
        "{} rows assessed: {} may be retired, {} preserved",
        plan.entries.len(),
        candidates,
        plan.entries.len() - candidates
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "{:<32} {:<9} REASON", "WORKER", "VERDICT");
    for e in &plan.entries {
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
    let _ = writeln!(out);
    let _ = writeln!(out, "registry_fingerprint  {}", plan.registry_fingerprint);
    let _ = writeln!(out, "candidate_fingerprint {}", plan.candidate_fingerprint);
    let _ = writeln!(out, "policy_fingerprint    {}", plan.policy_fingerprint);
    out
}

/// An apply report in a few lines.
pub fn apply_summary(report: &crate::apply::Report) -> String {
    let mut out = String::new();
    let outcome = serde_json::to_value(report.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let _ = writeln!(out, "outcome: {outcome} ({} retired)", report.retired_count);
    let _ = writeln!(out, "{}", report.detail);
    for r in &report.retired {
        let _ = writeln!(
            out,
            "  retired {:<32} at {} by {}",
            cut(&r.worker_identity, 32),
            r.retired_at,
            r.retired_by
        );
    }
    for k in &report.preserved {
        let _ = writeln!(
            out,
            "  kept    {:<32} {}: {}",
            cut(&k.worker_identity, 32),
            k.reason_code,
            k.detail
        );
    }
    if let Some(p) = &report.post_apply {
        let _ = writeln!(
            out,
            "after: {} live, {} stale, {} historical; live fleet {} ({} residual blocker(s))",
            p["live_worker_count"],
            p["stale_worker_count"],
            p["historical_worker_count"],
            if p["live_fleet_safe"] == true {
                "SAFE"
            } else {
                "NOT SAFE"
            },
            p["residual_blocker_count"]
        );
        for b in p["residual_blockers"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  - {}: {}",
                b["classification"].as_str().unwrap_or(""),
                b["detail"].as_str().unwrap_or("")
            );
        }
    }
    out
}

/// A snapshot: one line per instance, then the blockers.
pub fn snapshot_summary(snap: &serde_json::Value) -> String {
    let mut out = String::new();
    let _ =
        writeln!(
        out,
        "fleet at {}: {} live, {} stale, {} historical workers in {} instance(s); live fleet {}",
        snap["snapshot_at"].as_str().unwrap_or(""),
        snap["live_worker_count"],
        snap["stale_worker_count"],
        snap["historical_worker_count"],
        snap["instance_count"],
        if snap["live_fleet_safe"] == true { "SAFE" } else { "NOT SAFE" }
    );
    for inst in snap["instances"].as_array().into_iter().flatten() {
        let namespaces: Vec<&str> = inst["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str())
            .collect();
        let _ = writeln!(
            out,
            "  {:<48} {:<12} {} worker(s) [{}] {}",
            inst["client_instance_id"].as_str().unwrap_or(""),
            inst["client_type"].as_str().unwrap_or("mixed"),
            inst["worker_count"],
            namespaces.join(","),
            if inst["trusted_instance_identity"] == true {
                "trusted"
            } else {
                "UNTRUSTED"
            }
        );
    }
    let blockers = snap["active_blockers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if blockers.is_empty() {
        let _ = writeln!(out, "no blockers");
    } else {
        let _ = writeln!(out, "blockers:");
        for b in blockers {
            let _ = writeln!(
                out,
                "  - {}: {}",
                b["classification"].as_str().unwrap_or(""),
                b["detail"].as_str().unwrap_or("")
            );
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
