//! The security review's findings, each performed as an attack on real
//! files and real processes, and shown refused or harmless.
//! `docs/security.md` maps each finding to its test here.

mod common;

use common::*;
use fleet_retire::apply::{Hooks, Outcome};
use serde_json::{json, Value};
use sha2::Digest;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_fleet-retire");

fn save_plan(stores: &Stores, extra: &[&str]) -> (PathBuf, Value) {
    let out_path = stores.dir.path().join("plan.json");
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    args.extend(stores.plan_args("controller-prgs"));
    args.extend(["--out".into(), out_path.display().to_string()]);
    let out = bin().args(&args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let plan = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    (out_path, plan)
}

fn apply_cli(stores: &Stores, plan: &Path, profile: &str, extra: &[&str]) -> (Option<i32>, Value) {
    let mut cmd = bin();
    cmd.args(extra).args(stores.apply_args(profile)).arg(plan);
    let out = cmd.output().unwrap();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("apply printed no JSON: {}", text(&out)));
    (out.status.code(), report)
}

/// A policy folder that permits everything, with no properties of its own.
fn permit_all_folder(dir: &Path) -> PathBuf {
    let folder = dir.join("permit-all");
    std::fs::create_dir_all(folder.join("properties")).unwrap();
    std::fs::copy(
        "policies/schema.cedarschema",
        folder.join("schema.cedarschema"),
    )
    .unwrap();
    std::fs::write(
        folder.join("retirement.cedar"),
        "@id(\"retire-everything\")\npermit (principal, action, resource);\n",
    )
    .unwrap();
    std::fs::write(
        folder.join("capabilities.cedar"),
        "@id(\"anyone-anything\")\npermit (principal, action, resource);\n",
    )
    .unwrap();
    folder
}

// Finding 1: the caller chose the policy set.
#[test]
fn a_caller_chosen_policy_folder_cannot_apply_unless_the_operator_pins_it() {
    let (stores, live) = fleet();
    let folder = permit_all_folder(stores.dir.path());
    let flag = ["--policies", folder.to_str().unwrap()];
    // It still plans (a reviewer's dry run), and says which set decided.
    let mut args: Vec<String> = flag.iter().map(|s| s.to_string()).collect();
    args.extend(stores.plan_args("author-prgs"));
    let out = bin().args(&args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let human = String::from_utf8_lossy(&out.stdout);
    assert!(human.contains("w-running") && human.contains("retire"));
    assert!(
        human.contains(&format!("policy set            {}", folder.display())),
        "{human}"
    );
    let (plan_path, plan) = save_plan(&stores, &flag);
    assert!(
        plan["candidate_worker_identities"]
            .as_array()
            .unwrap()
            .contains(&json!("w-running")),
        "the permit-all set would retire the running worker"
    );
    let fingerprint = plan["policy_fingerprint"].as_str().unwrap().to_string();

    // The attack: an author applies under the permit-all set.
    let before = dump(&stores.registry);
    let (code, report) = apply_cli(&stores, &plan_path, "author-prgs", &flag);
    assert_eq!(code, Some(2), "{report}");
    assert_eq!(report["outcome"], "policy_set_not_pinned");
    let detail = report["detail"].as_str().unwrap();
    assert!(
        detail.contains(&fingerprint) && detail.contains("policy_pins"),
        "{detail}"
    );
    assert_eq!(dump(&stores.registry), before);
    assert_eq!(status_of(&stores.registry, "w-running"), "active");
    // The same through the environment variable.
    let out = bin()
        .env("FLEET_RETIRE_POLICIES", &folder)
        .args(stores.apply_args("author-prgs"))
        .arg(&plan_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(dump(&stores.registry), before);

    // A reviewed copy of the built-in set, pinned by the operator, applies.
    let reviewed = stores.dir.path().join("reviewed");
    std::fs::create_dir_all(&reviewed).unwrap();
    for f in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
    ] {
        let mut t = std::fs::read_to_string(Path::new("policies").join(f)).unwrap();
        if f == "retirement.cedar" {
            t.push_str("\n// reviewed by the operator\n");
        }
        std::fs::write(reviewed.join(f), t).unwrap();
    }
    let flag = ["--policies", reviewed.to_str().unwrap()];
    let (plan_path, plan) = save_plan(&stores, &flag);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &flag);
    assert_eq!(report["outcome"], "policy_set_not_pinned", "{report}");
    assert_eq!(code, Some(2));
    let mut profiles: Value =
        serde_json::from_str(&std::fs::read_to_string(&stores.profiles).unwrap()).unwrap();
    profiles["policy_pins"] = json!([plan["policy_fingerprint"]]);
    std::fs::write(&stores.profiles, profiles.to_string()).unwrap();
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &flag);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["retired_count"], 3);
    assert_eq!(status_of(&stores.registry, "w-running"), "active");
    drop(live);
}

/// A worker process that registers itself (identity from the launcher's
/// environment), runs `then` as itself, and keeps running as `sleep`.
fn self_registered_worker(registry: &Path, identity: &str, ttl: &str, then: &str) -> KillOnDrop {
    let marker = registry.with_extension(format!("{identity}.ready"));
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "\"$0\" register --registry \"$1\" --namespace author --ttl {ttl} \
             --repository-binding prgs/gitea-tools > \"$2.json\" {then} && : > \"$2\" && exec sleep 120"
        ))
        .arg(EXE)
        .arg(registry)
        .arg(&marker)
        .env("GITEA_MCP_WORKER_IDENTITY", identity)
        .env("GITEA_MCP_CLIENT", "codex")
        .env(
            "GITEA_MCP_CLIENT_INSTANCE",
            "inst-codex-20260730T100000Z-abc123def456",
        )
        .env("GITEA_MCP_INSTANCE_PROVENANCE", "trusted_launcher")
        .env("GITEA_MCP_CLIENT_SESSION", format!("sess-{identity}"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(child);
    let started = Instant::now();
    while !marker.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "worker {identity} did not register: {:?}",
            std::fs::read_to_string(marker.with_extension("ready.json"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    guard
}

fn heartbeat_of(registry: &Path, worker: &str) -> String {
    rusqlite::Connection::open(registry)
        .unwrap()
        .query_row(
            "SELECT last_heartbeat_at FROM worker_registrations WHERE worker_identity = ?1",
            [worker],
            |r| r.get(0),
        )
        .unwrap()
}

// Finding 2: release (and heartbeat) wrote any worker's row.
#[test]
fn a_worker_writes_only_its_own_registration() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry.sqlite");
    // The worker registers, heartbeats itself, and keeps running.
    let worker = self_registered_worker(
        &registry,
        "w-live",
        "900",
        "&& \"$0\" heartbeat --registry \"$1\" >/dev/null",
    );
    let row: Value = serde_json::from_str(
        &std::fs::read_to_string(registry.with_extension("w-live.ready.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(row["worker_identity"], "w-live");
    assert_eq!(
        row["pid"],
        json!(worker.id()),
        "the registered process is the worker"
    );
    assert_eq!(
        row["pid_namespace"],
        json!(std::fs::read_link("/proc/self/ns/pid")
            .unwrap()
            .to_string_lossy())
    );
    let beat = heartbeat_of(&registry, "w-live");

    // The attack: another process names the live worker.
    for command in ["release", "heartbeat"] {
        let out = bin()
            .args([command, "--registry", registry.to_str().unwrap()])
            .env("GITEA_MCP_WORKER_IDENTITY", "w-live")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{command}: {}", text(&out));
        assert!(
            text(&out).contains("not this command's own registration"),
            "{}",
            text(&out)
        );
    }
    assert_eq!(status_of(&registry, "w-live"), "active");
    assert_eq!(heartbeat_of(&registry, "w-live"), beat);
    // There is no flag to name a worker any more.
    let out = run(&[
        "release",
        "--registry",
        registry.to_str().unwrap(),
        "--worker-identity",
        "w-live",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(status_of(&registry, "w-live"), "active");

    // The worker itself releases its own row.
    let releasing = self_registered_worker(
        &registry,
        "w-own",
        "900",
        "&& \"$0\" release --registry \"$1\"",
    );
    assert_eq!(status_of(&registry, "w-own"), "released");
    drop((worker, releasing));
}

// Finding 3: a planted trigger and view made the audit lie.
#[test]
fn planted_triggers_views_and_foreign_audit_tables_are_refused() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores, &[]);
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER retire_all AFTER UPDATE OF status ON worker_registrations
           BEGIN UPDATE worker_registrations SET status = 'retired' WHERE status = 'active'; END;
         CREATE VIEW retirement_audit AS SELECT 1 AS audit_id;
         CREATE TRIGGER swallow INSTEAD OF INSERT ON retirement_audit BEGIN SELECT 1; END;",
    )
    .unwrap();
    let before = dump(&stores.registry);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(2), "{report}");
    assert_eq!(report["outcome"], "registry_untrusted");
    let detail = report["detail"].as_str().unwrap();
    for name in ["retire_all", "swallow", "retirement_audit"] {
        assert!(detail.contains(name), "{detail}");
    }
    assert_eq!(dump(&stores.registry), before, "nothing written");
    assert_eq!(status_of(&stores.registry, "w-running"), "active");

    // Without the trigger, the view alone is still refused.
    conn.execute_batch("DROP TRIGGER retire_all; DROP TRIGGER swallow;")
        .unwrap();
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(
        (code, report["outcome"].as_str()),
        (Some(2), Some("registry_untrusted"))
    );
    // An audit table that is not ours is refused too.
    conn.execute_batch(
        "DROP VIEW retirement_audit;
         CREATE TABLE retirement_audit (audit_id INTEGER PRIMARY KEY, worker_identity TEXT, forged TEXT);",
    )
    .unwrap();
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(
        (code, report["outcome"].as_str()),
        (Some(2), Some("registry_untrusted"))
    );
    assert!(report["detail"].as_str().unwrap().contains("forged"));
    drop(live);
}

#[test]
fn audit_rows_record_who_with_what_from_where_and_old_audit_tables_migrate() {
    let (stores, live) = fleet();
    // An audit table as the first version wrote it, with one old row.
    rusqlite::Connection::open(&stores.registry)
        .unwrap()
        .execute_batch(
            "CREATE TABLE retirement_audit (audit_id INTEGER PRIMARY KEY AUTOINCREMENT,
               worker_identity TEXT NOT NULL, retired_at TEXT NOT NULL, retired_by TEXT NOT NULL,
               retirement_reason TEXT NOT NULL, registry_fingerprint TEXT NOT NULL,
               candidate_fingerprint TEXT NOT NULL, policy_fingerprint TEXT NOT NULL,
               external_state_fingerprint TEXT NOT NULL, evidence TEXT NOT NULL);
             INSERT INTO retirement_audit (worker_identity, retired_at, retired_by, retirement_reason,
               registry_fingerprint, candidate_fingerprint, policy_fingerprint,
               external_state_fingerprint, evidence)
             VALUES ('w-old', '2026-01-01T00:00:00Z', 'p', 'eligible_stale_orphan', 'r', 'c', 'p', 'e', '{}');",
        )
        .unwrap();
    let (plan_path, _) = save_plan(&stores, &[]);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["retired_count"], 3);
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    let rows: Vec<Value> = conn
        .prepare(
            "SELECT worker_identity, retired_by, profiles_sha256, os_uid, host_id, program_version,
                    policy_source, policy_fingerprint, canonical_repository, lease_store, apply_id
             FROM retirement_audit ORDER BY audit_id",
        )
        .unwrap()
        .query_map([], |r| {
            let get = |i: usize| -> rusqlite::Result<Value> {
                Ok(match r.get_ref(i)? {
                    rusqlite::types::ValueRef::Null => Value::Null,
                    rusqlite::types::ValueRef::Integer(n) => json!(n),
                    v => json!(v.as_str().unwrap()),
                })
            };
            Ok(json!([
                get(0)?,
                get(1)?,
                get(2)?,
                get(3)?,
                get(4)?,
                get(5)?,
                get(6)?,
                get(7)?,
                get(8)?,
                get(9)?,
                get(10)?
            ]))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), 4, "the old row is kept");
    assert_eq!(rows[0][0], "w-old");
    assert_eq!(rows[0][2], Value::Null);
    let sha = format!(
        "sha256:{:x}",
        sha2::Sha256::digest(std::fs::read(&stores.profiles).unwrap())
    );
    let (host, _) = host_and_boot();
    for row in &rows[1..] {
        assert_eq!(row[1], "controller-prgs");
        assert_eq!(row[2], json!(sha));
        assert_eq!(row[3], json!(nix::unistd::getuid().as_raw()));
        assert_eq!(row[4], json!(host));
        assert_eq!(row[5], env!("CARGO_PKG_VERSION"));
        assert!(
            row[6].as_str().unwrap().starts_with("built-in (sha256:"),
            "{row}"
        );
        assert_eq!(row[7], report["policy_fingerprint"]);
        assert_eq!(row[8], "prgs/gitea-tools");
        assert_eq!(row[9], json!(stores.leases.display().to_string()));
        assert_eq!(row[10], rows[1][10], "one apply id for one apply");
    }
    drop(live);
}

// Finding 4: a lease store without `status` read as "no leases".
#[test]
fn a_lease_store_without_its_columns_is_refused() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores, &[]);
    std::fs::remove_file(&stores.leases).unwrap();
    rusqlite::Connection::open(&stores.leases)
        .unwrap()
        .execute_batch(
            "CREATE TABLE workflow_leases (lease_id TEXT PRIMARY KEY, role TEXT, target TEXT,
               session_id TEXT, owner_session_id TEXT, owner_pid INTEGER, session_pid INTEGER,
               generation TEXT, owner_worker_identity TEXT, acquired_at TEXT, expires_at TEXT);
             INSERT INTO workflow_leases (lease_id, owner_worker_identity) VALUES ('l-1', 'w-dead-1');",
        )
        .unwrap();
    let out = bin()
        .args(stores.plan_args("controller-prgs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("lacks the column(s) status"),
        "{}",
        text(&out)
    );
    let before = dump(&stores.registry);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["outcome"], "lease_store_unavailable");
    assert!(report["detail"].as_str().unwrap().contains("status"));
    assert_eq!(dump(&stores.registry), before);
    drop(live);
}

// Finding 5: a fixture's file name ran a command from run.sh.
#[test]
fn exported_fixture_names_cannot_inject_commands() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = dir.path().join("fixtures");
    std::fs::create_dir_all(&fixtures).unwrap();
    let evil = fixtures.join("pid-reuse$(touch PWNED)`touch PWNED2`;touch PWNED3.json");
    std::fs::copy("fixtures/plan/pid-reuse.json", &evil).unwrap();
    let export = dir.path().join("export");
    let out = bin()
        .args(["test", "--export-cedar"])
        .arg(&export)
        .arg(&fixtures)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // Run the generated script with a stand-in `cedar` that only succeeds.
    let fake = dir.path().join("bin");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(fake.join("cedar"), "#!/bin/sh\nexit 0\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(fake.join("cedar"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("bash")
        .arg(export.join("run.sh"))
        .current_dir(dir.path())
        .env(
            "PATH",
            format!("{}:{}", fake.display(), std::env::var("PATH").unwrap()),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for d in [dir.path(), export.as_path(), fixtures.as_path()] {
        for f in ["PWNED", "PWNED2", "PWNED3"] {
            assert!(!d.join(f).exists(), "{f} was created in {}", d.display());
        }
    }
    let names: Vec<String> = std::fs::read_dir(&export)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))),
        "{names:?}"
    );
}

// Finding 6: `policy verify DIR` proved only the folder's own properties.
#[test]
fn verifying_a_folder_proves_the_built_in_properties_too() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let folder = permit_all_folder(dir.path());
    let out = bin()
        .args(["--policies", folder.to_str().unwrap(), "policy", "verify"])
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(all.contains("FAILED retire-only-dead-pids"), "{all}");
    assert!(
        all.contains("FAILED retire-never-across-pid-namespaces"),
        "{all}"
    );
    assert!(
        all.lines()
            .any(|l| l.ends_with(" failed") && !l.ends_with(", 0 failed")),
        "{all}"
    );
}

fn unshare_works() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

// Finding 7: from a container's pid namespace every host pid looks dead.
#[test]
fn a_planner_in_another_pid_namespace_retires_nothing_it_cannot_see() {
    if skip_unless(unshare_works(), "unshare --pid (root, util-linux)") {
        return;
    }
    let stores = Stores::new(&[]);
    std::fs::remove_file(&stores.registry).unwrap();
    // A hung worker: running, but its 1-second heartbeat has lapsed.
    let hung = self_registered_worker(&stores.registry, "w-hung", "1", "");
    // A legacy row (no pid_namespace column value) of a dead process.
    let (pid, start) = dead_process();
    let mut legacy = stale_row("w-legacy", pid, &start);
    legacy["session_id"] = json!("sess-legacy");
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    insert_row(&conn, &legacy);
    conn.execute(
        "UPDATE worker_registrations SET repository_binding = 'prgs/gitea-tools', \
         client_instance_id = 'inst-codex-20260730T100000Z-abc123def456'",
        [],
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));

    let plan_in_container = || -> Value {
        let mut args = vec!["--pid", "--fork", "--mount-proc", EXE, "--format", "json"];
        let plan_args = stores.plan_args("controller-prgs");
        args.extend(plan_args.iter().map(String::as_str));
        let out = Command::new("unshare").args(&args).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let inside = plan_in_container();
    let (candidates, preserved) = verdicts(&inside);
    assert!(candidates.is_empty(), "{inside}");
    assert!(preserved.contains(&("w-hung".into(), "pid_namespace_mismatch".into())));
    assert!(preserved.contains(&("w-legacy".into(), "pid_namespace_unproven".into())));
    // On the host the same rows are judged by what the host sees.
    let outside = stores.plan_json();
    let (candidates, preserved) = verdicts(&outside);
    assert_eq!(candidates, vec!["w-legacy".to_string()], "{outside}");
    assert!(preserved.contains(&("w-hung".into(), "pid_alive".into())));

    // An apply from the container, naming both, retires nothing.
    let before = dump(&stores.registry);
    let mut args = vec![
        "--pid".to_string(),
        "--fork".into(),
        "--mount-proc".into(),
        EXE.into(),
    ];
    args.extend(stores.apply_args("controller-prgs"));
    args.extend([
        "--canonical-repository".into(),
        "prgs/gitea-tools".into(),
        "--registry-fingerprint".into(),
        inside["registry_fingerprint"].as_str().unwrap().into(),
        "--candidate-fingerprint".into(),
        inside["candidate_fingerprint"].as_str().unwrap().into(),
        "--policy-fingerprint".into(),
        inside["policy_fingerprint"].as_str().unwrap().into(),
        "--workers".into(),
        "w-hung,w-legacy".into(),
    ]);
    let out = Command::new("unshare").args(&args).output().unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(report["retired_count"], 0, "{report}");
    assert!(report["preserved"]
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k["reason_code"] == "not_in_current_plan"));
    assert_eq!(status_of(&stores.registry, "w-hung"), "active");
    assert_eq!(status_of(&stores.registry, "w-legacy"), "active");
    let _ = before;
    drop(hung);
}

fn add_lease(leases: &Path, id: &str, owner: &str) {
    rusqlite::Connection::open(leases)
        .unwrap()
        .execute(
            "INSERT INTO workflow_leases (lease_id, status, owner_worker_identity) VALUES (?1, 'active', ?2)",
            [id, owner],
        )
        .unwrap();
}

/// Apply through the library with a seam, over a fleet of three dead
/// workers (and a fourth lease-free running one); the apply must end with
/// `outcome`, retire nothing and leave the registry byte for byte.
fn retires_nothing(
    outcome: Outcome,
    setup: impl FnOnce(&Stores),
    run: impl FnOnce(&Lib, &fleet_retire::apply::Request) -> fleet_retire::apply::Report,
) -> fleet_retire::apply::Report {
    let (stores, live) = fleet();
    setup(&stores);
    let lib = Lib::new(stores);
    let req = lib.request();
    assert_eq!(req.workers.len(), 3);
    let before = dump(&lib.stores.registry);
    let report = run(&lib, &req);
    assert_eq!(report.outcome, outcome, "{}", report.detail);
    assert_eq!(report.retired_count, 0);
    assert_eq!(dump(&lib.stores.registry), before);
    drop(live);
    report
}

// Finding 8: lease changes inside apply went unseen.
#[test]
fn re_pointing_a_lease_at_a_target_inside_apply_retires_nothing() {
    let report = retires_nothing(
        Outcome::TransactionFailed,
        |stores| add_lease(&stores.leases, "l-1", "someone-else"),
        |lib, req| {
            let leases = lib.stores.leases.clone();
            // owner_worker_identity is not in the seed's lease token.
            let mut hook = |i: usize| {
                if i == 1 {
                    rusqlite::Connection::open(&leases)
                        .unwrap()
                        .execute(
                            "UPDATE workflow_leases SET owner_worker_identity = 'w-dead-2' WHERE lease_id = 'l-1'",
                            [],
                        )
                        .unwrap();
                }
            };
            lib.run(
                req,
                Hooks {
                    after_capability: Some(&mut hook),
                    ..Default::default()
                },
            )
        },
    );
    assert!(
        report.detail.contains("active leases changed"),
        "{}",
        report.detail
    );
}

#[test]
fn a_lease_added_after_the_last_per_target_check_is_caught_before_commit() {
    retires_nothing(
        Outcome::TransactionFailed,
        |_| {},
        |lib, req| {
            let leases = lib.stores.leases.clone();
            let mut hook = || add_lease(&leases, "l-late", "w-dead-1");
            lib.run(
                req,
                Hooks {
                    before_commit: Some(&mut hook),
                    ..Default::default()
                },
            )
        },
    );
}

#[test]
fn revoking_the_grant_between_two_targets_stops_the_apply() {
    retires_nothing(
        Outcome::PermissionDenied,
        |_| {},
        |lib, req| {
            let profiles = lib.stores.profiles.clone();
            let mut hook = |i: usize| {
                if i == 1 {
                    std::fs::write(
                        &profiles,
                        json!({"profiles": {"controller-prgs": {"role": "controller",
                        "allowed_operations": ["gitea.read"]}}})
                        .to_string(),
                    )
                    .unwrap();
                }
            };
            lib.run(
                req,
                Hooks {
                    between_targets: Some(&mut hook),
                    ..Default::default()
                },
            )
        },
    );
}

#[test]
fn a_blocking_profiles_json_never_holds_the_registry_lock() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores, &[]);
    std::fs::remove_file(&stores.profiles).unwrap();
    nix::unistd::mkfifo(&stores.profiles, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let started = Instant::now();
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(&plan_path)
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "apply blocked on a FIFO"
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not a regular file"), "{}", text(&out));
    drop(live);
}

// Finding 9: an empty canonical repository switched the check off.
#[test]
fn an_empty_canonical_repository_is_refused() {
    let (stores, live) = fleet();
    for repo in ["", "   "] {
        let mut args = stores.plan_args("controller-prgs");
        let at = args.iter().position(|a| a == "prgs/gitea-tools").unwrap();
        args[at] = repo.into();
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains("empty or blank"), "{}", text(&out));
    }
    let (plan_path, _) = save_plan(&stores, &[]);
    let mut plan: Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    plan["canonical_repository"] = json!("");
    std::fs::write(&plan_path, plan.to_string()).unwrap();
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(&plan_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("empty or blank"), "{}", text(&out));
    drop(live);
}

// Finding 10: control characters in worker ids faked terminal lines.
#[test]
fn control_characters_cannot_fake_lines_in_human_output() {
    let (pid, start) = dead_process();
    let evil = "w-x\n w-running          keep      pid_alive\u{1b}[2K\u{202e}";
    let stores = Stores::new(&[stale_row(evil, pid, &start)]);
    let out = bin()
        .args(stores.plan_args("controller-prgs"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let human = String::from_utf8(out.stdout).unwrap();
    assert!(
        !human.contains('\u{1b}') && !human.contains('\u{202e}'),
        "{human:?}"
    );
    assert!(
        !human.lines().any(|l| l.starts_with(" w-running")),
        "{human}"
    );
    assert!(human.contains("w-x\\u{a}"), "{human}");
    let (plan_path, _) = save_plan(&stores, &[]);
    let out = bin()
        .args(&stores.apply_args("controller-prgs")[2..])
        .arg(&plan_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let human = String::from_utf8(out.stdout).unwrap();
    assert!(human.contains("retired w-x\\u{a}"), "{human}");
    assert!(!human.contains('\u{1b}'), "{human:?}");
}

#[test]
fn duplicate_keys_in_profiles_json_are_refused_and_look_alikes_flagged() {
    let (stores, live) = fleet();
    // A grant, then a read-only duplicate: which one wins must not be a
    // parser's accident.
    std::fs::write(
        &stores.profiles,
        r#"{"profiles": {
            "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
            "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]}
        }}"#,
    )
    .unwrap();
    let (plan_path, _) = {
        let out = bin()
            .args(stores.plan_args("controller-prgs"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            text(&out).contains("duplicate key \"controller-prgs\""),
            "{}",
            text(&out)
        );
        (PathBuf::new(), ())
    };
    let _ = plan_path;
    let out = run(&["grants", "--profiles", stores.profiles.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("duplicate key"), "{}", text(&out));
    // Look-alike names: the Cyrillic "о" poses as the Latin one.
    std::fs::write(
        &stores.profiles,
        json!({"profiles": {
            "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]},
            "contr\u{43e}ller-prgs": {"role": "controller",
                "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}
        }})
        .to_string(),
    )
    .unwrap();
    let out = run(&["grants", "--profiles", stores.profiles.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let all = text(&out);
    assert!(
        all.contains("WARNING") && all.contains("look alike"),
        "{all}"
    );
    assert!(all.contains("mixes scripts"), "{all}");
    drop(live);
}

// ---- hostile inputs: serve's repository and duplicated keys (item 4) ----

/// Stores with three dead workers bound to the canonical repository and a
/// dead one, `w-other`, bound to `other/repo`, attacked by
/// `tests/mcp_client/hostile.py ATTACK` (the official Python MCP SDK's
/// client, talking to a real `serve` bound to `prgs/gitea-tools`). `None`
/// when the SDK is missing.
fn attack_serve(attack: &str) -> Option<(Stores, String)> {
    let mut rows = Vec::new();
    for i in 1..=3 {
        let (pid, start) = dead_process();
        rows.push(stale_row(&format!("w-dead-{i}"), pid, &start));
    }
    let (pid, start) = dead_process();
    let mut other = stale_row("w-other", pid, &start);
    other["repository_binding"] = json!("other/repo");
    rows.push(other);
    let stores = Stores::new(&rows);
    let out = run_mcp_client(
        "hostile.py",
        &[EXE.as_ref(), stores.dir.path().as_os_str(), attack.as_ref()],
        Duration::from_secs(120),
    )?;
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("all attacks refused"), "{all}");
    Some((stores, all))
}

#[test]
fn a_serve_tool_call_cannot_pick_another_canonical_repository() {
    let Some((stores, all)) = attack_serve("repository") else {
        return;
    };
    assert!(
        all.contains("a plan naming another repository is refused"),
        "{all}"
    );
    assert_eq!(status_of(&stores.registry, "w-other"), "active");
    assert_eq!(status_of(&stores.registry, "w-dead-1"), "active");
}

#[test]
fn a_duplicated_key_in_serve_tool_arguments_is_refused() {
    let Some((stores, all)) = attack_serve("duplicate-key") else {
        return;
    };
    assert!(all.contains("a JSON-RPC error naming the key"), "{all}");
    for w in ["w-dead-1", "w-dead-2", "w-dead-3"] {
        assert_eq!(status_of(&stores.registry, w), "active", "{w}");
    }
}
