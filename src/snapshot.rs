//! The fleet snapshot (seed `mcp_fleet_snapshot`): live, stale and
//! historical workers, instances keyed by `client_instance_id`, and every
//! finding class of the seed, with one deliberate difference (semantics
//! §11): a session shared by live workers is a collision only when they
//! belong to more than one instance or duplicate a namespace within one.
//!
//! Observational: it reads rows and probes, and writes nothing.

use crate::evidence::probe::{observe_pid, ProcessProbe};
use crate::identity::{assess_instance_identity, normalize_client_name, UNKNOWN_CLIENT};
use crate::liveness::assess;
use crate::observe::{foreign_repository, ownership_state, process_identity};
use crate::row::{Col, Row};
use crate::time::{format_ts, Micros};
use crate::value::Value;
use serde_json::{json, Map, Value as Json};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

/// Finding classes that make the live fleet unsafe.
pub const ACTIVE_BLOCKER_CLASSES: &[&str] = &[
    "missing_expected",
    "unmanifested",
    "duplicate_namespace_worker",
    "instance_id_collision",
    "worker_identity_collision",
    "session_identity_collision",
    "generation_identity_collision",
    "process_identity_collision",
    "pid_collision",
    "ownership_fencing_collision",
    "orphaned_unowned",
    "unknown_client",
    "foreign_repository",
    "old_revision",
    "stale_orphaned_worker",
    "legacy_incomplete_identity",
];

/// What the snapshot is asked.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The clock.
    pub now: Micros,
    /// Expected repository binding, if any.
    pub canonical_repository: Option<String>,
    /// Expected revision of every worker, if any.
    pub expected_live_revision: Option<String>,
    /// The approved fleet manifest (`instances` entries), if any.
    pub manifest: Option<Vec<Json>>,
}

/// What the snapshot measured about one row: enough to render its worker
/// entry again without probing again. About 150 bytes a row, where a
/// rendered entry is a few kilobytes: only live workers, which the
/// collision checks read, are kept rendered.
#[derive(Debug, Clone)]
struct Measured {
    pid_alive: Option<bool>,
    liveness: crate::liveness::Liveness,
    identity: crate::identity::InstanceIdentity,
    client_type: &'static str,
    live: bool,
    historical: bool,
    foreign: bool,
    old_revision: bool,
    ownership: &'static str,
    mutation_safe: bool,
}

/// Measure one row: probe its pid, classify its liveness and identity.
fn measure(row: &Row, opts: &Options, probe: &dyn ProcessProbe) -> Measured {
    let pid = observe_pid(row.get(Col::Pid), probe);
    let liveness = assess(row, opts.now, pid.alive);
    let historical = row.get(Col::Status).or_empty_str() != "active";
    let live = liveness.live && !historical;
    let identity = assess_instance_identity(
        row.get(Col::ClientInstanceId).as_text(),
        row.get(Col::InstanceIdSource).as_text(),
    );
    let client_type = normalize_client_name(row.get(Col::ClientName).as_text());
    let foreign = foreign_repository(row, opts.canonical_repository.as_deref());
    // An empty expected revision is no expectation (the seed tests it for
    // truth).
    let old_revision = opts
        .expected_live_revision
        .as_deref()
        .filter(|e| !e.is_empty())
        .is_some_and(|expected| {
            [
                Col::StartupRevision,
                Col::LoadedRevision,
                Col::ParityRevision,
                Col::LiveRevision,
            ]
            .iter()
            .any(|c| {
                let rev = row.get(*c).stripped();
                !rev.is_empty() && rev != expected
            })
        });
    let ownership = ownership_state(row, live, historical, identity.trusted);
    let mutation_safe = live
        && identity.trusted
        && !foreign
        && !old_revision
        && ownership == "live"
        && client_type != UNKNOWN_CLIENT;
    Measured {
        pid_alive: pid.alive,
        liveness,
        identity,
        client_type,
        live,
        historical,
        foreign,
        old_revision,
        ownership,
        mutation_safe,
    }
}

impl Measured {
    fn stale(&self) -> bool {
        !self.live && !self.historical
    }

    /// The assessed instance id (stripped), or the raw value.
    fn instance_id(&self, row: &Row) -> Json {
        self.identity
            .client_instance_id
            .clone()
            .map(Json::String)
            .unwrap_or_else(|| row.get(Col::ClientInstanceId).to_json())
    }
}

/// One worker as the snapshot reports it.
fn render(row: &Row, m: &Measured) -> Json {
    serde_json::to_value(WorkerView(row, m)).expect("a worker entry serialises")
}

/// One worker's entry, written straight from its row and measurements.
struct WorkerView<'r>(&'r Row, &'r Measured);

/// The seed's `record.get(x) or record.get(fallback)`: a falsy value (NULL,
/// "", 0) falls through to a column a registry does not have.
struct OrNull<'v>(&'v Value);

impl serde::Serialize for OrNull<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        if self.0.truthy() {
            self.0.serialize(s)
        } else {
            s.serialize_none()
        }
    }
}

/// The assessed instance id (stripped), or the raw value.
struct InstanceId<'r>(&'r Row, &'r Measured);

impl serde::Serialize for InstanceId<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match &self.1.identity.client_instance_id {
            Some(id) => s.serialize_str(id),
            None => self.0.get(Col::ClientInstanceId).serialize(s),
        }
    }
}

impl serde::Serialize for WorkerView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let WorkerView(row, m) = *self;
        let v = |c: Col| row.get(c);
        let liveness = &m.liveness;
        let mut map = s.serialize_map(Some(45))?;
        map.serialize_entry("worker_id", &OrNull(v(Col::WorkerIdentity)))?;
        map.serialize_entry("worker_identity", &OrNull(v(Col::WorkerIdentity)))?;
        map.serialize_entry("client_type", m.client_type)?;
        map.serialize_entry("client_instance_id", &InstanceId(row, m))?;
        map.serialize_entry("fleet_run_id", v(Col::FleetRunId))?;
        map.serialize_entry("namespace", v(Col::Namespace))?;
        map.serialize_entry("profile", v(Col::Profile))?;
        map.serialize_entry("declared_role", &OrNull(v(Col::Role)))?;
        map.serialize_entry("authenticated_account", v(Col::AuthenticatedAccount))?;
        map.serialize_entry("session_id", v(Col::SessionId))?;
        map.serialize_entry("generation_id", v(Col::GenerationId))?;
        map.serialize_entry("process_identity", &process_identity(row))?;
        map.serialize_entry("pid", v(Col::Pid))?;
        map.serialize_entry("pid_alive", &m.pid_alive)?;
        map.serialize_entry("repository_binding", v(Col::RepositoryBinding))?;
        map.serialize_entry("remote", v(Col::Remote))?;
        map.serialize_entry("startup_revision", v(Col::StartupRevision))?;
        map.serialize_entry("loaded_revision", v(Col::LoadedRevision))?;
        map.serialize_entry("parity_revision", v(Col::ParityRevision))?;
        map.serialize_entry("live_revision", v(Col::LiveRevision))?;
        map.serialize_entry("runtime_provenance", &OrNull(v(Col::Transport)))?;
        map.serialize_entry("transport", v(Col::Transport))?;
        map.serialize_entry("started_at", v(Col::StartedAt))?;
        map.serialize_entry("last_heartbeat_at", v(Col::LastHeartbeatAt))?;
        map.serialize_entry("heartbeat_ttl_seconds", v(Col::HeartbeatTtlSeconds))?;
        map.serialize_entry("fencing_epoch", v(Col::FencingEpoch))?;
        map.serialize_entry("status", v(Col::Status))?;
        map.serialize_entry("host_id", v(Col::HostId))?;
        map.serialize_entry("boot_id", v(Col::BootId))?;
        map.serialize_entry("instance_id_provenance", m.identity.provenance)?;
        map.serialize_entry("instance_identity_trusted", &m.identity.trusted)?;
        map.serialize_entry("live", &m.live)?;
        map.serialize_entry("historical", &m.historical)?;
        map.serialize_entry(
            "liveness",
            &LivenessView {
                live: liveness.live,
                heartbeat_fresh: liveness.heartbeat_fresh,
                heartbeat_age_seconds: liveness.heartbeat_age_seconds,
                heartbeat_ttl_seconds: liveness.heartbeat_ttl_seconds,
                pid_alive: m.pid_alive,
            },
        )?;
        map.serialize_entry("ownership_state", m.ownership)?;
        map.serialize_entry("foreign_repository", &m.foreign)?;
        map.serialize_entry("old_revision", &m.old_revision)?;
        map.serialize_entry("stale", &m.stale())?;
        map.serialize_entry("mutation_safe", &m.mutation_safe)?;
        map.end()
    }
}

/// A worker's `liveness` object.
#[derive(serde::Serialize)]
struct LivenessView {
    live: bool,
    heartbeat_fresh: Option<bool>,
    heartbeat_age_seconds: Option<f64>,
    heartbeat_ttl_seconds: f64,
    pid_alive: Option<bool>,
}

/// Python's `str()` of a JSON value as the seed's grouping keys use it.
fn key_text(v: &Json) -> Option<String> {
    let text = match v {
        Json::Null => return None,
        Json::String(s) => s.clone(),
        other => Value::from_json(other)
            .map(|x| x.py_str())
            .unwrap_or_default(),
    };
    (!text.is_empty() && text != "None").then_some(text)
}

/// Python's `str(v)` when `v` is truthy (`if v:`): how the seed keeps
/// instance ids, namespaces and fleet runs. Unlike a collision key, the text
/// `"None"` is a name like any other here.
fn truthy_text(v: &Json) -> Option<String> {
    let value = Value::from_json(v).ok()?;
    value.truthy().then(|| value.py_str())
}

/// How many distinct values `field` takes among `workers`, NULL and `""`
/// each counting as a value of its own (a Python set of the raw values).
fn distinct(workers: &[&Json], field: &str) -> usize {
    workers
        .iter()
        .map(|w| w[field].to_string())
        .collect::<BTreeSet<_>>()
        .len()
}

fn groups<'a>(
    rows: &[&'a Json],
    key: impl Fn(&Json) -> Option<String>,
) -> BTreeMap<String, Vec<&'a Json>> {
    let mut g: BTreeMap<String, Vec<&'a Json>> = BTreeMap::new();
    for r in rows {
        if let Some(k) = key(r) {
            g.entry(k).or_default().push(r);
        }
    }
    g.retain(|_, v| v.len() > 1);
    g
}

fn ids(workers: &[&Json], field: &str) -> BTreeSet<String> {
    workers
        .iter()
        .filter_map(|w| truthy_text(&w[field]))
        .collect()
}

/// One finding of the snapshot.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    /// Its class (`pid_collision`, `stale_orphaned_worker`, …).
    pub classification: &'static str,
    /// `blocker`, `warning` or `info`.
    pub severity: &'static str,
    /// Whether it makes the live fleet unsafe.
    pub active_blocker: bool,
    /// In words.
    pub detail: String,
    /// The instances it names.
    pub client_instance_ids: Vec<String>,
    /// The workers it names (as stored: NULL stays null).
    pub worker_identities: Vec<Json>,
}

struct Findings(Vec<Finding>);

impl Findings {
    fn add(
        &mut self,
        class: &'static str,
        severity: &'static str,
        workers: &[&Json],
        instances: Option<Vec<String>>,
        detail: String,
        blocker: bool,
    ) {
        let instance_ids =
            instances.unwrap_or_else(|| ids(workers, "client_instance_id").into_iter().collect());
        self.0.push(Finding {
            classification: class,
            severity,
            active_blocker: blocker,
            detail,
            client_instance_ids: instance_ids,
            worker_identities: workers
                .iter()
                .map(|w| w["worker_identity"].clone())
                .collect(),
        });
    }
}

/// The finding about one row that is not live, if any: stale rows are
/// `stale_orphaned_worker`, historical ones `historical_dead`. They are
/// derived from what was measured whenever they are read, never stored: a
/// large registry is mostly such rows.
fn row_finding(row: &Row, m: &Measured) -> Option<Finding> {
    let wid = row.get(Col::WorkerIdentity);
    let (class, severity, blocker, detail) = if m.stale() {
        (
            "stale_orphaned_worker",
            "warning",
            true,
            format!(
                "worker {} is active in the registry but not live (stale heartbeat or dead \
                 pid); `fleet-retire plan` says whether it may be retired",
                wid.to_json()
            ),
        )
    } else if m.historical {
        (
            "historical_dead",
            "info",
            false,
            format!(
                "historical registration {} (status {}) is not an active blocker",
                wid.to_json(),
                row.get(Col::Status).to_json()
            ),
        )
    } else {
        return None;
    };
    Some(Finding {
        classification: class,
        severity,
        active_blocker: blocker,
        detail,
        client_instance_ids: truthy_text(&m.instance_id(row)).into_iter().collect(),
        worker_identities: vec![if wid.truthy() {
            wid.to_json()
        } else {
            Json::Null
        }],
    })
}

fn namespace_duplicates(workers: &[&Json]) -> Vec<String> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for w in workers {
        if let Some(ns) = truthy_text(&w["namespace"]) {
            *counts.entry(ns).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(ns, _)| ns)
        .collect()
}

/// The consistency token: time-seeded, an observation stamp (never a CAS
/// token). Computed over the snapshot's worker rows, as the seed does (so
/// the instance id is the assessed, whitespace-stripped one).
fn consistency_token(rows: &[Row], measured: &[Measured], snapshot_at: &str) -> String {
    use std::borrow::Cow;
    // Python's `str(value or "")` of each field of a worker entry, borrowed
    // wherever the stored value is text (nearly always): a large registry
    // is sorted and hashed without a copy of its rows.
    fn fields<'r>(row: &'r Row, m: &'r Measured) -> [Cow<'r, str>; 6] {
        let instance = match &m.identity.client_instance_id {
            Some(id) => Cow::Borrowed(id.as_str()),
            None => row.get(Col::ClientInstanceId).or_empty_cow(),
        };
        [
            row.get(Col::WorkerIdentity).or_empty_cow(),
            instance,
            row.get(Col::Status).or_empty_cow(),
            row.get(Col::LastHeartbeatAt).or_empty_cow(),
            row.get(Col::FencingEpoch).or_empty_cow(),
            row.get(Col::GenerationId).or_empty_cow(),
        ]
    }
    // Each row's line (`|`-joined fields) is written once, in row order,
    // into one buffer; the sort then moves only small entries, and hashing
    // in sorted order reads one slice per row.
    let mut text: Vec<u8> = Vec::new();
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(rows.len());
    let mut keys: Vec<[Cow<'_, str>; 3]> = Vec::with_capacity(rows.len());
    for (r, m) in rows.iter().zip(measured) {
        let u = fields(r, m);
        let start = text.len();
        for (i, field) in u.iter().enumerate() {
            if i > 0 {
                text.push(b'|');
            }
            text.extend_from_slice(field.as_bytes());
        }
        spans.push((start, text.len()));
        let [wid, _, _, hb, epoch, _] = u;
        keys.push([wid, hb, epoch]);
    }
    // Sorted stably by (identity, heartbeat, epoch), as the seed's `sorted`.
    // The identity's first 32 bytes sit in the array being sorted, so most
    // comparisons never leave it; a tie there compares the whole key.
    let prefix = |k: &[Cow<'_, str>; 3]| {
        let mut p = [0u8; 32];
        let b = k[0].as_bytes();
        let n = b.len().min(32);
        p[..n].copy_from_slice(&b[..n]);
        p
    };
    let mut order: Vec<([u8; 32], u32)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (prefix(k), i as u32))
        .collect();
    order.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| keys[a.1 as usize].cmp(&keys[b.1 as usize]))
    });
    let mut hasher = Sha256::new();
    hasher.update(snapshot_at.as_bytes());
    for (_, i) in &order {
        let (start, end) = spans[*i as usize];
        hasher.update(b"\n");
        hasher.update(&text[start..end]);
    }
    let digest = crate::fingerprint::hex(&hasher.finalize());
    format!("fleetrev-{}", &digest[..16])
}

/// Take the snapshot, as one JSON document (for callers that want it
/// whole: `serve`, the demo, tests). The command line streams
/// [`Snapshot`] instead.
pub fn snapshot(rows: &[Row], opts: &Options, probe: &dyn ProcessProbe) -> Json {
    serde_json::to_value(Snapshot::take(rows, opts, probe)).expect("a snapshot serialises")
}

/// A snapshot: what was measured per row, the live workers rendered (the
/// collision checks read them), and the findings. Rows that are not live
/// are rendered only while the document is written, one at a time, so a
/// large registry costs about what its rows cost.
pub struct Snapshot<'a> {
    rows: &'a [Row],
    measured: Vec<Measured>,
    live: Vec<Json>,
    snapshot_at: String,
    token: String,
    historical_count: usize,
    stale_count: usize,
    instances: Vec<Json>,
    by_type: BTreeMap<String, Vec<String>>,
    manifest: Vec<Json>,
    missing: Vec<String>,
    unmanifested: Vec<String>,
    /// Findings about live workers (before the per-row ones).
    early: Vec<Finding>,
    /// Findings about the manifest (after the per-row ones).
    late: Vec<Finding>,
    live_safe: bool,
    mutation_safe: bool,
    /// Continuity with an earlier snapshot, when asked (`--compare`).
    pub comparison: Option<Json>,
}

impl<'a> Snapshot<'a> {
    /// Take the snapshot of `rows`.
    pub fn take(rows: &'a [Row], opts: &Options, probe: &dyn ProcessProbe) -> Snapshot<'a> {
        take(rows, opts, probe)
    }

    /// When it was taken.
    pub fn snapshot_at(&self) -> &str {
        &self.snapshot_at
    }

    /// Live workers.
    pub fn live_worker_count(&self) -> usize {
        self.live.len()
    }

    /// Active rows that are not live.
    pub fn stale_worker_count(&self) -> usize {
        self.stale_count
    }

    /// Rows whose status is not active.
    pub fn historical_worker_count(&self) -> usize {
        self.historical_count
    }

    /// Live instances.
    pub fn instance_count(&self) -> usize {
        self.instances.len()
    }

    /// No active blocker.
    pub fn live_fleet_safe(&self) -> bool {
        self.live_safe
    }

    /// The findings that make the live fleet unsafe.
    pub fn active_blockers(&self) -> impl Iterator<Item = Cow<'_, Finding>> {
        self.findings().filter(|f| f.active_blocker)
    }

    /// Every finding, in the order found: those about live workers, one per
    /// stale row, one per historical row, then the manifest's.
    pub fn findings(&self) -> impl Iterator<Item = Cow<'_, Finding>> {
        self.finding_parts().into_iter().flat_map(
            move |part| -> Box<dyn Iterator<Item = Cow<'_, Finding>> + '_> {
                match part {
                    FindingPart::Stored(found) => Box::new(found.iter().map(Cow::Borrowed)),
                    FindingPart::Rows(which) => Box::new(
                        self.rows
                            .iter()
                            .zip(&self.measured)
                            .filter(move |(_, m)| which(m))
                            .filter_map(|(r, m)| row_finding(r, m))
                            .map(Cow::Owned),
                    ),
                }
            },
        )
    }

    /// The consistency token (time-seeded: an observation stamp).
    pub fn consistency_token(&self) -> &str {
        &self.token
    }

    /// The live workers as rendered (for `compare`).
    pub fn live_workers(&self) -> &[Json] {
        &self.live
    }

    /// What a person reads: counts, instances, blockers, comparison (see
    /// `report::snapshot_summary`), without the per-worker lists.
    pub fn summary_json(&self) -> Json {
        let mut doc = json!({
            "snapshot_at": self.snapshot_at,
            "live_worker_count": self.live.len(),
            "historical_worker_count": self.historical_count,
            "stale_worker_count": self.stale_count,
            "instance_count": self.instances.len(),
            "instances": self.instances,
            "active_blockers": self.active_blockers().collect::<Vec<_>>(),
            "live_fleet_safe": self.live_safe,
        });
        if let Some(c) = &self.comparison {
            doc["comparison"] = c.clone();
        }
        doc
    }
}

/// Where a list of findings comes from, in document order: the stored
/// findings about live workers, the per-row findings (derived as they are
/// written), then the manifest's.
enum FindingPart<'s> {
    Stored(&'s [Finding]),
    Rows(fn(&Measured) -> bool),
}

/// One line of a streamed list: an element already rendered as JSON.
type Line = Vec<u8>;

const WRITE_BATCH: usize = 8192;

impl Snapshot<'_> {
    fn finding_parts(&self) -> [FindingPart<'_>; 4] {
        [
            FindingPart::Stored(&self.early),
            FindingPart::Rows(Measured::stale),
            FindingPart::Rows(|m| m.historical),
            FindingPart::Stored(&self.late),
        ]
    }

    /// The document as [`serde::Serialize`] gives it, written for a large
    /// registry: one top-level key per line, one list element per line, the
    /// per-row elements rendered in batches on every core and written in
    /// order, so only a batch of text is held at a time.
    pub fn write_json(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        fn field(
            w: &mut dyn std::io::Write,
            key: &str,
            value: &impl serde::Serialize,
        ) -> std::io::Result<()> {
            write!(w, "{}: ", Json::String(key.into()))?;
            serde_json::to_writer(&mut *w, value)?;
            w.write_all(b",\n")
        }
        fn list(
            w: &mut dyn std::io::Write,
            key: &str,
            mut parts: impl FnMut(&mut dyn FnMut(Line) -> std::io::Result<()>) -> std::io::Result<()>,
        ) -> std::io::Result<()> {
            write!(w, "{}: [", Json::String(key.into()))?;
            let mut first = true;
            parts(&mut |line: Line| {
                w.write_all(if first { b"\n" } else { b",\n" })?;
                first = false;
                w.write_all(&line)
            })?;
            w.write_all(if first { b"],\n" } else { b"\n],\n" })
        }
        w.write_all(b"{\n")?;
        field(w, "success", &true)?;
        field(w, "read_only", &true)?;
        field(w, "snapshot_at", &self.snapshot_at)?;
        field(w, "consistency_token", &self.token)?;
        field(w, "registry_revision", &self.token)?;
        field(w, "live_worker_count", &self.live.len())?;
        field(w, "historical_worker_count", &self.historical_count)?;
        field(w, "stale_worker_count", &self.stale_count)?;
        field(w, "instance_count", &self.instances.len())?;
        list(w, "workers", |emit| self.emit_rows(|_| true, emit))?;
        list(w, "live_workers", |emit| {
            json_lines(self.live.iter().map(Some))
                .into_iter()
                .try_for_each(&mut *emit)
        })?;
        list(w, "historical_workers", |emit| {
            self.emit_rows(|m| m.historical, emit)
        })?;
        list(w, "stale_workers", |emit| {
            self.emit_rows(Measured::stale, emit)
        })?;
        field(w, "instances", &self.instances)?;
        field(w, "multi_instance_same_client_type", &self.by_type)?;
        field(w, "same_client_type_not_duplicate", &true)?;
        field(w, "expected_manifest", &self.manifest)?;
        field(w, "missing_expected_instance_ids", &self.missing)?;
        field(w, "unmanifested_instance_ids", &self.unmanifested)?;
        list(w, "findings", |emit| {
            self.emit_findings(|_| true, |f| f, emit)
        })?;
        list(w, "active_blockers", |emit| {
            self.emit_findings(|f| f.active_blocker, |f| f, emit)
        })?;
        list(w, "historical_findings", |emit| {
            self.emit_findings(|f| f.classification == "historical_dead", |f| f, emit)
        })?;
        field(w, "live_fleet_safe", &self.live_safe)?;
        field(w, "mutation_safe", &self.mutation_safe)?;
        let comparison = self.comparison.as_ref();
        write!(w, "\"reasons\": [")?;
        let mut first = true;
        self.emit_findings(|f| f.active_blocker, |f| f.detail, &mut |line| {
            w.write_all(if first { b"\n" } else { b",\n" })?;
            first = false;
            w.write_all(&line)
        })?;
        w.write_all(if first { b"]" } else { b"\n]" })?;
        if let Some(c) = comparison {
            w.write_all(b",\n\"comparison\": ")?;
            serde_json::to_writer(&mut *w, c)?;
        }
        w.write_all(b"\n}\n")
    }

    /// Render the rows `keep` selects, a batch at a time on every core.
    fn emit_rows(
        &self,
        keep: fn(&Measured) -> bool,
        emit: &mut dyn FnMut(Line) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let selected: Vec<usize> = (0..self.rows.len())
            .filter(|i| keep(&self.measured[*i]))
            .collect();
        for batch in selected.chunks(WRITE_BATCH) {
            let parts = crate::pool::par_chunks(batch, |chunk| {
                vec![json_lines(chunk.iter().map(|i| {
                    Some(WorkerView(&self.rows[*i], &self.measured[*i]))
                }))]
            });
            parts.into_iter().flatten().try_for_each(&mut *emit)?;
        }
        Ok(())
    }

    /// Render the findings `keep` selects, in document order.
    fn emit_findings<T: serde::Serialize>(
        &self,
        keep: fn(&Finding) -> bool,
        part_of: fn(Finding) -> T,
        emit: &mut dyn FnMut(Line) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        for part in self.finding_parts() {
            match part {
                FindingPart::Stored(found) => {
                    let lines =
                        json_lines(found.iter().map(|f| keep(f).then(|| part_of(f.clone()))));
                    lines.into_iter().try_for_each(&mut *emit)?;
                }
                FindingPart::Rows(which) => {
                    let selected: Vec<usize> = (0..self.rows.len())
                        .filter(|i| which(&self.measured[*i]))
                        .collect();
                    for batch in selected.chunks(WRITE_BATCH) {
                        let parts = crate::pool::par_chunks(batch, |chunk| {
                            vec![json_lines(chunk.iter().map(|i| {
                                row_finding(&self.rows[*i], &self.measured[*i])
                                    .filter(&keep)
                                    .map(part_of)
                            }))]
                        });
                        parts.into_iter().flatten().try_for_each(&mut *emit)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The present items as lines of compact JSON joined by `,\n` (the
/// caller writes what precedes them), or nothing when none is present.
fn json_lines<T: serde::Serialize>(items: impl Iterator<Item = Option<T>>) -> Option<Line> {
    let mut out: Line = Vec::new();
    let mut any = false;
    for item in items.flatten() {
        if any {
            out.extend_from_slice(b",\n");
        } else {
            out.reserve(1 << 16);
        }
        any = true;
        serde_json::to_writer(&mut out, &item).expect("snapshot values serialise");
    }
    any.then_some(out)
}

/// Rows rendered one at a time as they are written.
struct RenderedRows<'s, 'a> {
    snap: &'s Snapshot<'a>,
    keep: fn(&Measured) -> bool,
}

impl serde::Serialize for RenderedRows<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(
            self.snap
                .rows
                .iter()
                .zip(&self.snap.measured)
                .filter(|(_, m)| (self.keep)(m))
                .map(|(r, m)| WorkerView(r, m)),
        )
    }
}

/// Findings filtered as they are written.
struct FindingsWhere<'s, 'a>(&'s Snapshot<'a>, fn(&Finding) -> bool);

impl serde::Serialize for FindingsWhere<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.0.findings().filter(|f| (self.1)(f)))
    }
}

/// The details of the active blockers, as they are written.
struct BlockerDetails<'s, 'a>(&'s Snapshot<'a>);

impl serde::Serialize for BlockerDetails<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.0.active_blockers().map(|f| f.into_owned().detail))
    }
}

impl serde::Serialize for Snapshot<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("success", &true)?;
        m.serialize_entry("read_only", &true)?;
        m.serialize_entry("snapshot_at", &self.snapshot_at)?;
        m.serialize_entry("consistency_token", &self.token)?;
        m.serialize_entry("registry_revision", &self.token)?;
        m.serialize_entry("live_worker_count", &self.live.len())?;
        m.serialize_entry("historical_worker_count", &self.historical_count)?;
        m.serialize_entry("stale_worker_count", &self.stale_count)?;
        m.serialize_entry("instance_count", &self.instances.len())?;
        m.serialize_entry(
            "workers",
            &RenderedRows {
                snap: self,
                keep: |_| true,
            },
        )?;
        m.serialize_entry("live_workers", &self.live)?;
        m.serialize_entry(
            "historical_workers",
            &RenderedRows {
                snap: self,
                keep: |m| m.historical,
            },
        )?;
        m.serialize_entry(
            "stale_workers",
            &RenderedRows {
                snap: self,
                keep: Measured::stale,
            },
        )?;
        m.serialize_entry("instances", &self.instances)?;
        m.serialize_entry("multi_instance_same_client_type", &self.by_type)?;
        m.serialize_entry("same_client_type_not_duplicate", &true)?;
        m.serialize_entry("expected_manifest", &self.manifest)?;
        m.serialize_entry("missing_expected_instance_ids", &self.missing)?;
        m.serialize_entry("unmanifested_instance_ids", &self.unmanifested)?;
        m.serialize_entry("findings", &FindingsWhere(self, |_| true))?;
        m.serialize_entry(
            "active_blockers",
            &FindingsWhere(self, |f| f.active_blocker),
        )?;
        m.serialize_entry(
            "historical_findings",
            &FindingsWhere(self, |f| f.classification == "historical_dead"),
        )?;
        m.serialize_entry("live_fleet_safe", &self.live_safe)?;
        m.serialize_entry("mutation_safe", &self.mutation_safe)?;
        m.serialize_entry("reasons", &BlockerDetails(self))?;
        if let Some(c) = &self.comparison {
            m.serialize_entry("comparison", c)?;
        }
        m.end()
    }
}

fn take<'a>(rows: &'a [Row], opts: &Options, probe: &dyn ProcessProbe) -> Snapshot<'a> {
    let started = std::time::Instant::now();
    let snapshot_at = format_ts(opts.now);
    let measured: Vec<Measured> = crate::pool::par_map(rows, |r| measure(r, opts, probe));
    tracing::debug!(elapsed = ?started.elapsed(), rows = rows.len(), "measured");
    let live_rendered: Vec<Json> = rows
        .iter()
        .zip(&measured)
        .filter(|(_, m)| m.live)
        .map(|(r, m)| render(r, m))
        .collect();
    let live: Vec<&Json> = live_rendered.iter().collect();
    let historical_count = measured.iter().filter(|m| m.historical).count();
    let stale_count = measured.iter().filter(|m| m.stale()).count();
    let mut f = Findings(Vec::new());

    for (wid, group) in groups(&live, |r| key_text(&r["worker_identity"])) {
        f.add(
            "worker_identity_collision",
            "blocker",
            &group,
            None,
            format!(
                "worker identity {wid:?} is claimed by {} live workers",
                group.len()
            ),
            true,
        );
    }
    for (sid, group) in groups(&live, |r| key_text(&r["session_id"])) {
        // Semantics §11: one launch's workers share a session legitimately.
        let instances = ids(&group, "client_instance_id");
        let unkeyed = group
            .iter()
            .any(|w| truthy_text(&w["client_instance_id"]).is_none());
        let mut by_instance: BTreeMap<String, Vec<&Json>> = BTreeMap::new();
        for w in &group {
            by_instance
                .entry(truthy_text(&w["client_instance_id"]).unwrap_or_default())
                .or_default()
                .push(w);
        }
        let ns_dup = by_instance
            .values()
            .any(|ws| !namespace_duplicates(ws).is_empty());
        if instances.len() > 1 || unkeyed || ns_dup {
            f.add("session_identity_collision", "blocker", &group, None, format!("session {sid:?} is shared by {} live workers across instances or within one namespace", group.len()), true);
        }
    }
    for (gen, group) in groups(&live, |r| key_text(&r["generation_id"])) {
        if !namespace_duplicates(&group).is_empty() || distinct(&group, "client_instance_id") > 1 {
            f.add(
                "generation_identity_collision",
                "blocker",
                &group,
                None,
                format!("generation {gen:?} is contested across namespaces or instances"),
                true,
            );
        }
    }
    for (proc_id, group) in groups(&live, |r| key_text(&r["process_identity"])) {
        if distinct(&group, "worker_identity") > 1 {
            f.add(
                "process_identity_collision",
                "blocker",
                &group,
                None,
                format!("process identity {proc_id:?} is shared by distinct live workers"),
                true,
            );
        }
    }
    for (pid, group) in groups(&live, |r| key_text(&r["pid"])) {
        if distinct(&group, "worker_identity") > 1 {
            f.add(
                "pid_collision",
                "blocker",
                &group,
                None,
                format!("pid {pid} is shared by distinct live workers"),
                true,
            );
        }
    }
    for (token, group) in groups(&live, |r| {
        match (&r["generation_id"], &r["fencing_epoch"]) {
            (Json::Null, _) | (_, Json::Null) => None,
            (g, e) => {
                let py = |v: &Json| Value::from_json(v).map(|x| x.py_str()).unwrap_or_default();
                Some(format!("{}:{}", py(g), py(e)))
            }
        }
    }) {
        if distinct(&group, "client_instance_id") > 1 {
            f.add(
                "ownership_fencing_collision",
                "blocker",
                &group,
                None,
                format!("fencing token {token:?} spans more than one client_instance_id"),
                true,
            );
        }
    }

    let mut by_instance: BTreeMap<String, Vec<&Json>> = BTreeMap::new();
    let mut unkeyed: Vec<&Json> = Vec::new();
    for w in &live {
        match truthy_text(&w["client_instance_id"]) {
            Some(iid) => by_instance.entry(iid).or_default().push(w),
            None => unkeyed.push(w),
        }
    }
    let mut instances = Vec::new();
    for (iid, workers) in &by_instance {
        let one = Some(vec![iid.clone()]);
        let client_types: BTreeSet<String> = ids(workers, "client_type");
        let trusted = workers
            .iter()
            .all(|w| w["instance_identity_trusted"] == true);
        let dup_ns = namespace_duplicates(workers);
        if !dup_ns.is_empty() {
            let dups: Vec<&Json> = workers
                .iter()
                .copied()
                .filter(|w| truthy_text(&w["namespace"]).is_some_and(|n| dup_ns.contains(&n)))
                .collect();
            f.add(
                "duplicate_namespace_worker",
                "blocker",
                &dups,
                one.clone(),
                format!(
                    "instance {iid:?} has more than one live worker for namespace(s) {dup_ns:?}"
                ),
                true,
            );
        }
        if client_types.len() > 1 {
            f.add("instance_id_collision", "blocker", workers, one.clone(), format!("client_instance_id {iid:?} is live under several client types {client_types:?}"), true);
        }
        if !trusted {
            f.add("legacy_incomplete_identity", "blocker", workers, one.clone(), format!("instance {iid:?} lacks a launcher-minted instance identity; relaunch it through `fleet-retire launch`"), true);
        }
        let unknown: Vec<&Json> = workers
            .iter()
            .copied()
            .filter(|w| w["client_type"] == UNKNOWN_CLIENT)
            .collect();
        if !unknown.is_empty() {
            f.add(
                "unknown_client",
                "blocker",
                &unknown,
                one.clone(),
                format!("instance {iid:?} has worker(s) with an unknown client type"),
                true,
            );
        }
        let foreign: Vec<&Json> = workers
            .iter()
            .copied()
            .filter(|w| w["foreign_repository"] == true)
            .collect();
        if !foreign.is_empty() {
            f.add(
                "foreign_repository",
                "blocker",
                &foreign,
                one.clone(),
                format!("instance {iid:?} has workers bound to another repository"),
                true,
            );
        }
        let old: Vec<&Json> = workers
            .iter()
            .copied()
            .filter(|w| w["old_revision"] == true)
            .collect();
        if !old.is_empty() {
            f.add(
                "old_revision",
                "blocker",
                &old,
                one.clone(),
                format!("instance {iid:?} has workers on an old revision"),
                true,
            );
        }
        let orphans: Vec<&Json> = workers
            .iter()
            .copied()
            .filter(|w| w["ownership_state"] == "orphaned")
            .collect();
        if !orphans.is_empty() {
            f.add(
                "orphaned_unowned",
                "blocker",
                &orphans,
                one.clone(),
                format!("instance {iid:?} has live workers without a session"),
                true,
            );
        }
        let mut ns_counts = Map::new();
        for w in workers.iter() {
            if let Some(ns) = truthy_text(&w["namespace"]) {
                let n = ns_counts.get(&ns).and_then(Json::as_u64).unwrap_or(0) + 1;
                ns_counts.insert(ns, json!(n));
            }
        }
        instances.push(json!({
            "client_instance_id": iid,
            "client_types": client_types,
            "client_type": if client_types.len() == 1 { client_types.iter().next().cloned() } else { None },
            "fleet_run_ids": ids(workers, "fleet_run_id"),
            "worker_count": workers.len(),
            "namespaces": ids(workers, "namespace"),
            "namespace_counts": ns_counts,
            "duplicate_namespaces": dup_ns,
            "trusted_instance_identity": trusted,
            "workers": workers,
            "mutation_safe": workers.iter().all(|w| w["mutation_safe"] == true) && dup_ns.is_empty() && trusted,
        }));
    }
    for w in &unkeyed {
        f.add(
            "legacy_incomplete_identity",
            "blocker",
            &[w],
            None,
            "live worker has no client_instance_id".into(),
            true,
        );
        if w["client_type"] == UNKNOWN_CLIENT {
            f.add(
                "unknown_client",
                "blocker",
                &[w],
                None,
                "live worker has an unknown client type and no instance id".into(),
                true,
            );
        }
    }
    // Stale and historical rows each have a finding of their own, derived
    // when read (see `row_finding`); the manifest's findings follow them.
    let early = std::mem::take(&mut f.0);

    let manifest = opts.manifest.clone().unwrap_or_default();
    let expected: BTreeSet<String> = manifest
        .iter()
        .filter_map(|i| {
            // Python's str(...).strip(), which also strips U+001C..U+001F.
            i["client_instance_id"]
                .as_str()
                .map(|s| crate::value::py_strip(s).to_string())
        })
        .filter(|s| !s.is_empty())
        .collect();
    let live_ids: BTreeSet<String> = by_instance.keys().cloned().collect();
    let missing: Vec<String> = expected.difference(&live_ids).cloned().collect();
    let unmanifested: Vec<String> = if expected.is_empty() {
        Vec::new()
    } else {
        live_ids.difference(&expected).cloned().collect()
    };
    for iid in &missing {
        f.add(
            "missing_expected",
            "blocker",
            &[],
            Some(vec![iid.clone()]),
            format!("expected instance {iid:?} is missing from the live fleet"),
            true,
        );
    }
    for iid in &unmanifested {
        f.add(
            "unmanifested",
            "blocker",
            by_instance.get(iid).map(Vec::as_slice).unwrap_or(&[]),
            Some(vec![iid.clone()]),
            format!("live instance {iid:?} is not on the approved fleet manifest"),
            true,
        );
    }

    let mut by_type: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for inst in &instances {
        for ct in inst["client_types"].as_array().into_iter().flatten() {
            by_type
                .entry(ct.as_str().unwrap_or_default().to_string())
                .or_default()
                .push(
                    inst["client_instance_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                );
        }
    }
    by_type.retain(|_, v| v.len() > 1);

    tracing::debug!(elapsed = ?started.elapsed(), "found");
    let late = f.0;
    let live_safe = stale_count == 0 && !early.iter().chain(&late).any(|x| x.active_blocker);
    let mutation_safe = live_safe && instances.iter().all(|i| i["mutation_safe"] == true);
    let token = consistency_token(rows, &measured, &snapshot_at);
    tracing::debug!(elapsed = ?started.elapsed(), "consistency token");
    let manifest = manifest
        .iter()
        .map(|i| {
            json!({
                "client_instance_id": i["client_instance_id"], "client_type": i["client_type"],
                "fleet_run_id": i["fleet_run_id"], "namespaces": i["namespaces"],
            })
        })
        .collect();
    drop(live);
    Snapshot {
        rows,
        measured,
        live: live_rendered,
        snapshot_at,
        token,
        historical_count,
        stale_count,
        instances,
        by_type,
        manifest,
        missing,
        unmanifested,
        early,
        late,
        live_safe,
        mutation_safe,
        comparison: None,
    }
}

/// Heartbeat continuity and stable ownership between two snapshots.
pub fn compare(earlier: &Json, later: &Json) -> Json {
    let index = |s: &Json| -> BTreeMap<String, Json> {
        s["live_workers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| key_text(&w["worker_identity"]).map(|k| (k, w.clone())))
            .collect()
    };
    let (a, b) = (index(earlier), index(later));
    let shared: Vec<&String> = a.keys().filter(|k| b.contains_key(*k)).collect();
    let mut stable = true;
    let mut continuity = Vec::new();
    for wid in &shared {
        let (x, y) = (&a[*wid], &b[*wid]);
        let same = |f: &str| x[f] == y[f];
        let hb_ok = match (
            x["last_heartbeat_at"].as_str(),
            y["last_heartbeat_at"].as_str(),
        ) {
            (Some(p), Some(q)) => q >= p,
            _ => true,
        };
        if !(same("client_instance_id") && same("session_id") && same("generation_id")) {
            stable = false;
        }
        continuity.push(json!({
            "worker_identity": wid,
            "same_client_instance_id": same("client_instance_id"),
            "same_session_id": same("session_id"),
            "same_generation_id": same("generation_id"),
            "heartbeat_non_decreasing": hb_ok,
            "earlier_heartbeat": x["last_heartbeat_at"],
            "later_heartbeat": y["last_heartbeat_at"],
        }));
    }
    let all_hb = continuity
        .iter()
        .all(|c| c["heartbeat_non_decreasing"] == true);
    json!({
        "shared_live_workers": shared,
        "continuity": continuity,
        "stable_ownership": stable && all_hb,
        "dropped_workers": a.keys().filter(|k| !b.contains_key(*k)).collect::<Vec<_>>(),
        "new_workers": b.keys().filter(|k| !a.contains_key(*k)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    //! The five divergences from the reference snapshot found by comparing
    //! it on real registries; two of them called an unsafe fleet safe.

    use super::*;
    use crate::evidence::probe::{GivenProbe, PidObservation};

    const NOW: &str = "2026-07-30T12:00:00Z";
    const INST: &str = "inst-codex-20260730T100000Z-abc123def456";

    /// A live, trusted codex worker.
    fn live(id: Json, pid: i64, overrides: Json) -> Row {
        let mut row = json!({
            "worker_identity": id, "client_name": "codex", "client_instance_id": INST,
            "instance_id_source": "launcher", "session_id": format!("s-{pid}"),
            "generation_id": format!("g-{pid}"), "namespace": format!("ns-{pid}"),
            "pid": pid, "started_at": "2026-07-30T11:00:00Z",
            "last_heartbeat_at": "2026-07-30T11:59:00Z", "heartbeat_ttl_seconds": 900,
            "fencing_epoch": 1, "status": "active", "host_id": "h", "boot_id": "b",
            "process_start_time": "ticks-1", "repository_binding": "prgs/gitea-tools",
        });
        for (k, v) in overrides.as_object().unwrap() {
            row[k] = v.clone();
        }
        Row::from_json(row.as_object().unwrap()).unwrap()
    }

    fn run(rows: &[Row], opts: Options) -> Json {
        let mut probe = GivenProbe::default();
        for r in rows {
            if let Value::Int(pid) = r.get(Col::Pid) {
                probe.processes.insert(
                    *pid,
                    PidObservation {
                        alive: Some(true),
                        start_time: Some("ticks-1".into()),
                    },
                );
            }
        }
        let opts = Options {
            now: crate::time::parse_ts(NOW).unwrap(),
            ..opts
        };
        snapshot(rows, &opts, &probe)
    }

    fn classes(snap: &Json) -> Vec<String> {
        snap["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["classification"].as_str().unwrap().to_string())
            .collect()
    }

    fn finding<'a>(snap: &'a Json, class: &str) -> &'a Json {
        snap["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["classification"] == class)
            .unwrap_or_else(|| panic!("no {class} in {:?}", classes(snap)))
    }

    #[test]
    fn a_null_identity_sharing_a_pid_is_a_collision() {
        for blank in [Json::Null, json!("")] {
            let rows = [
                live(blank.clone(), 4242, json!({"namespace": "author"})),
                live(json!("w-real"), 4242, json!({"namespace": "reviewer"})),
            ];
            let snap = run(&rows, Options::default());
            assert_eq!(snap["live_fleet_safe"], false, "{blank}");
            // As the seed reports them: a falsy identity is null.
            for class in ["pid_collision", "process_identity_collision"] {
                assert_eq!(
                    finding(&snap, class)["worker_identities"],
                    json!([null, "w-real"])
                );
            }
        }
    }

    #[test]
    fn a_namespace_named_none_is_a_namespace() {
        let same = json!({"namespace": "None", "generation_id": "g-None", "session_id": "s-None"});
        let rows = [
            live(json!("w-1"), 4242, same.clone()),
            live(json!("w-2"), 4243, same),
        ];
        let snap = run(&rows, Options::default());
        assert_eq!(snap["live_fleet_safe"], false);
        let found = classes(&snap);
        for class in [
            "duplicate_namespace_worker",
            "generation_identity_collision",
            "session_identity_collision",
        ] {
            assert!(found.contains(&class.to_string()), "{class}: {found:?}");
        }
        // An instance id and a fleet run named "None" are kept too.
        let rows = [live(
            json!("w-1"),
            4242,
            json!({"client_instance_id": "None", "fleet_run_id": "None"}),
        )];
        let snap = run(&rows, Options::default());
        assert_eq!(snap["instances"][0]["client_instance_id"], "None");
        assert_eq!(snap["instances"][0]["fleet_run_ids"], json!(["None"]));
    }

    #[test]
    fn an_empty_expected_revision_is_no_expectation() {
        let rows = [live(json!("w-1"), 4242, json!({"live_revision": "abc"}))];
        let snap = run(
            &rows,
            Options {
                expected_live_revision: Some(String::new()),
                ..Options::default()
            },
        );
        assert!(!classes(&snap).contains(&"old_revision".to_string()));
        assert_eq!(snap["live_fleet_safe"], true);
    }

    #[test]
    fn manifest_ids_are_stripped_as_python_strips() {
        let rows = [live(json!("w-1"), 4242, json!({}))];
        let snap = run(
            &rows,
            Options {
                manifest: Some(vec![json!({"client_instance_id": format!("{INST}\u{1f}")})]),
                ..Options::default()
            },
        );
        let found = classes(&snap);
        assert!(
            !found.contains(&"missing_expected".to_string()),
            "{found:?}"
        );
        assert!(!found.contains(&"unmanifested".to_string()), "{found:?}");
    }

    #[test]
    fn null_and_empty_instance_ids_are_different_instances() {
        let same = json!({"generation_id": "g-1", "fencing_epoch": 7});
        let mut a = same.clone();
        a["client_instance_id"] = Json::Null;
        a["namespace"] = json!("author");
        let mut b = same;
        b["client_instance_id"] = json!("");
        b["namespace"] = json!("reviewer");
        let rows = [live(json!("w-1"), 4242, a), live(json!("w-2"), 4243, b)];
        let snap = run(&rows, Options::default());
        let found = classes(&snap);
        for class in [
            "generation_identity_collision",
            "ownership_fencing_collision",
        ] {
            assert!(found.contains(&class.to_string()), "{class}: {found:?}");
        }
        assert_eq!(snap["live_fleet_safe"], false);
    }

    /// The streamed writer (`write_json`, used by the command line) and the
    /// `Serialize` document (used by `serve` and the fixtures) are the same
    /// document, key order included, whatever mix of live, stale and
    /// historical rows, findings and blockers the registry holds; and more
    /// rows than one write batch keep their order.
    #[test]
    fn streamed_document_equals_serialized_document() {
        let mut rows = Vec::new();
        for n in 0..(WRITE_BATCH as i64 + 300) {
            let status = match n % 7 {
                0 => "released",
                1 => "retired",
                _ => "active",
            };
            let heartbeat = if n % 3 == 0 {
                "2026-07-29T00:00:00Z"
            } else {
                "2026-07-30T11:59:00Z"
            };
            rows.push(live(
                json!(format!("w-{n}")),
                1000 + n % 50,
                json!({"status": status, "last_heartbeat_at": heartbeat,
                       "namespace": format!("ns-{}", n % 5), "fencing_epoch": n % 4}),
            ));
        }
        rows.push(live(json!(null), 7, json!({"client_instance_id": null})));
        let opts = Options {
            now: crate::time::parse_ts(NOW).unwrap(),
            canonical_repository: Some("prgs/gitea-tools".into()),
            expected_live_revision: Some("r2".into()),
            manifest: Some(vec![json!({"client_instance_id": "inst-missing"})]),
        };
        let mut probe = GivenProbe::default();
        for pid in 1000..1050 {
            probe.processes.insert(
                pid,
                PidObservation {
                    alive: Some(pid % 2 == 0),
                    start_time: Some("ticks-1".into()),
                },
            );
        }
        let mut snap = Snapshot::take(&rows, &opts, &probe);
        snap.comparison = Some(json!({"continuity": true}));
        let whole = serde_json::to_value(&snap).unwrap();
        let mut text = Vec::new();
        snap.write_json(&mut text).unwrap();
        let streamed: Json = serde_json::from_slice(&text).unwrap();
        assert_eq!(streamed, whole);
        let keys = |j: &Json| j.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&streamed), keys(&whole));
        assert!(whole["stale_workers"].as_array().unwrap().len() > 100);
        assert!(whole["historical_findings"].as_array().unwrap().len() > 100);
        assert!(!whole["active_blockers"].as_array().unwrap().is_empty());
        assert!(whole["workers"].as_array().unwrap().len() > WRITE_BATCH);
    }
}
