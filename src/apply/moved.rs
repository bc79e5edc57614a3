//! Verdicts that moved between the plan and apply's re-plan, sorted into
//! those that concern the apply's targets (which refuse it) and those that
//! do not (which are reported and refuse nothing): docs/semantics.md §13,
//! "Churn beside the targets".
//!
//! The seed refuses an apply whenever its whole candidate set moved. In a
//! fleet whose dead rows hold a large share of the pid space, some process
//! starts during any apply and takes one of those pids; the seed's rule then
//! turns every large apply into a lottery. With the plan's rows at hand
//! (they carry each row's verdict), apply knows which rows moved, and holds
//! only these to the plan: a target itself, and a row that shares identity
//! evidence (session, generation, process, pid) or an active instance slot
//! with a target, since those are the peer facts a target's verdict reads.

use crate::plan::planned::{peer_text, PlannedRows, VerdictMoved};
use crate::plan::Plan;
use crate::row::{Col, Row};
use crate::value::Value;
use std::borrow::Cow;
use std::collections::HashSet;

/// The moved rows sorted by whether they concern the targets.
#[derive(Debug, Default)]
pub struct Sorted {
    /// Moved rows that are targets (or, for a plan saved without its
    /// candidates' peer facts, rows near one): these refuse the apply.
    pub concerning: Vec<VerdictMoved>,
    /// Targets whose peer facts differ from the plan's ("identity: then ->
    /// now"): these refuse the apply too.
    pub peers_moved: Vec<String>,
    /// Rows that are not candidates now but were (not targets, no peer of one).
    pub left: Vec<VerdictMoved>,
    /// Rows that are candidates now but were not: never retired by this apply.
    pub added: Vec<VerdictMoved>,
    /// Whether the plan recorded every target's peer facts (and they were
    /// compared); otherwise rows near a target stood in for them.
    pub peers_known: bool,
}

/// Sort `moved` (every row whose verdict differs from the plan's) for an
/// apply of `workers` (with `first`, only that many of them count),
/// passing over the rows an earlier batch of the plan retired.
pub fn sort(
    fresh: &Plan,
    planned: &PlannedRows,
    moved: Vec<VerdictMoved>,
    req: &super::Request,
    retired: &[String],
) -> Sorted {
    let retired: HashSet<&str> = retired.iter().map(String::as_str).collect();
    let moved: Vec<VerdictMoved> = moved
        .into_iter()
        .filter(|m| !retired.contains(m.worker_identity.as_str()))
        .collect();
    let targets = targets(fresh, &moved, &req.workers, req.first, &retired);
    let mut sorted = Sorted::default();
    // Without the plan's peer facts for every target, any moved row near
    // a target counts as moving what its verdict reads.
    let near = match peers_moved(fresh, planned, &targets, &retired) {
        Some(moved) => {
            sorted.peers_moved = moved;
            sorted.peers_known = true;
            None
        }
        None => Some(Near::of(fresh, &targets)),
    };
    for m in moved {
        let at = fresh.entries[m.entry].index;
        let own = targets.contains(&at);
        if own
            || near
                .as_ref()
                .is_some_and(|n| n.touches(&fresh.rows[at], at))
        {
            sorted.concerning.push(m);
        } else if fresh.entries[m.entry].is_candidate() {
            sorted.added.push(m);
        } else {
            sorted.left.push(m);
        }
    }
    sorted
}

/// The rows (registry positions) this apply would write had nothing moved:
/// the requested workers that are candidates now or were at the plan, not
/// retired since; with `first`, the first that many of them.
fn targets(
    fresh: &Plan,
    moved: &[VerdictMoved],
    workers: &[String],
    first: Option<usize>,
    retired: &HashSet<&str>,
) -> HashSet<usize> {
    let eligible = crate::reasons::Reason::Eligible.code();
    let mut was_candidate: HashSet<usize> = HashSet::new();
    let mut became: HashSet<usize> = HashSet::new();
    for m in moved {
        let at = fresh.entries[m.entry].index;
        if m.then == eligible {
            was_candidate.insert(at);
        } else {
            became.insert(at);
        }
    }
    // Only the requested identities are looked up: a large plan's later
    // batches run this over every row of the registry.
    let wanted: HashSet<&str> = workers.iter().map(String::as_str).collect();
    let mut by_identity: std::collections::HashMap<&str, Vec<usize>> = Default::default();
    for e in &fresh.entries {
        let named = fresh.rows[e.index].get(Col::WorkerIdentity).canon_cow();
        if let Some(&w) = wanted.get(named.as_ref()) {
            by_identity.entry(w).or_default().push(e.index);
        }
    }
    let mut out = HashSet::new();
    let mut counted = 0;
    for w in workers {
        if first.is_some_and(|n| counted >= n) {
            break;
        }
        if retired.contains(w.as_str()) {
            continue;
        }
        // As `select_targets` writes: an identity on one row only, a
        // candidate now that did not become one since, or (had it not
        // moved) one that was a candidate at the plan.
        let [at] = by_identity
            .get(w.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default()
        else {
            continue;
        };
        let at = *at;
        if was_candidate.contains(&at)
            || (fresh.entries[at].is_candidate() && !became.contains(&at))
        {
            counted += 1;
            out.insert(at);
        }
    }
    out
}

/// The targets (candidates now) whose peer facts differ from the plan's,
/// each as "identity: then -> now"; `None` when the plan did not record
/// them for every such target. A candidate an earlier batch of the plan
/// retired claimed its slot then (it was active) and does not now; it held
/// no evidence and occupied nothing either way (it was a candidate), so it
/// is counted back among its slot's claimants.
fn peers_moved(
    fresh: &Plan,
    planned: &PlannedRows,
    targets: &HashSet<usize>,
    retired: &HashSet<&str>,
) -> Option<Vec<String>> {
    let recorded: std::collections::HashMap<&str, &str> = planned
        .rows
        .iter()
        .filter_map(|r| Some((r.worker_identity.as_str(), r.peers.as_deref()?)))
        .collect();
    let mut retired_in: std::collections::HashMap<(Cow<str>, Cow<str>), usize> = Default::default();
    for e in &fresh.entries {
        let named = fresh.rows[e.index].get(Col::WorkerIdentity).canon_cow();
        if retired.contains(named.as_ref()) {
            if let Some(key) = slot_named(&fresh.rows[e.index]) {
                *retired_in.entry(key).or_default() += 1;
            }
        }
    }
    let mut moved = Vec::new();
    let mut ordered: Vec<usize> = targets.iter().copied().collect();
    ordered.sort_unstable();
    for at in ordered {
        let e = &fresh.entries[at];
        if !e.is_candidate() {
            continue;
        }
        let identity = fresh.identity(e);
        let then = recorded.get(identity.as_str())?;
        let mut peers = fresh.observation(e).peers.clone();
        if peers.slot_active_claimants > 0 {
            let back = slot(&fresh.rows[at]).and_then(|k| retired_in.get(&k).copied());
            peers.slot_active_claimants += back.unwrap_or(0);
        }
        let now = peer_text(&peers);
        if *then != now {
            moved.push(format!("{}: {then} -> {now}", crate::text::esc(&identity)));
        }
    }
    Some(moved)
}

/// What the targets' verdicts read of other rows: their identity evidence
/// values and their active instance slots.
struct Near<'a> {
    evidence: HashSet<(&'static str, Cow<'a, str>)>,
    slots: HashSet<(Cow<'a, str>, Cow<'a, str>)>,
    targets: &'a HashSet<usize>,
}

impl<'a> Near<'a> {
    fn of(fresh: &'a Plan, targets: &'a HashSet<usize>) -> Near<'a> {
        let mut near = Near {
            evidence: HashSet::new(),
            slots: HashSet::new(),
            targets,
        };
        for &at in targets {
            let row = &fresh.rows[at];
            let process = fresh.observations[at].process_identity;
            near.evidence
                .extend(crate::observe::conflict_keys(row, process));
            near.slots.extend(slot(row));
        }
        near
    }

    /// Whether the row at `at` shares identity evidence or an active slot
    /// with a target other than itself.
    fn touches(&self, row: &Row, at: usize) -> bool {
        if self.targets.contains(&at) {
            return true;
        }
        let process = crate::observe::ProcessIdentity::of(row);
        crate::observe::conflict_keys(row, process)
            .iter()
            .any(|k| self.evidence.contains(k))
            || slot(row).is_some_and(|s| self.slots.contains(&s))
    }
}

/// A row's instance slot (instance, namespace) while it is active and both
/// are set.
fn slot(row: &Row) -> Option<(Cow<'_, str>, Cow<'_, str>)> {
    slot_named(row).filter(|_| row.is_active())
}

/// A row's (instance, namespace), both set, whatever its status.
fn slot_named(row: &Row) -> Option<(Cow<'_, str>, Cow<'_, str>)> {
    let instance = row.get(Col::ClientInstanceId).canon_cow();
    let namespace = row.get(Col::Namespace).canon_cow();
    (!instance.is_empty() && !namespace.is_empty()).then_some((instance, namespace))
}

/// Whether the plan's verdicts, as its rows record them, make exactly the
/// plan's candidate token over the rows now: the candidates now that were
/// candidates then, the rows that stopped being candidates as they are, and
/// the rows retired since the plan as they were (`active`). A plan file
/// whose recorded verdicts do not make its own token vouches for nothing.
pub fn plan_token_holds(
    fresh: &Plan,
    moved: &[VerdictMoved],
    retired: &[String],
    token: &str,
) -> bool {
    let eligible = crate::reasons::Reason::Eligible.code();
    let retired: HashSet<&str> = retired.iter().map(String::as_str).collect();
    let then: std::collections::HashMap<usize, bool> = moved
        .iter()
        .map(|m| (fresh.entries[m.entry].index, m.then == eligible))
        .collect();
    let planned: Vec<Row> = fresh
        .entries
        .iter()
        .filter_map(|e| {
            let row = &fresh.rows[e.index];
            if retired.contains(row.get(Col::WorkerIdentity).canon_cow().as_ref()) {
                let mut before = row.clone();
                before.set(Col::Status, Value::Text("active".into()));
                return Some(before);
            }
            then.get(&e.index)
                .copied()
                .unwrap_or(e.is_candidate())
                .then(|| row.clone())
        })
        .collect();
    crate::fingerprint::candidate_fingerprint(&planned) == token
}
