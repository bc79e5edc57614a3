//! Every reason code the program reports, with a one-line description.
//! The strings are the seed's, exactly (docs/semantics.md §8).

macro_rules! reasons {
    ($($variant:ident => $code:literal, $plan:literal, $desc:literal;)*) => {
        /// A reason code: why a row is a candidate, was preserved, or was
        /// refused at apply.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(missing_docs)]
        pub enum Reason { $($variant),* }

        /// Every reason code, in declaration order.
        pub const ALL: &[Reason] = &[$(Reason::$variant),*];

        impl Reason {
            /// The stable code string.
            pub fn code(self) -> &'static str {
                match self { $(Reason::$variant => $code),* }
            }
            /// One line saying what the code means.
            pub fn description(self) -> &'static str {
                match self { $(Reason::$variant => $desc),* }
            }
            /// Whether an eligibility policy carries this code (as opposed
            /// to codes produced by apply or by the evaluator itself).
            pub fn is_policy_reason(self) -> bool {
                match self { $(Reason::$variant => $plan),* }
            }
            /// Look a code up.
            pub fn from_code(code: &str) -> Option<Reason> {
                match code { $($code => Some(Reason::$variant),)* _ => None }
            }
        }
    };
}

reasons! {
    Eligible => "eligible_stale_orphan", false,
        "Every requirement holds: dead pid, expired heartbeat, proven identity, no active ownership.";
    ConflictingIdentity => "conflicting_identity_evidence", true,
        "The identity is on several rows, or its evidence is shared with a live or unprobeable worker.";
    AlreadyTerminal => "already_terminal_registration", true,
        "The registration is not active; there is nothing to retire.";
    IncompleteIdentity => "incomplete_registry_identity", true,
        "A field the conjunction reads (including the fencing triple) is missing or blank.";
    UnparsableHeartbeat => "unparsable_heartbeat", true,
        "last_heartbeat_at is not a strict UTC stamp; liveness is unknown.";
    WorkerLive => "worker_live", true,
        "The worker is live.";
    PidUnknown => "pid_liveness_unknown", true,
        "The pid could not be probed; liveness is unproven.";
    PidReused => "pid_reuse_detected", true,
        "The pid number is held by another process incarnation on this host and boot.";
    PidAlive => "pid_alive", true,
        "The recorded pid is still running.";
    HeartbeatFresh => "heartbeat_not_expired", true,
        "The heartbeat has not expired under the canonical TTL.";
    AmbiguousOwnership => "ambiguous_ownership_state", true,
        "The ownership classification is not exactly stale.";
    ForeignRepository => "repository_binding_ambiguous", true,
        "The repository binding is absent or not the canonical repository.";
    ProtectedOwner => "protected_active_workflow_owner", true,
        "An active workflow lease names this worker, its session or its pid.";
    InstanceConflict => "client_instance_conflict", true,
        "Another active row claims the same instance and namespace while one may be live.";
    UntrustedProvenance => "untrusted_identity_provenance", true,
        "The instance id is not launcher-minted (inst-...); nothing proves which launch the row belongs to.";
    HostUnproven => "host_binding_unproven", true,
        "This host is unknown, or the row was registered on another host.";
    PidNamespaceMismatch => "pid_namespace_mismatch", true,
        "The row was registered in another pid namespace than this run's, where its pid cannot be probed.";
    PidNamespaceUnproven => "pid_namespace_unproven", true,
        "The row records no pid namespace and this run is not in the initial one, so its pid may be invisible here.";
    BootUnknown => "boot_identity_unknown", true,
        "The boot identity is unknown, so pids cannot be compared.";
    PolicyEvaluationError => "policy_evaluation_error", false,
        "A policy failed to evaluate, or a denial had no determining policy; the row is kept.";
    NotInPlan => "not_in_current_plan", false,
        "Apply: the requested worker is not a candidate of the re-derived plan.";
    RegistrationMissing => "registration_missing", false,
        "Apply: the requested worker is no longer in the registry.";
    RowChanged => "row_changed_since_plan", false,
        "Apply: the guarded UPDATE matched no row; the registration changed since the plan.";
    LivenessReprobe => "liveness_reprobe_refused", false,
        "Apply: the re-probe before the write could not re-establish that this exact process is gone.";
}

impl Reason {
    /// What happens next to an active row kept for this reason, as one
    /// phrase after its count ("7,597 become eligible as …"): what an
    /// operator reads after an apply, in the plan's own words.
    pub fn next_step(self) -> &'static str {
        match self {
            Reason::Eligible => "may be retired now: a plan in progress retires those it holds in its next batch; plan again for the others, which became candidates after it",
            Reason::ConflictingIdentity => "share their identity or its evidence with another row: `fleet-retire explain --worker W` names it",
            Reason::AlreadyTerminal => "are history already: nothing to do",
            Reason::IncompleteIdentity => "lack a field the rules read (registered by an older version): never retired automatically; `fleet-retire explain --worker W` names it",
            Reason::UnparsableHeartbeat => "carry a heartbeat that is not a UTC stamp: never retired automatically; `fleet-retire explain --worker W` shows it",
            Reason::WorkerLive => "are live by the plan's rules: nothing to do",
            Reason::PidUnknown => "have a pid this host cannot probe: run on the host that registered them",
            Reason::PidReused => "have their pid taken by a new process: eligible once it ends or the host reboots; plan again then",
            Reason::PidAlive => "still have a running process: stop it or let it end, then plan again",
            Reason::HeartbeatFresh => "become eligible as their TTLs lapse",
            Reason::AmbiguousOwnership => "have an ownership state that is not exactly stale: `fleet-retire explain --worker W` shows it",
            Reason::ForeignRepository => "are bound to another repository: plan with its --canonical-repository",
            Reason::ProtectedOwner => "own an active workflow lease: eligible once it is released; plan again then",
            Reason::InstanceConflict => "share an instance slot with a worker that may be live: eligible once it is not",
            Reason::UntrustedProvenance => "have untrusted identities: relaunch them through `fleet-retire launch`",
            Reason::HostUnproven => "belong to other hosts: run there",
            Reason::PidNamespaceMismatch => "were registered in another pid namespace: run from that namespace",
            Reason::PidNamespaceUnproven => "record no pid namespace and this run is not in the initial one: run from the host's initial pid namespace",
            Reason::BootUnknown => "have no boot identity this host can compare: `fleet-retire explain --worker W` shows why",
            Reason::PolicyEvaluationError => "could not be judged (a policy failed): `fleet-retire explain --worker W`, then fix the policy set",
            Reason::NotInPlan
            | Reason::RegistrationMissing
            | Reason::RowChanged
            | Reason::LivenessReprobe => "were kept by an apply: plan again",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn codes_are_unique_and_round_trip() {
        let codes: HashSet<&str> = ALL.iter().map(|r| r.code()).collect();
        assert_eq!(codes.len(), ALL.len());
        for r in ALL {
            assert_eq!(Reason::from_code(r.code()), Some(*r));
            assert!(!r.description().is_empty());
            assert!(!r.next_step().is_empty());
        }
    }
}
