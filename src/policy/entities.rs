//! Observations → Cedar entities.
//!
//! One `Run` principal per run (host facts, canonical repository, lease
//! protections) and one `Worker` per registry row, keyed by row position
//! (identities may be duplicated, so they cannot be entity ids). Entities
//! are built once per run and checked against the schema.

use crate::error::{Error, Result};
use crate::observe::{Observation, RunFacts};
use crate::row::{Row, COLUMNS};
use cedar_policy::{
    Entities, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression, Schema,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::str::FromStr;

fn uid(type_name: &str, id: &str) -> EntityUid {
    let ty = EntityTypeName::from_str(type_name).expect("entity type names here are valid");
    EntityUid::from_type_name_and_id(ty, EntityId::new(id))
}

/// The run principal's uid.
pub fn run_uid() -> EntityUid {
    uid("FleetRetire::Run", "current")
}

/// The retire action's uid.
pub fn retire_action() -> EntityUid {
    uid("FleetRetire::Action", "retire")
}

/// The uid of the worker entity for row `index`.
pub fn worker_uid(index: usize) -> EntityUid {
    uid("FleetRetire::Worker", &format!("row-{index}"))
}

fn s(v: impl Into<String>) -> RestrictedExpression {
    RestrictedExpression::new_string(v.into())
}

fn b(v: bool) -> RestrictedExpression {
    RestrictedExpression::new_bool(v)
}

fn set<'a>(items: impl IntoIterator<Item = &'a String>) -> RestrictedExpression {
    RestrictedExpression::new_set(items.into_iter().map(|x| s(x.clone())))
}

/// The run principal.
pub fn run_entity(facts: &RunFacts) -> Result<Entity> {
    let p = &facts.protections;
    let canonical = facts
        .canonical_repository
        .as_deref()
        .filter(|c| !c.is_empty());
    let attrs: HashMap<String, RestrictedExpression> = [
        (
            "host_id_known",
            b(facts.host.host_id.as_deref().is_some_and(|h| !h.is_empty())),
        ),
        ("host_id", s(facts.host.host_id.clone().unwrap_or_default())),
        (
            "boot_id_known",
            b(facts.host.boot_id.as_deref().is_some_and(|h| !h.is_empty())),
        ),
        ("boot_id", s(facts.host.boot_id.clone().unwrap_or_default())),
        ("canonical_repository_given", b(canonical.is_some())),
        (
            "canonical_repository_key",
            s(canonical.unwrap_or("").trim_end_matches('/')),
        ),
        ("lease_worker_identities", set(&p.worker_identities)),
        ("lease_session_ids", set(&p.session_ids)),
        ("lease_pids", set(&p.pids)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Entity::new(run_uid(), attrs, HashSet::new())
        .map_err(|e| Error::Input(format!("building the run entity: {e}")))
}

/// The worker entity for one row.
pub fn worker_entity(index: usize, row: &Row, obs: &Observation) -> Result<Entity> {
    use crate::row::Col;
    let blank: BTreeSet<String> = COLUMNS
        .iter()
        .filter(|c| row.get(**c).is_blank())
        .map(|c| c.name().to_string())
        .collect();
    let heartbeat = match obs.liveness.heartbeat_fresh {
        Some(true) => "fresh",
        Some(false) => "expired",
        None => "unparsable",
    };
    let pid_probe = match obs.pid.alive {
        Some(true) => "alive",
        Some(false) => "dead",
        None => "unknown",
    };
    let binding = row.get(Col::RepositoryBinding).stripped();
    let attrs: HashMap<String, RestrictedExpression> = [
        ("worker_identity", s(row.get(Col::WorkerIdentity).canon())),
        (
            "identity_row_count",
            RestrictedExpression::new_long(obs.identity_row_count as i64),
        ),
        ("status", s(row.get(Col::Status).or_empty_str())),
        ("blank_fields", set(&blank)),
        ("heartbeat", s(heartbeat)),
        ("pid_probe", s(pid_probe)),
        (
            "live_start_time",
            s(obs.pid.start_time.clone().unwrap_or_default()),
        ),
        ("host_id", s(row.get(Col::HostId).stripped())),
        ("boot_id", s(row.get(Col::BootId).stripped())),
        (
            "process_start_time",
            s(row.get(Col::ProcessStartTime).stripped()),
        ),
        ("ownership_state", s(obs.ownership_state)),
        ("repository_binding_key", s(binding.trim_end_matches('/'))),
        ("repository_binding", s(binding)),
        (
            "client_instance_id",
            s(row.get(Col::ClientInstanceId).stripped()),
        ),
        (
            "instance_id_source",
            s(row.get(Col::InstanceIdSource).as_text().unwrap_or("")),
        ),
        ("session_id", s(row.get(Col::SessionId).canon())),
        ("pid", s(row.get(Col::Pid).canon())),
        (
            "shared_identity_evidence",
            set(&obs.shared_identity_evidence),
        ),
        ("instance_slot_contested", b(obs.instance_slot_contested)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Entity::new(worker_uid(index), attrs, HashSet::new())
        .map_err(|e| Error::Input(format!("building the entity for row {}: {e}", index + 1)))
}

/// All entities of a run, checked against the schema.
pub fn build(
    rows: &[Row],
    observations: &[Observation],
    facts: &RunFacts,
    schema: &Schema,
) -> Result<Entities> {
    let mut all = Vec::with_capacity(rows.len() + 1);
    all.push(run_entity(facts)?);
    for (i, (row, obs)) in rows.iter().zip(observations).enumerate() {
        all.push(worker_entity(i, row, obs)?);
    }
    Entities::from_entities(all, Some(schema)).map_err(|e| {
        Error::Policy(format!(
            "the observed entities do not fit policies/{}: {e}; the schema and the program disagree",
            crate::policy::SCHEMA_FILE
        ))
    })
}
