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
    out
}
