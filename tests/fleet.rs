//! Snapshot findings, launch identity, registration, and the demo.

mod common;

use common::*;
use fleet_retire::evidence::probe::{GivenProbe, PidObservation};
use fleet_retire::launcher::{launch, LaunchRequest, NAMESPACES};
use fleet_retire::row::Row;
use fleet_retire::snapshot::{snapshot, Options};
use serde_json::{json, Value};
use std::collections::BTreeMap;

const NOW: &str = "2026-07-30T12:00:00Z";

/// A live worker of instance `inst` in namespace `ns` (pid alive, fresh heartbeat).
fn live(id: &str, inst: &str, ns: &str, pid: i64) -> Value {
    json!({
        "worker_identity": id, "client_name": "codex", "client_instance_id": inst,
        "instance_id_source": "launcher", "session_id": format!("sess-{inst}"),
        "generation_id": format!("gen-{id}"), "namespace": ns, "role": ns, "profile": format!("{ns}-prgs"),
        "repository_binding": "prgs/gitea-tools", "pid": pid, "fencing_epoch": 1,
        "started_at": "2026-07-30T11:00:00Z", "last_heartbeat_at": "2026-07-30T11:59:00Z",
        "heartbeat_ttl_seconds": 900, "status": "active", "host_id": "h", "boot_id": "b",
        "process_start_time": format!("ticks-{pid}"), "loaded_revision": "rev-1",
    })
}

/// A healthy launch: five live workers sharing one instance and session.
fn instance(inst: &str, first_pid: i64) -> Vec<Value> {
    NAMESPACES
        .iter()
        .enumerate()
        .map(|(i, ns)| live(&format!("w-{inst}-{ns}"), inst, ns, first_pid + i as i64))
        .collect()
}

fn snap_with(rows: &[Value], opts: Options) -> Value {
    let rows: Vec<Row> = rows
        .iter()
        .map(|r| Row::from_json(r.as_object().unwrap()).unwrap())
        .collect();
    let mut probe = GivenProbe::default();
    for r in &rows {
        if let fleet_retire::value::Val::Int(pid) = r.get(fleet_retire::row::Col::Pid) {
            probe.processes.insert(
                pid,
                PidObservation {
                    alive: Some(true),
                    start_time: None,
                },
            );
        }
    }
    snapshot(
        &rows,
        &Options {
            now: fleet_retire::time::parse_ts(NOW).unwrap(),
            ..opts
        },
        &probe,
    )
}

fn snap(rows: &[Value]) -> Value {
    snap_with(
        rows,
        Options {
            canonical_repository: Some("prgs/gitea-tools".into()),
            ..Default::default()
        },
    )
}

fn classes(s: &Value) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for f in s["active_blockers"].as_array().unwrap() {
        *m.entry(f["classification"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    m
}

fn has(s: &Value, class: &str) -> bool {
    classes(s).contains_key(class)
}

const A: &str = "inst-codex-20260730T100000Z-aaaaaaaaaaaa";
const B: &str = "inst-codex-20260730T100100Z-bbbbbbbbbbbb";

#[test]
fn two_instances_of_one_client_type_are_healthy() {
    let mut rows = instance(A, 100);
    rows.extend(instance(B, 200));
    let s = snap(&rows);
    assert_eq!(s["live_fleet_safe"], true, "{:?}", classes(&s));
    assert_eq!(s["instance_count"], 2);
    assert_eq!(
        s["multi_instance_same_client_type"]["codex"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(s["mutation_safe"], true);
}

#[test]
fn historical_rows_never_block() {
    let mut rows = instance(A, 100);
    let mut old = live("w-old", A, "author", 999);
    old["status"] = json!("released");
    let mut retired = live("w-retired", B, "author", 998);
    retired["status"] = json!("retired");
    rows.push(old);
    rows.push(retired);
    let s = snap(&rows);
    assert_eq!(s["live_fleet_safe"], true, "{:?}", classes(&s));
    assert_eq!(s["historical_findings"].as_array().unwrap().len(), 2);
    assert!(s["historical_findings"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["active_blocker"] == false));
}

#[test]
fn every_finding_class_is_detected() {
    let base = || instance(A, 100);
    for (class, rows) in finding_cases() {
        let s = snap(&rows);
        assert!(has(&s, class), "{class} not found; got {:?}", classes(&s));
        assert_eq!(s["live_fleet_safe"], false, "{class}");
        assert!(
            !has(&snap(&base()), class),
            "{class} must not fire on a healthy instance"
        );
    }
    // Old revision needs an expected revision.
    let mut r = base();
    r[0]["loaded_revision"] = json!("rev-0");
    let s = snap_with(
        &r,
        Options {
            expected_live_revision: Some("rev-1".into()),
            ..Default::default()
        },
    );
    assert!(has(&s, "old_revision"), "{:?}", classes(&s));
}

/// Each finding class, and a healthy instance edited to show it.
fn finding_cases() -> Vec<(&'static str, Vec<Value>)> {
    let base = || instance(A, 100);
    vec![
        ("duplicate_namespace_worker", {
            let mut r = base();
            r.push(live("w-extra", A, "author", 150));
            r
        }),
        ("instance_id_collision", {
            let mut r = base();
            r[1]["client_name"] = json!("gemini");
            r
        }),
        ("worker_identity_collision", {
            let mut r = base();
            let mut dup = live("w-twin", B, "author", 300);
            dup["worker_identity"] = r[0]["worker_identity"].clone();
            r.push(dup);
            r
        }),
        ("session_identity_collision", {
            let mut r = base();
            let mut other = instance(B, 200);
            other[0]["session_id"] = r[0]["session_id"].clone();
            r.extend(other);
            r
        }),
        ("generation_identity_collision", {
            let mut r = base();
            let mut other = instance(B, 200);
            other[0]["generation_id"] = r[0]["generation_id"].clone();
            r.extend(other);
            r
        }),
        ("process_identity_collision", {
            let mut r = base();
            r[0]["process_identity"] = json!("host/1");
            r[1]["process_identity"] = json!("host/1");
            r
        }),
        ("pid_collision", {
            let mut r = base();
            r[1]["pid"] = r[0]["pid"].clone();
            r
        }),
        ("ownership_fencing_collision", {
            let mut r = base();
            let mut other = instance(B, 200);
            other[0]["generation_id"] = r[0]["generation_id"].clone();
            r.extend(other);
            r
        }),
        ("orphaned_unowned", {
            let mut r = base();
            r[2]["session_id"] = Value::Null;
            r
        }),
        ("unknown_client", {
            let mut r = base();
            for w in &mut r {
                w["client_name"] = json!("vim");
            }
            r
        }),
        ("foreign_repository", {
            let mut r = base();
            r[3]["repository_binding"] = json!("someone/else");
            r
        }),
        ("stale_orphaned_worker", {
            let mut r = base();
            r[4]["last_heartbeat_at"] = json!("2026-07-30T10:00:00Z");
            r
        }),
        ("legacy_incomplete_identity", {
            let mut r = base();
            r.push(live("w-legacy", "legacy-pid-77", "author", 77));
            r.push(live("w-none", "", "author", 78));
            r
        }),
    ]
}

#[test]
fn one_launch_sharing_a_session_is_not_a_collision() {
    // Semantics §11: the launcher gives all five workers one session.
    let s = snap(&instance(A, 100));
    assert!(!has(&s, "session_identity_collision"));
    // Two workers of one namespace in one instance sharing it are.
    let mut r = instance(A, 100);
    r.push(live("w-extra", A, "author", 150));
    assert!(has(&snap(&r), "session_identity_collision"));
}

#[test]
fn manifest_drift_both_ways() {
    let manifest = Some(vec![
        json!({"client_instance_id": A, "client_type": "codex", "namespaces": NAMESPACES}),
        json!({"client_instance_id": "inst-codex-20260730T100200Z-cccccccccccc"}),
    ]);
    let mut rows = instance(A, 100);
    rows.extend(instance(B, 200));
    let s = snap_with(
        &rows,
        Options {
            manifest,
            ..Default::default()
        },
    );
    assert_eq!(
        s["missing_expected_instance_ids"],
        json!(["inst-codex-20260730T100200Z-cccccccccccc"])
    );
    assert_eq!(s["unmanifested_instance_ids"], json!([B]));
    assert!(has(&s, "missing_expected") && has(&s, "unmanifested"));
    let exact = Some(vec![
        json!({"client_instance_id": A}),
        json!({"client_instance_id": B}),
    ]);
    let s = snap_with(
        &rows,
        Options {
            manifest: exact,
            ..Default::default()
        },
    );
    assert_eq!(s["live_fleet_safe"], true, "{:?}", classes(&s));
}

#[test]
fn compare_proves_heartbeat_continuity() {
    let first = snap(&instance(A, 100));
    let mut later_rows = instance(A, 100);
    for r in &mut later_rows {
        r["last_heartbeat_at"] = json!("2026-07-30T11:59:30Z");
    }
    let later = snap(&later_rows);
    let c = fleet_retire::snapshot::compare(&first, &later);
    assert_eq!(c["stable_ownership"], true);
    later_rows[0]["generation_id"] = json!("gen-new");
    let c = fleet_retire::snapshot::compare(&first, &snap(&later_rows));
    assert_eq!(c["stable_ownership"], false);
}

fn request(nonce: Option<&str>) -> LaunchRequest {
    LaunchRequest {
        client: Some("claude-code".into()),
        profiles: NAMESPACES
            .iter()
            .map(|n| (n.to_string(), format!("{n}-p")))
            .collect(),
        command: "worker".into(),
        extra_env: vec![("EXTRA".into(), "1".into())],
        now: fleet_retire::time::parse_ts(NOW).unwrap(),
        nonce: nonce.map(str::to_string),
        ..Default::default()
    }
}

#[test]
fn five_servers_share_one_id_and_two_launches_differ() {
    let a = launch(&request(None)).unwrap();
    let b = launch(&request(None)).unwrap();
    assert_ne!(a["client_instance_id"], b["client_instance_id"]);
    let id = a["client_instance_id"].as_str().unwrap();
    assert!(id.starts_with("inst-claude_code-20260730T120000Z-"), "{id}");
    let servers = a["mcpServers"].as_object().unwrap();
    assert_eq!(servers.len(), 5);
    for (_, s) in servers {
        assert_eq!(
            s["env"]["GITEA_MCP_CLIENT_INSTANCE"], id,
            "protected keys are never overridden"
        );
        assert_eq!(
            s["env"]["GITEA_MCP_INSTANCE_PROVENANCE"],
            "trusted_launcher"
        );
        assert_eq!(s["env"]["EXTRA"], "1");
        assert_eq!(
            s["env"]["GITEA_MCP_CLIENT_SESSION"],
            a["launch"]["session_id"]
        );
    }
    // Fixed client, time and nonce: the seed's id (worked out by hand:
    // printf 'claude_code\x1f20260730T120000Z\x1fn' | sha256sum).
    let fixed = launch(&request(Some("n"))).unwrap();
    let expect = {
        use sha2::Digest;
        let d = sha2::Sha256::digest(b"claude_code\x1f20260730T120000Z\x1fn");
        format!(
            "inst-claude_code-20260730T120000Z-{}",
            &fleet_retire::fingerprint::hex(&d)[..12]
        )
    };
    assert_eq!(fixed["client_instance_id"], expect.as_str());
    // Extra environment naming a key of the launch's own is refused.
    let mut evil = request(None);
    evil.extra_env
        .push(("GITEA_MCP_CLIENT_INSTANCE".into(), "inst-evil".into()));
    let err = launch(&evil).unwrap_err().to_string();
    assert!(err.contains("GITEA_MCP_CLIENT_INSTANCE"), "{err}");
}

#[test]
fn launch_refuses_untrusted_ids_and_missing_profiles() {
    let mut r = request(None);
    r.instance = Some("legacy-pid-4".into());
    assert!(launch(&r).is_err());
    r.instance = Some("inst-codex-20260730T100000Z-aaaaaaaaaaaa".into());
    assert_eq!(
        launch(&r).unwrap()["client_instance_id"],
        "inst-codex-20260730T100000Z-aaaaaaaaaaaa"
    );
    let mut r = request(None);
    r.profiles.remove("merger");
    let err = launch(&r).unwrap_err().to_string();
    assert!(err.contains("merger"), "{err}");
    let out = run(&[
        "launch",
        "--client",
        "codex",
        "--profiles",
        "author=a,reviewer=b",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("missing: merger, controller, reconciler"),
        "{}",
        text(&out)
    );
}

#[test]
fn register_heartbeat_die_then_plan_finds_the_worker_eligible() {
    let stores = Stores::new(&[]);
    // The fleet's registry is created once, by the operator; workers only
    // open it.
    std::fs::remove_file(&stores.registry).unwrap();
    let created = bin()
        .args(["registry", "create", "--registry"])
        .arg(&stores.registry)
        .output()
        .unwrap();
    assert!(created.status.success(), "{}", text(&created));
    let launched = launch(&request(None)).unwrap();
    let env = launched["mcpServers"]["gitea-author"]["env"]
        .as_object()
        .unwrap()
        .clone();
    // The worker registers itself, heartbeats itself, then runs on as `sleep`.
    let ready = stores.dir.path().join("ready");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(
            "\"$0\" register --registry \"$1\" --namespace author --ttl 1 \
             --repository-binding prgs/gitea-tools > \"$2.json\" \
             && \"$0\" heartbeat --registry \"$1\" > /dev/null && : > \"$2\" && exec sleep 60",
        )
        .arg(env!("CARGO_BIN_EXE_fleet-retire"))
        .arg(&stores.registry)
        .arg(&ready)
        .env("GITEA_MCP_WORKER_IDENTITY", "w-real");
    for (k, v) in &env {
        cmd.env(k, v.as_str().unwrap());
    }
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let started = std::time::Instant::now();
    while !ready.exists() {
        assert!(
            started.elapsed().as_secs() < 10,
            "the worker did not register"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let row: Value =
        serde_json::from_str(&std::fs::read_to_string(ready.with_extension("json")).unwrap())
            .unwrap();
    assert_eq!(row["worker_identity"], "w-real");
    assert_eq!(row["instance_id_source"], "launcher");
    assert_eq!(row["pid"], json!(child.id()));
    assert_eq!(row["process_start_time"], json!(start_time(child.id())));
    // Alive: kept.
    let plan = stores.plan_json();
    assert_eq!(plan["candidate_count"], 0);
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2200));
    let plan = stores.plan_json();
    assert_eq!(
        plan["candidate_worker_identities"],
        json!(["w-real"]),
        "{}",
        plan["preserved"]
    );
    // ... and apply retires it.
    let saved = stores.dir.path().join("plan.json");
    std::fs::write(&saved, plan.to_string()).unwrap();
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(&saved)
        .output()
        .unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(report["outcome"], "applied", "{report}");
    assert_eq!(report["retired"][0]["worker_identity"], "w-real");
    assert_eq!(report["post_apply"]["stale_worker_count"], 0);

    // A worker without launcher identity is recorded as such; it releases
    // its own row, and a released worker cannot heartbeat.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(
            "\"$0\" register --registry \"$1\" --namespace merger \
             && \"$0\" release --registry \"$1\" >&2 \
             && ! \"$0\" heartbeat --registry \"$1\" 2>/dev/null",
        )
        .arg(env!("CARGO_BIN_EXE_fleet-retire"))
        .arg(&stores.registry)
        .env("GITEA_MCP_WORKER_IDENTITY", "w-bare")
        .env_remove("GITEA_MCP_CLIENT_INSTANCE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let row: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(row["client_instance_id"], Value::Null);
    assert_eq!(row["instance_id_provenance"], "missing");
    assert!(text(&out).contains("w-bare released"), "{}", text(&out));
}

#[test]
fn the_demo_runs_and_cleans_up() {
    let before: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("fleet-retire-demo-"))
        .collect();
    let started = std::time::Instant::now();
    let out = run(&["demo"]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(started.elapsed().as_secs() < 30);
    assert!(all.contains("outcome: applied (4 retired)"), "{all}");
    assert!(all.contains("protected_active_workflow_owner"), "{all}");
    assert!(all.contains("legacy_incomplete_identity"), "{all}");
    let after: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("fleet-retire-demo-"))
        .collect();
    assert_eq!(before.len(), after.len(), "the demo leaves nothing behind");
}

#[test]
fn snapshot_on_the_command_line_is_gated_strict_and_compares() {
    let live_child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let (host, boot) = host_and_boot();
    let mut row = stale_row(
        "w-live",
        live_child.id() as i64,
        &start_time(live_child.id()),
    );
    row["last_heartbeat_at"] = json!(fleet_retire::time::format_ts(fleet_retire::time::now()));
    row["host_id"] = json!(host);
    row["boot_id"] = json!(boot);
    let stores = Stores::new(&[row, stale_row("w-stale", 3_999_999, "ticks-1")]);
    // `snapshot` as a profile, with extra arguments.
    let snapshot = |profile: &str, extra: &[&str]| {
        bin()
            .args(["snapshot", "--registry", stores.registry.to_str().unwrap()])
            .args([
                "--profiles",
                stores.profiles.to_str().unwrap(),
                "--profile",
                profile,
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    // Author profiles may not look at the fleet.
    let out = snapshot("author-prgs", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    // A stale row makes the fleet unsafe: --strict exits 2, plain exits 0.
    let out = snapshot("controller-prgs", &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("NOT SAFE") && text(&out).contains("stale_orphaned_worker"),
        "{}",
        text(&out)
    );
    let out = snapshot("controller-prgs", &["--strict"]);
    assert_eq!(out.status.code(), Some(2));
    // JSON, then compare a later snapshot with it; a manifest names drift.
    let out = snapshot("controller-prgs", &["--format", "json"]);
    let first: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(first["live_worker_count"], 1);
    let earlier = stores.dir.path().join("s1.json");
    std::fs::write(&earlier, out.stdout).unwrap();
    let manifest = stores.dir.path().join("manifest.json");
    std::fs::write(
        &manifest,
        json!({"instances": [{"client_instance_id": "inst-codex-20260730T100200Z-cccccccccccc"}]})
            .to_string(),
    )
    .unwrap();
    let out = snapshot(
        "controller-prgs",
        &[
            "--format",
            "json",
            "--compare",
            earlier.to_str().unwrap(),
            "--manifest",
            manifest.to_str().unwrap(),
        ],
    );
    let later: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(later["comparison"]["stable_ownership"], true);
    assert_eq!(
        later["comparison"]["shared_live_workers"],
        json!(["w-live"])
    );
    assert_eq!(
        later["missing_expected_instance_ids"],
        json!(["inst-codex-20260730T100200Z-cccccccccccc"])
    );
    assert_eq!(
        later["unmanifested_instance_ids"],
        json!(["inst-codex-20260730T100000Z-abc123def456"])
    );
    let mut child = live_child;
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Workers open the fleet's registry; they never create one. A worker
/// pointed at a missing file is refused with what to do and leaves no
/// file; `registry create` makes one, and refuses to make it twice.
#[test]
fn workers_never_create_a_registry_and_registry_create_does() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry.sqlite");
    let out = bin()
        .args(["register", "--namespace", "author", "--registry"])
        .arg(&registry)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("registry create"), "{}", text(&out));
    assert!(!registry.exists(), "a refused register created the file");
    let create = |path: &std::path::Path| {
        bin()
            .args(["registry", "create", "--registry"])
            .arg(path)
            .output()
            .unwrap()
    };
    assert!(create(&registry).status.success());
    let again = create(&registry);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(text(&again).contains("exists already"), "{}", text(&again));
    let out = bin()
        .args(["register", "--namespace", "author", "--registry"])
        .arg(&registry)
        .env("GITEA_MCP_WORKER_IDENTITY", "w-author-1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(status_of(&registry, "w-author-1"), "active");
}

/// A registry deleted under a running `serve` is not recreated empty by its
/// next heartbeat: the server finds its registry gone and stops.
#[test]
fn a_registry_deleted_under_a_running_server_is_not_recreated() {
    let stores = Stores::new(&[]);
    let mut server = KillOnDrop(
        serve_command(&stores, "w-author-serve", "sess-serve")
            .env("FLEET_RETIRE_HEARTBEAT_INTERVAL", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let started = std::time::Instant::now();
    let active = || {
        rusqlite::Connection::open(&stores.registry)
            .unwrap()
            .query_row(
                "SELECT 1 FROM worker_registrations WHERE worker_identity = 'w-author-serve' \
                 AND status = 'active'",
                [],
                |_| Ok(()),
            )
            .is_ok()
    };
    while !active() {
        assert!(
            started.elapsed().as_secs() < 10,
            "the server did not register"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::fs::remove_file(&stores.registry).unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed().as_secs() < 20, "the server did not stop");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(!status.success());
    assert!(!stores.registry.exists(), "the registry was created again");
    let mut log = String::new();
    std::io::Read::read_to_string(server.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(log.contains("does not exist"), "{log}");
}
