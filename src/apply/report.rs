//! What an apply says happened: its outcome, the workers it retired and
//! kept, and the tokens it held the registry to.

use super::Request;
use serde::Serialize;

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
    /// The connection was lost after COMMIT was sent and before its reply:
    /// the retirements may or may not have been committed
    /// (`fleet-retire apply-status APPLY_ID` says which).
    OutcomeUnknown,
    /// An apply of `fleet-retire controller` whose lease was no longer its
    /// own with the same term, or had expired, inside the transaction.
    LeadershipLost,
    /// An apply of `fleet-retire controller` with more targets than the
    /// host's retirement budget held.
    BudgetExhausted,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 16] = [
        Outcome::Applied,
        Outcome::RegistryRevisionMoved,
        Outcome::CandidateSetMoved,
        Outcome::PolicySetMoved,
        Outcome::AlreadyRetired,
        Outcome::NothingRequested,
        Outcome::BlastRadiusExceeded,
        Outcome::PermissionDenied,
        Outcome::PolicySetNotPinned,
        Outcome::RegistryUntrusted,
        Outcome::LeaseStoreUnavailable,
        Outcome::RegistryUnavailable,
        Outcome::TransactionFailed,
        Outcome::OutcomeUnknown,
        Outcome::LeadershipLost,
        Outcome::BudgetExhausted,
    ];

    /// The outcome's code, as the report's `outcome` field spells it.
    pub fn code(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::RegistryRevisionMoved => "registry_revision_moved",
            Outcome::CandidateSetMoved => "candidate_set_moved",
            Outcome::PolicySetMoved => "policy_set_moved",
            Outcome::AlreadyRetired => "already_retired",
            Outcome::NothingRequested => "nothing_requested",
            Outcome::BlastRadiusExceeded => "blast_radius_exceeded",
            Outcome::PermissionDenied => "permission_denied",
            Outcome::PolicySetNotPinned => "policy_set_not_pinned",
            Outcome::RegistryUntrusted => "registry_untrusted",
            Outcome::LeaseStoreUnavailable => "lease_store_unavailable",
            Outcome::RegistryUnavailable => "registry_unavailable",
            Outcome::TransactionFailed => "transaction_failed",
            Outcome::OutcomeUnknown => "outcome_unknown",
            Outcome::LeadershipLost => "leadership_lost",
            Outcome::BudgetExhausted => "budget_exhausted",
        }
    }

    /// What an operator does about this outcome (the report's `detail`
    /// says it for the case at hand).
    pub fn what_to_do(self) -> &'static str {
        match self {
            Outcome::Applied | Outcome::AlreadyRetired | Outcome::NothingRequested => "nothing",
            Outcome::RegistryRevisionMoved | Outcome::CandidateSetMoved | Outcome::PolicySetMoved => {
                "plan again (`fleet-retire plan --out PLAN.json`) and apply the new plan"
            }
            Outcome::BlastRadiusExceeded => {
                "apply in batches (`--first N`, or `--all-batches`), or raise --max-retire after review"
            }
            Outcome::PermissionDenied => {
                "apply with a profile holding gitea.worker_registry.retire (a controller or reconciler); `fleet-retire grants` shows who holds it"
            }
            Outcome::PolicySetNotPinned => {
                "use the built-in policies, or pin this set's fingerprint in profiles.json (\"policy_pins\")"
            }
            Outcome::RegistryUntrusted => {
                "inspect the registry database for the objects the detail names and drop them (docs/multi-host.md); nothing was retired"
            }
            Outcome::LeaseStoreUnavailable | Outcome::RegistryUnavailable => {
                "check the store the detail names (path or URL, permissions, that its server answers and is the writable member), then plan again"
            }
            Outcome::TransactionFailed => "nothing was retired: read the detail, then plan and apply again",
            Outcome::OutcomeUnknown => {
                "do not apply again yet: run `fleet-retire apply-status APPLY_ID` on the registry, which says whether it committed"
            }
            Outcome::LeadershipLost => {
                "nothing: another controller of this host leads now, or this one takes its lease again (a new term) and plans afresh"
            }
            Outcome::BudgetExhausted => {
                "wait for the budget to refill (--budget N/DURATION), or raise it deliberately after review"
            }
        }
    }

    /// The exit code this outcome maps to.
    pub fn exit_code(self) -> crate::error::ExitCode {
        use crate::error::ExitCode;
        match self {
            Outcome::Applied | Outcome::AlreadyRetired | Outcome::NothingRequested => ExitCode::Ok,
            Outcome::OutcomeUnknown => ExitCode::OutcomeUnknown,
            Outcome::RegistryUnavailable
            | Outcome::TransactionFailed
            | Outcome::LeaseStoreUnavailable => ExitCode::Error,
            _ => ExitCode::Refused,
        }
    }
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
    /// What was asked: the workers named, or, for a batch (`first`), the
    /// plan's candidates the batch walked (its targets and the rows it
    /// kept), empty when it was refused before its targets were chosen.
    pub requested: Vec<String>,
    /// The batch size asked for, when the request was "the first N
    /// candidates of the plan" rather than named workers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first: Option<usize>,
    /// The id this apply's audit rows carry, once it reached its writes
    /// (`fleet-retire apply-status APPLY_ID` reads them back).
    pub apply_id: Option<String>,
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
    /// With the plan's rows at hand, rows whose verdict moved since the
    /// plan. Refused `candidate_set_moved`: the rows that refused it (the
    /// targets whose own verdict moved, or, for a plan without peer facts,
    /// rows near a target), or, when a target's peer facts moved, every
    /// moved row beside the targets, or, when the plan's verdicts do not make
    /// its token, every moved row. Applied: the rows beside the targets
    /// that stopped being candidates; they refuse nothing (semantics §13).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verdicts_moved: Vec<crate::plan::planned::VerdictMoved>,
    /// Rows that were not candidates at plan time and are now (a heartbeat
    /// that expired, a process that ended, a lease released), beside the
    /// targets: reported, never retired by this apply (semantics §13); plan
    /// again to retire them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub candidates_added_since_plan: Vec<String>,
    /// Candidates of the plan retired since it was made (an earlier batch
    /// of the same plan): neither a change that refuses nor a target.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retired_since_plan: Vec<String>,
    /// Rows added since the plan, or changed beyond a heartbeat, none of
    /// them a candidate of the plan (another server's registration, a
    /// worker restarted): they refuse the apply only through what they move
    /// for its targets (semantics §13).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rows_changed_since_plan: Vec<String>,
    /// How long the registry's write lock was held (BEGIN IMMEDIATE to
    /// COMMIT or ROLLBACK), in milliseconds; workers cannot heartbeat
    /// meanwhile.
    pub lock_held_ms: u64,
    /// When this apply installed the row-version bookkeeping (the first
    /// apply into a registry the seed made), how long that transaction of
    /// its own held the write lock, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versions_install_lock_ms: Option<u64>,
    /// How the registry was read under the lock: only the rows changed
    /// since a judgement made outside it, or whole (and why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_under_lock: Option<super::ReadUnderLock>,
    /// How many times a host-scoped apply ran its transaction, when more
    /// than once: the server rolled the earlier ones back as
    /// unserializable with a concurrent transaction (SQLSTATE 40001 or
    /// 40P01), and each retry read and judged the scope again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction_attempts: Option<u32>,
    /// A sentence for a person.
    pub detail: String,
    /// The fleet after the transaction: retiring stale rows does not by
    /// itself make an untrusted fleet safe.
    pub post_apply: Option<serde_json::Value>,
    /// After a COMMIT, what still stands in the way, in the plan's words:
    /// the stale rows by the reason the re-plan keeps them, with what
    /// happens next, and the other blockers by class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub residual: Option<super::residual::Residual>,
    /// For an apply of a saved plan (set by the command line): how many of
    /// the plan's candidates are not retired yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left: Option<usize>,
    /// For an apply of a saved plan (set by the command line): the command
    /// that retires the next batch, when any is left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_command: Option<String>,
}

impl Report {
    /// Take over what the steps found about the registry since the plan
    /// (what was tolerated, what moved, the batch walked) from a report
    /// those steps filled, for the report that answers the apply.
    pub(super) fn carry_findings(&mut self, from: &mut Report) {
        self.requested = std::mem::take(&mut from.requested);
        self.heartbeats_tolerated = from.heartbeats_tolerated;
        self.heartbeats_tolerated_workers = std::mem::take(&mut from.heartbeats_tolerated_workers);
        self.verdicts_moved = std::mem::take(&mut from.verdicts_moved);
        self.candidates_added_since_plan = std::mem::take(&mut from.candidates_added_since_plan);
        self.retired_since_plan = std::mem::take(&mut from.retired_since_plan);
        self.rows_changed_since_plan = std::mem::take(&mut from.rows_changed_since_plan);
    }

    pub(super) fn new(req: &Request, outcome: Outcome, detail: impl Into<String>) -> Report {
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
            requested: match req.first {
                Some(_) => Vec::new(),
                None => req.workers.clone(),
            },
            first: req.first,
            apply_id: None,
            registry_fingerprint: req.registry_fingerprint.clone(),
            candidate_fingerprint: req.candidate_fingerprint.clone(),
            policy_fingerprint: req.policy_fingerprint.clone(),
            external_state_fingerprint: None,
            max_retire: req.max_retire,
            heartbeats_tolerated: 0,
            heartbeats_tolerated_workers: Vec::new(),
            verdicts_moved: Vec::new(),
            candidates_added_since_plan: Vec::new(),
            retired_since_plan: Vec::new(),
            rows_changed_since_plan: Vec::new(),
            lock_held_ms: 0,
            versions_install_lock_ms: None,
            read_under_lock: None,
            transaction_attempts: None,
            detail: detail.into(),
            post_apply: None,
            residual: None,
            left: None,
            next_command: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Outcome;

    /// The code a tool result or a summary names is the report's own field.
    #[test]
    fn every_code_is_the_serialised_outcome() {
        for outcome in Outcome::ALL {
            assert_eq!(
                serde_json::to_value(outcome).unwrap(),
                serde_json::json!(outcome.code())
            );
        }
    }
}
