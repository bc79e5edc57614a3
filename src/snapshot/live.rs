//! A live worker as the detectors read it: the fields they group, compare
//! and name, each holding the value the snapshot's document reports for it
//! (so a finding names what the document shows), built once from the row
//! and what was measured. The text forms the seed groups by are here too.

use super::measure::Measured;
use crate::row::{Col, Row};
use crate::value::{py_strip, Val, Value};
use std::collections::BTreeSet;

/// A stored value as the document carries it: a real that is not finite
/// and a blob are written as their text, so they read back as text.
pub(super) fn reported(v: Val<'_>) -> Value {
    match v {
        Val::Real(f) if !f.is_finite() => Value::Text(v.py_str().into()),
        Val::Blob(_) => Value::Text(v.py_str().into()),
        other => other.to_value(),
    }
}

/// The worker's identity as reported: NULL when it is falsy (the seed's
/// `record.get(...) or None`).
pub(super) fn reported_identity(row: &Row) -> Value {
    let wid = row.get(Col::WorkerIdentity);
    if wid.truthy() {
        reported(wid)
    } else {
        Value::Null
    }
}

/// The assessed instance id (stripped), or the stored value.
pub(super) fn reported_instance(row: &Row, m: &Measured) -> Value {
    match &m.identity.client_instance_id {
        Some(id) => Value::Text(id.as_str().into()),
        None => reported(row.get(Col::ClientInstanceId)),
    }
}

/// One live worker, read once for the detectors.
#[derive(Debug, Clone)]
pub(super) struct LiveWorker {
    /// Its row among the registry's (the document renders it from there).
    pub(super) index: usize,
    pub(super) worker_identity: Value,
    pub(super) client_instance_id: Value,
    pub(super) client_type: &'static str,
    pub(super) fleet_run_id: Value,
    pub(super) namespace: Value,
    pub(super) session_id: Value,
    pub(super) generation_id: Value,
    pub(super) process_identity: Value,
    pub(super) pid: Value,
    pub(super) fencing_epoch: Value,
    pub(super) host_id: Value,
    /// Its instance identity was minted by the launcher.
    pub(super) trusted: bool,
    /// Bound to another repository than the canonical one.
    pub(super) foreign: bool,
    /// On another revision than the expected one.
    pub(super) old_revision: bool,
    /// Live without a session that owns it.
    pub(super) orphaned: bool,
    pub(super) mutation_safe: bool,
}

impl LiveWorker {
    /// Read row `index` and what was measured of it.
    pub(super) fn of(index: usize, row: &Row, m: &Measured) -> LiveWorker {
        let v = |c: Col| reported(row.get(c));
        LiveWorker {
            index,
            worker_identity: reported_identity(row),
            client_instance_id: reported_instance(row, m),
            client_type: m.client_type,
            fleet_run_id: v(Col::FleetRunId),
            namespace: v(Col::Namespace),
            session_id: v(Col::SessionId),
            generation_id: v(Col::GenerationId),
            process_identity: reported(crate::observe::process_identity(row).as_val()),
            pid: v(Col::Pid),
            fencing_epoch: v(Col::FencingEpoch),
            host_id: v(Col::HostId),
            trusted: m.identity.trusted,
            foreign: m.foreign,
            old_revision: m.old_revision,
            orphaned: m.ownership == "orphaned",
            mutation_safe: m.mutation_safe,
        }
    }

    /// Its instance, as the seed keeps instance ids (`if iid:`).
    pub(super) fn instance(&self) -> Option<String> {
        truthy_text(&self.client_instance_id)
    }

    /// The host its process runs on (stripped; empty when it names none).
    pub(super) fn host(&self) -> &str {
        match &self.host_id {
            Value::Text(s) => py_strip(s),
            _ => "",
        }
    }
}

/// Python's `str()` of a value as the seed's grouping keys use it: none for
/// NULL, for the empty text and for the text `"None"`.
pub(super) fn key_text(v: &Value) -> Option<String> {
    let text = match v {
        Value::Null => return None,
        other => other.py_str(),
    };
    (!text.is_empty() && text != "None").then_some(text)
}

/// Python's `str(v)` when `v` is truthy (`if v:`): how the seed keeps
/// instance ids, namespaces and fleet runs. Unlike a collision key, the text
/// `"None"` is a name like any other here.
pub(super) fn truthy_text(v: &Value) -> Option<String> {
    v.truthy().then(|| v.py_str())
}

/// A field of a live worker that holds a stored value.
pub(super) type Field = fn(&LiveWorker) -> &Value;

/// The truthy texts `field` takes among `workers`.
pub(super) fn ids(workers: &[&LiveWorker], field: Field) -> BTreeSet<String> {
    workers
        .iter()
        .filter_map(|w| truthy_text(field(w)))
        .collect()
}

/// How many distinct values `field` takes among `workers`, NULL and `""`
/// each counting as a value of its own, and `1` apart from `1.0` (a Python
/// set of the raw values, compared as the document writes them).
pub(super) fn distinct(workers: &[&LiveWorker], field: Field) -> usize {
    workers
        .iter()
        .map(|w| field(w).to_json().to_string())
        .collect::<BTreeSet<_>>()
        .len()
}
