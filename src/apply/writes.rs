//! The writes and what guards them: each target's checks (capability,
//! re-probe, lease fence) beside the engine's image, the guarded writes
//! with their audit rows, and the check of the transaction's effect before
//! COMMIT.

use super::*;

/// What the targets' checks before the writes need besides the
/// transaction (they never use it, so an engine may read while they run).
pub(super) struct Checks<'a, 'h, 's> {
    pub(super) ctx: &'a Context<'a>,
    pub(super) leases: &'a mut dyn FenceSource,
    pub(super) hooks: &'a mut Hooks<'h>,
    pub(super) standing: &'a mut Standing<'s>,
}

impl Checks<'_, '_, '_> {
    /// What the registry and audit hold before the first write (the
    /// transaction's effect is checked against it before COMMIT), taken by
    /// `tx` while the targets' own checks run, where the engine can; then
    /// the grant once more, right before the writes: the image may have
    /// outlasted the checks (seconds at a million rows on PostgreSQL), and
    /// a revocation meanwhile must still stop them. The targets admitted.
    pub(super) fn beside_the_image(
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
pub(super) struct Writes<'p> {
    pub(super) fence: leases::Fence,
    /// Whether the fence was checked before a write yet.
    pub(super) fence_checked: bool,
    pub(super) rejudge: Rejudge<'p>,
    pub(super) fresh: &'p crate::plan::Plan,
    pub(super) audit: &'p AuditContext,
    /// The rows (by index) this transaction retired.
    pub(super) written: Vec<usize>,
}

/// A target that passed its checks, waiting for the write.
pub(super) struct Pending {
    /// Its entry's index in the plan.
    pub(super) index: usize,
    pub(super) worker_identity: String,
    /// Its evidence as the audit row records it.
    pub(super) evidence: String,
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
    pub(super) fn write_all(
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
                    rows_changed_since_plan: report.rows_changed_since_plan.len() as i64,
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
pub(super) fn verify_before_commit(
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
                 triggers (docs/multi-host.md, \"The roles, and exactly their grants\")"
            ),
        )),
        None => Ok(()),
    }
}
