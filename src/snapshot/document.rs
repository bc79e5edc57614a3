//! The snapshot as a document: the one place its JSON is made. One
//! worker's entry written straight from its row and measurements, an
//! instance's entry from the detectors' typed result, and the whole document
//! streamed for a large registry (one list element per line, rendered in
//! batches on every core).

use super::detect::Instance;
use super::findings::{row_finding, Finding, FindingClass};
use super::measure::Measured;
use super::take::{FindingPart, Snapshot};
use crate::observe::process_identity;
use crate::row::{Col, Row};
use crate::value::Val;
use serde_json::{json, Value as Json};

/// The lists of workers a snapshot document holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerList {
    /// `workers`: every row.
    All,
    /// `live_workers`.
    Live,
    /// `stale_workers`.
    Stale,
    /// `historical_workers`.
    Historical,
}

/// One worker as the snapshot reports it.
fn render(row: &Row, m: &Measured) -> Json {
    serde_json::to_value(WorkerView(row, m)).expect("a worker entry serialises")
}

/// One worker's entry, written straight from its row and measurements.
struct WorkerView<'r>(&'r Row, &'r Measured);

/// The seed's `record.get(x) or record.get(fallback)`: a falsy value (NULL,
/// "", 0) falls through to a column a registry does not have.
struct OrNull<'v>(Val<'v>);

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
        map.serialize_entry("fleet_run_id", &v(Col::FleetRunId))?;
        map.serialize_entry("namespace", &v(Col::Namespace))?;
        map.serialize_entry("profile", &v(Col::Profile))?;
        map.serialize_entry("declared_role", &OrNull(v(Col::Role)))?;
        map.serialize_entry("authenticated_account", &v(Col::AuthenticatedAccount))?;
        map.serialize_entry("session_id", &v(Col::SessionId))?;
        map.serialize_entry("generation_id", &v(Col::GenerationId))?;
        map.serialize_entry("process_identity", &process_identity(row))?;
        map.serialize_entry("pid", &v(Col::Pid))?;
        map.serialize_entry("pid_alive", &m.pid_alive)?;
        map.serialize_entry("repository_binding", &v(Col::RepositoryBinding))?;
        map.serialize_entry("remote", &v(Col::Remote))?;
        map.serialize_entry("startup_revision", &v(Col::StartupRevision))?;
        map.serialize_entry("loaded_revision", &v(Col::LoadedRevision))?;
        map.serialize_entry("parity_revision", &v(Col::ParityRevision))?;
        map.serialize_entry("live_revision", &v(Col::LiveRevision))?;
        map.serialize_entry("runtime_provenance", &OrNull(v(Col::Transport)))?;
        map.serialize_entry("transport", &v(Col::Transport))?;
        map.serialize_entry("started_at", &v(Col::StartedAt))?;
        map.serialize_entry("last_heartbeat_at", &v(Col::LastHeartbeatAt))?;
        map.serialize_entry("heartbeat_ttl_seconds", &v(Col::HeartbeatTtlSeconds))?;
        map.serialize_entry("fencing_epoch", &v(Col::FencingEpoch))?;
        map.serialize_entry("status", &v(Col::Status))?;
        map.serialize_entry("host_id", &v(Col::HostId))?;
        map.serialize_entry("boot_id", &v(Col::BootId))?;
        map.serialize_entry("instance_id_provenance", m.identity.provenance)?;
        map.serialize_entry("instance_identity_trusted", &m.identity.trusted)?;
        map.serialize_entry("live", &m.live)?;
        map.serialize_entry("historical", &m.historical)?;
        map.serialize_entry(
            "liveness",
            &LivenessView {
                live: liveness.live,
                heartbeat_fresh: liveness.heartbeat_fresh,
                heartbeat_age_seconds: liveness.heartbeat_age_seconds(),
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

/// One line of a streamed list: an element already rendered as JSON.
pub(super) type Line = Vec<u8>;

pub(super) const WRITE_BATCH: usize = 8192;

/// One live instance's entry, its workers rendered from their rows.
struct InstanceView<'s, 'a>(&'s Instance, &'s Snapshot<'a>);

impl serde::Serialize for InstanceView<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let InstanceView(inst, snap) = *self;
        let client_type = match inst.client_types.len() {
            1 => inst.client_types.first(),
            _ => None,
        };
        let mut map = s.serialize_map(Some(11))?;
        map.serialize_entry("client_instance_id", &inst.client_instance_id)?;
        map.serialize_entry("client_types", &inst.client_types)?;
        map.serialize_entry("client_type", &client_type)?;
        map.serialize_entry("fleet_run_ids", &inst.fleet_run_ids)?;
        map.serialize_entry("worker_count", &inst.workers.len())?;
        map.serialize_entry("namespaces", &inst.namespaces)?;
        map.serialize_entry("namespace_counts", &NamespaceCounts(&inst.namespace_counts))?;
        map.serialize_entry("duplicate_namespaces", &inst.duplicate_namespaces)?;
        map.serialize_entry("trusted_instance_identity", &inst.trusted)?;
        let workers: Vec<WorkerView<'_>> = inst
            .workers
            .iter()
            .map(|i| WorkerView(&snap.rows[*i], &snap.measured[*i]))
            .collect();
        map.serialize_entry("workers", &workers)?;
        map.serialize_entry("mutation_safe", &inst.mutation_safe)?;
        map.end()
    }
}

/// Workers per namespace, as an object in the order given.
struct NamespaceCounts<'s>(&'s [(String, usize)]);

impl serde::Serialize for NamespaceCounts<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(ns, n)| (ns, n)))
    }
}

impl Snapshot<'_> {
    /// The live workers as rendered (for `compare`).
    pub fn live_workers(&self) -> Vec<Json> {
        self.rows
            .iter()
            .zip(&self.measured)
            .filter(|(_, m)| m.live)
            .map(|(r, m)| render(r, m))
            .collect()
    }

    /// The entries of one list of workers, in registry order, as the
    /// document renders them: `skip` of them left out, then each rendered
    /// as `take` asks for more (a caller paging by size stops early).
    pub fn workers_of(&self, list: WorkerList, skip: usize, mut take: impl FnMut(Json) -> bool) {
        let keep: fn(&Measured) -> bool = match list {
            WorkerList::All => |_| true,
            WorkerList::Live => |m| m.live,
            WorkerList::Stale => Measured::stale,
            WorkerList::Historical => |m| m.historical,
        };
        let selected = self
            .rows
            .iter()
            .zip(&self.measured)
            .filter(|(_, m)| keep(m))
            .skip(skip);
        for (r, m) in selected {
            if !take(render(r, m)) {
                return;
            }
        }
    }

    /// How many workers one list holds.
    pub fn worker_count(&self, list: WorkerList) -> usize {
        match list {
            WorkerList::All => self.rows.len(),
            WorkerList::Live => self.live_count,
            WorkerList::Stale => self.stale_count,
            WorkerList::Historical => self.historical_count,
        }
    }

    /// The live instances' entries, as the document renders them.
    pub fn instance_entries(&self) -> Vec<Json> {
        self.instance_views()
            .iter()
            .map(|v| serde_json::to_value(v).expect("an instance entry serialises"))
            .collect()
    }

    /// The live instances' entries.
    fn instance_views(&self) -> Vec<InstanceView<'_, '_>> {
        self.instances
            .iter()
            .map(|i| InstanceView(i, self))
            .collect()
    }

    /// What a person reads: counts, instances, blockers, comparison (see
    /// `report::snapshot_summary`), without the per-worker lists.
    pub fn summary_json(&self) -> Json {
        let mut doc = json!({
            "snapshot_at": self.snapshot_at,
            "live_worker_count": self.live_count,
            "historical_worker_count": self.historical_count,
            "stale_worker_count": self.stale_count,
            "instance_count": self.instances.len(),
            "instances": self.instance_views(),
            "active_blockers": self.active_blockers().collect::<Vec<_>>(),
            "live_fleet_safe": self.live_safe,
        });
        if let Some(c) = &self.comparison {
            doc["comparison"] = c.clone();
        }
        doc
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
        field(w, "live_worker_count", &self.live_count)?;
        field(w, "historical_worker_count", &self.historical_count)?;
        field(w, "stale_worker_count", &self.stale_count)?;
        field(w, "instance_count", &self.instances.len())?;
        field(w, "other_host_worker_count", &self.other_host_count)?;
        list(w, "workers", |emit| self.emit_rows(|_| true, emit))?;
        list(w, "live_workers", |emit| self.emit_rows(|m| m.live, emit))?;
        list(w, "historical_workers", |emit| {
            self.emit_rows(|m| m.historical, emit)
        })?;
        list(w, "stale_workers", |emit| {
            self.emit_rows(Measured::stale, emit)
        })?;
        field(w, "instances", &self.instance_views())?;
        field(w, "multi_instance_same_client_type", &self.by_type)?;
        field(w, "same_client_type_not_duplicate", &true)?;
        field(w, "expected_manifest", &self.manifest)?;
        field(w, "missing_expected_instance_ids", &self.missing)?;
        field(w, "unmanifested_instance_ids", &self.unmanifested)?;
        list(w, "findings", |emit| {
            self.emit_findings(|_| true, |f| f, emit)
        })?;
        list(w, "active_blockers", |emit| {
            self.emit_findings(|f| f.classification.blocks(), |f| f, emit)
        })?;
        list(w, "historical_findings", |emit| {
            self.emit_findings(
                |f| f.classification == FindingClass::HistoricalDead,
                |f| f,
                emit,
            )
        })?;
        field(w, "live_fleet_safe", &self.live_safe)?;
        field(w, "mutation_safe", &self.mutation_safe)?;
        let comparison = self.comparison.as_ref();
        write!(w, "\"reasons\": [")?;
        let mut first = true;
        self.emit_findings(|f| f.classification.blocks(), |f| f.detail, &mut |line| {
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
        m.serialize_entry("live_worker_count", &self.live_count)?;
        m.serialize_entry("historical_worker_count", &self.historical_count)?;
        m.serialize_entry("stale_worker_count", &self.stale_count)?;
        m.serialize_entry("instance_count", &self.instances.len())?;
        m.serialize_entry("other_host_worker_count", &self.other_host_count)?;
        m.serialize_entry(
            "workers",
            &RenderedRows {
                snap: self,
                keep: |_| true,
            },
        )?;
        m.serialize_entry(
            "live_workers",
            &RenderedRows {
                snap: self,
                keep: |m| m.live,
            },
        )?;
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
        m.serialize_entry("instances", &self.instance_views())?;
        m.serialize_entry("multi_instance_same_client_type", &self.by_type)?;
        m.serialize_entry("same_client_type_not_duplicate", &true)?;
        m.serialize_entry("expected_manifest", &self.manifest)?;
        m.serialize_entry("missing_expected_instance_ids", &self.missing)?;
        m.serialize_entry("unmanifested_instance_ids", &self.unmanifested)?;
        m.serialize_entry("findings", &FindingsWhere(self, |_| true))?;
        m.serialize_entry(
            "active_blockers",
            &FindingsWhere(self, |f| f.classification.blocks()),
        )?;
        m.serialize_entry(
            "historical_findings",
            &FindingsWhere(self, |f| f.classification == FindingClass::HistoricalDead),
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
