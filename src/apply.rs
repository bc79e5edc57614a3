//! Apply: retire exactly what a plan approved, inside one `BEGIN IMMEDIATE`
//! transaction, or nothing at all.
//!
//! The order of refusals is semantics §10, step for step. Inside the lock the
//! plan is re-derived from what is read there with the same `plan` function,
//! and each write sits behind its own liveness re-probe, external-state fence
//! and guarded `UPDATE`. Any error rolls the whole transaction back. Rows are
//! never deleted: a retired row keeps its history and gains an audit row.

use crate::capability::{check, Profiles};
use crate::error::{Error, Result};
use crate::evidence::leases::{self, Protections};
use crate::evidence::probe::{HostFacts, ProcessProbe};
use crate::evidence::registry::{read_rows, TABLE};
use crate::fingerprint::external_state_fingerprint;
use crate::observe::RunFacts;
use crate::plan::{plan, Rejudge};
use crate::policy::Policies;
use crate::reasons::Reason;
use crate::row::Col;
use crate::value::Value;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
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
    /// The capability policies refused (at entry or before the first write).
    PermissionDenied,
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
            Outcome::RegistryUnavailable | Outcome::TransactionFailed => ExitCode::Error,
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
            detail: detail.into(),
            post_apply: None,
        }
    }
}

fn capability(ctx: &Context) -> Result<Option<String>> {
    let profiles = Profiles::load(ctx.profiles)?;
    let decision = check(ctx.policies, &profiles, ctx.profile, "apply")?;
    Ok((!decision.allowed).then_some(decision.explanation))
}

/// Open the registry for writing (it must exist) and add any known column it
/// lacks, before the transaction.
pub fn open_and_migrate(path: &Path, busy_timeout: Duration) -> Result<Connection> {
    let err = |message: String| Error::Registry {
        path: path.to_path_buf(),
        message,
    };
    if !path.is_file() {
        return Err(err(
            "no such file; pass the worker registry with --registry".into(),
        ));
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
        .map_err(|e| err(format!("cannot open for writing: {e}")))?;
    conn.busy_timeout(busy_timeout)
        .map_err(|e| err(format!("cannot set the busy timeout: {e}")))?;
    crate::evidence::registry::add_missing_columns(&conn, path)?;
    Ok(conn)
}

fn sql(v: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as S;
    match v {
        Value::Null => S::Null,
        Value::Int(i) => S::Integer(*i),
        Value::Real(f) => S::Real(*f),
        Value::Text(t) => S::Text(t.to_string()),
        Value::Bool(b) => S::Integer(*b as i64),
        Value::Blob(b) => S::Blob(b.to_vec()),
    }
}

/// Columns the guarded UPDATE asserts unchanged (NULL-safe).
const GUARD: &[Col] = &[
    Col::Status,
    Col::LastHeartbeatAt,
    Col::GenerationId,
    Col::SessionId,
    Col::FencingEpoch,
    Col::Pid,
    Col::HostId,
    Col::BootId,
    Col::ProcessStartTime,
];

const AUDIT_DDL: &str = "CREATE TABLE IF NOT EXISTS retirement_audit (
    audit_id INTEGER PRIMARY KEY AUTOINCREMENT,
    worker_identity TEXT NOT NULL,
    retired_at TEXT NOT NULL,
    retired_by TEXT NOT NULL,
    retirement_reason TEXT NOT NULL,
    registry_fingerprint TEXT NOT NULL,
    candidate_fingerprint TEXT NOT NULL,
    policy_fingerprint TEXT NOT NULL,
    external_state_fingerprint TEXT NOT NULL,
    evidence TEXT NOT NULL
)";

/// Why a transaction must be rolled back, as opposed to a refusal.
enum Abort {
    Refuse(Outcome, String),
    Fail(String),
}

impl From<Error> for Abort {
    fn from(e: Error) -> Abort {
        Abort::Fail(e.to_string())
    }
}

impl From<rusqlite::Error> for Abort {
    fn from(e: rusqlite::Error) -> Abort {
        Abort::Fail(format!("SQLite: {e}"))
    }
}

/// The fleet as a snapshot sees it after the transaction (or `None` when the
/// registry cannot be read).
fn post_apply(req: &Request, ctx: &Context) -> Option<serde_json::Value> {
    let rows = crate::evidence::registry::load(ctx.registry).ok()?;
    let snap = crate::snapshot::snapshot(
        &rows,
        &crate::snapshot::Options {
            now: crate::time::now(),
            canonical_repository: req.canonical_repository.clone(),
            ..Default::default()
        },
        ctx.probe,
    );
    let blockers: Vec<serde_json::Value> = snap["active_blockers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| serde_json::json!({"classification": b["classification"], "detail": b["detail"]}))
        .collect();
    Some(serde_json::json!({
        "snapshot_at": snap["snapshot_at"],
        "live_worker_count": snap["live_worker_count"],
        "stale_worker_count": snap["stale_worker_count"],
        "historical_worker_count": snap["historical_worker_count"],
        "instance_count": snap["instance_count"],
        "live_fleet_safe": snap["live_fleet_safe"],
        "residual_blocker_count": blockers.len(),
        "residual_blockers": blockers,
    }))
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
    let mut report = apply_inner(req, ctx, hooks)?;
    if !matches!(
        report.outcome,
        Outcome::PermissionDenied | Outcome::RegistryUnavailable
    ) {
        report.post_apply = post_apply(req, ctx);
    }
    Ok(report)
}

fn apply_inner(req: &Request, ctx: &Context, hooks: Hooks) -> Result<Report> {
    // 1. Capability at entry.
    if let Some(why) = capability(ctx)? {
        return Ok(Report::new(req, Outcome::PermissionDenied, why));
    }
    // 2. The plan's policies must be the loaded ones.
    if req.policy_fingerprint != ctx.policies.fingerprint {
        return Ok(Report::new(
            req,
            Outcome::PolicySetMoved,
            format!(
                "the plan was made under policy set {} but {} is loaded; plan again",
                req.policy_fingerprint, ctx.policies.fingerprint
            ),
        ));
    }
    // 3. Something must be asked for.
    if req.workers.is_empty() {
        return Ok(Report::new(
            req,
            Outcome::NothingRequested,
            "no worker was requested",
        ));
    }
    // 4. Open the registry, migrating missing columns.
    let mut conn = match open_and_migrate(ctx.registry, ctx.busy_timeout) {
        Ok(c) => c,
        Err(e) => {
            return Ok(Report::new(
                req,
                Outcome::RegistryUnavailable,
                e.to_string(),
            ))
        }
    };
    let lease_conn = match leases::open_read_only(ctx.leases) {
        Ok(c) => c,
        Err(e) => return Ok(Report::new(req, Outcome::TransactionFailed, e.to_string())),
    };
    // 5. The transaction.
    let mut report = Report::new(req, Outcome::Applied, "");
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            report.outcome = Outcome::TransactionFailed;
            report.success = false;
            report.detail = format!("could not take the registry's write lock: {e}");
            return Ok(report);
        }
    };
    let fail_commit = hooks.fail_commit;
    let result = inside(req, ctx, hooks, &tx, &lease_conn, &mut report).and_then(|()| {
        if fail_commit {
            Err(Abort::Fail("injected failure at commit".into()))
        } else {
            Ok(())
        }
    });
    match result {
        Ok(()) => {
            if let Err(e) = tx.commit() {
                let mut failed = Report::new(
                    req,
                    Outcome::TransactionFailed,
                    format!("commit failed, nothing was retired: {e}"),
                );
                failed.success = false;
                failed.external_state_fingerprint = report.external_state_fingerprint.take();
                return Ok(failed);
            }
            report.retired_count = report.retired.len();
            report.mutation_performed = report.retired_count > 0;
            if report.detail.is_empty() {
                report.detail = format!(
                    "retired {} of {} requested worker(s)",
                    report.retired_count,
                    req.workers.len()
                );
            }
        }
        Err(abort) => {
            // Dropping the transaction rolls it back; do it explicitly so a
            // failing rollback is reported too.
            let rolled_back = tx_rollback_note(tx);
            let (outcome, detail) = match abort {
                Abort::Refuse(o, d) => (o, d),
                Abort::Fail(d) => (Outcome::TransactionFailed, d),
            };
            let mut fresh = Report::new(req, outcome, format!("{detail}{rolled_back}"));
            fresh.external_state_fingerprint = report.external_state_fingerprint.take();
            if outcome == Outcome::TransactionFailed {
                fresh.success = false;
            }
            return Ok(fresh);
        }
    }
    Ok(report)
}

fn tx_rollback_note(tx: rusqlite::Transaction) -> String {
    match tx.rollback() {
        Ok(()) => String::new(),
        Err(e) => format!(" (rollback also failed: {e}; SQLite discards the transaction when the connection closes)"),
    }
}

fn read_fence(lease_conn: &Connection, path: &Path) -> Result<String> {
    let all = leases::read(lease_conn, path)?;
    Ok(external_state_fingerprint(
        all.iter().filter(|l| l.is_active()),
    ))
}

fn inside(
    req: &Request,
    ctx: &Context,
    mut hooks: Hooks,
    tx: &rusqlite::Transaction,
    lease_conn: &Connection,
    report: &mut Report,
) -> std::result::Result<(), Abort> {
    // The external fence, before the authoritative read.
    let fence = read_fence(lease_conn, ctx.leases)?;
    report.external_state_fingerprint = Some(fence.clone());
    let rows = read_rows(tx, ctx.registry)?;

    // Rows by canonical identity, once (requests can name thousands).
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

    // Re-plan from what is read under the lock, with leases read afresh.
    let lease_rows = leases::read(lease_conn, ctx.leases)?;
    let facts = RunFacts {
        now: crate::time::now(),
        host: HostFacts::observe(ctx.proc_root),
        canonical_repository: req.canonical_repository.clone(),
        protections: Protections::from_leases(&lease_rows),
    };
    let fresh = plan(rows, facts, ctx.probe, ctx.policies)?;
    if fresh.registry_fingerprint != req.registry_fingerprint {
        return Err(Abort::Refuse(
            Outcome::RegistryRevisionMoved,
            format!(
                "the registry changed since the plan (now {}); plan again",
                fresh.registry_fingerprint
            ),
        ));
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

    // Revalidate every requested identity against the fresh plan.
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

    if let Some(hook) = hooks.before_first_write.as_mut() {
        hook();
    }

    let rejudge = Rejudge::new(&fresh, ctx.policies);
    let retired_at = crate::time::format_ts(crate::time::now());
    let mut capability_checked = false;
    let guard_sql = GUARD
        .iter()
        .enumerate()
        .map(|(i, c)| format!("\"{}\" IS ?{}", c.name(), i + 5))
        .collect::<Vec<_>>()
        .join(" AND ");
    let update = format!(
        "UPDATE {TABLE} SET status = 'retired', retired_at = ?1, retired_by = ?2, \
         retirement_reason = ?3 WHERE worker_identity IS ?4 AND {guard_sql}"
    );
    for entry in targets {
        let row = &fresh.rows[entry.index];
        let w = fresh.identity(entry);
        // Liveness re-probe: the same policies judge the row again with the
        // process probed now (pid definitely gone, this host, a known boot).
        let again = rejudge.entry(entry, ctx.probe);
        let refused = (!again.allowed).then(|| {
            let codes: Vec<&str> = again.reason_codes().iter().map(|r| r.code()).collect();
            format!("the row is no longer eligible ({})", codes.join(", "))
        });
        if let Some(why) = refused {
            report.preserved.push(Kept {
                worker_identity: w,
                reason_code: Reason::LivenessReprobe.code(),
                detail: format!("re-probe before the write refused: {why}"),
            });
            continue;
        }
        // The external fence: any movement aborts everything.
        let now_fence = read_fence(lease_conn, ctx.leases)?;
        if now_fence != fence {
            return Err(Abort::Fail(format!(
                "the active leases changed inside the transaction ({fence} -> {now_fence}); \
                 every decision was made against a world that no longer exists, so nothing was retired"
            )));
        }
        if !capability_checked {
            if let Some(why) = capability(ctx)? {
                return Err(Abort::Refuse(
                    Outcome::PermissionDenied,
                    format!(
                        "capability re-read before the first write: {why}; nothing was retired"
                    ),
                ));
            }
            tx.execute_batch(AUDIT_DDL)?;
            capability_checked = true;
        }
        let mut params: Vec<rusqlite::types::Value> = vec![
            rusqlite::types::Value::Text(retired_at.clone()),
            rusqlite::types::Value::Text(ctx.profile.to_string()),
            rusqlite::types::Value::Text(Reason::Eligible.code().to_string()),
            sql(row.get(Col::WorkerIdentity)),
        ];
        params.extend(GUARD.iter().map(|c| sql(row.get(*c))));
        let changed = tx
            .prepare_cached(&update)?
            .execute(rusqlite::params_from_iter(params))?;
        if changed != 1 {
            if changed > 1 {
                return Err(Abort::Fail(format!(
                    "the guarded UPDATE for {w} matched {changed} rows"
                )));
            }
            report.preserved.push(Kept {
                worker_identity: w,
                reason_code: Reason::RowChanged.code(),
                detail:
                    "the guarded UPDATE matched no row; the registration changed since the plan"
                        .into(),
            });
            continue;
        }
        let evidence = serde_json::to_string(&fresh.evidence(entry))
            .map_err(|e| Abort::Fail(e.to_string()))?;
        tx.prepare_cached(
            "INSERT INTO retirement_audit (worker_identity, retired_at, retired_by, retirement_reason,
             registry_fingerprint, candidate_fingerprint, policy_fingerprint,
             external_state_fingerprint, evidence) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?
        .execute(rusqlite::params![
                w,
                retired_at,
                ctx.profile,
                Reason::Eligible.code(),
                req.registry_fingerprint,
                req.candidate_fingerprint,
                req.policy_fingerprint,
                fence,
                evidence
            ])?;
        report.retired.push(Retired {
            worker_identity: w,
            retired_at: retired_at.clone(),
            retired_by: ctx.profile.to_string(),
        });
    }
    Ok(())
}
