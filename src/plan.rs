//! The dry run: observations → Cedar → one verdict per row, plus the tokens.
//!
//! Pure: it takes rows, run facts and a probe, and never opens a file. Apply
//! calls the same function inside its transaction so plan and apply cannot
//! disagree about what they saw.

use crate::error::Result;
use crate::evidence::probe::ProcessProbe;
use crate::fingerprint::{candidate_fingerprint, registry_fingerprint};
use crate::observe::{observe_all, Observation, RunFacts};
use crate::policy::entities::{build, retire_action, run_uid, worker_uid};
use crate::policy::eval::{judge, Verdict};
use crate::policy::Policies;
use crate::reasons::Reason;
use crate::row::{Col, Row};
use cedar_policy::Authorizer;
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;

/// One row's outcome.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Position in the registry (0-based).
    pub index: usize,
    /// Cedar's verdict.
    pub verdict: Verdict,
    /// What was measured.
    pub observation: Observation,
}

impl Entry {
    /// Eligible for retirement.
    pub fn is_candidate(&self) -> bool {
        self.verdict.allowed
    }

    /// Every reason code for a preserved row, first = primary.
    pub fn reason_codes(&self) -> Vec<Reason> {
        self.verdict.reason_codes()
    }

    /// The primary reason code.
    pub fn reason(&self) -> Reason {
        if self.is_candidate() {
            Reason::Eligible
        } else {
            self.reason_codes()
                .first()
                .copied()
                .unwrap_or(Reason::PolicyEvaluationError)
        }
    }
}

/// A complete plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The rows the plan judged, in registry order.
    pub rows: Vec<Row>,
    /// One entry per row.
    pub entries: Vec<Entry>,
    /// Token over every row.
    pub registry_fingerprint: String,
    /// Token over the candidate rows.
    pub candidate_fingerprint: String,
    /// sha256 of the policy set that judged.
    pub policy_fingerprint: String,
    /// What the run was told and observed.
    pub facts: RunFacts,
}

/// Judge every row.
pub fn plan(
    rows: Vec<Row>,
    facts: RunFacts,
    probe: &dyn ProcessProbe,
    policies: &Policies,
) -> Result<Plan> {
    let observations = observe_all(&rows, &facts, probe);
    let entities = build(&rows, &observations, &facts, &policies.schema)?;
    let principal = run_uid();
    let action = retire_action();

    // Evaluation is independent per row; split it over the available cores.
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8);
    let chunk = rows.len().div_ceil(workers.max(1)).max(1);
    let verdicts: Vec<Verdict> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..rows.len())
            .step_by(chunk)
            .map(|start| {
                let end = (start + chunk).min(rows.len());
                let (entities, principal, action) = (&entities, &principal, &action);
                scope.spawn(move || {
                    let authorizer = Authorizer::new();
                    (start..end)
                        .map(|i| {
                            judge(
                                policies,
                                &authorizer,
                                entities,
                                principal,
                                action,
                                &worker_uid(i),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("policy evaluation thread panicked"))
            .collect()
    });

    let entries: Vec<Entry> = verdicts
        .into_iter()
        .zip(observations)
        .enumerate()
        .map(|(index, (verdict, observation))| Entry {
            index,
            verdict,
            observation,
        })
        .collect();
    let registry = registry_fingerprint(&rows);
    let candidate = candidate_fingerprint(
        entries
            .iter()
            .filter(|e| e.is_candidate())
            .map(|e| &rows[e.index]),
    );
    Ok(Plan {
        rows,
        entries,
        registry_fingerprint: registry,
        candidate_fingerprint: candidate,
        policy_fingerprint: policies.fingerprint.clone(),
        facts,
    })
}

impl Plan {
    /// The candidate entries, in registry order.
    pub fn candidates(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.is_candidate())
    }

    /// The preserved entries, in registry order.
    pub fn preserved(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| !e.is_candidate())
    }

    /// The canonical identity of an entry's row.
    pub fn identity(&self, entry: &Entry) -> String {
        self.rows[entry.index].get(Col::WorkerIdentity).canon()
    }

    /// The evidence block for one entry (the seed's evidence keys).
    pub fn evidence(&self, entry: &Entry) -> Json {
        let row = &self.rows[entry.index];
        let obs = &entry.observation;
        let v = |c: Col| row.get(c).to_json();
        let client_type =
            crate::identity::normalize_client_name(row.get(Col::ClientName).as_text());
        json!({
            "worker_identity": v(Col::WorkerIdentity),
            "client_type": client_type,
            "client_instance_id": v(Col::ClientInstanceId),
            "fleet_run_id": v(Col::FleetRunId),
            "namespace": v(Col::Namespace),
            "profile": v(Col::Profile),
            "declared_role": v(Col::Role),
            "session_id": v(Col::SessionId),
            "generation_id": v(Col::GenerationId),
            "fencing_epoch": v(Col::FencingEpoch),
            "process_identity": obs.process_identity.to_json(),
            "pid": v(Col::Pid),
            "pid_alive": obs.pid.alive,
            "live_process_start_time": obs.pid.start_time,
            "host_id": v(Col::HostId),
            "boot_id": v(Col::BootId),
            "process_start_time": v(Col::ProcessStartTime),
            "repository_binding": v(Col::RepositoryBinding),
            "foreign_repository": obs.foreign_repository,
            "status": v(Col::Status),
            "started_at": v(Col::StartedAt),
            "last_heartbeat_at": v(Col::LastHeartbeatAt),
            "heartbeat_ttl_seconds": v(Col::HeartbeatTtlSeconds),
            "canonical_heartbeat_ttl_seconds": obs.liveness.heartbeat_ttl_seconds,
            "heartbeat_age_seconds": obs.liveness.heartbeat_age_seconds,
            "heartbeat_fresh": obs.liveness.heartbeat_fresh,
            "live": obs.live,
            "ownership_state": obs.ownership_state,
            "instance_id_provenance": obs.identity.provenance,
            "instance_identity_trusted": obs.identity.trusted,
            "identity_row_count": obs.identity_row_count,
            "shared_identity_evidence": obs.shared_identity_evidence,
            "instance_slot_contested": obs.instance_slot_contested,
            "protected_by_active_leases": obs.protected_hits,
        })
    }

    fn entry_json(&self, entry: &Entry) -> Json {
        let row = &self.rows[entry.index];
        let mut m = Map::new();
        m.insert(
            "worker_identity".into(),
            row.get(Col::WorkerIdentity).to_json(),
        );
        m.insert("reason_code".into(), json!(entry.reason().code()));
        if entry.is_candidate() {
            m.insert(
                "detail".into(),
                json!(
                    "no eligibility policy forbids retirement: dead pid, expired heartbeat, \
                       proven identity and host, canonical binding, no active ownership"
                ),
            );
        } else {
            let codes: Vec<&str> = entry.reason_codes().iter().map(|r| r.code()).collect();
            m.insert("reason_codes".into(), json!(codes));
            let detail = match entry.verdict.forbids.first() {
                Some(rule) if entry.verdict.errors.is_empty() => {
                    format!("{} [policy {}]", rule.description, rule.id)
                }
                _ => format!(
                    "policy evaluation failed; the row is kept: {}",
                    if entry.verdict.errors.is_empty() {
                        "denied with no determining policy".to_string()
                    } else {
                        entry.verdict.errors.join("; ")
                    }
                ),
            };
            m.insert("detail".into(), json!(detail));
            m.insert(
                "policy_ids".into(),
                json!(entry
                    .verdict
                    .forbids
                    .iter()
                    .map(|r| r.id.as_str())
                    .collect::<Vec<_>>()),
            );
        }
        m.insert("evidence".into(), self.evidence(entry));
        Json::Object(m)
    }

    /// Count of preserved rows by primary reason code.
    pub fn reason_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for e in self.preserved() {
            *counts.entry(e.reason().code()).or_default() += 1;
        }
        counts
    }

    /// The plan as the stable JSON document.
    pub fn to_json(&self) -> Json {
        let candidates: Vec<Json> = self.candidates().map(|e| self.entry_json(e)).collect();
        let preserved: Vec<Json> = self.preserved().map(|e| self.entry_json(e)).collect();
        let identities: Vec<Json> = self
            .candidates()
            .map(|e| self.rows[e.index].get(Col::WorkerIdentity).to_json())
            .collect();
        let p = &self.facts.protections;
        json!({
            "success": true,
            "read_only": true,
            "mutation_performed": false,
            "outcome": "planned",
            "registry_fingerprint": self.registry_fingerprint,
            "candidate_fingerprint": self.candidate_fingerprint,
            "policy_fingerprint": self.policy_fingerprint,
            "assessed_count": self.entries.len(),
            "candidate_count": candidates.len(),
            "preserved_count": preserved.len(),
            "candidate_worker_identities": identities,
            "candidates": candidates,
            "preserved": preserved,
            "preserved_reason_counts": self.reason_counts(),
            "protected_inputs": {
                "worker_identities": p.worker_identities,
                "session_ids": p.session_ids,
                "pids": p.pids,
            },
            "canonical_repository": self.facts.canonical_repository,
            "fencing_context": {
                "current_host_id": self.facts.host.host_id,
                "current_boot_id": self.facts.host.boot_id,
                "start_time_probe_available": true,
            },
        })
    }
}
