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
