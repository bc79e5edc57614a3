//! Heartbeat continuity and stable ownership between two snapshot
//! documents: the earlier one is read back from a file, so both are read
//! as JSON here, once, into what continuity compares.

use super::live::key_text;
use crate::value::Value;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::BTreeMap;

/// What continuity reads of one live worker of a snapshot document (a
/// member it lacks reads as null).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct Beat {
    worker_identity: Json,
    client_instance_id: Json,
    session_id: Json,
    generation_id: Json,
    last_heartbeat_at: Json,
}

/// The `live_workers` of a snapshot document, by identity (a later entry
/// of one identity wins, an entry without one is left out).
fn live_beats(snapshot: &Json) -> BTreeMap<String, Beat> {
    let workers = snapshot.get("live_workers").and_then(Json::as_array);
    workers
        .into_iter()
        .flatten()
        .filter(|w| w.is_object())
        .filter_map(|w| Beat::deserialize(w).ok())
        .filter_map(|b| {
            let key = Value::from_json(&b.worker_identity).ok();
            key.as_ref().and_then(key_text).map(|k| (k, b))
        })
        .collect()
}

/// One shared worker's continuity.
#[derive(Serialize)]
struct Continuity<'a> {
    worker_identity: &'a str,
    same_client_instance_id: bool,
    same_session_id: bool,
    same_generation_id: bool,
    heartbeat_non_decreasing: bool,
    earlier_heartbeat: &'a Json,
    later_heartbeat: &'a Json,
}

impl<'a> Continuity<'a> {
    /// Compare one worker in both snapshots. A heartbeat that is not text
    /// on either side does not break continuity.
    fn of(wid: &'a str, x: &'a Beat, y: &'a Beat) -> Continuity<'a> {
        let heartbeat_ok = match (x.last_heartbeat_at.as_str(), y.last_heartbeat_at.as_str()) {
            (Some(p), Some(q)) => q >= p,
            _ => true,
        };
        Continuity {
            worker_identity: wid,
            same_client_instance_id: x.client_instance_id == y.client_instance_id,
            same_session_id: x.session_id == y.session_id,
            same_generation_id: x.generation_id == y.generation_id,
            heartbeat_non_decreasing: heartbeat_ok,
            earlier_heartbeat: &x.last_heartbeat_at,
            later_heartbeat: &y.last_heartbeat_at,
        }
    }

    /// Same instance, session and generation.
    fn same_owner(&self) -> bool {
        self.same_client_instance_id && self.same_session_id && self.same_generation_id
    }
}

/// The comparison as the document reports it.
#[derive(Serialize)]
struct Comparison<'a> {
    shared_live_workers: Vec<&'a String>,
    continuity: Vec<Continuity<'a>>,
    stable_ownership: bool,
    dropped_workers: Vec<&'a String>,
    new_workers: Vec<&'a String>,
}

/// Heartbeat continuity and stable ownership between two snapshots.
pub fn compare(earlier: &Json, later: &Json) -> Json {
    let (a, b) = (live_beats(earlier), live_beats(later));
    let shared: Vec<&String> = a.keys().filter(|k| b.contains_key(*k)).collect();
    let continuity: Vec<Continuity<'_>> = shared
        .iter()
        .map(|wid| Continuity::of(wid, &a[*wid], &b[*wid]))
        .collect();
    let stable = continuity
        .iter()
        .all(|c| c.same_owner() && c.heartbeat_non_decreasing);
    serde_json::to_value(Comparison {
        shared_live_workers: shared,
        continuity,
        stable_ownership: stable,
        dropped_workers: a.keys().filter(|k| !b.contains_key(*k)).collect(),
        new_workers: b.keys().filter(|k| !a.contains_key(*k)).collect(),
    })
    .expect("a comparison serialises")
}
