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

use crate::capability::{check, Profiles};
use crate::error::{Error, Result};
use crate::evidence::leases;
use crate::evidence::probe::ProcessProbe;
use crate::observe::RunFacts;
use crate::plan::{plan, Rejudge};
use crate::policy::Policies;
use crate::reasons::Reason;
use crate::row::{Col, Row};
use crate::store::seam::{ApplyConnection, ApplyTx, FenceSource, Written};
use crate::value::Value;
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// How an apply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The transaction ran and committed (see `retired` / `preserved`).
    Applied,
    /// The registry changed since the plan.
    RegistryRevisionMoved,
    /// The eligibility verdict changed since the plan.
    CandidateSetMoved,
    /// The plan was made under other policies.
    PolicySetMoved,
    /// Every requested row is already retired (idempotent replay).
    AlreadyRetired,
    /// The request named no worker.
    NothingRequested,
    /// More targets than the blast-radius limit.
    BlastRadiusExceeded,
    /// The capability policies refused (at entry or before a write).
    PermissionDenied,
    /// The loaded policy set is neither the built-in one nor pinned by the
    /// operator in `profiles.json`.
    PolicySetNotPinned,
    /// The registry holds triggers, views or a foreign audit table that
    /// could make apply's writes differ from its report.
    RegistryUntrusted,
    /// The lease store could not be opened.
    LeaseStoreUnavailable,
    /// The registry could not be opened or migrated.
    RegistryUnavailable,
    /// Something failed inside the transaction; it was rolled back.
    TransactionFailed,
}

impl Outcome {
    /// The exit code this outcome maps to.
    pub fn exit_code(self) -> crate::error::ExitCode {
        use crate::error::ExitCode;
        match self {
            Outcome::Applied | Outcome::AlreadyRetired | Outcome::NothingRequested => ExitCode::Ok,
            Outcome::RegistryUnavailable
            | Outcome::TransactionFailed
            | Outcome::LeaseStoreUnavailable => ExitCode::Error,
            _ => ExitCode::Refused,
        }
    }
}

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
}

/// One retired worker.
#[derive(Debug, Clone, Serialize)]
pub struct Retired {
    /// Its identity.
    pub worker_identity: String,
    /// When.
    pub retired_at: String,
    /// By which profile.
    pub retired_by: String,
}

/// One requested worker that was not retired.
#[derive(Debug, Clone, Serialize)]
pub struct Kept {
    /// Its identity.
    pub worker_identity: String,
    /// Why.
    pub reason_code: &'static str,
    /// In words.
    pub detail: String,
}

/// The report of an apply.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// How it ended.
    pub outcome: Outcome,
    /// Whether it did what was asked without a failure.
    pub success: bool,
    /// Always false: apply is the mutating operation.
    pub read_only: bool,
    /// Whether any row was retired (and committed).
    pub mutation_performed: bool,
    /// Rows retired.
    pub retired_count: usize,
    /// The retired workers.
    pub retired: Vec<Retired>,
    /// Requested workers kept, with reasons.
    pub preserved: Vec<Kept>,
    /// What was asked.
    pub requested: Vec<String>,
    /// The token presented.
    pub registry_fingerprint: String,
    /// The token presented.
    pub candidate_fingerprint: String,
    /// The policy fingerprint presented.
    pub policy_fingerprint: String,
    /// The external fence captured inside the transaction, if it got there.
    pub external_state_fingerprint: Option<String>,
    /// The blast-radius limit.
    pub max_retire: usize,
    /// How many rows differed from the plan only by a heartbeat on a worker
    /// live then and now (tolerated; see docs/apply.md).
    pub heartbeats_tolerated: usize,
    /// Those workers.
    pub heartbeats_tolerated_workers: Vec<String>,
    /// How long the registry's write lock was held (BEGIN IMMEDIATE to
    /// COMMIT or ROLLBACK), in milliseconds; workers cannot heartbeat
    /// meanwhile.
    pub lock_held_ms: u64,
    /// A sentence for a person.
    pub detail: String,
    /// The fleet after the transaction: retiring stale rows does not by
    /// itself make an untrusted fleet safe.
    pub post_apply: Option<serde_json::Value>,
}

impl Report {
    fn new(req: &Request, outcome: Outcome, detail: impl Into<String>) -> Report {
        Report {
            outcome,
            success: matches!(
                outcome,
                Outcome::Applied | Outcome::AlreadyRetired | Outcome::NothingRequested
            ),
            read_only: false,
            mutation_performed: false,
            retired_count: 0,
            retired: Vec::new(),
            preserved: Vec::new(),
            requested: req.workers.clone(),
            registry_fingerprint: req.registry_fingerprint.clone(),
            candidate_fingerprint: req.candidate_fingerprint.clone(),
            policy_fingerprint: req.policy_fingerprint.clone(),
            external_state_fingerprint: None,
            max_retire: req.max_retire,
            heartbeats_tolerated: 0,
            heartbeats_tolerated_workers: Vec::new(),
            lock_held_ms: 0,
            detail: detail.into(),
            post_apply: None,
        }
    }
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

/// The operator's standing, read from `profiles.json`: decided before the
/// lock and re-read (without blocking: regular files only) before every
/// write, so revoking the grant or the policy pin stops an apply under way.
struct Standing<'a> {
    ctx: &'a Context<'a>,
    /// sha256 of the profiles.json that was last found to allow apply.
    allowed_sha256: String,
    /// That file's identity and times when it was read, if they can vouch
    /// that it has not changed since (see `FileStamp`).
    stamp: Option<FileStamp>,
}

/// What `stat` says of a file: device, inode, size, modification and
/// change times. Any write changes the change time, and a replacement
/// changes the inode, so an equal stamp means unchanged content, except
/// for writes within one tick of the kernel's coarse clock. A stamp whose
/// change time is recent therefore vouches for nothing, and the file is
/// read again (as git does for racily clean files).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp([i64; 7]);

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_nanos() as i128;
        let changed = m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128;
        if !m.is_file() || changed >= now - 2_000_000_000 {
            return None;
        }
        Some(FileStamp([
            m.dev() as i64,
            m.ino() as i64,
            m.size() as i64,
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        ]))
    }
}

impl<'a> Standing<'a> {
    /// Why `profiles` does not let this apply run, if it does not.
    fn refusal(ctx: &Context, profiles: &Profiles) -> Result<Option<(Outcome, String)>> {
        if let Some(why) = profiles.pin_refusal(ctx.policies, ctx.profiles) {
            return Ok(Some((Outcome::PolicySetNotPinned, why)));
        }
        let decision = check(ctx.policies, profiles, ctx.profile, "apply")?;
        Ok((!decision.allowed).then_some((Outcome::PermissionDenied, decision.explanation)))
    }

    /// Read and decide at entry.
    fn at_entry(ctx: &'a Context<'a>) -> Result<std::result::Result<Self, (Outcome, String)>> {
        // The stamp is taken before the read: a write during the read
        // makes the next stamp differ.
        let stamp = FileStamp::of(ctx.profiles);
        let profiles = Profiles::load(ctx.profiles)?;
        if let Some(refused) = Self::refusal(ctx, &profiles)? {
            return Ok(Err(refused));
        }
        Ok(Ok(Standing {
            ctx,
            allowed_sha256: profiles.sha256,
            stamp,
        }))
    }

    /// Read again; an unchanged file keeps its decision, a changed one is
    /// decided afresh. Any failure to read is a refusal.
    fn recheck(&mut self) -> std::result::Result<(), Abort> {
        let refused = |why: String| {
            Abort::Refuse(
                Outcome::PermissionDenied,
                format!("capability re-read before a write: {why}; nothing was retired"),
            )
        };
        let stamp = FileStamp::of(self.ctx.profiles);
        if stamp.is_some() && stamp == self.stamp {
            return Ok(());
        }
        let profiles = Profiles::load(self.ctx.profiles).map_err(|e| refused(e.to_string()))?;
        if profiles.sha256 == self.allowed_sha256 {
            self.stamp = stamp;
            return Ok(());
        }
        match Self::refusal(self.ctx, &profiles) {
            Ok(None) => {
                self.allowed_sha256 = profiles.sha256;
                self.stamp = stamp;
                Ok(())
            }
            Ok(Some((outcome, why))) => Err(Abort::Refuse(
                outcome,
                format!("re-read before a write: {why}; nothing was retired"),
            )),
            Err(e) => Err(refused(e.to_string())),
        }
    }
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
    // 5. The transaction.
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
                report.detail = format!(
                    "retired {} of {} requested worker(s)",
                    report.retired_count,
                    req.workers.len()
                );
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
    mut hooks: Hooks,
    standing: &mut Standing,
    report: &mut Report,
) -> std::result::Result<Vec<Row>, Abort> {
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
    let rows = t.tx.read_rows()?;
    let by_identity = refuse_if_all_retired(t.req, &rows)?;
    let fresh = replan(t, rows, &active_leases, report)?;
    let targets = select_targets(t.req, &fresh, &by_identity, report)?;
    if let Some(hook) = hooks.before_first_write.as_mut() {
        hook();
    }
    let audit = AuditContext {
        apply_id: crate::evidence::random_hex(16)?,
        os_uid: i64::from(nix::unistd::getuid().as_raw()),
        host_id: fresh.facts.host.host_id.clone(),
        policy_source: t.ctx.policies.source_label(),
        lease_store: t.leases.label(),
        retired_at: crate::time::format_ts(crate::time::now()),
    };
    // What the registry and audit hold before the first write: the
    // transaction's effect is checked against it before COMMIT.
    let target_ids: Vec<String> = targets.iter().map(|e| fresh.identity(e)).collect();
    t.tx.before_writes(&target_ids, &audit.apply_id)?;
    let mut w = Writes {
        fence,
        rejudge: Rejudge::new(&fresh, t.ctx.policies),
        fresh: &fresh,
        audit: &audit,
        written: Vec::new(),
    };
    for (i, entry) in targets.into_iter().enumerate() {
        if let Some(hook) = hooks.between_targets.as_mut() {
            hook(i);
        }
        // The capability (and the policy pin) first: a grant revoked since
        // the last write stops the apply here.
        standing.recheck()?;
        if let Some(hook) = hooks.after_capability.as_mut() {
            hook(i);
        }
        w.retire(t, entry, &standing.allowed_sha256, report)?;
    }
    if let Some(hook) = hooks.before_commit.as_mut() {
        hook();
    }
    verify_before_commit(t, &w.fence, &audit, report)?;
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
    t: &Txn,
    rows: Vec<crate::row::Row>,
    active_leases: &[leases::Lease],
    report: &mut Report,
) -> std::result::Result<crate::plan::Plan, Abort> {
    let req = t.req;
    let facts = RunFacts::of_this_host(
        t.ctx.proc_root,
        req.canonical_repository.clone(),
        active_leases,
    );
    let fresh = plan(rows, facts, t.ctx.probe, t.ctx.policies)?;
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
                Ok(workers) => {
                    report.heartbeats_tolerated = workers.len();
                    report.heartbeats_tolerated_workers = workers;
                }
                Err(why) => return Err(moved(format!(": {why}"))),
            },
        }
    }
    if fresh.candidate_fingerprint != req.candidate_fingerprint {
        return Err(Abort::Refuse(
            Outcome::CandidateSetMoved,
            format!(
                "the eligibility verdict changed since the plan (now {}); plan again",
                fresh.candidate_fingerprint
            ),
        ));
    }
    Ok(fresh)
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
    for w in &req.workers {
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

/// What each write needs: the lease fence as last seen, the re-judge of a
/// row with its process probed now, the fresh plan and the audit context.
struct Writes<'p> {
    fence: leases::Fence,
    rejudge: Rejudge<'p>,
    fresh: &'p crate::plan::Plan,
    audit: &'p AuditContext,
    /// The rows (by index) this transaction retired.
    written: Vec<usize>,
}

impl Writes<'_> {
    /// Retire one target behind its own checks: the re-probe, the lease
    /// fence last, the guarded UPDATE, then its audit row.
    fn retire(
        &mut self,
        t: &mut Txn,
        entry: &crate::plan::Entry,
        profiles_sha256: &str,
        report: &mut Report,
    ) -> std::result::Result<(), Abort> {
        let (req, ctx) = (t.req, t.ctx);
        let row = &self.fresh.rows[entry.index];
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
            return Ok(());
        }
        // The lease fence last, right before the write.
        self.fence = self
            .fence
            .recheck(&mut *t.leases)?
            .map_err(|now| fence_moved(&self.fence, &now))?;
        let retired_at = &self.audit.retired_at;
        let mut evidence = Vec::with_capacity(1024);
        crate::plan::render::evidence(&mut evidence, &self.fresh.evidence(entry));
        let evidence = String::from_utf8(evidence).map_err(|e| Abort::Fail(e.to_string()))?;
        let audit_row = crate::store::audit::AuditRow {
            worker_identity: &w,
            retired_at,
            retired_by: ctx.profile,
            retirement_reason: Reason::Eligible.code(),
            registry_fingerprint: &req.registry_fingerprint,
            candidate_fingerprint: &req.candidate_fingerprint,
            policy_fingerprint: &req.policy_fingerprint,
            external_state_fingerprint: &self.fence.token,
            evidence: &evidence,
            apply_id: &self.audit.apply_id,
            profiles_sha256,
            os_uid: self.audit.os_uid,
            host_id: self.audit.host_id.as_deref(),
            program_version: env!("CARGO_PKG_VERSION"),
            policy_source: &self.audit.policy_source,
            canonical_repository: req.canonical_repository.as_deref(),
            lease_store: &self.audit.lease_store,
            lease_digest: &self.fence.digest,
            heartbeats_tolerated: report.heartbeats_tolerated as i64,
        };
        // The guarded UPDATE, and its audit row when it matched one row.
        let changed = t.tx.retire_with_audit(row, &audit_row)?;
        if changed > 1 {
            return Err(Abort::Fail(format!(
                "the guarded UPDATE for {w} matched {changed} rows; nothing was retired"
            )));
        }
        if changed == 0 {
            report.preserved.push(Kept {
                worker_identity: w,
                reason_code: Reason::RowChanged.code(),
                detail:
                    "the guarded UPDATE matched no row; the registration changed since the plan"
                        .into(),
            });
            return Ok(());
        }
        self.written.push(entry.index);
        report.retired.push(Retired {
            worker_identity: w,
            retired_at: retired_at.clone(),
            retired_by: ctx.profile.to_string(),
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

/// Parse `--workers`: a JSON list of strings, or comma-separated names.
pub fn parse_workers(text: &str) -> Result<Vec<String>> {
    let trimmed = text.trim();
    if trimmed.starts_with('[') {
        let list: Vec<String> = serde_json::from_str(trimmed).map_err(|e| {
            Error::Input(format!(
                "the worker list looks like JSON but is not a list of strings: {e}"
            ))
        })?;
        return Ok(list);
    }
    Ok(trimmed
        .split([',', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect())
}
