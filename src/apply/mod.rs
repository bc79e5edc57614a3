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
use attempt::transaction;
use standing::Standing;

mod attempt;
mod fenced;
mod moved;
mod prejudge;
mod report;
pub mod residual;
mod scoped;
mod standing;
mod verdicts;
mod workers;
mod writes;

use crate::value::Value;
pub use prejudge::ReadUnderLock;
use prejudge::{NotJudged, Prejudged};
pub use report::{Kept, Outcome, Report, Retired};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use verdicts::{refuse_if_all_retired, replan, select_targets};
pub use workers::{parse_workers, Workers};
use writes::{verify_before_commit, Checks, Writes};

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
    /// The host whose scope the plan judged (`plan --scope host`): apply
    /// then reads and judges that scope under its lock, and nothing else
    /// (`scoped.rs`). `None`: the whole registry.
    pub scope: Option<String>,
    /// Leave out the fleet after the apply (`post_apply`, `residual`): a
    /// snapshot of the whole registry, which `apply --all-batches` takes
    /// once at the end rather than after every batch.
    pub skip_fleet_summary: bool,
    /// Set by `fleet-retire controller`: the lease, term and tick it acts
    /// under, checked inside the transaction (`fenced`); `None` for an
    /// apply made by hand, which never needs the lease.
    pub controller: Option<crate::store::controller::Stamp>,
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
    /// After the row-version bookkeeping was installed (or found), before
    /// the judgement outside the lock.
    pub after_install: Option<&'a mut dyn FnMut()>,
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

impl Hooks<'_> {
    /// The same hooks, lent to one attempt of the transaction.
    fn again(&mut self) -> Hooks<'_> {
        Hooks {
            after_install: self.after_install.as_mut().map(|h| &mut **h as _),
            after_prejudge: self.after_prejudge.as_mut().map(|h| &mut **h as _),
            before_first_write: self.before_first_write.as_mut().map(|h| &mut **h as _),
            between_targets: self.between_targets.as_mut().map(|h| &mut **h as _),
            after_capability: self.after_capability.as_mut().map(|h| &mut **h as _),
            before_commit: self.before_commit.as_mut().map(|h| &mut **h as _),
            fail_commit: self.fail_commit,
            cancelled: self.cancelled,
        }
    }
}

/// Why a transaction must be rolled back, as opposed to a refusal.
enum Abort {
    Refuse(Outcome, String),
    Fail(String),
    /// The server rolled the transaction back as unserializable with a
    /// concurrent one ([`crate::store::lost_a_race`]): a host-scoped apply
    /// tries again ([`retry`]); otherwise `registry_revision_moved`.
    Raced(String),
}

impl Abort {
    /// The outcome and its words, a lost race being a refusal.
    fn settled(self) -> (Outcome, String) {
        match self {
            Abort::Refuse(o, d) => (o, d),
            Abort::Fail(d) => (Outcome::TransactionFailed, d),
            Abort::Raced(d) => (Outcome::RegistryRevisionMoved, d),
        }
    }
}

impl From<Error> for Abort {
    fn from(e: Error) -> Abort {
        match &e {
            // The engine aborted this transaction because a concurrent one
            // (another apply, a lease taken) made the two unserializable:
            // what this apply read is no longer the registry.
            e if crate::store::lost_a_race(e) => Abort::Raced(format!(
                "a concurrent transaction changed what this apply read ({e}); \
                 nothing was retired; plan again"
            )),
            _ => Abort::Fail(e.to_string()),
        }
    }
}

/// The fleet as a snapshot sees it after the transaction: counts and
/// blockers (`post_apply`), and what still stands in the way in the plan's
/// words (`residual`). `committed` is the registry as committed: the
/// transaction's own read (it held the write lock from before that read to
/// COMMIT, and nothing but its own guarded writes changed it) with those
/// writes applied, and its verdicts; so the summary needs no second read of
/// the whole registry.
pub fn after_apply(
    canonical_repository: Option<String>,
    proc_root: &Path,
    probe: &dyn ProcessProbe,
    committed: &crate::plan::Plan,
) -> (serde_json::Value, residual::Residual) {
    let snap = crate::snapshot::Snapshot::take(
        &committed.rows,
        &crate::snapshot::Options {
            now: crate::time::now(),
            canonical_repository,
            host_id: crate::evidence::probe::HostFacts::observe(proc_root).host_id,
            ..Default::default()
        },
        probe,
    );
    (fleet_summary(&snap), residual::of(committed, &snap))
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
    if let Some(plan) = committed.filter(|_| report.mutation_performed && !req.skip_fleet_summary) {
        let (summary, residual) = after_apply(
            req.canonical_repository.clone(),
            ctx.proc_root,
            ctx.probe,
            &plan,
        );
        report.post_apply = Some(summary);
        report.residual = Some(residual);
    }
    Ok(report)
}

/// The report, and after a COMMIT the plan of the registry as committed.
fn apply_inner(
    req: &Request,
    ctx: &Context,
    hooks: Hooks,
) -> Result<(Report, Option<crate::plan::Plan>)> {
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
    // 5. A registry without the row-version bookkeeping (one the seed
    //    made) gains it in a short transaction of its own, so that it is
    //    judged outside the lock from its first apply on.
    let mut hooks = hooks;
    let installed = match install_versions_first(&mut *conn) {
        Ok(installed) => installed,
        Err((why, lock_ms)) => {
            let mut report = Report::new(req, Outcome::RegistryUntrusted, why);
            report.versions_install_lock_ms = Some(lock_ms);
            report.lock_held_ms = lock_ms;
            return Ok((report, None));
        }
    };
    if let Some(hook) = hooks.after_install.as_mut() {
        hook();
    }
    // 6. Judged outside the lock when the registry keeps row versions.
    let prejudged = prejudge::prejudge(req, ctx, &mut *lease_source);
    if let Some(hook) = hooks.after_prejudge.as_mut() {
        hook();
    }
    if hooks.cancelled.is_some_and(|c| c()) {
        let mut report = Report::new(req, Outcome::TransactionFailed, CANCELLED_BEFORE_LOCK);
        report.success = false;
        return Ok((report, None));
    }
    // 7. The transaction.
    Ok(transaction(
        req,
        ctx,
        (&mut *conn, &mut *lease_source),
        prejudged,
        hooks,
        &mut standing,
        installed,
    ))
}

/// Install the row-version bookkeeping when the registry lacks it, in a
/// transaction that writes nothing else and commits on its own (docs/apply.md,
/// "The first apply"). `Ok` with how long it held the write lock when it ran;
/// `Err` (the reason, the lock's time) when the registry's schema is one
/// apply refuses. Any other failure installs nothing and lets apply go on:
/// its transaction then reads the whole registry under the lock, as before,
/// and says what is wrong if something is.
fn install_versions_first(
    conn: &mut dyn ApplyConnection,
) -> std::result::Result<Option<u64>, (String, u64)> {
    let skip = |what: &str, why: &dyn std::fmt::Display| {
        tracing::warn!("row-version bookkeeping not installed before judging ({what}): {why}");
        Ok(None)
    };
    match conn.lacks_versions() {
        Ok(false) => return Ok(None),
        Ok(true) => {}
        Err(e) => return skip("cannot tell whether it is there", &e),
    }
    let locked_at = std::time::Instant::now();
    let mut tx = match conn.begin() {
        Ok(tx) => tx,
        Err(why) => return skip("no write lock", &why),
    };
    let lock_ms = || locked_at.elapsed().as_millis() as u64;
    match tx.untrusted_objects() {
        Ok(None) => {}
        Ok(Some(why)) => {
            tx.rollback();
            return Err((why, lock_ms()));
        }
        Err(e) => return skip("cannot inspect the schema", &e),
    }
    if let Err(e) = tx.install_versions() {
        return skip("install failed", &e);
    }
    match tx.commit() {
        Ok(()) => Ok(Some(lock_ms())),
        Err(e) => skip("commit failed", &e),
    }
}

/// The refusals that need no store: the plan's policy set must be the one
/// loaded, and something must be asked for.
fn refuse_before_lock(req: &Request, ctx: &Context) -> Option<Report> {
    if let Some(refused) = scoped::refuse_before_lock(req, ctx) {
        return Some(refused);
    }
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
/// each behind its own checks, and verify before COMMIT. Returns the
/// re-plan with its rows as they stand once this transaction commits.
fn inside(
    t: &mut Txn,
    prejudged: std::result::Result<Prejudged, NotJudged>,
    mut hooks: Hooks,
    standing: &mut Standing,
    report: &mut Report,
) -> std::result::Result<crate::plan::Plan, Abort> {
    let started = std::time::Instant::now();
    let step =
        |what: &str| tracing::debug!(elapsed = ?started.elapsed(), "apply under the lock: {what}");
    prepare_registry(t)?;
    fenced::still_leading(t)?;
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
    report.apply_id = Some(audit.apply_id.clone());
    fenced::spend(t, &audit.apply_id, targets.len())?;
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
    let mut fresh = fresh;
    for index in written {
        let row = &mut fresh.rows[index];
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
    Ok(fresh)
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
    prejudged: std::result::Result<Prejudged, NotJudged>,
    fence: &leases::Fence,
    active_leases: &[leases::Lease],
    report: &mut Report,
) -> std::result::Result<(crate::plan::Plan, Vec<usize>), Abort> {
    if let Some(host) = t.req.scope.clone() {
        return scoped::judge_scope(t, &host, active_leases, report);
    }
    let why = match prejudged {
        Err(NotJudged::Unread(why)) => why,
        Err(NotJudged::Refused(refusal)) => match answer_outside(t, *refusal, report)? {
            Ok(refused) => return Err(refused),
            Err(why) => why,
        },
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

/// A refusal found outside the lock, answered under it without a whole
/// read (`read_under_lock` `nothing`) when it was read from the file the
/// lock holds and, for `already_retired` (a success), no requested row
/// changed since. `Err` says why the lock must read and judge again.
fn answer_outside(
    t: &mut Txn,
    refusal: prejudge::Refusal,
    report: &mut Report,
) -> std::result::Result<std::result::Result<Abort, String>, Abort> {
    let prejudge::Refusal {
        outcome,
        why,
        report: mut found,
        versions,
        requested,
    } = refusal;
    if !t.tx.same_file(&versions) {
        return Ok(Err(format!(
            "a step refused outside the lock ({why}), but on a file the lock cannot tell is \
             the one it holds"
        )));
    }
    if outcome == Outcome::AlreadyRetired {
        let untouched = match t.tx.changed_since(&versions)? {
            Ok(changes) => changes.iter().all(|(at, _)| !requested.contains(at)),
            Err(_) => false,
        };
        if !untouched {
            return Ok(Err(
                "every requested worker was retired when read outside the lock, but a \
                 requested row may have changed since"
                    .into(),
            ));
        }
    }
    report.carry_findings(&mut found);
    report.read_under_lock = Some(ReadUnderLock {
        scope: "nothing",
        rows: 0,
        why: Some(
            "refused on the registry as read outside the lock, moments before, from the file \
             the lock holds; the lock checked its shape and the fence only"
                .into(),
        ),
    });
    Ok(Ok(Abort::Refuse(outcome, why)))
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
