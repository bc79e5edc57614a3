//! The detectors: each family of finding classes has a function that looks
//! at the live workers (rendered as the snapshot reports them) and adds its
//! findings. Which classes block is `findings`' business, not theirs.

use super::fields::{ids, truthy_text};
use super::findings::{FindingClass, Findings};
use crate::identity::UNKNOWN_CLIENT;
use crate::value::Value;
use serde_json::{json, Map, Value as Json};
use std::collections::{BTreeMap, BTreeSet};

/// Python's `str()` of a JSON value as the seed's grouping keys use it.
pub(super) fn key_text(v: &Json) -> Option<String> {
    let text = match v {
        Json::Null => return None,
        Json::String(s) => s.clone(),
        other => Value::from_json(other)
            .map(|x| x.py_str())
            .unwrap_or_default(),
    };
    (!text.is_empty() && text != "None").then_some(text)
}

/// How many distinct values `field` takes among `workers`, NULL and `""`
/// each counting as a value of its own (a Python set of the raw values).
pub(super) fn distinct(workers: &[&Json], field: &str) -> usize {
    workers
        .iter()
        .map(|w| w[field].to_string())
        .collect::<BTreeSet<_>>()
        .len()
}

/// A collision key scoped to the row's host (its `host_id` stripped; empty
/// when it names none, so rows without a host group as before).
fn on_host(row: &Json, key: Option<String>) -> Option<String> {
    let host = row["host_id"]
        .as_str()
        .map(crate::value::py_strip)
        .unwrap_or("");
    key.map(|k| format!("{host}\u{1f}{k}"))
}

/// The host (as " on host \"h\"", or empty) and the key of [`on_host`].
fn split_host(key: &str) -> (String, &str) {
    let (host, k) = key.split_once('\u{1f}').unwrap_or(("", key));
    let host = if host.is_empty() {
        String::new()
    } else {
        format!(" on host {host:?}")
    };
    (host, k)
}

pub(super) fn groups<'a>(
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

pub(super) fn namespace_duplicates(workers: &[&Json]) -> Vec<String> {
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

/// Identities shared among live workers: worker, session (docs/semantics.md §11), generation, process, pid and fencing token.
pub(super) fn live_collisions(live: &[&Json], f: &mut Findings) {
    let live = live.to_vec();
    for (wid, group) in groups(&live, |r| key_text(&r["worker_identity"])) {
        f.add(
            FindingClass::WorkerIdentityCollision,
            &group,
            None,
            format!(
                "worker identity {wid:?} is claimed by {} live workers",
                group.len()
            ),
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
            f.add(FindingClass::SessionIdentityCollision, &group, None, format!("session {sid:?} is shared by {} live workers across instances or within one namespace", group.len()));
        }
    }
    for (gen, group) in groups(&live, |r| key_text(&r["generation_id"])) {
        if !namespace_duplicates(&group).is_empty() || distinct(&group, "client_instance_id") > 1 {
            f.add(
                FindingClass::GenerationIdentityCollision,
                &group,
                None,
                format!("generation {gen:?} is contested across namespaces or instances"),
            );
        }
    }
    // A process lives on one host: the same pid (or pid-derived process
    // identity) on two hosts is two processes (docs/semantics.md §15).
    for (key, group) in groups(&live, |r| on_host(r, key_text(&r["process_identity"]))) {
        if distinct(&group, "worker_identity") > 1 {
            let (host, proc_id) = split_host(&key);
            f.add(
                FindingClass::ProcessIdentityCollision,
                &group,
                None,
                format!("process identity {proc_id:?}{host} is shared by distinct live workers"),
            );
        }
    }
    for (key, group) in groups(&live, |r| on_host(r, key_text(&r["pid"]))) {
        if distinct(&group, "worker_identity") > 1 {
            let (host, pid) = split_host(&key);
            f.add(
                FindingClass::PidCollision,
                &group,
                None,
                format!("pid {pid}{host} is shared by distinct live workers"),
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
                FindingClass::OwnershipFencingCollision,
                &group,
                None,
                format!("fencing token {token:?} spans more than one client_instance_id"),
            );
        }
    }
}

/// Per live instance: its findings, and its entry in `instances`.
pub(super) fn instance_findings(
    by_instance: &BTreeMap<String, Vec<&Json>>,
    f: &mut Findings,
) -> Vec<Json> {
    by_instance
        .iter()
        .map(|(iid, workers)| one_instance(iid, workers, f))
        .collect()
}

/// Findings about some of an instance's workers: the class, which workers,
/// and what to say.
type WorkerCheck = (FindingClass, fn(&Json) -> bool, &'static str);

const WORKER_CHECKS: &[WorkerCheck] = &[
    (
        FindingClass::UnknownClient,
        |w| w["client_type"] == UNKNOWN_CLIENT,
        "has worker(s) with an unknown client type",
    ),
    (
        FindingClass::ForeignRepository,
        |w| w["foreign_repository"] == true,
        "has workers bound to another repository",
    ),
    (
        FindingClass::OldRevision,
        |w| w["old_revision"] == true,
        "has workers on an old revision",
    ),
    (
        FindingClass::OrphanedUnowned,
        |w| w["ownership_state"] == "orphaned",
        "has live workers without a session",
    ),
];

fn one_instance(iid: &str, workers: &[&Json], f: &mut Findings) -> Json {
    let one = Some(vec![iid.to_string()]);
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
            FindingClass::DuplicateNamespaceWorker,
            &dups,
            one.clone(),
            format!("instance {iid:?} has more than one live worker for namespace(s) {dup_ns:?}"),
        );
    }
    if client_types.len() > 1 {
        f.add(
            FindingClass::InstanceIdCollision,
            workers,
            one.clone(),
            format!(
                "client_instance_id {iid:?} is live under several client types {client_types:?}"
            ),
        );
    }
    if !trusted {
        f.add(
            FindingClass::LegacyIncompleteIdentity,
            workers,
            one.clone(),
            format!(
                "instance {iid:?} lacks a launcher-minted instance identity; relaunch it \
                 through `fleet-retire launch`"
            ),
        );
    }
    for (class, applies, says) in WORKER_CHECKS {
        let hit: Vec<&Json> = workers.iter().copied().filter(|w| applies(w)).collect();
        if !hit.is_empty() {
            f.add(
                *class,
                &hit,
                one.clone(),
                format!("instance {iid:?} {says}"),
            );
        }
    }
    let mut ns_counts = Map::new();
    for w in workers {
        if let Some(ns) = truthy_text(&w["namespace"]) {
            let n = ns_counts.get(&ns).and_then(Json::as_u64).unwrap_or(0) + 1;
            ns_counts.insert(ns, json!(n));
        }
    }
    let mutation_safe =
        workers.iter().all(|w| w["mutation_safe"] == true) && dup_ns.is_empty() && trusted;
    json!({
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
        "mutation_safe": mutation_safe,
    })
}

/// Live workers without an instance id.
pub(super) fn unkeyed_findings(unkeyed: &[&Json], f: &mut Findings) {
    for w in unkeyed {
        f.add(
            FindingClass::LegacyIncompleteIdentity,
            &[w],
            None,
            "live worker has no client_instance_id".into(),
        );
        if w["client_type"] == UNKNOWN_CLIENT {
            f.add(
                FindingClass::UnknownClient,
                &[w],
                None,
                "live worker has an unknown client type and no instance id".into(),
            );
        }
    }
}

/// The approved manifest against the live instances: the expected ones
/// missing, and (when a manifest is given) the live ones not on it.
pub(super) fn manifest_findings(
    manifest: &[Json],
    by_instance: &BTreeMap<String, Vec<&Json>>,
    f: &mut Findings,
) -> (Vec<String>, Vec<String>) {
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
            FindingClass::MissingExpected,
            &[],
            Some(vec![iid.clone()]),
            format!("expected instance {iid:?} is missing from the live fleet"),
        );
    }
    for iid in &unmanifested {
        f.add(
            FindingClass::Unmanifested,
            by_instance.get(iid).map(Vec::as_slice).unwrap_or(&[]),
            Some(vec![iid.clone()]),
            format!("live instance {iid:?} is not on the approved fleet manifest"),
        );
    }

    (missing, unmanifested)
}
