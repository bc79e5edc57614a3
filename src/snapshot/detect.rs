//! The detectors: each family of finding classes has a function that looks
//! at the live workers (read once as [`LiveWorker`]s) and adds its
//! findings. Which classes block is `findings`' business, not theirs. Their
//! results are typed; `document` writes them as JSON.

use super::findings::{FindingClass, Findings};
use super::live::{distinct, ids, key_text, truthy_text, Field, LiveWorker};
use crate::identity::UNKNOWN_CLIENT;
use crate::value::Value;
use serde_json::Value as Json;
use std::collections::{BTreeMap, BTreeSet};

/// Live workers by the key they share: the groups of more than one.
type Groups<'w> = BTreeMap<String, Vec<&'w LiveWorker>>;

/// A collision key scoped to the worker's host (empty when it names none,
/// so workers without a host group as before).
fn on_host(w: &LiveWorker, key: Option<String>) -> Option<String> {
    key.map(|k| format!("{}\u{1f}{k}", w.host()))
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

/// The workers that share a key with another, by key.
fn groups<'w>(
    workers: &[&'w LiveWorker],
    key: impl Fn(&LiveWorker) -> Option<String>,
) -> Groups<'w> {
    let mut g: Groups<'w> = BTreeMap::new();
    for w in workers {
        if let Some(k) = key(w) {
            g.entry(k).or_default().push(w);
        }
    }
    g.retain(|_, v| v.len() > 1);
    g
}

/// The grouping key a stored field gives.
fn keyed(field: Field) -> impl Fn(&LiveWorker) -> Option<String> {
    move |w| key_text(field(w))
}

/// The namespaces more than one of `workers` serves.
fn namespace_duplicates(workers: &[&LiveWorker]) -> Vec<String> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for w in workers {
        if let Some(ns) = truthy_text(&w.namespace) {
            *counts.entry(ns).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(ns, _)| ns)
        .collect()
}

/// Identities shared among live workers: worker, session (docs/semantics.md
/// §11), generation, process, pid and fencing token.
pub(super) fn live_collisions(live: &[&LiveWorker], f: &mut Findings) {
    for (wid, group) in groups(live, keyed(|w| &w.worker_identity)) {
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
    session_collisions(live, f);
    for (gen, group) in groups(live, keyed(|w| &w.generation_id)) {
        if !namespace_duplicates(&group).is_empty()
            || distinct(&group, |w| &w.client_instance_id) > 1
        {
            f.add(
                FindingClass::GenerationIdentityCollision,
                &group,
                None,
                format!("generation {gen:?} is contested across namespaces or instances"),
            );
        }
    }
    process_collisions(live, f);
    for (token, group) in groups(live, fencing_token) {
        if distinct(&group, |w| &w.client_instance_id) > 1 {
            f.add(
                FindingClass::OwnershipFencingCollision,
                &group,
                None,
                format!("fencing token {token:?} spans more than one client_instance_id"),
            );
        }
    }
}

/// A session shared by live workers is a collision when they belong to
/// more than one instance, or to none, or duplicate a namespace within one
/// (semantics §11: one launch's workers share a session legitimately).
fn session_collisions(live: &[&LiveWorker], f: &mut Findings) {
    for (sid, group) in groups(live, keyed(|w| &w.session_id)) {
        let instances = ids(&group, |w| &w.client_instance_id);
        let unkeyed = group.iter().any(|w| w.instance().is_none());
        let mut by_instance: Groups<'_> = BTreeMap::new();
        for w in &group {
            by_instance
                .entry(w.instance().unwrap_or_default())
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
}

/// A process lives on one host: the same pid (or pid-derived process
/// identity) on two hosts is two processes (docs/semantics.md §15).
fn process_collisions(live: &[&LiveWorker], f: &mut Findings) {
    let identity = |w: &LiveWorker| on_host(w, key_text(&w.process_identity));
    for (key, group) in groups(live, identity) {
        if distinct(&group, |w| &w.worker_identity) > 1 {
            let (host, proc_id) = split_host(&key);
            f.add(
                FindingClass::ProcessIdentityCollision,
                &group,
                None,
                format!("process identity {proc_id:?}{host} is shared by distinct live workers"),
            );
        }
    }
    for (key, group) in groups(live, |w| on_host(w, key_text(&w.pid))) {
        if distinct(&group, |w| &w.worker_identity) > 1 {
            let (host, pid) = split_host(&key);
            f.add(
                FindingClass::PidCollision,
                &group,
                None,
                format!("pid {pid}{host} is shared by distinct live workers"),
            );
        }
    }
}

/// The fencing token `generation:epoch`, when both are recorded.
fn fencing_token(w: &LiveWorker) -> Option<String> {
    match (&w.generation_id, &w.fencing_epoch) {
        (Value::Null, _) | (_, Value::Null) => None,
        (g, e) => Some(format!("{}:{}", g.py_str(), e.py_str())),
    }
}

/// A live instance: what the snapshot reports of it, and its workers (by
/// row, rendered when the document is written).
#[derive(Debug, Clone)]
pub(super) struct Instance {
    pub(super) client_instance_id: String,
    pub(super) client_types: BTreeSet<String>,
    pub(super) fleet_run_ids: BTreeSet<String>,
    pub(super) namespaces: BTreeSet<String>,
    /// Workers per namespace, in the order the namespaces first appear.
    pub(super) namespace_counts: Vec<(String, usize)>,
    pub(super) duplicate_namespaces: Vec<String>,
    pub(super) trusted: bool,
    /// The rows of its workers.
    pub(super) workers: Vec<usize>,
    pub(super) mutation_safe: bool,
}

/// Per live instance: its findings, and its entry in `instances`.
pub(super) fn instance_findings(
    by_instance: &BTreeMap<String, Vec<&LiveWorker>>,
    f: &mut Findings,
) -> Vec<Instance> {
    by_instance
        .iter()
        .map(|(iid, workers)| one_instance(iid, workers, f))
        .collect()
}

/// Findings about some of an instance's workers: the class, which workers,
/// and what to say.
type WorkerCheck = (FindingClass, fn(&LiveWorker) -> bool, &'static str);

const WORKER_CHECKS: &[WorkerCheck] = &[
    (
        FindingClass::UnknownClient,
        |w| w.client_type == UNKNOWN_CLIENT,
        "has worker(s) with an unknown client type",
    ),
    (
        FindingClass::ForeignRepository,
        |w| w.foreign,
        "has workers bound to another repository",
    ),
    (
        FindingClass::OldRevision,
        |w| w.old_revision,
        "has workers on an old revision",
    ),
    (
        FindingClass::OrphanedUnowned,
        |w| w.orphaned,
        "has live workers without a session",
    ),
];

fn one_instance(iid: &str, workers: &[&LiveWorker], f: &mut Findings) -> Instance {
    let one = Some(vec![iid.to_string()]);
    let client_types: BTreeSet<String> = workers
        .iter()
        .filter(|w| !w.client_type.is_empty())
        .map(|w| w.client_type.to_string())
        .collect();
    let trusted = workers.iter().all(|w| w.trusted);
    let dup_ns = namespace_duplicates(workers);
    if !dup_ns.is_empty() {
        let dups: Vec<&LiveWorker> = workers
            .iter()
            .copied()
            .filter(|w| truthy_text(&w.namespace).is_some_and(|n| dup_ns.contains(&n)))
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
        let hit: Vec<&LiveWorker> = workers.iter().copied().filter(|w| applies(w)).collect();
        if !hit.is_empty() {
            f.add(
                *class,
                &hit,
                one.clone(),
                format!("instance {iid:?} {says}"),
            );
        }
    }
    let mutation_safe = workers.iter().all(|w| w.mutation_safe) && dup_ns.is_empty() && trusted;
    Instance {
        client_instance_id: iid.to_string(),
        client_types,
        fleet_run_ids: ids(workers, |w| &w.fleet_run_id),
        namespaces: ids(workers, |w| &w.namespace),
        namespace_counts: namespace_counts(workers),
        duplicate_namespaces: dup_ns,
        trusted,
        workers: workers.iter().map(|w| w.index).collect(),
        mutation_safe,
    }
}

/// Workers per namespace, in the order the namespaces first appear.
fn namespace_counts(workers: &[&LiveWorker]) -> Vec<(String, usize)> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for ns in workers.iter().filter_map(|w| truthy_text(&w.namespace)) {
        match counts.iter_mut().find(|(n, _)| *n == ns) {
            Some((_, c)) => *c += 1,
            None => counts.push((ns, 1)),
        }
    }
    counts
}

/// Live workers without an instance id.
pub(super) fn unkeyed_findings(unkeyed: &[&LiveWorker], f: &mut Findings) {
    for w in unkeyed {
        f.add(
            FindingClass::LegacyIncompleteIdentity,
            &[w],
            None,
            "live worker has no client_instance_id".into(),
        );
        if w.client_type == UNKNOWN_CLIENT {
            f.add(
                FindingClass::UnknownClient,
                &[w],
                None,
                "live worker has an unknown client type and no instance id".into(),
            );
        }
    }
}

/// One instance of the approved manifest: the members the document echoes
/// back, as given (a member it lacks, or an entry that is not an object,
/// reads as null).
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(default)]
pub(super) struct ManifestEntry {
    client_instance_id: Json,
    client_type: Json,
    fleet_run_id: Json,
    namespaces: Json,
}

impl ManifestEntry {
    /// Read one entry of the manifest.
    pub(super) fn read(entry: &Json) -> ManifestEntry {
        // Only an object has members (serde would read a list by position).
        entry
            .is_object()
            .then(|| serde::Deserialize::deserialize(entry).ok())
            .flatten()
            .unwrap_or_default()
    }

    /// The instance it expects: Python's `str(...).strip()` of a text id,
    /// which also strips U+001C..U+001F; none when that is empty.
    fn expected(&self) -> Option<String> {
        self.client_instance_id
            .as_str()
            .map(|s| crate::value::py_strip(s).to_string())
            .filter(|s| !s.is_empty())
    }
}

/// The approved manifest against the live instances: the expected ones
/// missing, and (when a manifest is given) the live ones not on it.
pub(super) fn manifest_findings(
    manifest: &[ManifestEntry],
    by_instance: &BTreeMap<String, Vec<&LiveWorker>>,
    f: &mut Findings,
) -> (Vec<String>, Vec<String>) {
    let expected: BTreeSet<String> = manifest
        .iter()
        .filter_map(ManifestEntry::expected)
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
