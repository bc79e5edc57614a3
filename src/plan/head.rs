//! The head of a plan document: every top-level member before the per-row
//! lists, as one type. `plan` writes it; `apply` reads it back from a saved
//! plan (`plan --out`) through the same type, so the two cannot drift apart
//! on a key's name or shape. Reading is two steps, as for fixtures: serde
//! takes the file as it is ([`PlanHead`]), then [`PlanHead::checked`] turns
//! it into what apply needs, naming the member of anything wrong.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::{BTreeMap, BTreeSet};

/// What the active leases protected when the plan was made.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProtectedInputs {
    /// `owner_worker_identity` values.
    pub worker_identities: BTreeSet<String>,
    /// Session ids.
    pub session_ids: BTreeSet<String>,
    /// Pids, as canonical text.
    pub pids: BTreeSet<String>,
}

/// The host facts the plan's fencing judgments used.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FencingContext {
    /// This host's id, when known.
    pub current_host_id: Option<String>,
    /// This boot's id, when known.
    pub current_boot_id: Option<String>,
    /// Whether process start times could be read here.
    pub start_time_probe_available: bool,
    /// Rows registered on another host: this host's process table cannot
    /// speak for them, and the policies keep them (`host_binding_unproven`,
    /// or an earlier reason); they are retired from their own host.
    #[serde(default)]
    pub other_host_rows: usize,
}

/// The head of a plan document, in the order it is written. Members apply
/// does not need default when absent, so a plan of an older version (or of
/// the original system) still reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PlanHead {
    /// Always true for a plan.
    #[serde(default)]
    pub success: bool,
    /// A plan writes nothing.
    #[serde(default)]
    pub read_only: bool,
    /// A plan writes nothing.
    #[serde(default)]
    pub mutation_performed: bool,
    /// `planned`.
    #[serde(default)]
    pub outcome: String,
    /// The registry token apply must see again.
    pub registry_fingerprint: Option<String>,
    /// The candidate token apply must derive again.
    pub candidate_fingerprint: Option<String>,
    /// The policy set that decided.
    pub policy_fingerprint: Option<String>,
    /// Rows judged.
    #[serde(default)]
    pub assessed_count: usize,
    /// Rows that may be retired.
    #[serde(default)]
    pub candidate_count: usize,
    /// Rows kept.
    #[serde(default)]
    pub preserved_count: usize,
    /// Kept rows per primary reason code.
    #[serde(default)]
    pub preserved_reason_counts: BTreeMap<String, usize>,
    /// What the active leases protected.
    #[serde(default)]
    pub protected_inputs: ProtectedInputs,
    /// The repository binding the plan expected (`null`: any).
    #[serde(default)]
    pub canonical_repository: Option<String>,
    /// The host facts used.
    #[serde(default)]
    pub fencing_context: FencingContext,
    /// The candidates' identities, in registry order, as stored.
    pub candidate_worker_identities: Option<Vec<Json>>,
    /// What a host-scoped plan read (`plan --scope host`); absent from a
    /// plan of the whole registry, whose document stays the seed's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<ScopeHead>,
}

/// What a host-scoped plan read, in one snapshot (docs/semantics.md §17).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeHead {
    /// `host`.
    pub kind: String,
    /// The host whose rows these are.
    pub host_id: String,
    /// Its active rows, read and judged (the plan's entries).
    pub own_rows: usize,
    /// The peer rows read for their verdicts (not judged for themselves).
    pub peer_rows: usize,
    /// Its rows of other statuses, counted and not read: none of them can
    /// be a candidate.
    pub terminal_rows: u64,
}

impl PlanHead {
    /// The top-level keys the head has (what a streamed reader keeps).
    pub const KEYS: &'static [&'static str] = &[
        "success",
        "read_only",
        "mutation_performed",
        "outcome",
        "registry_fingerprint",
        "candidate_fingerprint",
        "policy_fingerprint",
        "assessed_count",
        "candidate_count",
        "preserved_count",
        "preserved_reason_counts",
        "protected_inputs",
        "canonical_repository",
        "fencing_context",
        "candidate_worker_identities",
        "scope",
    ];

    /// The members apply needs, checked; an error names the member and
    /// what to do.
    pub fn checked(self) -> Result<CheckedHead, String> {
        let required = |v: Option<String>, k: &str| {
            v.ok_or_else(|| {
                format!("missing `{k}`; is this a plan written by `fleet-retire plan --out`?")
            })
        };
        let workers = self
            .candidate_worker_identities
            .ok_or("missing `candidate_worker_identities` (a list of strings)")?
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Json::String(s) => Ok(s),
                other => Err(format!(
                    "`candidate_worker_identities[{i}]` must be a string, not {other}"
                )),
            })
            .collect::<Result<_, _>>()?;
        let canonical_repository = self
            .canonical_repository
            .map(|r| {
                crate::text::nonblank_repository(&r)
                    .map_err(|e| format!("`canonical_repository`: {e}"))
            })
            .transpose()?;
        let scoped = [&self.registry_fingerprint, &self.candidate_fingerprint]
            .iter()
            .map(|t| {
                t.as_deref()
                    .is_some_and(|t| t.starts_with(crate::fingerprint::HOST_SCOPE))
            })
            .collect::<Vec<bool>>();
        let scope = match (&self.scope, scoped.as_slice()) {
            (Some(s), [true, true]) if s.kind == "host" => Some(s.host_id.clone()),
            (None, [false, false]) => None,
            _ => {
                return Err("its `scope` and its tokens disagree (a host-scoped plan, \
                            `plan --scope host`, has both a `scope` member and `host-scope:` \
                            tokens; a plan of the whole registry has neither); plan again"
                    .into())
            }
        };
        Ok(CheckedHead {
            scope,
            registry_fingerprint: required(self.registry_fingerprint, "registry_fingerprint")?,
            candidate_fingerprint: required(self.candidate_fingerprint, "candidate_fingerprint")?,
            policy_fingerprint: required(self.policy_fingerprint, "policy_fingerprint")?,
            workers,
            canonical_repository,
        })
    }
}

/// What apply takes from a saved plan, checked.
#[derive(Debug, Clone)]
pub struct CheckedHead {
    /// The plan's registry token.
    pub registry_fingerprint: String,
    /// The plan's candidate token.
    pub candidate_fingerprint: String,
    /// The plan's policy fingerprint.
    pub policy_fingerprint: String,
    /// The candidates to retire.
    pub workers: Vec<String>,
    /// The repository binding the plan expected; never blank.
    pub canonical_repository: Option<String>,
    /// The host whose scope a host-scoped plan judged (`plan --scope
    /// host`); `None` for a plan of the whole registry.
    pub scope: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_members_in_written_order() {
        // `scope` is written only by a host-scoped plan.
        let scoped = PlanHead {
            scope: Some(ScopeHead::default()),
            ..PlanHead::default()
        };
        let whole = serde_json::to_value(PlanHead::default()).unwrap();
        assert!(whole.get("scope").is_none());
        let written = serde_json::to_value(scoped).unwrap();
        let keys: Vec<&str> = written
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, PlanHead::KEYS);
    }

    #[test]
    fn a_wrongly_typed_member_is_named() {
        let head: PlanHead = serde_json::from_value(serde_json::json!({
            "registry_fingerprint": "r", "candidate_fingerprint": "c",
            "policy_fingerprint": "p", "candidate_worker_identities": ["w", 7]
        }))
        .unwrap();
        let e = head.checked().unwrap_err();
        assert!(e.contains("candidate_worker_identities[1]"), "{e}");
    }
}
