//! The brake: a tick that would retire more than a fraction of the rows
//! active on this host (at the previous tick, or now on the first tick
//! after a start, since a restart is when a controller is blindest), and
//! at least ten, retires nothing. Those rows are retired only when a later
//! tick, at least one heartbeat TTL later, finds them still candidates:
//! every grace period restarts, as after a full disruption.

use crate::plan::Plan;
use crate::row::Col;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The fewest candidates the brake ever holds back.
const AT_LEAST: usize = 10;

/// A heartbeat TTL for a row that states none (the policies' default).
const DEFAULT_TTL: Duration = Duration::from_secs(900);

/// The brake's memory between ticks (lost on a restart, which engages it
/// afresh: failing closed).
#[derive(Default)]
pub struct Brake {
    prev_active: Option<usize>,
    held: Option<Held>,
    /// A tick could not see since the brake engaged: its grace period
    /// restarts at the next tick that sees.
    blinded: bool,
}

struct Held {
    rows: BTreeSet<String>,
    since: Instant,
    wait: Duration,
}

impl Brake {
    /// Of `candidates`, those this tick may retire.
    pub fn allow(&mut self, plan: &Plan, candidates: &[String], fraction: f64) -> Vec<String> {
        let active = active_here(plan);
        let base = self.prev_active.replace(active).unwrap_or(active);
        if let Some(held) = &mut self.held {
            if std::mem::take(&mut self.blinded) {
                // Visibility regained: the rows' workers could not be
                // seen either, so a full heartbeat TTL from now.
                held.since = Instant::now();
                return Vec::new();
            }
            if held.since.elapsed() < held.wait {
                return Vec::new();
            }
            let still: Vec<String> = candidates
                .iter()
                .filter(|c| held.rows.contains(*c))
                .cloned()
                .collect();
            tracing::info!(
                rows = still.len(),
                "brake released: a heartbeat TTL later these rows are still candidates"
            );
            self.held = None;
            return still;
        }
        if candidates.len() >= AT_LEAST && candidates.len() as f64 > fraction * base as f64 {
            let wait = longest_ttl(plan, candidates);
            tracing::warn!(
                candidates = candidates.len(),
                active = base,
                "brake engaged: retiring nothing now; the same rows are retired only if still candidates after {wait:?}"
            );
            self.held = Some(Held {
                rows: candidates.iter().cloned().collect(),
                since: Instant::now(),
                wait,
            });
            return Vec::new();
        }
        candidates.to_vec()
    }

    /// Whether it holds rows back now.
    /// A tick could not see (`/proc`, the registry, the lease store, the
    /// clock): a held brake's grace period restarts once it sees again.
    pub fn blinded(&mut self) {
        self.blinded = self.held.is_some();
    }

    pub fn engaged(&self) -> bool {
        self.held.is_some()
    }

    /// The rows held back and until when, while engaged.
    pub fn holding(&self) -> Option<(usize, Duration)> {
        self.held
            .as_ref()
            .map(|h| (h.rows.len(), h.wait.saturating_sub(h.since.elapsed())))
    }

    /// Why this tick retired nothing, for the log.
    pub fn why(&self) -> String {
        match self.holding() {
            Some((n, left)) => format!(
                "brake engaged: {n} candidate(s) held back; retired only if still candidates in {left:?}"
            ),
            None => "brake".into(),
        }
    }
}

/// Rows with status `active` registered on this host.
fn active_here(plan: &Plan) -> usize {
    let host = plan.facts.host.host_id.as_deref();
    plan.rows
        .iter()
        .filter(|r| {
            r.get(Col::Status).as_text() == Some("active") && r.get(Col::HostId).as_text() == host
        })
        .count()
}

/// The longest heartbeat TTL among `candidates`.
fn longest_ttl(plan: &Plan, candidates: &[String]) -> Duration {
    let wanted: BTreeSet<&String> = candidates.iter().collect();
    plan.rows
        .iter()
        .filter(|r| {
            r.get(Col::WorkerIdentity)
                .as_text()
                .is_some_and(|w| wanted.contains(&w.to_string()))
        })
        .filter_map(|r| match r.get(Col::HeartbeatTtlSeconds) {
            crate::value::Val::Real(s) if s.is_finite() && s > 0.0 => {
                Some(Duration::from_secs_f64(s.min(86_400.0)))
            }
            crate::value::Val::Int(s) if s > 0 => Some(Duration::from_secs(s.min(86_400) as u64)),
            _ => None,
        })
        .max()
        .unwrap_or(DEFAULT_TTL)
}
