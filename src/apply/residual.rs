//! What still stands in the way after an apply, in the plan's words.
//!
//! The snapshot after an apply calls every active row that is not live a
//! `stale_orphaned_worker` and sends the reader back to `plan`. After a
//! successful apply that is advice in a circle: the plan has nothing left
//! to retire, and the rows are there for reasons the plan already knows
//! (issue 52 §1). Apply holds those reasons (its re-plan judged every row),
//! so the stale rows are grouped here by the reason code the re-plan keeps
//! each one for, with what happens next ([`Reason::next_step`]): the
//! snapshot and the plan speak one vocabulary. The other blockers (about
//! live workers, or the manifest) are counted per class.

use crate::plan::Plan;
use crate::reasons::Reason;
use crate::snapshot::Snapshot;
use serde::Serialize;
use std::collections::BTreeMap;

/// How many workers each group names (the JSON's `post_apply` lists them
/// all; `fleet-retire plan` and `snapshot` list them too).
const NAMED: usize = 5;

/// The blockers left after an apply, grouped.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Residual {
    /// The stale rows by the re-plan's primary reason code, most first.
    pub stale_by_reason: Vec<ReasonGroup>,
    /// The other blockers by class, most first.
    pub other_blockers: Vec<ClassGroup>,
}

/// Stale rows kept for one reason.
#[derive(Debug, Clone, Serialize)]
pub struct ReasonGroup {
    /// The plan's reason code (the row's first failing requirement).
    pub reason_code: &'static str,
    /// How many rows.
    pub count: usize,
    /// What happens next to them, a phrase after the count.
    pub next: &'static str,
    /// For `heartbeat_not_expired`: when the first of their heartbeats
    /// expires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_eligible_at: Option<String>,
    /// How many of them the plan also keeps for other reasons.
    pub held_by_more: usize,
    /// The first few of them.
    pub workers: Vec<String>,
}

/// Blockers of one class that are not stale rows.
#[derive(Debug, Clone, Serialize)]
pub struct ClassGroup {
    /// The snapshot's finding class.
    pub classification: &'static str,
    /// How many findings.
    pub count: usize,
    /// What the class means.
    pub what: &'static str,
    /// The first few workers they name.
    pub workers: Vec<String>,
}

/// Group what `snap` (taken of `plan`'s rows) still blocks on.
pub fn of(plan: &Plan, snap: &Snapshot) -> Residual {
    let mut by_reason: BTreeMap<Reason, ReasonGroup> = BTreeMap::new();
    for at in snap.stale_rows() {
        let Some(entry) = plan.entries.get(at) else {
            continue;
        };
        let reason = entry.reason();
        let group = by_reason.entry(reason).or_insert_with(|| ReasonGroup {
            reason_code: reason.code(),
            count: 0,
            next: reason.next_step(),
            first_eligible_at: None,
            held_by_more: 0,
            workers: Vec::new(),
        });
        group.count += 1;
        if entry.reason_codes().len() > 1 {
            group.held_by_more += 1;
        }
        if group.workers.len() < NAMED {
            group.workers.push(plan.identity(entry));
        }
        if reason == Reason::HeartbeatFresh {
            if let Some(at) = expires_at(plan, entry) {
                group.first_eligible_at = Some(match group.first_eligible_at.take() {
                    Some(was) if was <= at => was,
                    _ => at,
                });
            }
        }
    }
    let mut by_class: BTreeMap<&'static str, ClassGroup> = BTreeMap::new();
    for finding in snap.fleet_blockers() {
        let class = finding.classification;
        let group = by_class.entry(class.code()).or_insert_with(|| ClassGroup {
            classification: class.code(),
            count: 0,
            what: class.description(),
            workers: Vec::new(),
        });
        group.count += 1;
        for w in &finding.worker_identities {
            if group.workers.len() < NAMED {
                group
                    .workers
                    .push(w.as_str().map_or(w.to_string(), str::to_string));
            }
        }
    }
    let mut stale_by_reason: Vec<ReasonGroup> = by_reason.into_values().collect();
    stale_by_reason.sort_by_key(|g| std::cmp::Reverse(g.count));
    let mut other_blockers: Vec<ClassGroup> = by_class.into_values().collect();
    other_blockers.sort_by_key(|g| std::cmp::Reverse(g.count));
    Residual {
        stale_by_reason,
        other_blockers,
    }
}

/// When the row's heartbeat expires (the first whole second at which its
/// age exceeds its TTL), as a stamp; `None` when its heartbeat is
/// unparsable.
fn expires_at(plan: &Plan, entry: &crate::plan::Entry) -> Option<String> {
    let liveness = &plan.observation(entry).liveness;
    let age = liveness.heartbeat_age_us?;
    let heartbeat = liveness.assessed_at - age;
    let ttl_us = (liveness.heartbeat_ttl_seconds * 1e6).min(1e15) as i64;
    let expires = heartbeat.saturating_add(ttl_us).saturating_add(1);
    // Up to the next whole second: stamps are written to the second.
    let second = expires.div_euclid(1_000_000) + i64::from(expires.rem_euclid(1_000_000) > 0);
    Some(crate::time::format_ts(second * 1_000_000))
}

impl Residual {
    /// The groups as lines for a person, most first: `7,597
    /// heartbeat_not_expired: become eligible as their TTLs lapse, the
    /// first at …`.
    pub fn lines(&self) -> Vec<String> {
        let n = crate::text::count;
        let mut lines: Vec<String> = self
            .stale_by_reason
            .iter()
            .map(|g| {
                let mut line = format!("{} {}: {}", n(g.count), g.reason_code, g.next);
                if let Some(at) = &g.first_eligible_at {
                    line.push_str(&format!(", the first at {at}; plan again then"));
                }
                if g.held_by_more > 0 {
                    line.push_str(&format!(
                        " ({} of them also kept for other reasons: `fleet-retire plan --all` lists \
                         them)",
                        n(g.held_by_more)
                    ));
                }
                line
            })
            .collect();
        lines.extend(self.other_blockers.iter().map(|g| {
            format!(
                "{} {}: {} (e.g. {})",
                n(g.count),
                g.classification,
                g.what,
                g.workers
                    .iter()
                    .map(|w| crate::text::esc(w).into_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }));
        lines
    }
}
