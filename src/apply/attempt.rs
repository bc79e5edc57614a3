//! Apply's transaction from BEGIN to COMMIT's answer: one attempt, or for
//! a host-scoped apply the attempts a serialization failure calls for, and
//! what each ending (committed, rolled back, unknown) makes of the report.

use super::*;

/// How many times a host-scoped apply runs its transaction at most.
const ATTEMPTS: u32 = 10;

/// The transaction, COMMITted or rolled back, and after a COMMIT the plan
/// of the registry as committed. A host-scoped apply the server rolled
/// back as unserializable with a concurrent transaction (PostgreSQL's
/// predicate locks are page-grained, so two hosts' applies can collide on
/// an index page neither needs of the other) runs it again after a
/// random pause and its turn among the applies trying again
/// ([`ApplyConnection::take_turn`]), up to [`ATTEMPTS`] times: each
/// attempt begins afresh and reads and judges the scope under the lock
/// exactly as the first, so a real change of the scope still refuses it. A whole-registry apply does
/// not: its re-read under the lock would be the whole registry, and a race
/// it loses is nearly always a write its token covers.
pub(super) fn transaction(
    req: &Request,
    ctx: &Context,
    (conn, lease_source): (&mut dyn ApplyConnection, &mut dyn FenceSource),
    prejudged: std::result::Result<Prejudged, NotJudged>,
    mut hooks: Hooks,
    standing: &mut Standing,
    installed: Option<u64>,
) -> (Report, Option<crate::plan::Plan>) {
    let mut prejudged = Some(prejudged);
    let mut attempt = 1;
    loop {
        let mut report = Report::new(req, Outcome::Applied, "");
        report.versions_install_lock_ms = installed;
        let mut tx = match conn.begin() {
            Ok(tx) => tx,
            Err(why) => {
                report.outcome = Outcome::TransactionFailed;
                report.success = false;
                report.detail = why;
                return (report, None);
            }
        };
        let locked_at = std::time::Instant::now();
        let fail_commit = hooks.fail_commit;
        let mut committed = None;
        let judged = prejudged.take().unwrap_or_else(|| {
            Err(NotJudged::Unread(
                "the transaction is tried again after a serialization failure".into(),
            ))
        });
        let result = inside(
            &mut Txn {
                req,
                ctx,
                tx: &mut *tx,
                leases: &mut *lease_source,
            },
            judged,
            hooks.again(),
            standing,
            &mut report,
        )
        .and_then(|plan| {
            if fail_commit {
                Err(Abort::Fail("injected failure at commit".into()))
            } else {
                committed = Some(plan);
                Ok(())
            }
        });
        let (mut report, raced) = conclude(req, tx, result, report, locked_at);
        report.versions_install_lock_ms = installed;
        if attempt > 1 {
            report.transaction_attempts = Some(attempt);
        }
        if raced && req.scope.is_some() {
            if attempt < ATTEMPTS {
                tracing::info!(
                    attempt,
                    "apply: the server rolled the transaction back as unserializable with a \
                     concurrent one; trying again"
                );
                std::thread::sleep(pause(attempt));
                if let Err(e) = conn.take_turn() {
                    tracing::warn!("apply: trying again without waiting for its turn: {e}");
                }
                attempt += 1;
                continue;
            }
            report.detail.push_str(&format!(
                " (the transaction was rolled back so {attempt} times)"
            ));
        }
        if attempt > 1 {
            conn.end_turn();
        }
        let committed = committed.filter(|_| report.outcome == Outcome::Applied);
        return (report, committed);
    }
}

/// A random pause before attempt `attempt + 1`: up to 25 ms doubled per
/// attempt, at most 800 ms, so colliding applies spread apart.
fn pause(attempt: u32) -> std::time::Duration {
    use std::hash::{BuildHasher, Hasher};
    let bound = (25u64 << attempt.saturating_sub(1).min(5)).min(800);
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    std::time::Duration::from_millis(bound / 2 + random % (bound / 2 + 1))
}

/// COMMIT what `inside` did, or roll it back, and say which in the report;
/// `true` with it when the server rolled it back as unserializable.
fn conclude(
    req: &Request,
    tx: Box<dyn ApplyTx + '_>,
    result: std::result::Result<(), Abort>,
    mut report: Report,
    locked_at: std::time::Instant,
) -> (Report, bool) {
    let lock_ms = || locked_at.elapsed().as_millis() as u64;
    match result {
        Ok(()) => {
            if let Err(e) = tx.commit() {
                if let Error::OutcomeUnknown { .. } = e {
                    return (outcome_unknown(req, &e, report, lock_ms()), false);
                }
                // An error the server answered COMMIT with: it did not
                // commit (a serialization failure among them).
                let abort = Abort::from(e);
                let raced = matches!(abort, Abort::Raced(_));
                let (outcome, detail) = match abort {
                    Abort::Fail(d) => (
                        Outcome::TransactionFailed,
                        format!("nothing was retired: {d}"),
                    ),
                    settled => settled.settled(),
                };
                let mut failed = Report::new(req, outcome, detail);
                failed.success = outcome != Outcome::TransactionFailed;
                failed.external_state_fingerprint = report.external_state_fingerprint.take();
                failed.lock_held_ms = lock_ms();
                return (failed, raced);
            }
            report.lock_held_ms = lock_ms();
            report.retired_count = report.retired.len();
            report.mutation_performed = report.retired_count > 0;
            if report.detail.is_empty() {
                report.detail = match req.first {
                    Some(n) => format!(
                        "retired {} (a batch of the first {n} of the plan's {} candidates; {} \
                         retired by earlier batches)",
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
                    "; {added} row(s) became candidates since the plan (not retired: plan again)"
                ));
            }
            let left = report.verdicts_moved.len();
            if left > 0 {
                report.detail.push_str(&format!(
                    "; {left} row(s) beside the targets stopped being candidates since the plan \
                     (see verdicts_moved; what the targets' verdicts read of them did not move)"
                ));
            }
            (report, false)
        }
        Err(abort) => {
            // Dropping the transaction rolls it back; do it explicitly so a
            // failing rollback is reported too.
            let rolled_back = tx
                .rollback()
                .map(|e| format!(" (rollback also failed: {e})"))
                .unwrap_or_default();
            let raced = matches!(abort, Abort::Raced(_));
            let (outcome, detail) = abort.settled();
            let mut fresh = Report::new(req, outcome, format!("{detail}{rolled_back}"));
            fresh.external_state_fingerprint = report.external_state_fingerprint.take();
            fresh.lock_held_ms = lock_ms();
            fresh.carry_findings(&mut report);
            fresh.read_under_lock = report.read_under_lock.take();
            if outcome == Outcome::TransactionFailed {
                fresh.success = false;
            }
            (fresh, raced)
        }
    }
}

/// The report of an apply whose COMMIT went out and whose reply never
/// came: it names the apply's id and the command that finds out.
fn outcome_unknown(req: &Request, e: &Error, mut report: Report, lock_ms: u64) -> Report {
    let id = report.apply_id.clone().unwrap_or_default();
    let mut unknown = Report::new(
        req,
        Outcome::OutcomeUnknown,
        format!(
            "{e}. The retirements of apply {id} may or may not have been committed. Run \
             `fleet-retire apply-status {id} --registry REGISTRY` (the same registry) before \
             anything else: it answers committed, with the rows, or not committed"
        ),
    );
    unknown.success = false;
    unknown.apply_id = report.apply_id.take();
    unknown.external_state_fingerprint = report.external_state_fingerprint.take();
    unknown.lock_held_ms = lock_ms;
    unknown
}
