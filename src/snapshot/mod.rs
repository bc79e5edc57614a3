//! The fleet snapshot (seed `mcp_fleet_snapshot`): live, stale and
//! historical workers, instances keyed by `client_instance_id`, and every
//! finding class of the seed, with two deliberate differences
//! (docs/semantics.md §11 and §14): a session shared by live workers is a
//! collision only when they belong to more than one instance or duplicate a
//! namespace within one, and a stale row is a blocker by name as well as by
//! effect.
//!
//! Observational: it reads rows and probes, and writes nothing.
//!
//! The module is layered, each file importing only those before it:
//! `measure` (what is asked, what each row measures) → `live` (a live
//! worker as the detectors read it) → `findings` (the classes, and the
//! findings a row makes alone) → `detect` (the detectors, typed results) →
//! `take` (the [`Snapshot`]) → `document` (its JSON, made only there);
//! `compare` reads two documents.

mod compare;
mod detect;
mod document;
pub mod findings;
mod live;
mod measure;
mod take;

pub use compare::compare;
pub use document::WorkerList;
pub use findings::{Finding, FindingClass, Severity};
pub use measure::{entry_without_instance_id, manifest_entries, Options};
pub use take::Snapshot;

use crate::evidence::probe::ProcessProbe;
use crate::row::Row;
use serde_json::Value as Json;

/// Take the snapshot, as one JSON document (for callers that want it
/// whole: `serve`, the demo, tests). The command line streams
/// [`Snapshot`] instead.
pub fn snapshot(rows: &[Row], opts: &Options, probe: &dyn ProcessProbe) -> Json {
    serde_json::to_value(Snapshot::take(rows, opts, probe)).expect("a snapshot serialises")
}

#[cfg(test)]
mod tests {
    //! The five divergences from the reference snapshot found by comparing
    //! it on real registries; two of them called an unsafe fleet safe.

    use super::document::WRITE_BATCH;
    use super::*;
    use crate::evidence::probe::{GivenProbe, PidObservation};
    use crate::row::Col;
    use crate::value::Val;
    use serde_json::json;

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
