//! Applying a host-scoped plan (`plan --scope host`): the same story as
//! any apply (docs/semantics.md §10), with one step said differently.
//! Under the lock, the authoritative read is this host's scope
//! (`ApplyTx::read_scope`: its active rows, their peers, the requested
//! workers' rows whatever their status) instead of the whole registry, and
//! the re-plan is `plan::scoped::plan_scope`, held to the plan's scoped
//! tokens. A write to a row outside the scope is never read, so it never
//! moves them. When the scope's indexes cannot be trusted under the lock
//! (one dropped or replaced since the plan), the scope is taken from a
//! read of every row instead: the same rows, by the definition in
//! `store::scope`, so the same judgement (`tests/scoped_differential.rs`
//! holds the two reads to equal outcomes). Everything after the targets
//! (the re-probe, the fence, the capability re-read, the guarded UPDATE,
//! the effect check, COMMIT) is the one path every apply takes.
//!
//! The tolerance for what changed since the plan is narrower than the
//! whole registry's (docs/semantics.md §17): heartbeats of this host's
//! rows live then and now; a peer may change in any way that leaves this
//! host's candidates and their rows exactly as planned (the candidate
//! token, recomputed from the peers read now, must match); anything else
//! refuses, plan again.
//!
//! A batch of a scoped plan after the first: the plan's candidates an
//! earlier batch retired are no longer this host's active rows, so the
//! scope moved. They are read anyway (by identity, as every requested
//! worker is) and judged beside the own rows, so the plan's rows recognise
//! them (`retired_since_plan`, as for the whole registry); the candidate
//! token must then be the plan's once they are put back as they were
//! planned (active, and counted out of the host's other rows). Anything
//! else that moved the scope still refuses.

use super::{refuse_if_all_retired, select_targets, Abort, Context, Outcome, Report, Request, Txn};
use crate::evidence::leases::Lease;
use crate::observe::RunFacts;
use crate::plan::Plan;
use crate::row::Col;
use crate::value::{Val, Value};

/// Before any store is opened: a scoped plan names this host (the kernel's
/// node name), and scoped tokens come only with a scoped plan.
pub(super) fn refuse_before_lock(req: &Request, ctx: &Context) -> Option<Report> {
    let scoped_tokens = [&req.registry_fingerprint, &req.candidate_fingerprint]
        .iter()
        .any(|t| t.starts_with(crate::fingerprint::HOST_SCOPE));
    let why = match &req.scope {
        None if scoped_tokens => {
            "these are a host-scoped plan's tokens (`host-scope:`), which vouch for one \
             host's scope: apply the saved plan file itself (`apply PLAN.json`), which names \
             the scope"
                .to_string()
        }
        Some(host) => {
            let facts = RunFacts::of_this_host(ctx.proc_root, None, &[]);
            match crate::plan::scoped::this_host(&facts) {
                Ok(mine) if mine == *host => return None,
                Ok(mine) => format!(
                    "the plan judged host {host:?}'s scope and this is host {mine:?}: a host \
                     applies only its own scope's plan"
                ),
                Err(e) => e.to_string(),
            }
        }
        None => return None,
    };
    Some(Report::new(req, Outcome::RegistryRevisionMoved, why))
}

/// Under the lock: read the scope, refuse a replay as any apply does, re-plan
/// the scope, hold it to the plan's tokens, pick the targets.
pub(super) fn judge_scope(
    t: &mut Txn,
    host: &str,
    active_leases: &[Lease],
    report: &mut Report,
) -> std::result::Result<(Plan, Vec<usize>), Abort> {
    let scope = read_scope(t, host, report)?;
    // Every requested worker already retired (a replay): their rows are
    // among the peers, read by identity.
    let read: Vec<crate::row::Row> = scope.own.iter().chain(&scope.peers).cloned().collect();
    refuse_if_all_retired(t.req, &read)?;
    drop(read);
    // The requested workers' positions among this host's active rows,
    // which are the re-plan's entries (none of them retired: no refusal).
    let mut scope = scope;
    if t.req.planned.is_some() {
        judge_retired_requests_as_own(&mut scope, &t.req.workers);
    }
    let by_identity = refuse_if_all_retired(t.req, &scope.own)?;
    let facts = RunFacts::of_this_host(
        t.ctx.proc_root,
        t.req.canonical_repository.clone(),
        active_leases,
    );
    let fresh = crate::plan::scoped::plan_scope(scope, facts, t.ctx.probe, t.ctx.policies)?;
    hold_to_tokens(t.req, &fresh, report)?;
    let targets = select_targets(t.req, &fresh, &by_identity, report)?
        .into_iter()
        .map(|e| e.index)
        .collect();
    Ok((fresh, targets))
}

/// The scope under the lock: through its indexes, or, when they cannot be
/// trusted here (dropped or replaced since the plan, which checked them),
/// taken from a read of every row (`store::scope::from_whole_read`): the
/// same rows by the scope's definition, read more slowly, never refused
/// for the indexes alone. The report says which (`read_under_lock`).
fn read_scope(
    t: &mut Txn,
    host: &str,
    report: &mut Report,
) -> std::result::Result<crate::store::scope::Scope, Abort> {
    let started = std::time::Instant::now();
    let (scope, read) = match t.tx.read_scope(host, &t.req.workers)? {
        Ok(scope) => {
            let rows = scope.own.len() + scope.peers.len();
            (scope, ("host_scope", rows, None))
        }
        Err(why) => {
            tracing::warn!(
                "host scope read from every row under the lock: {}",
                crate::text::esc(&why)
            );
            let rows = t.tx.read_rows()?;
            let read = rows.len();
            let why = format!(
                "the host scope's indexes cannot be trusted under the lock ({why}); this \
                 host's scope was taken from every row of the registry instead"
            );
            let scope = crate::store::scope::from_whole_read(rows, host, &t.req.workers);
            (scope, ("whole_registry", read, Some(why)))
        }
    };
    tracing::debug!(
        elapsed = ?started.elapsed(),
        how = read.0,
        own = scope.own.len(),
        peers = scope.peers.len(),
        "apply under the lock: host scope read"
    );
    report.read_under_lock = Some(super::ReadUnderLock {
        scope: read.0,
        rows: read.1,
        why: read.2,
    });
    Ok(scope)
}

/// This host's rows among the peers that are requested workers and
/// `retired` (an earlier batch of the plan, or another apply of it),
/// moved to the own rows so the re-plan has an entry for each: a terminal
/// row holds no evidence and claims no slot (`policy::scope_check`), so no
/// other row's peer facts move, and the tokens hash the same rows.
fn judge_retired_requests_as_own(scope: &mut crate::store::scope::Scope, workers: &[String]) {
    let wanted: std::collections::HashSet<&str> = workers.iter().map(String::as_str).collect();
    let (retired, peers): (Vec<_>, Vec<_>) = std::mem::take(&mut scope.peers)
        .into_iter()
        .partition(|row| {
            matches!(row.get(Col::HostId), Val::Text(h) if h == scope.host_id)
                && row.get(Col::Status).as_text() == Some("retired")
                && wanted.contains(row.get(Col::WorkerIdentity).canon_cow().as_ref())
        });
    scope.peers = peers;
    scope.own.extend(retired);
}

/// The scope's tokens: the registry token equal, or differing only by
/// heartbeats of this host's rows live then and now (given the plan's
/// rows), by the plan's candidates an earlier batch retired, or by peers;
/// the candidate token equal, once those are put back as planned.
fn hold_to_tokens(req: &Request, fresh: &Plan, report: &mut Report) -> Result<(), Abort> {
    let moved = |why: String| {
        Abort::Refuse(
            Outcome::RegistryRevisionMoved,
            format!(
                "this host's scope changed since the plan (now {}){why}; plan again",
                fresh.registry_fingerprint
            ),
        )
    };
    if fresh.registry_fingerprint != req.registry_fingerprint {
        let planned = req
            .planned
            .as_deref()
            .filter(|p| p.registry_fingerprint == req.registry_fingerprint)
            .ok_or_else(|| moved(String::new()))?;
        let tolerance = planned
            .tolerated(fresh)
            .map_err(|w| moved(format!(": {w}")))?;
        let planned_ids: std::collections::HashSet<&str> = planned
            .rows
            .iter()
            .map(|p| p.worker_identity.as_str())
            .collect();
        let (added, changed): (Vec<String>, Vec<String>) = tolerance
            .changed
            .into_iter()
            .partition(|w| !planned_ids.contains(w.as_str()));
        if let Some(first) = changed.first() {
            return Err(moved(format!(
                ": {} of this host's rows were changed or retired (the first: {})",
                changed.len(),
                crate::text::esc(first)
            )));
        }
        refuse_added_near_targets(req, fresh, &added)?;
        report.rows_changed_since_plan = added;
        report.heartbeats_tolerated = tolerance.heartbeats.len();
        report.heartbeats_tolerated_workers = tolerance.heartbeats;
        report.retired_since_plan = tolerance.retired_since_plan;
    }
    if candidate_token_as_planned(fresh, &report.retired_since_plan).as_deref()
        != Some(req.candidate_fingerprint.as_str())
    {
        return Err(Abort::Refuse(
            Outcome::CandidateSetMoved,
            format!(
                "the eligibility verdicts of this host's scope changed since the plan (now \
                 {}); plan again",
                fresh.candidate_fingerprint
            ),
        ));
    }
    Ok(())
}

/// The scope's candidate token as the plan saw it: today's candidates and
/// the plan's candidates retired since (`retired`), put back as they were
/// (`active`, and not among the host's other rows). `None` when the
/// re-plan has no scope.
fn candidate_token_as_planned(fresh: &Plan, retired: &[String]) -> Option<String> {
    let head = fresh.scope.as_ref()?;
    if retired.is_empty() {
        return Some(fresh.candidate_fingerprint.clone());
    }
    let retired: std::collections::HashSet<&str> = retired.iter().map(String::as_str).collect();
    let planned: Vec<crate::row::Row> = fresh
        .entries
        .iter()
        .filter_map(|e| {
            let row = &fresh.rows[e.index];
            if retired.contains(row.get(Col::WorkerIdentity).canon_cow().as_ref()) {
                let mut before = row.clone();
                before.set(Col::Status, Value::Text("active".into()));
                return Some(before);
            }
            e.is_candidate().then(|| row.clone())
        })
        .collect();
    let terminal = head.terminal_rows.checked_sub(retired.len() as u64)?;
    let (_, token) = crate::fingerprint::scoped_tokens(&planned, &head.host_id, terminal, |_| true);
    Some(token)
}

/// Rows of this host added since the plan (a worker registered since, such
/// as a `serve` started for the call that applies) are let pass when they
/// can move nothing a target's verdict reads: not candidates themselves,
/// and sharing no key a peer is found by (`store::scope::PeerKeys`:
/// identity, session, generation, process identity, pid, instance) with a
/// requested worker's row. Anything else refuses, plan again; the targets'
/// verdicts are judged afresh under the lock either way.
fn refuse_added_near_targets(req: &Request, fresh: &Plan, added: &[String]) -> Result<(), Abort> {
    if added.is_empty() {
        return Ok(());
    }
    let refuse = |why: String| {
        Abort::Refuse(
            Outcome::CandidateSetMoved,
            format!("a row of this host added since the plan {why}; plan again"),
        )
    };
    let identity = |row: &crate::row::Row| row.get(Col::WorkerIdentity).canon();
    let wanted: std::collections::HashSet<&str> = req.workers.iter().map(String::as_str).collect();
    let targets: Vec<crate::row::Row> = fresh
        .rows
        .iter()
        .filter(|r| wanted.contains(identity(r).as_str()))
        .cloned()
        .collect();
    let keys = crate::store::scope::PeerKeys::of(&targets);
    for e in &fresh.entries {
        let row = &fresh.rows[e.index];
        let who = identity(row);
        if !added.contains(&who) {
            continue;
        }
        if e.is_candidate() {
            return Err(refuse(format!(
                "is a candidate: {}",
                crate::text::esc(&who)
            )));
        }
        let mine = crate::store::scope::PeerKeys::of(std::slice::from_ref(row));
        let shares = mine
            .columns()
            .iter()
            .zip(keys.columns())
            .any(|(a, b)| a.2.iter().any(|k| b.2.contains(k)));
        if shares {
            return Err(refuse(format!(
                "shares a key with a requested worker's row: {}",
                crate::text::esc(&who)
            )));
        }
    }
    Ok(())
}
