//! Observations: what Rust measures about each row before Cedar judges it.
//!
//! Per row: the pid probe, liveness (docs/semantics.md §2), the snapshot's ownership
//! classification, instance-identity trust (for evidence). Across rows: how
//! many rows carry the same identity, which identity evidence is held by a
//! live or unprobeable worker, and which (instance, namespace) slots are
//! contested. Nothing here decides eligibility.

use crate::evidence::leases::Protections;
use crate::evidence::probe::{observe_pid, HostFacts, PidObservation, ProcessProbe};
use crate::identity::{classify_instance_identity, InstanceClass};
use crate::liveness::{assess, Liveness};
use crate::row::{Col, Row};
use crate::time::Micros;
use crate::value::{Val, Value};
use std::borrow::Cow;

/// Everything a run was told or observed about its surroundings.
#[derive(Debug, Clone)]
pub struct RunFacts {
    /// The planning clock.
    pub now: Micros,
    /// This host's fencing facts.
    pub host: HostFacts,
    /// The expected repository binding (`None`: any non-blank binding).
    pub canonical_repository: Option<String>,
    /// What the active leases protect.
    pub protections: Protections,
    /// The active leases themselves, so `explain` can name the lease that
    /// protects a row (by its id), not only the value it matched.
    pub active_leases: Vec<crate::evidence::leases::Lease>,
}

impl RunFacts {
    /// The facts of a run on this host now: the clock, this host's fencing
    /// facts read under `proc_root`, and what the given active leases
    /// protect. Plan, explain, serve, the demo and apply's re-plan under
    /// the lock all take them here, so they cannot disagree on what a run
    /// knows.
    pub fn of_this_host(
        proc_root: &std::path::Path,
        canonical_repository: Option<String>,
        leases: &[crate::evidence::leases::Lease],
    ) -> RunFacts {
        RunFacts {
            now: crate::time::now(),
            host: HostFacts::observe(proc_root),
            canonical_repository,
            protections: Protections::from_leases(leases),
            active_leases: leases.iter().filter(|l| l.is_active()).cloned().collect(),
        }
    }
}

/// What was measured about one row.
#[derive(Debug, Clone)]
pub struct Observation {
    /// The pid probe.
    pub pid: PidObservation,
    /// Liveness at the planning clock.
    pub liveness: Liveness,
    /// Instance-identity classification.
    pub identity: InstanceClass,
    /// The snapshot's ownership classification.
    pub ownership_state: &'static str,
    /// The row is historical (status not `active`).
    pub historical: bool,
    /// Snapshot `live` (liveness live and not historical).
    pub live: bool,
    /// Binding present and different from the canonical repository.
    pub foreign_repository: bool,
    /// Where the row's process identity comes from.
    pub process_identity: ProcessIdentity,
    /// Rows carrying this row's (non-empty) canonical identity.
    pub identity_row_count: usize,
    /// What other rows hold, collected from Cedar's first-stage answers
    /// (filled by the plan; empty until then).
    pub peers: PeerFacts,
    /// Which lease protections match this row ("field=value").
    pub protected_hits: Vec<String>,
    /// The row's blank columns ([`Row::blank_columns`]), measured once
    /// for every stage that asks.
    pub blank_columns: u64,
}

/// Facts about other rows, aggregated over Cedar's answers to the first
/// stage actions (`hold_<kind>`, `claim_instance_slot`,
/// `occupy_instance_slot`): counts
/// and sets, never a judgment of their own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerFacts {
    /// This row's identity evidence (`name=value`, sorted) that another row
    /// Cedar judged to hold identity evidence also holds.
    pub shared_identity_evidence: Vec<String>,
    /// Active rows claiming this row's (instance, namespace) slot, this one
    /// included; 0 when this row is not active or the slot is unnamed.
    pub slot_active_claimants: usize,
    /// Of those, the ones Cedar judged to occupy the slot.
    pub slot_occupants: usize,
}

/// `process_identity`, else `pid-<str(pid)>` when a pid is recorded.
pub fn process_identity(row: &Row) -> Value {
    match ProcessIdentity::of(row) {
        ProcessIdentity::Given => row.get(Col::ProcessIdentity).to_value(),
        ProcessIdentity::FromPid => Value::Text(ProcessIdentity::pid_text(row).into()),
        ProcessIdentity::Missing => Value::Null,
    }
}

/// Where a row's process identity comes from; a plan keeps this rather than
/// a copy of the identity, which [`ProcessIdentity::canon`] and
/// [`ProcessIdentity::json`] rebuild from the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessIdentity {
    /// The row's own `process_identity` (truthy).
    Given,
    /// `pid-<str(pid)>`: no identity given, a pid recorded.
    FromPid,
    /// Neither.
    Missing,
}

impl ProcessIdentity {
    /// Classify a row.
    pub fn of(row: &Row) -> ProcessIdentity {
        if row.get(Col::ProcessIdentity).truthy() {
            ProcessIdentity::Given
        } else if !row.get(Col::Pid).is_null() {
            ProcessIdentity::FromPid
        } else {
            ProcessIdentity::Missing
        }
    }

    fn pid_text(row: &Row) -> String {
        derived_process_identity(row.get(Col::Pid))
    }

    /// The identity's canonical text (empty when missing).
    pub fn canon(self, row: &Row) -> Cow<'_, str> {
        match self {
            ProcessIdentity::Given => row.get(Col::ProcessIdentity).canon_cow(),
            ProcessIdentity::FromPid => Cow::Owned(ProcessIdentity::pid_text(row)),
            ProcessIdentity::Missing => Cow::Borrowed(""),
        }
    }

    /// The identity as a plan's evidence shows it: the given value with its
    /// storage class, the derived text, or null.
    pub fn json(self, row: &Row) -> ProcessIdentityJson<'_> {
        match self {
            ProcessIdentity::Given => ProcessIdentityJson::Value(row.get(Col::ProcessIdentity)),
            ProcessIdentity::FromPid => ProcessIdentityJson::Pid(row.get(Col::Pid)),
            ProcessIdentity::Missing => ProcessIdentityJson::Value(Val::Null),
        }
    }
}

/// The process identity derived from a pid: `pid-<str(pid)>`.
pub fn derived_process_identity(pid: Val<'_>) -> String {
    format!("pid-{}", pid.py_str())
}

/// The kinds of identity evidence, in the order `shared_identity_evidence`
/// names them (stated in full beside that attribute in
/// `policies/schema.cedarschema`; a test holds the two equal).
pub const EVIDENCE_KINDS: [&str; 4] = ["session_id", "generation_id", "process_identity", "pid"];

/// A process identity ready to render: a stored value, or `pid-` and a pid.
#[derive(Debug, Clone, Copy)]
pub enum ProcessIdentityJson<'a> {
    /// A stored value (or null).
    Value(Val<'a>),
    /// `pid-<str(pid)>`.
    Pid(Val<'a>),
}

impl serde::Serialize for ProcessIdentityJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ProcessIdentityJson::Value(v) => v.serialize(s),
            ProcessIdentityJson::Pid(pid) => s.serialize_str(&derived_process_identity(*pid)),
        }
    }
}

pub(crate) fn conflict_keys(
    row: &Row,
    process_identity: ProcessIdentity,
) -> Vec<(&'static str, Cow<'_, str>)> {
    let [session, generation, process, pid] = EVIDENCE_KINDS;
    [
        (session, row.get(Col::SessionId).canon_cow()),
        (generation, row.get(Col::GenerationId).canon_cow()),
        (process, process_identity.canon(row)),
        (pid, row.get(Col::Pid).canon_cow()),
    ]
    .into_iter()
    .filter(|(_, text)| !text.is_empty())
    .collect()
}

/// Snapshot ownership classification (seed `build_worker_snapshot_row`).
pub fn ownership_state(row: &Row, live: bool, historical: bool, trusted: bool) -> &'static str {
    if historical {
        "historical"
    } else if !live {
        "stale"
    } else if !row.get(Col::SessionId).truthy() {
        "orphaned"
    } else if !trusted {
        "live_untrusted_identity"
    } else {
        "live"
    }
}

/// Binding present and, when a canonical repository is given, different
/// from it. The row side is whitespace-stripped, both sides lose trailing
/// `/` (docs/semantics.md, pitfall 8: the canonical side is not whitespace-stripped).
pub fn foreign_repository(row: &Row, canonical: Option<&str>) -> bool {
    let binding = row.get(Col::RepositoryBinding).stripped_cow();
    match canonical {
        Some(c) if !c.is_empty() && !binding.is_empty() => {
            binding.trim_end_matches('/') != c.trim_end_matches('/')
        }
        _ => false,
    }
}

/// Observe every row; probes run once per row.
pub fn observe_all(rows: &[Row], facts: &RunFacts, probe: &dyn ProcessProbe) -> Vec<Observation> {
    let index = ProtectionIndex::of(&facts.protections);
    // The counts need every row, the observations one row each: they are
    // made side by side.
    let (counts, mut out) = crate::pool::join(
        || identity_row_counts(rows),
        || crate::pool::par_map(rows, |row| observe_row(row, facts, &index, probe)),
    );
    for (obs, count) in out.iter_mut().zip(counts) {
        obs.identity_row_count = count;
    }
    out
}

/// Observe one row on its own, with `identity_row_count` as given (it is
/// counted over every row): apply's look at a row changed since it judged.
pub fn observe_one(
    row: &Row,
    facts: &RunFacts,
    probe: &dyn ProcessProbe,
    identity_row_count: usize,
) -> Observation {
    let index = ProtectionIndex::of(&facts.protections);
    let mut obs = observe_row(row, facts, &index, probe);
    obs.identity_row_count = identity_row_count;
    obs
}

/// The lease protections hashed for lookup (the sets themselves are
/// ordered, for the run entity and the saved plan).
pub struct ProtectionIndex<'a> {
    identities: rustc_hash::FxHashSet<&'a str>,
    sessions: rustc_hash::FxHashSet<&'a str>,
    pids: rustc_hash::FxHashSet<&'a str>,
}

impl<'a> ProtectionIndex<'a> {
    /// Index `p`.
    pub fn of(p: &'a Protections) -> ProtectionIndex<'a> {
        let set =
            |s: &'a std::collections::BTreeSet<String>| s.iter().map(String::as_str).collect();
        ProtectionIndex {
            identities: set(&p.worker_identities),
            sessions: set(&p.session_ids),
            pids: set(&p.pids),
        }
    }
}

/// Which of the protections match `row` ("field=value").
pub fn protection_hits(row: &Row, p: &ProtectionIndex<'_>) -> Vec<String> {
    let mut hits = Vec::new();
    if !p.identities.is_empty() {
        let id = row.get(Col::WorkerIdentity).canon_cow();
        if !id.is_empty() && p.identities.contains(id.as_ref()) {
            hits.push(format!("worker_identity={id}"));
        }
    }
    if !p.sessions.is_empty() {
        let session = row.get(Col::SessionId).canon_cow();
        if p.sessions.contains(session.as_ref()) {
            hits.push(format!("session_id={session}"));
        }
    }
    if !p.pids.is_empty() {
        // An integer pid's canonical text without an allocation.
        let mut digits = itoa::Buffer::new();
        let pid_text: Cow<str> = match row.get(Col::Pid) {
            Val::Int(i) => Cow::Borrowed(digits.format(i)),
            other => other.canon_cow(),
        };
        if p.pids.contains(pid_text.as_ref()) {
            hits.push(format!("pid={pid_text}"));
        }
    }
    hits
}

/// Per row, how many rows carry its (non-empty) identity.
fn identity_row_counts(rows: &[Row]) -> Vec<usize> {
    use std::hash::BuildHasher;
    // Every non-empty identity's hash beside its row, sorted: rows with one
    // identity are neighbours, and a hash held by one row is an identity
    // held by one row. Only rows sharing a hash compare their identities
    // (so colliding hashes cost a sort, never a wrong count).
    let hasher = rustc_hash::FxBuildHasher;
    let mut keyed: Vec<(u64, u32)> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, row)| {
            let id = row.get(Col::WorkerIdentity).canon_cow();
            (!id.is_empty()).then(|| (hasher.hash_one(id.as_ref()), i as u32))
        })
        .collect();
    keyed.sort_unstable();
    let mut counts = vec![0usize; rows.len()];
    for run in keyed.chunk_by(|a, b| a.0 == b.0) {
        if let [(_, i)] = run {
            counts[*i as usize] = 1;
            continue;
        }
        let mut members: Vec<(Cow<str>, u32)> = run
            .iter()
            .map(|&(_, i)| (rows[i as usize].get(Col::WorkerIdentity).canon_cow(), i))
            .collect();
        members.sort_unstable();
        for same in members.chunk_by(|a, b| a.0 == b.0) {
            for (_, i) in same {
                counts[*i as usize] = same.len();
            }
        }
    }
    counts
}

/// One row's first-stage answers (an evaluation error counts as yes:
/// fail closed, the row may be live).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FirstStage {
    /// Per kind of identity evidence ([`EVIDENCE_KINDS`] order): whether
    /// the row holds it.
    pub holds: [bool; 4],
    /// Whether the row claims its instance slot.
    pub claims: bool,
    /// Whether it occupies it.
    pub occupies: bool,
}

/// Collect Cedar's first-stage answers into each row's peer facts: the
/// evidence it shares with another row holding that kind, and its slot's
/// claimants and occupants.
pub fn peer_facts(
    rows: &[Row],
    observations: &[Observation],
    answers: &[FirstStage],
) -> Vec<PeerFacts> {
    // Two independent counts, one per core.
    let (shared, mut out) = crate::pool::join(
        || shared_evidence(rows, observations, answers),
        || {
            let mut out = vec![PeerFacts::default(); rows.len()];
            slot_counts(rows, answers, &mut out);
            out
        },
    );
    for (i, evidence) in shared {
        out[i].shared_identity_evidence = evidence;
    }
    out
}

/// The other rows that bear on row `index` through the first stage: those
/// holding any of its identity evidence values, and the other active
/// claimants of its slot (for `explain`).
pub fn peers_of(rows: &[Row], observations: &[Observation], index: usize) -> Vec<usize> {
    let keys = conflict_keys(&rows[index], observations[index].process_identity);
    let slot = |r: &Row| {
        r.is_active().then(|| {
            (
                r.get(Col::ClientInstanceId).canon(),
                r.get(Col::Namespace).canon(),
            )
        })
    };
    let mine = slot(&rows[index]).filter(|(i, n)| !i.is_empty() && !n.is_empty());
    (0..rows.len())
        .filter(|&j| j != index)
        .filter(|&j| {
            let theirs = conflict_keys(&rows[j], observations[j].process_identity);
            theirs.iter().any(|k| keys.contains(k)) || (mine.is_some() && slot(&rows[j]) == mine)
        })
        .collect()
}

/// Per (instance, namespace) slot, the claimants (rows Cedar says claim
/// it) and, of them, the occupants.
fn slot_counts(rows: &[Row], answers: &[FirstStage], out: &mut [PeerFacts]) {
    let mut slots: rustc_hash::FxHashMap<(Cow<str>, Cow<str>), Vec<usize>> = Default::default();
    for (i, row) in rows.iter().enumerate() {
        if !answers[i].claims {
            continue;
        }
        let instance = row.get(Col::ClientInstanceId).canon_cow();
        let namespace = row.get(Col::Namespace).canon_cow();
        if !instance.is_empty() && !namespace.is_empty() {
            slots.entry((instance, namespace)).or_default().push(i);
        }
    }
    for members in slots.values() {
        let occupants = members.iter().filter(|&&i| answers[i].occupies).count();
        for &i in members {
            out[i].slot_active_claimants = members.len();
            out[i].slot_occupants = occupants;
        }
    }
}

/// The index of an evidence kind in [`EVIDENCE_KINDS`].
fn kind_index(kind: &str) -> usize {
    EVIDENCE_KINDS
        .iter()
        .position(|k| *k == kind)
        .expect("conflict_keys names only EVIDENCE_KINDS")
}

/// Per row that shares any, the identity evidence it shares with another
/// row that holds that kind: a row never "shares" evidence with itself
/// alone.
fn shared_evidence(
    rows: &[Row],
    obs: &[Observation],
    answers: &[FirstStage],
) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut holders: rustc_hash::FxHashMap<(&'static str, Cow<str>), usize> = Default::default();
    for (i, (row, o)) in rows.iter().zip(obs).enumerate() {
        for key in conflict_keys(row, o.process_identity) {
            if answers[i].holds[kind_index(key.0)] {
                *holders.entry(key).or_default() += 1;
            }
        }
    }
    if holders.is_empty() {
        return out;
    }
    for (i, (row, o)) in rows.iter().zip(obs).enumerate() {
        let mut shared: Vec<String> = conflict_keys(row, o.process_identity)
            .into_iter()
            .filter(|k| {
                let own = usize::from(answers[i].holds[kind_index(k.0)]);
                holders.get(k).is_some_and(|n| *n > own)
            })
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        if !shared.is_empty() {
            shared.sort();
            out.push((i, shared));
        }
    }
    out
}

/// The row names a host, and it is not `mine` (compared as the policies
/// compare them: the row's `host_id` stripped). A measurement: the policies
/// decide what it means (`host-binding-unproven`).
pub fn of_another_host(row: &Row, mine: &str) -> bool {
    let theirs = row.get(Col::HostId).stripped_cow();
    !theirs.is_empty() && *theirs != *mine
}

fn observe_row(
    row: &Row,
    facts: &RunFacts,
    protections: &ProtectionIndex<'_>,
    probe: &dyn ProcessProbe,
) -> Observation {
    let pid = observe_pid(row.get(Col::Pid), probe);
    let liveness = assess(row, facts.now, pid.alive);
    let historical = !row.is_active();
    let live = liveness.live && !historical;
    let (_, identity) = classify_instance_identity(
        row.get(Col::ClientInstanceId).as_text(),
        row.get(Col::InstanceIdSource).as_text(),
    );
    let ownership = ownership_state(row, live, historical, identity.trusted);
    let protected_hits = protection_hits(row, protections);
    Observation {
        pid,
        liveness,
        ownership_state: ownership,
        historical,
        live,
        foreign_repository: foreign_repository(row, facts.canonical_repository.as_deref()),
        process_identity: ProcessIdentity::of(row),
        identity,
        identity_row_count: 0,
        peers: PeerFacts::default(),
        protected_hits,
        blank_columns: row.blank_columns(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    /// The schema's statement of the row joins is the code's: the
    /// evidence kinds (and one first-stage action per kind), the
    /// `pid-<pid>` default, and the slot key (canonical text, not
    /// stripped).
    #[test]
    fn the_schema_states_the_joins_the_code_makes() {
        let schema = include_str!("../policies/schema.cedarschema");
        let stated = |tag: &str| -> Vec<String> {
            let line = schema
                .lines()
                .find_map(|l| l.trim().strip_prefix("//")?.trim().strip_prefix(tag))
                .unwrap_or_else(|| panic!("the schema states no {tag:?}"));
            line.split(',').map(|c| c.trim().to_string()).collect()
        };
        assert_eq!(stated("evidence kinds:"), EVIDENCE_KINDS.map(String::from));
        let holds = &crate::policy::entities::FIRST_STAGE_ACTIONS[..4];
        assert_eq!(holds, EVIDENCE_KINDS.map(|k| format!("hold_{k}")));
        assert_eq!(stated("slot key:"), ["client_instance_id", "namespace"]);
        assert!(schema.contains("\"pid-<pid>\""));

        let row = |instance: &str, status: &str| {
            let mut r = Row::default();
            r.set(Col::ClientInstanceId, Value::Text(instance.into()));
            r.set(Col::Namespace, Value::Text("author".into()));
            r.set(Col::Status, Value::Text(status.into()));
            r.set(Col::Pid, Value::Int(42));
            r
        };
        let rows = [
            row("inst-1", "active"),
            row(" inst-1", "active"),
            row("inst-1", " active"),
            row("inst-1", "active"),
        ];
        // Who claims is Cedar's answer (claim_instance_slot); here the
        // built-in policy's: status exactly "active".
        let answers: Vec<FirstStage> = rows
            .iter()
            .map(|r| FirstStage {
                claims: r.is_active(),
                occupies: true,
                ..FirstStage::default()
            })
            .collect();
        let mut out = vec![PeerFacts::default(); rows.len()];
        slot_counts(&rows, &answers, &mut out);
        let claimants: Vec<usize> = out.iter().map(|p| p.slot_active_claimants).collect();
        assert_eq!(claimants, [2, 1, 0, 2]);
        let keys = conflict_keys(&rows[0], ProcessIdentity::of(&rows[0]));
        assert!(
            keys.iter()
                .any(|(k, v)| *k == "process_identity" && v == "pid-42"),
            "{keys:?}"
        );
    }

    /// Each row's identity count is the number of rows whose canonical
    /// identity is its own (an integer identity and its text are one), and
    /// zero for a row without one, whatever the hashes do.
    #[test]
    fn identity_counts_count_equal_identities() {
        let ids: Vec<Value> = (0..5000u32)
            .map(|i| match i % 9 {
                0 => Value::Null,
                1 => Value::Text("".into()),
                2 => Value::Int(i64::from(i % 50)),
                3 => Value::Text(format!("{}", i % 50).into()),
                4 => Value::Text(format!("w-{}", i % 700).into()),
                _ => Value::Text(format!("w-{i}").into()),
            })
            .collect();
        let rows: Vec<Row> = ids
            .iter()
            .map(|id| {
                let mut row = Row::default();
                row.set(Col::WorkerIdentity, id.clone());
                row
            })
            .collect();
        let canon: Vec<String> = rows
            .iter()
            .map(|r| r.get(Col::WorkerIdentity).canon_cow().into_owned())
            .collect();
        let counts = identity_row_counts(&rows);
        for (i, c) in canon.iter().enumerate() {
            let expected = if c.is_empty() {
                0
            } else {
                canon.iter().filter(|o| *o == c).count()
            };
            assert_eq!(counts[i], expected, "row {i} ({c:?})");
        }
        assert!(counts.iter().any(|c| *c > 2));
    }
}
