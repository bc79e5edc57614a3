//! Apply: retire exactly what a plan approved, inside one transaction of the
//! registry's engine (SQLite's `BEGIN IMMEDIATE`, PostgreSQL's
//! `SERIALIZABLE`; `store::seam::ApplyTx`), or nothing at all. This is the
//! story, written once; each engine says its steps in its own folder.
//!
//! The order of refusals is docs/semantics.md §10, step for step. Inside the lock the
//! plan is re-derived from what is read there with the same `plan` function,
//! and each write sits behind its own liveness re-probe, external-state fence
//! and guarded `UPDATE`. Any error rolls the whole transaction back. Rows are
//! never deleted: a retired row keeps its history and gains an audit row.

use crate::error::{Error, Result};
use crate::evidence::leases;
use crate::evidence::probe::ProcessProbe;
use crate::observe::RunFacts;
use crate::plan::{plan, Rejudge};
use crate::policy::Policies;
use crate::reasons::Reason;
use crate::row::{Col, Row};
use crate::store::seam::{ApplyConnection, ApplyTx, FenceSource, Written};
use standing::Standing;

mod prejudge;
mod report;
mod standing;
mod workers;

use crate::value::Value;
use prejudge::Prejudged;
pub use prejudge::ReadUnderLock;
pub use report::{Kept, Outcome, Report, Retired};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
pub use workers::{parse_workers, Workers};

/// What an operator asks apply to retire: the tokens and identities of a plan.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The plan's registry token.
    pub registry_fingerprint: String,
    /// The plan's candidate token.
    pub candidate_fingerprint: String,
    /// The plan's policy fingerprint.
    pub policy_fingerprint: String,
    /// The workers to retire (all or some of the plan's candidates).
    pub workers: Vec<String>,
    /// Retire only the first N of `workers` that are candidates now,
    /// passing over those an earlier batch of the plan retired (`apply
    /// PLAN.json --first N`).
    pub first: Option<usize>,
    /// The canonical repository the plan used.
    pub canonical_repository: Option<String>,
    /// Refuse (retiring nothing) above this many targets.
    pub max_retire: usize,
    /// The plan's rows, when apply has them (a saved plan file, or a plan
    /// `serve` issued): heartbeat-only changes on rows live then and now are
    /// tolerated (docs/apply.md). Without them the registry token must match
    /// exactly.
    pub planned: Option<std::sync::Arc<crate::plan::planned::PlannedRows>>,
}

/// The three tokens of a plan, as an apply presents them.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// The plan's registry token.
    pub registry_fingerprint: String,
    /// The plan's candidate token.
    pub candidate_fingerprint: String,
    /// The plan's policy fingerprint.
    pub policy_fingerprint: String,
}

impl Request {
    /// A request to retire `workers` under a plan's `tokens`. The canonical
    /// repository, the plan's rows and the blast-radius limit are set by the
    /// caller that knows them (a saved plan, an operator, `serve`'s launch).
    pub fn new(tokens: Tokens, workers: Vec<String>) -> Request {
        Request {
            registry_fingerprint: tokens.registry_fingerprint,
            candidate_fingerprint: tokens.candidate_fingerprint,
            policy_fingerprint: tokens.policy_fingerprint,
            workers,
            ..Request::default()
        }
    }

    /// Give apply the plan's rows. Rows of another plan (another registry
    /// token) are refused: they would excuse changes this plan never saw.
    pub fn with_planned(
        mut self,
        rows: Option<std::sync::Arc<crate::plan::planned::PlannedRows>>,
    ) -> std::result::Result<Request, String> {
        if let Some(r) = &rows {
            if r.registry_fingerprint != self.registry_fingerprint {
                return Err(
                    "`planned_rows` belong to another plan (their registry_fingerprint \
                            differs)"
                        .into(),
                );
            }
        }
        self.planned = rows;
        Ok(self)
    }
}

/// Where apply reads and writes.
pub struct Context<'a> {
    /// The worker registry.
    pub registry: &'a Path,
    /// The lease store.
    pub leases: &'a Path,
    /// `profiles.json`, read at entry and again before the first write.
    pub profiles: &'a Path,
    /// The operator's profile.
    pub profile: &'a str,
    /// The `/proc` root for host facts.
    pub proc_root: &'a Path,
    /// The loaded policies.
    pub policies: &'a Policies,
    /// The process probe (the live system in production).
    pub probe: &'a dyn ProcessProbe,
    /// How long to wait for a locked registry.
    pub busy_timeout: Duration,
}

/// Test seams: code that runs at fixed points inside the transaction.
#[derive(Default)]
pub struct Hooks<'a> {
    /// After the judgement outside the lock, before `BEGIN`.
    pub after_prejudge: Option<&'a mut dyn FnMut()>,
    /// Runs after revalidation, before the first write.
    pub before_first_write: Option<&'a mut dyn FnMut()>,
    /// Runs at the start of each target (its index), before anything is
    /// re-read for it.
    pub between_targets: Option<&'a mut dyn FnMut(usize)>,
    /// Runs after a target's capability re-read, before its lease fence.
    pub after_capability: Option<&'a mut dyn FnMut(usize)>,
    /// Runs after the last write, before the final checks and COMMIT.
    pub before_commit: Option<&'a mut dyn FnMut()>,
    /// Fail instead of committing (the failure path must leave nothing).
    pub fail_commit: bool,
    /// Not only a test seam: whether the caller has given up on the apply
    /// (`serve` passes its client's cancellation). Asked before the lock
    /// is taken, before the first write and before COMMIT; a cancelled
    /// apply retires nothing (`transaction_failed`, saying so).
    pub cancelled: Option<&'a dyn Fn() -> bool>,
}

/// Why a transaction must be rolled back, as opposed to a refusal.
enum Abort {
    Refuse(Outcome, String),
    Fail(String),
}

impl From<Error> for Abort {
    fn from(e: Error) -> Abort {
        match &e {
            // PostgreSQL aborted this transaction because a concurrent one
            // (another apply, a lease taken) made the two unserializable:
            // what this apply read is no longer the registry.
            Error::Postgres { source, .. }
                if crate::store::postgres::is_serialization_failure(source) =>
            {
                Abort::Refuse(
                    Outcome::RegistryRevisionMoved,
                    format!(
                        "a concurrent transaction changed what this apply read ({e}); \
                         nothing was retired; plan again"
                    ),
                )
            }
            _ => Abort::Fail(e.to_string()),
        }
    }
}

/// The fleet as a snapshot sees it after the transaction: counts and
/// blockers only. `rows` are the registry as committed: the transaction's
/// own read (it held the write lock from before that read to COMMIT, and
/// nothing but its own guarded writes changed them) with those writes
/// applied, so the summary needs no second read of the whole registry.
fn post_apply(req: &Request, ctx: &Context, rows: &[Row]) -> serde_json::Value {
    let snap = crate::snapshot::Snapshot::take(
        rows,
        &crate::snapshot::Options {
            now: crate::time::now(),
            canonical_repository: req.canonical_repository.clone(),
            host_id: crate::evidence::probe::HostFacts::observe(ctx.proc_root).host_id,
            ..Default::default()
        },
        ctx.probe,
    );
    fleet_summary(&snap)
}

/// A snapshot's counts and blockers, as the report's `post_apply` gives them.
pub fn fleet_summary(snap: &crate::snapshot::Snapshot) -> serde_json::Value {
    let blockers: Vec<serde_json::Value> = snap
        .active_blockers()
        .map(|b| serde_json::json!({"classification": b.classification, "detail": b.detail}))
        .collect();
    serde_json::json!({
        "snapshot_at": snap.snapshot_at(),
        "live_worker_count": snap.live_worker_count(),
        "stale_worker_count": snap.stale_worker_count(),
        "historical_worker_count": snap.historical_worker_count(),
        "instance_count": snap.instance_count(),
        "live_fleet_safe": snap.live_fleet_safe(),
        "residual_blocker_count": blockers.len(),
        "residual_blockers": blockers,
    })
}

/// Run an apply. Refusals and rollbacks are reports, not errors; an error
/// is returned only for failures before any lock is taken that are not
/// outcomes of their own (an unreadable profiles.json).
pub fn apply(req: &Request, ctx: &Context, hooks: Hooks) -> Result<Report> {
    // A worker named twice is one request.
    let mut req = req.clone();
    let mut seen = std::collections::HashSet::new();
    req.workers.retain(|w| seen.insert(w.clone()));
    let req = &req;
    let (mut report, committed) = apply_inner(req, ctx, hooks)?;
    // Only a committed retirement changes the fleet: a refusal or a
    // rollback does not pay for a fleet summary.
    if let Some(rows) = committed.filter(|_| report.mutation_performed) {
        report.post_apply = Some(post_apply(req, ctx, &rows));
    }
    Ok(report)
}

/// The report, and after a COMMIT the registry's rows as committed.
fn apply_inner(req: &Request, ctx: &Context, hooks: Hooks) -> Result<(Report, Option<Vec<Row>>)> {
    // 1. The policy set must be the built-in one or pinned, and the
    //    capability must allow apply: decided from profiles.json read once
    //    here, before any lock.
    let mut standing = match Standing::at_entry(ctx)? {
        Ok(s) => s,
        Err((outcome, why)) => return Ok((Report::new(req, outcome, why), None)),
    };
    // 2 and 3. The plan's policies are the loaded ones; something is asked.
    if let Some(refused) = refuse_before_lock(req, ctx) {
        return Ok((refused, None));
    }
    // 4. Open the registry and the lease store.
    let (mut conn, mut lease_source) = match open_stores(ctx) {
        Ok(stores) => stores,
        Err((outcome, why)) => return Ok((Report::new(req, outcome, why), None)),
    };
    // 5. Judged outside the lock when the registry keeps row versions.
    let prejudged = prejudge::prejudge(req, ctx, &mut *lease_source);
    let mut hooks = hooks;
    if let Some(hook) = hooks.after_prejudge.as_mut() {
        hook();
    }
    if hooks.cancelled.is_some_and(|c| c()) {
        let mut report = Report::new(req, Outcome::TransactionFailed, CANCELLED_BEFORE_LOCK);
        report.success = false;
        return Ok((report, None));
    }
    // 6. The transaction.
    let mut report = Report::new(req, Outcome::Applied, "");
    let mut tx = match conn.begin() {
        Ok(tx) => tx,
        Err(why) => {
            report.outcome = Outcome::TransactionFailed;
            report.success = false;
            report.detail = why;
            return Ok((report, None));
        }
    };
    let locked_at = std::time::Instant::now();
    let fail_commit = hooks.fail_commit;
    let mut committed = None;
    let result = inside(
        &mut Txn {
            req,
            ctx,
            tx: &mut *tx,
            leases: &mut *lease_source,
        },
        prejudged,
        hooks,
        &mut standing,
        &mut report,
    )
    .and_then(|rows| {
        if fail_commit {
            Err(Abort::Fail("injected failure at commit".into()))
        } else {
            committed = Some(rows);
            Ok(())
        }
    });
    let report = conclude(req, tx, result, report, locked_at);
    let committed = committed.filter(|_| report.outcome == Outcome::Applied);
    Ok((report, committed))
}

/// The refusals that need no store: the plan's policy set must be the one
/// loaded, and something must be asked for.
fn refuse_before_lock(req: &Request, ctx: &Context) -> Option<Report> {
    if req.policy_fingerprint != ctx.policies.fingerprint {
        return Some(Report::new(
            req,
            Outcome::PolicySetMoved,
            format!(
                "the plan was made under policy set {} but {} is loaded; plan again",
                req.policy_fingerprint, ctx.policies.fingerprint
            ),
        ));
    }
    if req.workers.is_empty() {
        return Some(Report::new(
            req,
            Outcome::NothingRequested,
            "no worker was requested",
        ));
    }
    None
}

/// The registry opened for writing and the lease store for reading; a
/// store that cannot be opened is a refusal naming it.
#[allow(clippy::type_complexity)]
fn open_stores(
    ctx: &Context,
) -> std::result::Result<(Box<dyn ApplyConnection>, Box<dyn FenceSource>), (Outcome, String)> {
    let conn = crate::store::open::engine(ctx.registry)
        .and_then(|e| e.apply_connection(ctx.busy_timeout))
        .map_err(|e| (Outcome::RegistryUnavailable, e.to_string()))?;
    let lease_source = leases::open_fence(ctx.leases)
        .map_err(|e| (Outcome::LeaseStoreUnavailable, e.to_string()))?;
    Ok((conn, lease_source))
}

/// COMMIT what `inside` did, or roll it back, and say which in the report.
fn conclude(
    req: &Request,
    tx: Box<dyn ApplyTx + '_>,
    result: std::result::Result<(), Abort>,
    mut report: Report,
    locked_at: std::time::Instant,
) -> Report {
    let lock_ms = || locked_at.elapsed().as_millis() as u64;
    match result {
        Ok(()) => {
            if let Err(e) = tx.commit() {
                let (outcome, detail) = match Abort::from(e) {
                    Abort::Refuse(o, d) => (o, d),
                    Abort::Fail(d) => (
                        Outcome::TransactionFailed,
                        format!("nothing was retired: {d}"),
                    ),
                };
                let mut failed = Report::new(req, outcome, detail);
                failed.success = outcome != Outcome::TransactionFailed;
                failed.external_state_fingerprint = report.external_state_fingerprint.take();
                failed.lock_held_ms = lock_ms();
                return failed;
            }
            report.lock_held_ms = lock_ms();
            report.retired_count = report.retired.len();
            report.mutation_performed = report.retired_count > 0;
            if report.detail.is_empty() {
                report.detail = match req.first {
                    Some(n) => format!(
                        "retired {} (--first {n} of the plan's {} candidates; {} retired by \
                         earlier batches)",
                        report.retired_count,
                        req.workers.len(),
                        report.retired_since_plan.len()
                    ),
                    None => format!(
                        "retired {} of {} requested worker(s)",
                        report.retired_count,
                        req.workers.len()
                    ),
                };
            }
            let added = report.candidates_added_since_plan.len();
            if added > 0 {
                report.detail.push_str(&format!(
                    "; {added} row(s) became candidates since the plan as their heartbeat \
                     expired (not retired: plan again)"
                ));
            }
            report
        }
        Err(abort) => {
            // Dropping the transaction rolls it back; do it explicitly so a
            // failing rollback is reported too.
            let rolled_back = tx
                .rollback()
                .map(|e| format!(" (rollback also failed: {e})"))
                .unwrap_or_default();
            let (outcome, detail) = match abort {
                Abort::Refuse(o, d) => (o, d),
                Abort::Fail(d) => (Outcome::TransactionFailed, d),
            };
            let mut fresh = Report::new(req, outcome, format!("{detail}{rolled_back}"));
            fresh.external_state_fingerprint = report.external_state_fingerprint.take();
            fresh.lock_held_ms = lock_ms();
            fresh.heartbeats_tolerated = report.heartbeats_tolerated;
            fresh.heartbeats_tolerated_workers =
                std::mem::take(&mut report.heartbeats_tolerated_workers);
            fresh.verdicts_moved = std::mem::take(&mut report.verdicts_moved);
            fresh.candidates_added_since_plan =
                std::mem::take(&mut report.candidates_added_since_plan);
            fresh.retired_since_plan = std::mem::take(&mut report.retired_since_plan);
            fresh.read_under_lock = report.read_under_lock.take();
            if outcome == Outcome::TransactionFailed {
                fresh.success = false;
            }
            fresh
        }
    }
}

fn fence_moved(was: &leases::Fence, now: &leases::Fence) -> Abort {
    Abort::Fail(format!(
        "the active leases changed inside the transaction ({} {} -> {} {}); every decision \
         was made against a world that no longer exists, so nothing was retired",
        was.token, was.digest, now.token, now.digest
    ))
}

/// Everything an audit row records besides the retirement itself.
struct AuditContext {
    apply_id: String,
    os_uid: i64,
    host_id: Option<String>,
    policy_source: String,
    lease_store: String,
    /// The one time stamp every retirement of this apply carries.
    retired_at: String,
}

/// The transaction's parts, shared by its steps.
struct Txn<'a, 'c> {
    req: &'a Request,
    ctx: &'a Context<'a>,
    tx: &'a mut (dyn ApplyTx + 'c),
    leases: &'a mut dyn FenceSource,
}

/// Everything apply does under the lock, in the order of docs/semantics.md
/// §10: check the file, fence and read, re-plan, pick the targets, write
/// each behind its own checks, and verify before COMMIT. Returns the rows
/// as they stand once this transaction commits.
fn inside(
    t: &mut Txn,
    prejudged: std::result::Result<Prejudged, String>,
    mut hooks: Hooks,
    standing: &mut Standing,
    report: &mut Report,
) -> std::result::Result<Vec<Row>, Abort> {
    let started = std::time::Instant::now();
    let step =
        |what: &str| tracing::debug!(elapsed = ?started.elapsed(), "apply under the lock: {what}");
    prepare_registry(t)?;
    // The external fence, before the authoritative read; the same read of
    // the active leases feeds the re-plan.
    let (fence, active_leases) =
        t.tx.read_leases_here(t.ctx.leases)
            .map(|read| read.map(|(version, active)| (leases::Fence::of(&active, version), active)))
            .unwrap_or_else(|| leases::Fence::read(&mut *t.leases))
            .map_err(|e| match Abort::from(e) {
                Abort::Fail(why) => Abort::Refuse(Outcome::LeaseStoreUnavailable, why),
                refused => refused,
            })?;
    report.external_state_fingerprint = Some(fence.token.clone());
    let (fresh, targets) = judge_under_lock(t, prejudged, &fence, &active_leases, report)?;
    step("judged");
    let targets: Vec<&crate::plan::Entry> = targets.iter().map(|&i| &fresh.entries[i]).collect();
    if let Some(hook) = hooks.before_first_write.as_mut() {
        hook();
    }
    refuse_if_cancelled(&hooks)?;
    let audit = AuditContext {
        apply_id: crate::evidence::random_hex(16)?,
        os_uid: i64::from(nix::unistd::getuid().as_raw()),
        host_id: fresh.facts.host.host_id.clone(),
        policy_source: t.ctx.policies.source_label(),
        lease_store: t.leases.label(),
        retired_at: crate::time::format_ts(crate::time::now()),
    };
    let mut w = Writes {
        fence,
        fence_checked: false,
        rejudge: Rejudge::new(&fresh, t.ctx.policies),
        fresh: &fresh,
        audit: &audit,
        written: Vec::new(),
    };
    let checks = Checks {
        ctx: t.ctx,
        leases: &mut *t.leases,
        hooks: &mut hooks,
        standing: &mut *standing,
    };
    let pending = checks.beside_the_image(&mut *t.tx, &mut w, &targets, &audit.apply_id, report)?;
    step("image taken and targets checked");
    w.write_all(t, &pending, report)?;
    step("written");
    if let Some(hook) = hooks.before_commit.as_mut() {
        hook();
    }
    refuse_if_cancelled(&hooks)?;
    verify_before_commit(t, &w.fence, &audit, report)?;
    step("verified");
    let written = std::mem::take(&mut w.written);
    drop(w);
    let mut rows = fresh.rows;
    for index in written {
        let row = &mut rows[index];
        // What the guarded UPDATE set (`store::registry::retire_guarded`).
        row.set(Col::Status, Value::Text("retired".into()));
        row.set(
            Col::RetiredAt,
            Value::Text(audit.retired_at.as_str().into()),
        );
        row.set(Col::RetiredBy, Value::Text(t.ctx.profile.into()));
        row.set(
            Col::RetirementReason,
            Value::Text(Reason::Eligible.code().into()),
        );
    }
    Ok(rows)
}

const CANCELLED_BEFORE_LOCK: &str =
    "the caller cancelled the apply before it took the registry's lock; nothing was retired";

/// Inside the transaction: a cancelled apply rolls everything back.
fn refuse_if_cancelled(hooks: &Hooks) -> std::result::Result<(), Abort> {
    if hooks.cancelled.is_some_and(|c| c()) {
        return Err(Abort::Fail(
            "the caller cancelled the apply; everything was rolled back and nothing was retired"
                .into(),
        ));
    }
    Ok(())
}

/// The plan and its targets (indices of its entries) under the lock: the
/// one judged outside it, confirmed by the rows changed since, when that
/// holds; otherwise the whole registry read and judged again here.
fn judge_under_lock(
    t: &mut Txn,
    prejudged: std::result::Result<Prejudged, String>,
    fence: &leases::Fence,
    active_leases: &[leases::Lease],
    report: &mut Report,
) -> std::result::Result<(crate::plan::Plan, Vec<usize>), Abort> {
    let why = match prejudged {
        Err(why) => why,
        Ok(pre) => match pre.confirm(t, fence)? {
            Err(why) => why,
            Ok((fresh, targets, confirmed, rows)) => {
                let fence_token = report.external_state_fingerprint.take();
                *report = confirmed;
                report.external_state_fingerprint = fence_token;
                report.read_under_lock = Some(ReadUnderLock {
                    scope: "changed_rows",
                    rows,
                    why: None,
                });
                return Ok((fresh, targets));
            }
        },
    };
    let started = std::time::Instant::now();
    let rows = t.tx.read_rows()?;
    tracing::debug!(elapsed = ?started.elapsed(), rows = rows.len(), "apply under the lock: whole registry read");
    report.read_under_lock = Some(ReadUnderLock {
        scope: "whole_registry",
        rows: rows.len(),
        why: Some(why),
    });
    prejudge::judge(t.req, t.ctx, rows, active_leases, report)
}

/// Nothing in the file may turn our writes into other writes; migrations
/// run inside the transaction, so a refusal undoes them too.
fn prepare_registry(t: &mut Txn) -> std::result::Result<(), Abort> {
    if let Some(why) = t.tx.untrusted_objects()? {
        return Err(Abort::Refuse(Outcome::RegistryUntrusted, why));
    }
    if let Err(e) = t.tx.migrate_registry() {
        return Err(match Abort::from(e) {
            Abort::Fail(why) => Abort::Refuse(Outcome::RegistryUnavailable, why),
            refused => refused,
        });
    }
    t.tx.migrate_audit()?;
    Ok(())
}

/// Rows by canonical identity, built once (requests can name thousands);
/// refused when every requested worker is retired already.
fn refuse_if_all_retired(
    req: &Request,
    rows: &[crate::row::Row],
) -> std::result::Result<HashMap<String, Vec<usize>>, Abort> {
    let mut by_identity: HashMap<String, Vec<usize>> = HashMap::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        by_identity
            .entry(r.get(Col::WorkerIdentity).canon())
            .or_default()
            .push(i);
    }
    let all_retired = req.workers.iter().all(|w| {
        by_identity.get(w).is_some_and(|mine| {
            mine.iter()
                .all(|&i| rows[i].get(Col::Status).as_text() == Some("retired"))
        })
    });
    if all_retired {
        return Err(Abort::Refuse(
            Outcome::AlreadyRetired,
            "every requested worker is already retired; nothing to do".into(),
        ));
    }
    Ok(by_identity)
}

/// Re-plan from what is read under the lock, and hold it to the plan's
/// tokens: the registry's (heartbeats of live workers tolerated when the
/// plan's rows are at hand) and the candidates'.
fn replan(
    req: &Request,
    ctx: &Context,
    rows: Vec<crate::row::Row>,
    active_leases: &[leases::Lease],
    report: &mut Report,
) -> std::result::Result<crate::plan::Plan, Abort> {
    let facts = RunFacts::of_this_host(
        ctx.proc_root,
        req.canonical_repository.clone(),
        active_leases,
    );
    let fresh = plan(rows, facts, ctx.probe, ctx.policies)?;
    if fresh.registry_fingerprint != req.registry_fingerprint {
        let moved = |why: String| {
            Abort::Refuse(
                Outcome::RegistryRevisionMoved,
                format!(
                    "the registry changed since the plan (now {}){why}; plan again",
                    fresh.registry_fingerprint
                ),
            )
        };
        match req
            .planned
            .as_deref()
            .filter(|p| p.registry_fingerprint == req.registry_fingerprint)
        {
            None => return Err(moved(String::new())),
            Some(planned) => match planned.tolerated(&fresh) {
                Ok(tolerance) => {
                    report.heartbeats_tolerated = tolerance.heartbeats.len();
                    report.heartbeats_tolerated_workers = tolerance.heartbeats;
                    report.retired_since_plan = tolerance.retired_since_plan;
                }
                Err(why) => return Err(moved(format!(": {why}"))),
            },
        }
    }
    if fresh.candidate_fingerprint != req.candidate_fingerprint {
        let moved = planned_verdicts_moved(req, &fresh);
        if let Some(added) = moved
            .as_deref()
            .and_then(|m| moved_as_planned(req, &fresh, m, &report.retired_since_plan))
        {
            report.candidates_added_since_plan = added;
            return Ok(fresh);
        }
        let which = verdicts_moved_words(moved, report);
        return Err(Abort::Refuse(
            Outcome::CandidateSetMoved,
            format!(
                "the eligibility verdict changed since the plan (now {}){which}; plan again",
                fresh.candidate_fingerprint
            ),
        ));
    }
    Ok(fresh)
}

/// The rows whose verdicts moved since the plan, when apply holds the
/// plan's rows with their verdicts.
fn planned_verdicts_moved(
    req: &Request,
    fresh: &crate::plan::Plan,
) -> Option<Vec<crate::plan::planned::VerdictMoved>> {
    req.planned
        .as_deref()
        .filter(|p| p.registry_fingerprint == req.registry_fingerprint)
        .and_then(|p| p.verdicts_moved(fresh))
}

/// Semantics §13: the candidate set moved only as time and this plan's own
/// batches move it. Every moved row either was kept at plan time only for
/// an unexpired heartbeat and is a candidate now (time passed), or was a
/// candidate and has been retired since (an earlier batch of this plan,
/// `retired`); and the plan's candidates, rebuilt from the rows now (the
/// retired ones as they were, `active`), make exactly the plan's token.
/// Then the apply goes on: the rows that became candidates are named and
/// left alone. `None` when any other change is in the set.
fn moved_as_planned(
    req: &Request,
    fresh: &crate::plan::Plan,
    moved: &[crate::plan::planned::VerdictMoved],
    retired: &[String],
) -> Option<Vec<String>> {
    let retired: std::collections::HashSet<&str> = retired.iter().map(String::as_str).collect();
    let explained = |m: &&crate::plan::planned::VerdictMoved| {
        m.expired_since || retired.contains(m.worker_identity.as_str())
    };
    if moved.is_empty() || !moved.iter().all(|m| explained(&m)) {
        return None;
    }
    let added: std::collections::HashSet<usize> = moved
        .iter()
        .filter(|m| m.expired_since)
        .map(|m| m.entry)
        .collect();
    let planned: Vec<Row> = fresh
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let row = &fresh.rows[e.index];
            if e.is_candidate() && !added.contains(&i) {
                Some(row.clone())
            } else if retired.contains(fresh.identity(e).as_str()) {
                let mut before = row.clone();
                before.set(Col::Status, Value::Text("active".into()));
                Some(before)
            } else {
                None
            }
        })
        .collect();
    (crate::fingerprint::candidate_fingerprint(&planned) == req.candidate_fingerprint).then(|| {
        moved
            .iter()
            .filter(|m| m.expired_since)
            .map(|m| m.worker_identity.clone())
            .collect()
    })
}

/// The refusal's words for the rows whose verdict moved, and those rows
/// into the report (the first five in the words, and how many more).
fn verdicts_moved_words(
    moved: Option<Vec<crate::plan::planned::VerdictMoved>>,
    report: &mut Report,
) -> String {
    let Some(moved) = moved else {
        return ": which rows moved is known only to an apply of a plan saved with its rows \
                (plan --out, or through serve)"
            .into();
    };
    let shown: Vec<String> = moved
        .iter()
        .take(5)
        .map(|m| {
            format!(
                "{} {} -> {}",
                crate::text::esc(&m.worker_identity),
                m.then,
                m.now
            )
        })
        .collect();
    let more = moved.len().saturating_sub(shown.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    report.verdicts_moved = moved;
    if shown.is_empty() {
        String::new()
    } else {
        format!(": {}{more}", shown.join(", "))
    }
}

/// Every requested identity revalidated against the fresh plan: one row,
/// a candidate of it. The others are kept with their reason; more targets
/// than the limit refuse the whole apply.
fn select_targets<'p>(
    req: &Request,
    fresh: &'p crate::plan::Plan,
    by_identity: &HashMap<String, Vec<usize>>,
    report: &mut Report,
) -> std::result::Result<Vec<&'p crate::plan::Entry>, Abort> {
    let mut targets = Vec::new();
    // Sets, not lists: a large plan's later batches pass over tens of
    // thousands of retired rows, inside the write lock.
    let retired: std::collections::HashSet<String> =
        report.retired_since_plan.iter().cloned().collect();
    let added: std::collections::HashSet<String> =
        report.candidates_added_since_plan.iter().cloned().collect();
    for w in &req.workers {
        if req.first.is_some_and(|n| targets.len() >= n) {
            break;
        }
        if retired.contains(w) {
            continue;
        }
        let entries: Vec<_> = by_identity
            .get(w)
            .map(|ix| ix.iter().map(|&i| &fresh.entries[i]).collect())
            .unwrap_or_default();
        match entries.as_slice() {
            [] => report.preserved.push(Kept {
                worker_identity: w.clone(),
                reason_code: Reason::RegistrationMissing.code(),
                detail: "no registry row carries this identity".into(),
            }),
            [_] if added.contains(w) => report.preserved.push(Kept {
                worker_identity: w.clone(),
                reason_code: Reason::NotInPlan.code(),
                detail: "not a candidate when planned (its heartbeat had not expired); \
                             plan again to retire it"
                    .into(),
            }),
            [e] if e.is_candidate() => targets.push(*e),
            [e, ..] => report.preserved.push(Kept {
                worker_identity: w.clone(),
                reason_code: Reason::NotInPlan.code(),
                detail: format!(
                    "not a candidate of the current plan ({})",
                    e.reason().code()
                ),
            }),
        }
    }
    if targets.len() > req.max_retire {
        return Err(Abort::Refuse(
            Outcome::BlastRadiusExceeded,
            format!(
                "{} workers would be retired, more than the limit of {}; nothing was retired. \
                 Raise --max-retire deliberately, or request fewer workers",
                targets.len(),
                req.max_retire
            ),
        ));
    }
    Ok(targets)
}

/// What the targets' checks before the writes need besides the
/// transaction (they never use it, so an engine may read while they run).
struct Checks<'a, 'h, 's> {
    ctx: &'a Context<'a>,
    leases: &'a mut dyn FenceSource,
    hooks: &'a mut Hooks<'h>,
    standing: &'a mut Standing<'s>,
}

impl Checks<'_, '_, '_> {
    /// What the registry and audit hold before the first write (the
    /// transaction's effect is checked against it before COMMIT), taken by
    /// `tx` while the targets' own checks run, where the engine can; then
    /// the grant once more, right before the writes: the image may have
    /// outlasted the checks (seconds at a million rows on PostgreSQL), and
    /// a revocation meanwhile must still stop them. The targets admitted.
    fn beside_the_image(
        mut self,
        tx: &mut dyn ApplyTx,
        w: &mut Writes,
        targets: &[&crate::plan::Entry],
        apply_id: &str,
        report: &mut Report,
    ) -> std::result::Result<Vec<Pending>, Abort> {
        let ids: Vec<String> = targets.iter().map(|e| w.fresh.identity(e)).collect();
        let mut checked = None;
        let mut check = || {
            if checked.is_none() {
                checked = Some(self.run(w, targets, report)); // once, whatever the engine does
            }
        };
        tx.before_writes(&ids, apply_id, &mut check)?;
        let pending = checked.unwrap_or_else(|| {
            Err(Abort::Fail(
                "the targets were not checked before the writes (a fault of this program's \
                 storage engine; please report it); nothing was written"
                    .into(),
            ))
        })?;
        self.standing.recheck()?;
        Ok(pending)
    }

    /// Each target in turn: the capability (and the policy pin) first, so
    /// a grant revoked since the last target stops the apply here; then
    /// its re-probe and the fence. The targets admitted, in order.
    fn run(
        &mut self,
        w: &mut Writes,
        targets: &[&crate::plan::Entry],
        report: &mut Report,
    ) -> std::result::Result<Vec<Pending>, Abort> {
        let mut pending = Vec::with_capacity(targets.len());
        for (i, entry) in targets.iter().enumerate() {
            if let Some(hook) = self.hooks.between_targets.as_mut() {
                hook(i);
            }
            self.standing.recheck()?;
            if let Some(hook) = self.hooks.after_capability.as_mut() {
                hook(i);
            }
            let sha = &self.standing.allowed_sha256;
            if let Some(admitted) = w.admit(self.ctx, &mut *self.leases, entry, sha, report)? {
                pending.push(admitted);
            }
        }
        Ok(pending)
    }
}

/// What each write needs: the lease fence as last seen, the re-judge of a
/// row with its process probed now, the fresh plan and the audit context.
struct Writes<'p> {
    fence: leases::Fence,
    /// Whether the fence was checked before a write yet.
    fence_checked: bool,
    rejudge: Rejudge<'p>,
    fresh: &'p crate::plan::Plan,
    audit: &'p AuditContext,
    /// The rows (by index) this transaction retired.
    written: Vec<usize>,
}

/// A target that passed its checks, waiting for the write.
struct Pending {
    /// Its entry's index in the plan.
    index: usize,
    worker_identity: String,
    /// Its evidence as the audit row records it.
    evidence: String,
    /// sha256 of the profiles.json that allowed it.
    profiles_sha256: String,
}

impl Writes<'_> {
    /// One target's checks before it is written: the re-probe, then the
    /// lease fence (before every write where that costs next to nothing,
    /// else before the first; for all, in full before COMMIT). `None` when
    /// the re-probe keeps it.
    fn admit(
        &mut self,
        ctx: &Context,
        leases: &mut dyn FenceSource,
        entry: &crate::plan::Entry,
        profiles_sha256: &str,
        report: &mut Report,
    ) -> std::result::Result<Option<Pending>, Abort> {
        let w = self.fresh.identity(entry);
        // Liveness re-probe: the same policies judge the row again with the
        // process probed now (pid definitely gone, this host, a known boot).
        let again = self.rejudge.entry(entry, ctx.probe);
        if !again.allowed {
            let codes: Vec<&str> = again.reason_codes().iter().map(|r| r.code()).collect();
            report.preserved.push(Kept {
                worker_identity: w,
                reason_code: Reason::LivenessReprobe.code(),
                detail: format!(
                    "re-probe before the write refused: the row is no longer eligible ({})",
                    codes.join(", ")
                ),
            });
            return Ok(None);
        }
        if leases.cheap_to_check() || !self.fence_checked {
            self.fence = self
                .fence
                .recheck(leases)?
                .map_err(|now| fence_moved(&self.fence, &now))?;
            self.fence_checked = true;
        }
        let mut evidence = Vec::with_capacity(1024);
        crate::plan::render::evidence(&mut evidence, &self.fresh.evidence(entry));
        let evidence = String::from_utf8(evidence).map_err(|e| Abort::Fail(e.to_string()))?;
        Ok(Some(Pending {
            index: entry.index,
            worker_identity: w,
            evidence,
            profiles_sha256: profiles_sha256.to_string(),
        }))
    }

    /// The guarded UPDATE of every admitted target and its audit row, in
    /// one step where the engine can (`ApplyTx::retire_all`); a target
    /// whose UPDATE matched nothing is kept (`row_changed_since_plan`),
    /// one that matched more aborts everything.
    fn write_all(
        &mut self,
        t: &mut Txn,
        pending: &[Pending],
        report: &mut Report,
    ) -> std::result::Result<(), Abort> {
        let (req, ctx) = (t.req, t.ctx);
        let retired_at = &self.audit.retired_at;
        let batch: Vec<(&Row, crate::store::audit::AuditRow<'_>)> = pending
            .iter()
            .map(|p| {
                let audit_row = crate::store::audit::AuditRow {
                    worker_identity: &p.worker_identity,
                    retired_at,
                    retired_by: ctx.profile,
                    retirement_reason: Reason::Eligible.code(),
                    registry_fingerprint: &req.registry_fingerprint,
                    candidate_fingerprint: &req.candidate_fingerprint,
                    policy_fingerprint: &req.policy_fingerprint,
                    external_state_fingerprint: &self.fence.token,
                    evidence: &p.evidence,
                    apply_id: &self.audit.apply_id,
                    profiles_sha256: &p.profiles_sha256,
                    os_uid: self.audit.os_uid,
                    host_id: self.audit.host_id.as_deref(),
                    program_version: env!("CARGO_PKG_VERSION"),
                    policy_source: &self.audit.policy_source,
                    canonical_repository: req.canonical_repository.as_deref(),
                    lease_store: &self.audit.lease_store,
                    lease_digest: &self.fence.digest,
                    heartbeats_tolerated: report.heartbeats_tolerated as i64,
                };
                (&self.fresh.rows[p.index], audit_row)
            })
            .collect();
        let changed = if batch.is_empty() {
            Vec::new()
        } else {
            t.tx.retire_all(&batch)?
        };
        for (p, changed) in pending.iter().zip(changed) {
            self.written_one(p, changed, retired_at, ctx.profile, report)?;
        }
        Ok(())
    }

    /// Report one target's write by the rows its UPDATE changed.
    fn written_one(
        &mut self,
        p: &Pending,
        changed: u64,
        retired_at: &str,
        profile: &str,
        report: &mut Report,
    ) -> std::result::Result<(), Abort> {
        let w = &p.worker_identity;
        if changed > 1 {
            return Err(Abort::Fail(format!(
                "the guarded UPDATE for {w} matched {changed} rows; nothing was retired"
            )));
        }
        if changed == 0 {
            report.preserved.push(Kept {
                worker_identity: w.clone(),
                reason_code: Reason::RowChanged.code(),
                detail:
                    "the guarded UPDATE matched no row; the registration changed since the plan"
                        .into(),
            });
            return Ok(());
        }
        self.written.push(p.index);
        report.retired.push(Retired {
            worker_identity: w.clone(),
            retired_at: retired_at.to_string(),
            retired_by: profile.to_string(),
        });
        Ok(())
    }
}

/// Before COMMIT: the leases once more, in full; then the transaction's
/// effect, which must be exactly the retirements reported and their audit
/// rows (`registry_untrusted`, naming what differs, when it is not).
fn verify_before_commit(
    t: &mut Txn,
    fence: &leases::Fence,
    audit: &AuditContext,
    report: &Report,
) -> std::result::Result<(), Abort> {
    fence
        .recheck_fully(&mut *t.leases)?
        .map_err(|now| fence_moved(fence, &now))?;
    let reason = Reason::Eligible.code();
    let written: Vec<Written<'_>> = report
        .retired
        .iter()
        .map(|r| Written {
            worker_identity: &r.worker_identity,
            retirement: ["retired", &r.retired_at, &r.retired_by, reason],
        })
        .collect();
    match t.tx.verify_writes(&audit.apply_id, &written)? {
        Some(why) => Err(Abort::Refuse(
            Outcome::RegistryUntrusted,
            format!(
                "the transaction's effect is not what apply wrote: {why}. Something in the \
                 registry database ran code inside apply's writes; nothing was retired. \
                 Inspect the tables' constraints, defaults, indexes, column types and \
                 triggers (docs/multi-host.md, \"The role apply connects as\")"
            ),
        )),
        None => Ok(()),
    }
}
