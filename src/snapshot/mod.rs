//! The fleet snapshot (seed `mcp_fleet_snapshot`): live, stale and
//! historical workers, instances keyed by `client_instance_id`, and every
//! finding class of the seed, with two deliberate differences
//! (docs/semantics.md §11 and §14): a session shared by live workers is a
//! collision only when they belong to more than one instance or duplicate a
//! namespace within one, and a stale row is a blocker by name as well as by
//! effect.
//!
//! Observational: it reads rows and probes, and writes nothing.

mod detect;
mod document;
mod fields;
pub mod findings;

use crate::evidence::probe::{observe_pid, ProcessProbe};
use crate::identity::{assess_instance_identity, normalize_client_name, UNKNOWN_CLIENT};
use crate::liveness::assess;
use crate::observe::{foreign_repository, ownership_state, process_identity};
use crate::row::{Col, Row};
use crate::time::{format_ts, Micros};
use crate::value::Val;
use detect::key_text;
use detect::{instance_findings, live_collisions, manifest_findings, unkeyed_findings};
use document::{render, FindingPart};
use fields::truthy_text;
use findings::Findings;
pub use findings::{Finding, FindingClass, Severity};
use serde_json::{json, Value as Json};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::BTreeMap;

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
    other_host: bool,
}

/// Measure one row: probe its pid, classify its liveness and identity.
fn measure(row: &Row, opts: &Options, probe: &dyn ProcessProbe) -> Measured {
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
        other_host,
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

/// The finding about one row that is not live, if any: stale rows are
/// `stale_orphaned_worker`, historical ones `historical_dead`. They are
/// derived from what was measured whenever they are read, never stored: a
/// large registry is mostly such rows.
fn row_finding(row: &Row, m: &Measured) -> Option<Finding> {
    let wid = row.get(Col::WorkerIdentity);
    let (class, detail) = if m.stale() {
        (
            FindingClass::StaleOrphanedWorker,
            format!(
                "worker {} is active in the registry but not live (stale heartbeat or dead \
                 pid); `fleet-retire plan` says whether it may be retired",
                wid.to_json()
            ),
        )
    } else if m.historical {
        (
            FindingClass::HistoricalDead,
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
        detail,
        client_instance_ids: truthy_text(&m.instance_id(row)).into_iter().collect(),
        worker_identities: vec![if wid.truthy() {
            wid.to_json()
        } else {
            Json::Null
        }],
    })
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
    other_host_count: usize,
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

    /// Rows registered on another host than this one (0 when the snapshot
    /// was not told this host's id).
    pub fn other_host_worker_count(&self) -> usize {
        self.other_host_count
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
        self.findings().filter(|f| f.classification.blocks())
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
    let other_host_count = measured.iter().filter(|m| m.other_host).count();
    let mut f = Findings(Vec::new());

    live_collisions(&live, &mut f);
    let mut by_instance: BTreeMap<String, Vec<&Json>> = BTreeMap::new();
    let mut unkeyed: Vec<&Json> = Vec::new();
    for w in &live {
        match truthy_text(&w["client_instance_id"]) {
            Some(iid) => by_instance.entry(iid).or_default().push(w),
            None => unkeyed.push(w),
        }
    }
    let instances = instance_findings(&by_instance, &mut f);
    unkeyed_findings(&unkeyed, &mut f);
    // Stale and historical rows each have a finding of their own, derived
    // when read (see `row_finding`); the manifest's findings follow them.
    let early = std::mem::take(&mut f.0);

    let manifest = opts.manifest.clone().unwrap_or_default();
    let (missing, unmanifested) = manifest_findings(&manifest, &by_instance, &mut f);
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
    let live_safe =
        stale_count == 0 && !early.iter().chain(&late).any(|x| x.classification.blocks());
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
        other_host_count,
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

    use super::document::WRITE_BATCH;
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
            if let Val::Int(pid) = r.get(Col::Pid) {
                probe.processes.insert(
                    pid,
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

    #[test]
    fn another_hosts_worker_is_live_by_its_heartbeat_not_by_this_hosts_process_table() {
        // Host "h" registered the worker; the snapshot runs on host "other",
        // whose process table has no such pid (ESRCH, "dead").
        let rows = vec![live(json!("w-b"), 4242, json!({}))];
        let probe_says_dead = |opts: &Options| {
            let mut probe = GivenProbe::default();
            probe.processes.insert(
                4242,
                PidObservation {
                    alive: Some(false),
                    start_time: None,
                },
            );
            snapshot(&rows, opts, &probe)
        };
        let now = crate::time::parse_ts(NOW).unwrap();
        let elsewhere = probe_says_dead(&Options {
            now,
            host_id: Some("other".into()),
            ..Default::default()
        });
        assert_eq!(elsewhere["live_worker_count"], 1);
        assert_eq!(elsewhere["stale_worker_count"], 0);
        assert_eq!(elsewhere["other_host_worker_count"], 1);
        // On its own host a dead pid withdraws liveness, as the seed says.
        let at_home = probe_says_dead(&Options {
            now,
            host_id: Some("h".into()),
            ..Default::default()
        });
        assert_eq!(at_home["live_worker_count"], 0);
        assert_eq!(at_home["stale_worker_count"], 1);
        assert_eq!(at_home["other_host_worker_count"], 0);
    }

    #[test]
    fn one_pid_on_two_hosts_is_two_processes() {
        let on = |id: &str, host: &str| {
            live(
                json!(id),
                77,
                json!({"host_id": host, "session_id": id, "generation_id": id}),
            )
        };
        let two_hosts = run(
            &[on("w-a", "host-a"), on("w-b", "host-b")],
            Options::default(),
        );
        let found = classes(&two_hosts);
        assert!(
            !found
                .iter()
                .any(|c| c == "pid_collision" || c == "process_identity_collision"),
            "{found:?}"
        );
        let one_host = run(
            &[on("w-a", "host-a"), on("w-b", "host-a")],
            Options::default(),
        );
        let found = classes(&one_host);
        assert!(found.iter().any(|c| c == "pid_collision"), "{found:?}");
        assert!(
            one_host["findings"]
                .to_string()
                .contains("pid 77 on host \\\"host-a\\\" is shared"),
            "{}",
            one_host["findings"]
        );
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
            ..Default::default()
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
