//! Observations → Cedar entities.
//!
//! One `Run` principal per run (host facts, canonical repository, lease
//! protections) and one `Worker` per registry row, keyed by row position
//! (identities may be duplicated, so they cannot be entity ids).
//!
//! Entities are built as Cedar values directly (no expression parsing or
//! evaluation), which is what lets a plan judge 100,000 rows in well under a
//! second. Every run checks its run entity and a worker entity against the
//! schema through the public API, so a drift between this builder and
//! `schema.cedarschema` stops the run instead of producing evaluation errors.

use crate::error::{About, Error, Result};
use crate::observe::{Observation, RunFacts};
use crate::row::{Col, Row, COLUMNS};
use cedar_policy::{EntityTypeName, Schema};
use cedar_policy_core::ast::{self, EntityUID, PartialValue, Value};
use smol_str::SmolStr;
use std::borrow::Cow;
use std::collections::HashSet;
use std::str::FromStr;

/// The schema file name inside a policy folder. Kept here, beside the
/// check that names it, so this file needs nothing from the policy module
/// that uses it (no import circle).
pub const SCHEMA_FILE: &str = "schema.cedarschema";

fn uid(type_name: &str, id: &str) -> EntityUID {
    let ty = EntityTypeName::from_str(type_name).expect("entity type names here are valid");
    cedar_policy::EntityUid::from_type_name_and_id(ty, cedar_policy::EntityId::new(id)).into()
}

fn worker_type() -> &'static EntityTypeName {
    static TYPE: std::sync::OnceLock<EntityTypeName> = std::sync::OnceLock::new();
    TYPE.get_or_init(|| EntityTypeName::from_str("FleetRetire::Worker").expect("valid entity type"))
}

/// The run principal's uid.
pub fn run_uid() -> EntityUID {
    uid("FleetRetire::Run", "current")
}

/// The retire action's uid.
pub fn retire_action() -> EntityUID {
    uid("FleetRetire::Action", "retire")
}

/// The first-stage actions, judged per row before retire (see
/// `observe::peer_facts`): one per kind of identity evidence ("does the row
/// hold this kind?", in `observe::EVIDENCE_KINDS` order, each named
/// `hold_<kind>`), then "does it claim its instance slot?" and "does it
/// occupy it?".
pub const FIRST_STAGE_ACTIONS: [&str; 6] = [
    "hold_session_id",
    "hold_generation_id",
    "hold_process_identity",
    "hold_pid",
    "claim_instance_slot",
    "occupy_instance_slot",
];

/// The first-stage actions' uids, in [`FIRST_STAGE_ACTIONS`] order.
pub fn first_stage_actions() -> Vec<EntityUID> {
    FIRST_STAGE_ACTIONS
        .iter()
        .map(|a| uid("FleetRetire::Action", a))
        .collect()
}

/// Worker attributes computed from first-stage answers: no first-stage
/// policy may read them (`Policies::load` refuses one that does).
pub const AGGREGATE_ATTRIBUTES: &[&str] = &[
    "shared_identity_evidence",
    "slot_active_claimants",
    "slot_occupants",
];

/// The uid of the worker entity for row `index`.
pub fn worker_uid(index: usize) -> EntityUID {
    cedar_policy::EntityUid::from_type_name_and_id(
        worker_type().clone(),
        cedar_policy::EntityId::new(format!("row-{index}")),
    )
    .into()
}

/// An attribute value as observed, before it becomes a Cedar value. Cheap
/// to build for every row; only rows Cedar is actually asked about are
/// converted (see `policy::memo`).
#[derive(Debug, Clone, PartialEq)]
pub enum Attr<'a> {
    /// A boolean.
    Bool(bool),
    /// A long.
    Long(i64),
    /// A string.
    Str(Cow<'a, str>),
    /// A set of strings, sorted and without repeats.
    Set(Vec<Cow<'a, str>>),
    /// A set of column names, as the bits of their columns (bit `c` for
    /// column `c`, as `Row::blank_columns` gives them): to Cedar, the set
    /// of those columns' names.
    Columns(u64),
}

impl Attr<'_> {
    /// The Cedar value.
    pub fn to_cedar(&self) -> Value {
        match self {
            Attr::Bool(b) => Value::from(*b),
            Attr::Long(n) => Value::from(*n),
            Attr::Str(t) => Value::from(SmolStr::from(t.as_ref())),
            Attr::Set(items) => Value::set(
                items.iter().map(|t| Value::from(SmolStr::from(t.as_ref()))),
                None,
            ),
            Attr::Columns(bits) => Value::set(
                column_names(*bits).map(|n| Value::from(SmolStr::new_static(n))),
                None,
            ),
        }
    }
}

/// The names of the columns whose bits are set in `bits`, sorted.
pub fn column_names(bits: u64) -> impl Iterator<Item = &'static str> {
    columns_by_name()
        .iter()
        .filter(move |c| bits & (1 << **c as u64) != 0)
        .map(|c| c.name())
}

/// Every column's name (the strings an [`Attr::Columns`] can hold).
pub fn all_column_names() -> impl Iterator<Item = &'static str> {
    columns_by_name().iter().map(|c| c.name())
}

fn s<'a>(v: impl Into<Cow<'a, str>>) -> Attr<'a> {
    Attr::Str(v.into())
}

fn set<'a, I, T>(items: I) -> Attr<'a>
where
    I: IntoIterator<Item = T>,
    T: Into<Cow<'a, str>>,
{
    let mut v: Vec<Cow<'a, str>> = items.into_iter().map(Into::into).collect();
    v.sort();
    v.dedup();
    Attr::Set(v)
}

/// Make an entity from attribute values.
pub fn entity(uid: EntityUID, attrs: &[(&'static str, Attr<'_>)]) -> ast::Entity {
    ast::Entity::new_with_attr_partial_value(
        uid,
        attrs
            .iter()
            .map(|(k, v)| (SmolStr::new_static(k), PartialValue::Value(v.to_cedar()))),
        HashSet::new(),
        HashSet::new(),
        [],
    )
}

/// The run principal.
pub fn run_entity(facts: &RunFacts) -> ast::Entity {
    entity(run_uid(), &run_attrs(facts))
}

/// The run principal's attributes.
pub fn run_attrs(facts: &RunFacts) -> Vec<(&'static str, Attr<'_>)> {
    let p = &facts.protections;
    let known = |v: &Option<String>| v.as_deref().is_some_and(|h| !h.is_empty());
    let canonical = facts
        .canonical_repository
        .as_deref()
        .filter(|c| !c.is_empty());
    vec![
        ("host_id_known", Attr::Bool(known(&facts.host.host_id))),
        ("host_id", s(facts.host.host_id.as_deref().unwrap_or(""))),
        ("boot_id_known", Attr::Bool(known(&facts.host.boot_id))),
        ("boot_id", s(facts.host.boot_id.as_deref().unwrap_or(""))),
        (
            "pid_namespace",
            s(facts.host.pid_namespace.as_deref().unwrap_or("")),
        ),
        (
            "canonical_repository_given",
            Attr::Bool(canonical.is_some()),
        ),
        (
            "canonical_repository_key",
            s(canonical.unwrap_or("").trim_end_matches('/')),
        ),
        (
            "lease_worker_identities",
            set(p.worker_identities.iter().map(String::as_str)),
        ),
        (
            "lease_session_ids",
            set(p.session_ids.iter().map(String::as_str)),
        ),
        ("lease_pids", set(p.pids.iter().map(String::as_str))),
    ]
}

/// The worker entity for one row at the run's clock `now`.
pub fn worker_entity(
    index: usize,
    row: &Row,
    obs: &Observation,
    now: crate::time::Micros,
) -> ast::Entity {
    entity(worker_uid(index), &worker_attrs(row, obs, now))
}

/// The worker attributes, in schema order (`worker_attrs` lists them so).
pub const WORKER_ATTRIBUTES: &[&str] = &[
    "worker_identity",
    "identity_row_count",
    "status",
    "blank_fields",
    "heartbeat_parsed",
    "heartbeat_age_us",
    "ttl_number",
    "ttl_sign",
    "ttl_us",
    "pid_probe",
    "live_start_time",
    "host_id",
    "boot_id",
    "process_start_time",
    "pid_namespace",
    "repository_binding_key",
    "repository_binding",
    "client_instance_id",
    "instance_id_source",
    "session_id",
    "pid",
    "shared_identity_evidence",
    "slot_active_claimants",
    "slot_occupants",
    "slot_instance_key",
    "slot_namespace_key",
];

/// Which worker attributes to build: bit `i` is `WORKER_ATTRIBUTES[i]`.
/// A stage whose policies read few attributes builds only those: the rest
/// cannot change its verdict (see `policy::memo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttrMask(u64);

impl AttrMask {
    /// Every attribute (what the schema check and `explain` use).
    pub const ALL: AttrMask = AttrMask(u64::MAX);

    /// The attributes whose names `keep` accepts.
    pub fn of(keep: impl Fn(&str) -> bool) -> AttrMask {
        AttrMask(
            WORKER_ATTRIBUTES
                .iter()
                .enumerate()
                .filter(|(_, n)| keep(n))
                .fold(0, |m, (i, _)| m | (1 << i)),
        )
    }

    fn has(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }
}

/// Every column, sorted by name: `blank_fields` lists names in this order,
/// already sorted and distinct as a Cedar set's items are kept.
fn columns_by_name() -> &'static [Col] {
    static SORTED: std::sync::OnceLock<Vec<Col>> = std::sync::OnceLock::new();
    SORTED.get_or_init(|| {
        let mut cols = COLUMNS.to_vec();
        cols.sort_by_key(|c| c.name());
        cols.dedup_by_key(|c| c.name());
        cols
    })
}

/// A worker's attributes, in schema order: measurements of the row, and
/// the aggregates of `obs.peers` (zero and empty before the first stage).
pub fn worker_attrs<'a>(
    row: &'a Row,
    obs: &'a Observation,
    now: crate::time::Micros,
) -> Vec<(&'static str, Attr<'a>)> {
    worker_attrs_where(row, obs, now, AttrMask::ALL)
}

/// [`worker_attrs`], building only the attributes in `mask`.
pub fn worker_attrs_where<'a>(
    row: &'a Row,
    obs: &'a Observation,
    now: crate::time::Micros,
    mask: AttrMask,
) -> Vec<(&'static str, Attr<'a>)> {
    let mut out = Vec::with_capacity(WORKER_ATTRIBUTES.len());
    worker_attrs_into(row, obs, now, mask, &mut out);
    out
}

/// [`worker_attrs_where`], into `out` (cleared first): a caller building
/// the attributes of many rows reuses one vector.
pub fn worker_attrs_into<'a>(
    row: &'a Row,
    obs: &'a Observation,
    now: crate::time::Micros,
    mask: AttrMask,
    out: &mut Vec<(&'static str, Attr<'a>)>,
) {
    out.clear();
    // Each measured once, and only when an attribute in the mask needs it.
    let age_cell = std::cell::OnceCell::new();
    let age = || {
        *age_cell.get_or_init(|| {
            if obs.liveness.assessed_at == now {
                obs.liveness.heartbeat_age_us
            } else {
                crate::liveness::heartbeat_age_us(row, now)
            }
        })
    };
    let ttl_cell = std::cell::OnceCell::new();
    let ttl = || {
        *ttl_cell.get_or_init(|| crate::liveness::measure_ttl(row.get(Col::HeartbeatTtlSeconds)))
    };
    // Positions 15 and 16: repository_binding_key and repository_binding,
    // borrowed from the row unless stripping had to render a non-text value.
    let binding: Cow<'a, str> = if mask.has(15) || mask.has(16) {
        row.get(Col::RepositoryBinding).stripped_cow()
    } else {
        Cow::Borrowed("")
    };
    let binding_part = |part: fn(&str) -> &str| -> Attr<'a> {
        match &binding {
            Cow::Borrowed(b) => s(part(b)),
            Cow::Owned(b) => s(part(b).to_string()),
        }
    };
    let mut at = 0usize;
    let mut add = |value: &dyn Fn() -> Attr<'a>| {
        if mask.has(at) {
            out.push((WORKER_ATTRIBUTES[at], value()));
        }
        at += 1;
    };
    add(&|| s(row.get(Col::WorkerIdentity).canon_cow()));
    add(&|| Attr::Long(obs.identity_row_count as i64));
    add(&|| s(row.get(Col::Status).or_empty_cow()));
    add(&|| Attr::Columns(obs.blank_columns));
    add(&|| Attr::Bool(age().is_some()));
    add(&|| Attr::Long(age().unwrap_or(0)));
    add(&|| Attr::Bool(ttl().number));
    add(&|| Attr::Long(ttl().sign));
    add(&|| Attr::Long(ttl().us));
    add(&|| {
        s(match obs.pid.alive {
            Some(true) => "alive",
            Some(false) => "dead",
            None => "unknown",
        })
    });
    add(&|| s(obs.pid.start_time.as_deref().unwrap_or("")));
    add(&|| s(row.get(Col::HostId).stripped_cow()));
    add(&|| s(row.get(Col::BootId).stripped_cow()));
    add(&|| s(row.get(Col::ProcessStartTime).stripped_cow()));
    add(&|| s(row.get(Col::PidNamespace).stripped_cow()));
    add(&|| binding_part(|b| b.trim_end_matches('/')));
    add(&|| binding_part(|b| b));
    add(&|| s(row.get(Col::ClientInstanceId).stripped_cow()));
    add(&|| s(row.get(Col::InstanceIdSource).as_text().unwrap_or("")));
    add(&|| s(row.get(Col::SessionId).canon_cow()));
    add(&|| s(row.get(Col::Pid).canon_cow()));
    add(&|| {
        set(obs
            .peers
            .shared_identity_evidence
            .iter()
            .map(String::as_str))
    });
    add(&|| Attr::Long(obs.peers.slot_active_claimants as i64));
    add(&|| Attr::Long(obs.peers.slot_occupants as i64));
    add(&|| s(row.get(Col::ClientInstanceId).canon_cow()));
    add(&|| s(row.get(Col::Namespace).canon_cow()));
    debug_assert_eq!(at, WORKER_ATTRIBUTES.len());
    debug_assert_eq!(WORKER_ATTRIBUTES[15], "repository_binding_key");
}

/// Check entities against the schema through Cedar's public API.
pub fn check_schema(entities: Vec<ast::Entity>, schema: &Schema) -> Result<()> {
    cedar_policy::Entities::from_entities(
        entities.into_iter().map(cedar_policy::Entity::from),
        Some(schema),
    )
    .map(|_| ())
    .map_err(|e| {
        Error::policy(About::PolicySet, format!(
            "the observed entities do not fit policies/{}: {e}; the schema and the program disagree",
            SCHEMA_FILE
        ))
    })
}
