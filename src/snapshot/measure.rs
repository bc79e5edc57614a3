//! What the snapshot is asked, and what it measures of each row: its pid
//! probed, its liveness and instance identity classified, once per row.

use crate::evidence::probe::{observe_pid, ProcessProbe};
use crate::identity::{assess_instance_identity, normalize_client_name, UNKNOWN_CLIENT};
use crate::liveness::assess;
use crate::observe::{foreign_repository, ownership_state};
use crate::row::{Col, Row};
use crate::time::Micros;
use serde_json::Value as Json;

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
    /// This host's id, when the snapshot is taken of a live registry here:
    /// a row of another host then has its pid unknown rather than probed
    /// (this host's process table cannot speak for it), and is live or not
    /// by its heartbeat alone. `None` (fixtures) probes every pid.
    pub host_id: Option<String>,
}

impl Options {
    /// What a snapshot of a live registry on this host is asked: now, this
    /// host's id (from `proc_root`), and what the caller expects. An empty
    /// expected revision is no expectation, as the seed reads it.
    pub fn here(
        proc_root: &std::path::Path,
        canonical_repository: Option<String>,
        expected_live_revision: Option<String>,
        manifest: Option<Vec<Json>>,
    ) -> Options {
        Options {
            now: crate::time::now(),
            canonical_repository,
            expected_live_revision: expected_live_revision.filter(|r| !r.is_empty()),
            manifest,
            host_id: crate::evidence::probe::HostFacts::observe(proc_root).host_id,
        }
    }
}

/// The first manifest entry without a string `client_instance_id`, the one
/// field the snapshot matches instances by.
pub fn entry_without_instance_id(entries: &[Json]) -> Option<usize> {
    entries
        .iter()
        .position(|item| !item.get("client_instance_id").is_some_and(Json::is_string))
}

/// A manifest document's entries: `{"instances": [...]}` or a bare list,
/// each with a string `client_instance_id`. The error says what is wrong.
pub fn manifest_entries(doc: Json) -> Result<Vec<Json>, String> {
    let entries = match doc {
        Json::Array(a) => a,
        Json::Object(mut o) => match o.remove("instances") {
            Some(Json::Array(a)) => a,
            _ => return Err("expected {\"instances\": [...]}".into()),
        },
        _ => return Err("expected {\"instances\": [...]}".into()),
    };
    match entry_without_instance_id(&entries) {
        Some(i) => Err(format!("instances[{i}] needs a string client_instance_id")),
        None => Ok(entries),
    }
}

/// What the snapshot measured about one row: enough to render its worker
/// entry, or read it as a live worker, without probing again. About 150
/// bytes a row, where a rendered entry is a few kilobytes: entries are
/// rendered only while the document is written.
#[derive(Debug, Clone)]
pub(super) struct Measured {
    pub(super) pid_alive: Option<bool>,
    pub(super) liveness: crate::liveness::Liveness,
    pub(super) identity: crate::identity::InstanceIdentity,
    pub(super) client_type: &'static str,
    pub(super) live: bool,
    pub(super) historical: bool,
    pub(super) foreign: bool,
    pub(super) old_revision: bool,
    pub(super) ownership: &'static str,
    pub(super) mutation_safe: bool,
    pub(super) other_host: bool,
}

/// Measure one row: probe its pid, classify its liveness and identity.
pub(super) fn measure(row: &Row, opts: &Options, probe: &dyn ProcessProbe) -> Measured {
    let other_host = opts
        .host_id
        .as_deref()
        .is_some_and(|mine| crate::observe::of_another_host(row, mine));
    let pid = if other_host {
        crate::evidence::probe::PidObservation::default()
    } else {
        observe_pid(row.get(Col::Pid), probe)
    };
    let liveness = assess(row, opts.now, pid.alive);
    let historical = !row.is_active();
    let live = liveness.live && !historical;
    let identity = assess_instance_identity(
        row.get(Col::ClientInstanceId).as_text(),
        row.get(Col::InstanceIdSource).as_text(),
    );
    let client_type = normalize_client_name(row.get(Col::ClientName).as_text());
    let foreign = foreign_repository(row, opts.canonical_repository.as_deref());
    let old_revision = on_old_revision(row, opts.expected_live_revision.as_deref());
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
        other_host,
    }
}

/// Whether any revision the row records differs from the expected one. An
/// empty expected revision is no expectation (the seed tests it for truth).
fn on_old_revision(row: &Row, expected: Option<&str>) -> bool {
    expected.filter(|e| !e.is_empty()).is_some_and(|expected| {
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
    })
}

impl Measured {
    /// Active in the registry but not live.
    pub(super) fn stale(&self) -> bool {
        !self.live && !self.historical
    }
}
