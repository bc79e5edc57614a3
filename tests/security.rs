//! The security review's findings, each performed as an attack on real
//! files and real processes, and shown refused or harmless.
//! `docs/security.md` maps each finding to its test here.

mod common;
#[path = "security/fourth_review.rs"]
mod fourth_review;
#[path = "security/secret_sweep.rs"]
mod secret_sweep;
#[path = "security/third_review.rs"]
mod third_review;

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
    // The fleet's registry exists before its workers (they only open it).
    if !registry.exists() {
        drop(fleet_retire::worker::open(registry).unwrap());
    }
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
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
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
    assert_eq!(out.status.code(), Some(4), "{all}");
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

// ---- hostile stores: code the registry database runs inside apply's writes (issue 30.1) ----

/// Plants `ev_retire_live()`: once per transaction it retires the live
/// worker `w-running`, inside an `EXCEPTION` block, so the write is made
/// by a subtransaction (another transaction id than apply's), and any
/// error is swallowed. `ev(s)` calls it when `s` is `'retired'`;
/// `ev_imm(s)` is the same declared IMMUTABLE (what an index expression or
/// a generated column requires); `ev_key()` calls it and returns a fresh
/// key, for a column default.
const PLANT_RETIRE_LIVE: &str = "\
CREATE SEQUENCE ev_keys START 1000000; \
CREATE FUNCTION ev_retire_live() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
  IF pg_catalog.current_setting('ev.done', true) IS DISTINCT FROM 'y' THEN \
    PERFORM pg_catalog.set_config('ev.done', 'y', true); \
    BEGIN \
      UPDATE worker_registrations SET status = 'retired' \
        WHERE worker_identity OPERATOR(pg_catalog.=) 'w-running'; \
    EXCEPTION WHEN others THEN NULL; \
    END; \
  END IF; END $$; \
CREATE FUNCTION ev(s text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN \
  IF s OPERATOR(pg_catalog.=) 'retired' THEN PERFORM ev_retire_live(); END IF; \
  RETURN true; END $$; \
CREATE FUNCTION ev_imm(s text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN \
  RETURN ev(s); END $$; \
CREATE FUNCTION ev_key() RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN \
  PERFORM ev_retire_live(); RETURN pg_catalog.nextval('ev_keys'); END $$;";

/// The fleet on PostgreSQL with `attack` run by the database's owner after
/// the rows are in, and a saved plan of its three dead workers.
fn pg_attacked(tag: &str, attack: &str) -> Option<(Stores, KillOnDrop, PgDb, PathBuf)> {
    let (stores, live, db) = pg_fleet(tag)?;
    db.client()
        .batch_execute(PLANT_RETIRE_LIVE)
        .unwrap_or_else(|e| panic!("planting the function failed: {e}"));
    db.client()
        .batch_execute(attack)
        .unwrap_or_else(|e| panic!("the attack's setup failed: {e}"));
    let (plan, body) = save_plan(&stores, &[]);
    assert_eq!(
        body["candidate_worker_identities"],
        json!(["w-dead-1", "w-dead-2", "w-dead-3"]),
        "{body}"
    );
    Some((stores, live, db, plan))
}

/// The live worker's row is as the plan saw it.
fn assert_live_worker_kept(db: &PgDb, report: &Value) {
    let live = pg_statuses(db)
        .into_iter()
        .find(|(w, _)| w == "w-running")
        .map(|(_, s)| s);
    assert_eq!(
        live.as_deref(),
        Some("active"),
        "the live worker was retired: {report}"
    );
}

/// Apply refused the registry (`registry_untrusted`, naming `names`) and
/// wrote nothing at all.
fn assert_refused_untouched(stores: &Stores, db: &PgDb, plan: &Path, names: &str) {
    assert_refused_as(stores, db, plan, ("registry_untrusted", 2), names);
}

/// Apply was refused with `outcome` and its exit code, naming `names`,
/// the live worker kept and the database as it was.
fn assert_refused_as(stores: &Stores, db: &PgDb, plan: &Path, outcome: (&str, i32), names: &str) {
    let before = pg_dump(db);
    let (code, report) = apply_cli(stores, plan, "controller-prgs", &[]);
    assert_live_worker_kept(db, &report);
    assert_eq!(report["outcome"], outcome.0, "{report}");
    assert_eq!(code, Some(outcome.1), "{report}");
    let detail = report["detail"].as_str().unwrap();
    assert!(
        detail.contains(names),
        "the refusal does not name {names:?}: {detail}"
    );
    assert_eq!(
        pg_dump(db),
        before,
        "the refused apply changed the database"
    );
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_check_constraint_that_retires_a_live_worker_in_a_subtransaction_is_refused() {
    let Some((stores, _live, db, plan)) = pg_attacked(
        "check_fn",
        "ALTER TABLE worker_registrations ADD CONSTRAINT looks_harmless CHECK (ev(status));",
    ) else {
        return;
    };
    assert_refused_untouched(&stores, &db, &plan, "looks_harmless");
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn the_same_check_constraint_is_refused_when_apply_is_not_the_tables_owner() {
    let Some((mut stores, _live, db, plan)) = pg_attacked(
        "check_role",
        "ALTER TABLE worker_registrations ADD CONSTRAINT looks_harmless CHECK (ev(status)); \
         DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'fr_applier') \
           THEN CREATE ROLE fr_applier LOGIN; END IF; END $$; \
         GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO fr_applier; \
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO fr_applier;",
    ) else {
        return;
    };
    // Apply connects as a role that owns nothing (the cluster trusts
    // loopback, so no password is needed).
    let as_applier = db.url.replacen("://fleet@", "://fr_applier@", 1);
    assert_ne!(
        as_applier, db.url,
        "the test cluster's URL has another user"
    );
    stores.registry = PathBuf::from(&as_applier);
    stores.leases = PathBuf::from(&as_applier);
    assert_refused_untouched(&stores, &db, &plan, "looks_harmless");
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_trigger_on_an_inheritance_child_holding_a_target_is_refused() {
    let Some((stores, _live, db, plan)) = pg_attacked(
        "inherit",
        "CREATE TABLE worker_registrations_part () INHERITS (worker_registrations); \
         WITH moved AS (DELETE FROM ONLY worker_registrations \
           WHERE worker_identity = 'w-dead-1' RETURNING *) \
         INSERT INTO worker_registrations_part SELECT * FROM moved; \
         CREATE FUNCTION ev_trigger() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           PERFORM ev(NEW.status); RETURN NEW; END $$; \
         CREATE TRIGGER on_child AFTER UPDATE ON worker_registrations_part \
           FOR EACH ROW EXECUTE FUNCTION ev_trigger();",
    ) else {
        return;
    };
    assert_refused_untouched(&stores, &db, &plan, "inherits from");
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_default_on_the_audit_key_that_retires_a_live_worker_is_refused() {
    let Some((stores, _live, db, plan)) = pg_attacked(
        "audit_default",
        "ALTER TABLE retirement_audit ALTER COLUMN audit_id DROP IDENTITY; \
         ALTER TABLE retirement_audit ALTER COLUMN audit_id SET DEFAULT ev_key();",
    ) else {
        return;
    };
    assert_refused_untouched(&stores, &db, &plan, "ev_key");
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn an_expression_index_that_retires_a_live_worker_is_refused() {
    let Some((stores, _live, db, plan)) = pg_attacked(
        "index_expr",
        "CREATE INDEX looks_like_a_speedup ON worker_registrations (ev_imm(status));",
    ) else {
        return;
    };
    assert_refused_untouched(&stores, &db, &plan, "looks_like_a_speedup");
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_generated_column_that_retires_a_live_worker_is_refused() {
    let Some((stores, _live, db, plan)) = pg_attacked(
        "generated",
        "ALTER TABLE worker_registrations \
           ADD COLUMN checked boolean GENERATED ALWAYS AS (ev_imm(status)) STORED;",
    ) else {
        return;
    };
    assert_refused_untouched(&stores, &db, &plan, "ev_imm");
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn an_equality_operator_planted_in_the_search_path_is_never_called() {
    let Some((stores, _live, db, plan)) = pg_attacked(
        "operator",
        "CREATE FUNCTION public.text_eq(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$ \
           BEGIN IF pg_catalog.texteq(b, 'w-dead-1') OR pg_catalog.texteq(a, 'w-dead-1') THEN \
             PERFORM ev('retired'); END IF; RETURN pg_catalog.texteq(a, b); END $$; \
         CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.text_eq);",
    ) else {
        return;
    };
    // Every new session of this database now finds `public.=` first.
    let name = db.url.rsplit('/').next().unwrap().to_string();
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET search_path = public, pg_catalog"
        ))
        .unwrap();
    let (code, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_live_worker_kept(&db, &report);
    assert_eq!(report["outcome"], "applied", "{report}");
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["retired_count"], 3, "{report}");
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_domain_check_that_writes_is_refused_before_any_write() {
    // A domain's CHECK runs when apply sets `status`; no trigger, rule,
    // constraint of the table, default or index names the function. It was
    // caught by the transaction's effect check alone; since the third
    // review every column of a domain (or of a type not PostgreSQL's own)
    // is refused up front (docs/security.md, 41.3), and the effect check
    // stays behind it for what no shape check names.
    let Some((stores, _live, db, plan)) = pg_attacked(
        "domain",
        "CREATE DOMAIN guarded_status AS text CHECK (ev(VALUE)); \
         ALTER TABLE worker_registrations ALTER COLUMN status TYPE guarded_status;",
    ) else {
        return;
    };
    assert_refused_untouched(&stores, &db, &plan, "guarded_status, a domain");
}

// ---- hostile stores: SQL from a lease column's name (issue 30.2) ----

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_lease_column_whose_name_carries_sql_cannot_run_it_through_plan() {
    let Some((stores, _live, db)) = pg_fleet("lease_column_sql") else {
        return;
    };
    db.client().batch_execute(PLANT_RETIRE_LIVE).unwrap();
    // The column's name closes the quote our SELECT would open around it
    // and calls a function of the attacker's.
    db.client()
        .batch_execute(
            "CREATE FUNCTION public.ev_text() RETURNS text LANGUAGE plpgsql AS $$ BEGIN \
               PERFORM ev('retired'); RETURN 'x'; END $$; \
             ALTER TABLE workflow_leases ADD COLUMN \"lease_id\"\",public.ev_text() \"\"y\" text; \
             INSERT INTO workflow_leases (lease_id, status) VALUES ('l-1', 'active');",
        )
        .unwrap();
    let out = bin()
        .args(stores.plan_args("controller-prgs"))
        .output()
        .unwrap();
    let live = pg_statuses(&db)
        .into_iter()
        .find(|(w, _)| w == "w-running")
        .map(|(_, s)| s);
    assert_eq!(
        live.as_deref(),
        Some("active"),
        "plan ran the column's SQL: {}",
        text(&out)
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("not plain identifiers"),
        "the refusal does not say why: {}",
        text(&out)
    );
    // The same name in a SQLite lease store is refused the same way.
    let (sqlite, _live2) = fleet();
    rusqlite::Connection::open(&sqlite.leases)
        .unwrap()
        .execute_batch("ALTER TABLE workflow_leases ADD COLUMN \"lease_id\"\",x \"\"y\" TEXT;")
        .unwrap();
    let out = bin()
        .args(sqlite.plan_args("controller-prgs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("not plain identifiers"),
        "{}",
        text(&out)
    );
}

// ---- hostile inputs: passwords in store URLs (issue 30.3) ----

/// The password the URLs below carry: `/` and `?` end the authority for
/// a naive scanner, while the driver still reads them as the password.
const PASSWORD: &str = "SE/CR?ET";

fn assert_no_password(what: &str, text: &str) {
    for leak in [PASSWORD, "SE/CR", "CR?ET", "SE%2FCR", "CR%3FET"] {
        assert!(
            !text.contains(leak),
            "{what} shows the password ({leak}): {text}"
        );
    }
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_password_in_a_store_url_is_shown_by_no_output_error_audit_row_or_file() {
    let Some((stores, _live, db)) = pg_fleet("password") else {
        return;
    };
    // The test cluster trusts loopback: any password connects.
    let url = with_password(&db.url);
    assert!(url.contains(PASSWORD));
    let mut stores = stores;
    stores.registry = PathBuf::from(&url);
    stores.leases = PathBuf::from(&url);
    let capture_out = stores.dir.path().join("captured.json");
    for (what, args) in &commands_through(&url, &stores.profiles, &capture_out) {
        assert_runs_without_password(what, args);
    }
    assert!(capture_out.exists(), "fixture capture wrote no case");
    assert_no_password(
        "the captured case",
        &std::fs::read_to_string(&capture_out).unwrap(),
    );
    assert_apply_shows_no_password(&stores, &db);
    assert_copy_shows_no_password();
}

/// The test database's URL with [`PASSWORD`] as the user's password.
fn with_password(url: &str) -> String {
    url.replacen("://fleet@", &format!("://fleet:{PASSWORD}@"), 1)
}

/// Every command that reads a store, named, with arguments that send it
/// through `url`: two of them fail (an unknown worker, a missing database).
fn commands_through(
    url: &str,
    profiles_file: &Path,
    capture_out: &Path,
) -> Vec<(&'static str, Vec<String>)> {
    let strings = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
    let store_args = [
        "--registry",
        url,
        "--leases",
        url,
        "--canonical-repository",
        "prgs/gitea-tools",
    ];
    let common = |cmd: &[&str]| [strings(cmd), strings(&store_args)].concat();
    let profiles_file = profiles_file.display().to_string();
    let profile_args = strings(&["--profiles", &profiles_file, "--profile", "controller-prgs"]);
    let profile = |args: Vec<String>| [args, profile_args.clone()].concat();
    let capture_out = capture_out.display().to_string();
    let bad_db = format!("{url}_missing");
    vec![
        ("plan", profile(common(&["plan"]))),
        ("plan json", profile(common(&["--format", "json", "plan"]))),
        (
            "snapshot",
            profile(strings(&[
                "snapshot",
                "--registry",
                url,
                "--canonical-repository",
                "prgs/gitea-tools",
            ])),
        ),
        (
            "explain",
            profile(common(&["explain", "--worker", "w-dead-1"])),
        ),
        (
            "fixture capture",
            profile(common(&[
                "fixture",
                "capture",
                "--worker",
                "w-dead-1",
                "--out",
                &capture_out,
            ])),
        ),
        (
            "fixture capture of an unknown worker",
            profile(common(&["fixture", "capture", "--worker", "w-nobody"])),
        ),
        (
            "policy diff",
            [
                strings(&["policy", "diff", "policies", "policies"]),
                common(&[]),
            ]
            .concat(),
        ),
        (
            "plan of a database that does not exist",
            profile(strings(&[
                "plan",
                "--registry",
                &bad_db,
                "--leases",
                &bad_db,
                "--canonical-repository",
                "prgs/gitea-tools",
            ])),
        ),
    ]
}

/// Run one command: it succeeds (or, for the two failing ones, fails) as
/// meant, so its output is the one that would show the URL, and shows no
/// password.
fn assert_runs_without_password(what: &str, args: &[String]) {
    let out = bin().args(args).output().unwrap();
    assert_no_password(what, &text(&out));
    let failing = what.contains("unknown worker") || what.contains("does not exist");
    assert_eq!(
        out.status.code(),
        Some(i32::from(failing)),
        "{what}: {}",
        text(&out)
    );
}

/// Apply through the URL: the saved plan, its report, and the audit rows
/// it writes show no password.
fn assert_apply_shows_no_password(stores: &Stores, db: &PgDb) {
    let (plan_path, _) = save_plan(stores, &[]);
    assert_no_password(
        "the saved plan",
        &std::fs::read_to_string(&plan_path).unwrap(),
    );
    let (code, report) = apply_cli(stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_no_password("apply's report", &report.to_string());
    let audit: Vec<String> = db
        .client()
        .query("SELECT t::text FROM retirement_audit t", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(audit.len(), 3);
    assert_no_password("the audit rows", &audit.join("\n"));
}

/// `registry copy` into a second database through a URL with the
/// password, twice: the second copy is refused (the tables are no longer
/// empty), and neither shows the password.
fn assert_copy_shows_no_password() {
    let Some(target) = postgres("password_copy") else {
        return;
    };
    let to = with_password(&target.url);
    let (sqlite, _live2) = fleet();
    let s = |p: &Path| p.display().to_string();
    for args in [
        vec![
            "registry",
            "copy",
            "--from",
            &s(&sqlite.registry),
            "--to",
            &to,
        ],
        vec![
            "registry",
            "copy",
            "--from",
            &s(&sqlite.registry),
            "--to",
            &to,
        ],
    ] {
        let out = bin().args(&args).output().unwrap();
        assert_no_password("registry copy", &text(&out));
    }
}

// ---- hostile inputs: fixture capture secrets and --out, launch --env (items 7, 8) ----

/// `fixture capture` arguments for these stores (the selection comes after).
fn capture_cli(stores: &Stores) -> Vec<String> {
    let mut args: Vec<String> = vec!["fixture".into(), "capture".into()];
    args.extend(stores.plan_args("controller-prgs").into_iter().skip(1));
    args
}

// Finding 30.7: secrets in row values survived a capture.
#[test]
fn fixture_capture_scrubs_every_secret_in_row_values_and_the_case_still_passes() {
    let (pid, start) = dead_process();
    let mut one = stale_row("w-secret-1", pid, &start);
    // Credentials of a second URL in one value.
    one["remote"] = json!("https://a:pw-first@h1.example/x https://b:pw-second@h2.example/y");
    // A password holding `/`.
    one["transport"] = json!("https://s:ghp_EEEE/secret5@h");
    one["authenticated_account"] = json!("bot:ghp_AAAA1111");
    one["client_name"] = json!("Bearer ghp_BBBB2222");
    let (pid2, start2) = dead_process();
    let mut two = stale_row("w-secret-2", pid2, &start2);
    two["remote"] = json!("git https://x-token:glpat-CCCC3333@gitlab.example/g/p");
    two["authenticated_account"] = json!("xoxb-1234-DDDD4444");
    two["transport"] = json!("AKIAIOSFODNN7EXAMPLE");
    two["retirement_reason"] = json!("token Zm9vYmFyX3Rvaw; Authorization: Basic dXNlcjpwYXNz");
    two["retired_by"] = json!("github_pat_11ABCDEFG_hijkl gho_FFFF5555 ghs_GGGG6666");
    let stores = Stores::new(&[one, two]);
    let out_path = stores.dir.path().join("captured.json");
    let out = bin()
        .args(capture_cli(&stores))
        .args(["--worker", "w-secret-1", "--worker", "w-secret-2"])
        .arg("--out")
        .arg(&out_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let written = std::fs::read_to_string(&out_path).unwrap();
    for secret in [
        "pw-first",
        "pw-second",
        "ghp_",
        "EEEE",
        "secret5",
        "AAAA1111",
        "BBBB2222",
        "glpat-",
        "CCCC3333",
        "x-token",
        "xoxb-",
        "DDDD4444",
        "AKIA",
        "Zm9vYmFyX3Rvaw",
        "dXNlcjpwYXNz",
        "github_pat_",
        "FFFF5555",
        "GGGG6666",
    ] {
        assert!(!written.contains(secret), "{secret} leaked: {written}");
    }
    // Placeholders are stable; the hosts and the scheme words stay.
    assert!(written.contains("@h1.example/x"), "{written}");
    assert!(written.contains("@h2.example/y"), "{written}");
    assert!(written.contains("Bearer redacted-"), "{written}");
    for column in [
        "remote",
        "transport",
        "authenticated_account",
        "client_name",
    ] {
        assert!(
            text(&out).contains(&format!("value(s) of {column}")),
            "{}",
            text(&out)
        );
    }
    // The scrubbed case still reproduces the verdicts it was captured for.
    let pass = bin().arg("test").arg(&out_path).output().unwrap();
    assert!(pass.status.success(), "{}", text(&pass));
    // Standard output gets the same scrubbed case.
    let out = bin()
        .args(capture_cli(&stores))
        .args(["--worker", "w-secret-1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        !printed.contains("ghp_") && !printed.contains("pw-second"),
        "{printed}"
    );
}

// Finding 30.7: `--out` onto a symlink overwrote the link's target.
#[test]
fn fixture_capture_out_never_writes_through_a_symlink_or_over_a_file() {
    let (pid, start) = dead_process();
    let stores = Stores::new(&[stale_row("w-dead", pid, &start)]);
    let dir = stores.dir.path();
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    let link = dir.join("captured.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let capture_to = |path: &Path, extra: &[&str]| {
        bin()
            .args(capture_cli(&stores))
            .args(["--worker", "w-dead", "--out"])
            .arg(path)
            .args(extra)
            .output()
            .unwrap()
    };
    // Onto a symlink: refused, naming the path and --force; the target kept.
    let out = capture_to(&link, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&link.display().to_string()) && text(&out).contains("--force"),
        "{}",
        text(&out)
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    // A dangling symlink: refused too, and its target is not created.
    let nowhere = dir.join("created-through-the-link");
    let dangling = dir.join("dangling.json");
    std::os::unix::fs::symlink(&nowhere, &dangling).unwrap();
    let out = capture_to(&dangling, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!nowhere.exists());
    // An existing file: refused and unchanged.
    let existing = dir.join("existing.json");
    std::fs::write(&existing, "keep me\n").unwrap();
    let out = capture_to(&existing, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me\n");
    // --force replaces the link itself, never its target.
    let out = capture_to(&link, &["--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_file());
    let case: Value = serde_json::from_str(&std::fs::read_to_string(&link).unwrap()).unwrap();
    assert!(case["rows"].is_array());
    let out = capture_to(&dangling, &["--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!nowhere.exists());
    // A new path is written as before, and no temporary file is left.
    let fresh = dir.join("fresh.json");
    assert!(capture_to(&fresh, &[]).status.success());
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains(".tmp")),
        "a temporary file was left: {names:?}"
    );
}

// Finding 30.8: `launch --env` overrode the keys the launch sets itself.
#[test]
fn launch_env_cannot_set_the_launchs_own_keys_or_malformed_keys() {
    let launch_with = |env: &str| {
        bin()
            .args(["launch", "--client", "codex", "--profiles"])
            .arg("author=a,reviewer=r,merger=m,controller=c,reconciler=x")
            .args(["--config", "/etc/fleet/profiles.json", "--env", env])
            .output()
            .unwrap()
    };
    for env in [
        "GITEA_MCP_PROFILE=evil",
        "GITEA_MCP_CONFIG=/tmp/evil.json",
        "GITEA_MCP_CLIENT_SESSION=shared",
        "GITEA_MCP_WORKER_IDENTITY=w-shared",
        "GITEA_MCP_CLIENT_INSTANCE=inst-evil",
        "GITEA_MCP_NAMESPACE=controller",
        "GITEA_MCP_FLEET_RUN_ID=run-evil",
        "GITEA_CLIENT_MANAGED=0",
        "GITEA_MCP_SOMETHING_NEW=1",
        "gitea_mcp_profile=evil",
    ] {
        let out = launch_with(env);
        let key = env.split_once('=').unwrap().0;
        assert_eq!(out.status.code(), Some(1), "{env}: {}", text(&out));
        assert!(out.stdout.is_empty(), "{env}: a config was printed");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--env") && err.contains(key), "{env}: {err}");
    }
    for env in ["=x", "A\nB=1", "1A=x", "A-B=x", "A B=x", "NOEQUALS"] {
        let out = launch_with(env);
        assert_eq!(out.status.code(), Some(1), "{env:?}: {}", text(&out));
        assert!(out.stdout.is_empty(), "{env:?}: a config was printed");
        assert!(text(&out).contains("--env"), "{env:?}: {}", text(&out));
    }
    // An ordinary key reaches all five servers; the launch's own keys stand.
    let out = launch_with("FLEET_RETIRE_REGISTRY=/var/lib/fleet/registry.sqlite");
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (name, server) in doc["mcpServers"].as_object().unwrap() {
        let env = &server["env"];
        assert_eq!(
            env["FLEET_RETIRE_REGISTRY"], "/var/lib/fleet/registry.sqlite",
            "{name}"
        );
        assert_eq!(
            env["GITEA_MCP_CONFIG"], "/etc/fleet/profiles.json",
            "{name}"
        );
        assert_ne!(env["GITEA_MCP_PROFILE"], "evil", "{name}");
    }
}

// ---- hostile inputs: policy diff's git revisions and policy folder files ----

/// Run `cmd` with its output collected, killing it if it has not ended
/// within `limit` (a blocked read must fail the test, not hang it).
fn output_within(mut cmd: Command, limit: Duration) -> std::process::Output {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = pipe(Box::new(child.stdout.take().unwrap()));
    let stderr = pipe(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the command was still running after {limit:?}: it blocked");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// A git repository in a temporary folder whose one commit holds `files`
/// under `policies/`.
fn git_repo_with_policies(files: &[(&str, &str)]) -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    std::fs::create_dir(repo.path().join("policies")).unwrap();
    for (name, text) in files {
        std::fs::write(repo.path().join("policies").join(name), text).unwrap();
    }
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .current_dir(repo.path())
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", text(&out));
    };
    git(&["init", "-q"]);
    git(&["add", "policies"]);
    git(&["commit", "-q", "-m", "policies"]);
    repo
}

fn builtin_policy_files() -> Vec<(&'static str, String)> {
    [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
    ]
    .into_iter()
    .map(|f| {
        let text = std::fs::read_to_string(Path::new("policies").join(f)).unwrap();
        (f, text)
    })
    .collect()
}

// Finding 30.5: `policy diff` handed a revision starting with `-` to
// `git show` as an option (`--output=` wrote files), and compared the empty
// set it read back as if it were a policy set.
#[test]
fn policy_diff_passes_no_option_to_git_and_refuses_an_empty_set() {
    let builtin = builtin_policy_files();
    let files: Vec<(&str, &str)> = builtin.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let repo = git_repo_with_policies(&files);
    let here = repo.path();
    let policy_diff = |old: &str, new: &str| {
        let mut cmd = bin();
        cmd.current_dir(here)
            .args(["policy", "diff", "--", old, new]);
        output_within(cmd, Duration::from_secs(120))
    };
    // `--output=pwn2` makes git write `pwn2:policies/<file>` (a folder the
    // attacker planted); `--output=pwn3:` writes `pwn3:<file>` right here.
    std::fs::create_dir(here.join("pwn2:policies")).unwrap();
    let written = || -> Vec<String> {
        let names = |d: &Path| -> Vec<String> {
            std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        };
        let mut all = names(&here.join("pwn2:policies"));
        all.extend(names(here).into_iter().filter(|n| n.starts_with("pwn3")));
        all
    };
    for (old, new) in [
        ("policies", "--output=pwn2"),
        ("--output=pwn3:", "policies"),
    ] {
        let out = policy_diff(old, new);
        let all = text(&out);
        assert!(written().is_empty(), "git wrote {:?}: {all}", written());
        assert_eq!(out.status.code(), Some(1), "{old} {new}: {all}");
        assert!(all.contains("starts with '-'"), "{all}");
    }
    // A revision or a folder whose files are empty is no policy set to
    // compare against: it is an error, whichever side it is on.
    let empty_repo = git_repo_with_policies(&[
        ("schema.cedarschema", ""),
        ("retirement.cedar", ""),
        ("capabilities.cedar", ""),
    ]);
    let empty_dir = empty_repo.path().join("policies");
    let full_dir = std::fs::canonicalize("policies").unwrap();
    let (full, empty) = (full_dir.to_str().unwrap(), empty_dir.to_str().unwrap());
    let in_empty_repo = |old: &str, new: &str| {
        let mut cmd = bin();
        cmd.current_dir(empty_repo.path())
            .args(["policy", "diff", old, new]);
        output_within(cmd, Duration::from_secs(120))
    };
    for (old, new, side) in [
        (full, empty, "NEW"),
        (empty, full, "OLD"),
        (full, "HEAD", "NEW"),
        ("HEAD:policies", full, "OLD"),
    ] {
        let out = in_empty_repo(old, new);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(3), "{old} {new}: {all}");
        assert!(all.contains(&format!("{side} (")), "{all}");
        assert!(all.contains("holds no policies"), "{all}");
        assert!(!all.contains("EQUIVALENT"), "{all}");
    }
}

/// A copy of the built-in policy folder, with its properties.
fn policy_folder_copy(dir: &Path) -> PathBuf {
    let folder = dir.join("reviewed");
    std::fs::create_dir_all(folder.join("properties")).unwrap();
    for (name, text) in builtin_policy_files() {
        std::fs::write(folder.join(name), text).unwrap();
    }
    for entry in std::fs::read_dir("policies/properties").unwrap() {
        let from = entry.unwrap().path();
        std::fs::copy(
            &from,
            folder.join("properties").join(from.file_name().unwrap()),
        )
        .unwrap();
    }
    folder
}

// Finding 30.6: a policy folder's files were followed through symlinks
// (`/etc/shadow`, `/proc/self/environ`, `/dev/zero`) and read whole, and a
// parse error printed lines around the one it was about.
#[test]
fn a_policy_folder_holds_bounded_regular_files_only() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("shadow");
    std::fs::write(
        &secret,
        "root:SECRET-HASH-1:19000:0:99999:7:::\nbin:SECRET-HASH-2:19000::::::\n",
    )
    .unwrap();
    let folder = policy_folder_copy(dir.path());
    let policies_arg = folder.to_str().unwrap().to_string();
    let run_in = |args: &[&str]| {
        let mut cmd = bin();
        cmd.args(["--policies", &policies_arg]).args(args);
        output_within(cmd, Duration::from_secs(30))
    };
    let replace_with = |name: &str, make: &dyn Fn(&Path)| {
        let path = folder.join(name);
        std::fs::remove_file(&path).unwrap();
        make(&path);
        let out = run_in(&["policy", "validate"]);
        let builtin = std::fs::read_to_string(Path::new("policies").join(name)).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, builtin).unwrap();
        out
    };
    // A symlink to a file we may read, for each file of the folder and for
    // a property file: refused, naming the file, printing none of it.
    let link_to_secret = |p: &Path| std::os::unix::fs::symlink(&secret, p).unwrap();
    for name in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
        "properties/retirement.cedar",
    ] {
        let out = replace_with(name, &link_to_secret);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(3), "{name}: {all}");
        assert!(!all.contains("SECRET-HASH"), "{name}: {all}");
        assert!(
            all.contains(name) && all.contains("symbolic link"),
            "{name}: {all}"
        );
    }
    // /dev/zero behind a symlink, and a FIFO in place of the file: refused
    // at once, never read until memory runs out or a writer comes. The
    // address space is capped so that reading /dev/zero cannot take the
    // machine's memory with it.
    let link_to_zero = |p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap();
    let fifo = |p: &Path| nix::unistd::mkfifo(p, nix::sys::stat::Mode::S_IRWXU).unwrap();
    for (name, make, said) in [
        (
            "retirement.cedar",
            &link_to_zero as &dyn Fn(&Path),
            "symbolic link",
        ),
        ("capabilities.cedar", &fifo, "not a regular file"),
    ] {
        let path = folder.join(name);
        std::fs::remove_file(&path).unwrap();
        make(&path);
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "ulimit -v 524288; exec \"$0\" \"$@\"", EXE])
            .args(["--policies", &policies_arg, "policy", "list"]);
        let out = output_within(cmd, Duration::from_secs(30));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(3), "{name}: {all}");
        assert!(all.contains(name) && all.contains(said), "{name}: {all}");
        std::fs::remove_file(&path).unwrap();
        std::fs::copy(Path::new("policies").join(name), &path).unwrap();
    }
    environ_behind_a_symlink_shows_no_token(&folder, &policies_arg);
    large_and_broken_files_show_nothing_more(&folder, &run_in);
}

/// The environment behind a symlink, in `policy diff`: no token shown.
fn environ_behind_a_symlink_shows_no_token(folder: &Path, policies_arg: &str) {
    let caps = folder.join("capabilities.cedar");
    std::fs::remove_file(&caps).unwrap();
    std::os::unix::fs::symlink("/proc/self/environ", &caps).unwrap();
    let mut cmd = bin();
    cmd.env("GITEA_TOKEN", "ghp_SECRETTOKENFROMTHEENVIRONMENT")
        .args(["policy", "diff", "policies", policies_arg]);
    let out = output_within(cmd, Duration::from_secs(120));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(!all.contains("SECRETTOKEN"), "{all}");
    assert!(all.contains("capabilities.cedar"), "{all}");
    std::fs::remove_file(&caps).unwrap();
    std::fs::copy("policies/capabilities.cedar", &caps).unwrap();
}

/// A regular file larger than any policy file is refused, not parsed; a
/// parse error shows the located line and not its neighbours.
fn large_and_broken_files_show_nothing_more(
    folder: &Path,
    run_in: &dyn Fn(&[&str]) -> std::process::Output,
) {
    let retirement = folder.join("retirement.cedar");
    let mut huge = std::fs::read_to_string(&retirement).unwrap();
    huge.push_str(&"// padding\n".repeat(200_000));
    std::fs::write(&retirement, huge).unwrap();
    let out = run_in(&["policy", "list"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(all.contains("larger than"), "{all}");
    // A parse error in a file we accept shows the located line, and not
    // its neighbours.
    std::fs::write(
        &retirement,
        "// SECRET-NEIGHBOUR-BEFORE\n@id(\"x\")\npermit (principal, action, resource) when { resource.x != };\n// SECRET-NEIGHBOUR-AFTER\n",
    )
    .unwrap();
    let out = run_in(&["policy", "list"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(all.contains("retirement.cedar:3:"), "{all}");
    assert!(all.contains("when { resource.x != };"), "{all}");
    assert!(!all.contains("SECRET-NEIGHBOUR"), "{all}");
}

// ---- hostile inputs: registry copy's source, leases named by another type (items 9, 10) ----

/// `registry copy` from `from` (and `leases`) into `to`.
fn registry_copy(from: &Path, leases: Option<&Path>, to: &str) -> std::process::Output {
    let mut cmd = bin();
    cmd.args([
        "registry",
        "copy",
        "--from",
        from.to_str().unwrap(),
        "--to",
        to,
    ]);
    if let Some(leases) = leases {
        cmd.args(["--leases", leases.to_str().unwrap()]);
    }
    cmd.output().unwrap()
}

/// How many tables the PostgreSQL database holds.
fn pg_table_count(db: &PgDb) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()",
            &[],
        )
        .unwrap()
        .get(0)
}

// Finding 30.9: `registry copy` copied through a view hiding a row, and
// reported every row read back value for value.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn registry_copy_refuses_a_source_read_through_a_view_or_with_triggers() {
    let db = postgres("copy_view");
    // Without a cluster the refusal must still come first, before any
    // connection is tried.
    let to = db
        .as_ref()
        .map_or("postgres://fleet@127.0.0.1:1/none".to_string(), |d| {
            d.url.clone()
        });
    let dir = tempfile::tempdir().unwrap();
    let (pid, start) = dead_process();
    let rows = [
        stale_row("w-shown", pid, &start),
        stale_row("w-hidden", pid, &start),
    ];

    // The table renamed away, a view in its place that hides w-hidden.
    let viewed = dir.path().join("viewed.sqlite");
    common::registry(&viewed, &rows);
    rusqlite::Connection::open(&viewed)
        .unwrap()
        .execute_batch(
            "ALTER TABLE worker_registrations RENAME TO hidden_rows;
             CREATE VIEW worker_registrations AS
                 SELECT * FROM hidden_rows WHERE worker_identity <> 'w-hidden';",
        )
        .unwrap();
    let out = registry_copy(&viewed, None, &to);
    let message = text(&out);
    assert_eq!(out.status.code(), Some(1), "{message}");
    assert!(
        message.contains("cannot be copied")
            && message.contains("view \"worker_registrations\"")
            && message.contains("\"worker_registrations\" is a view, not a table")
            && message.contains("Nothing was written")
            && message.contains("then copy again"),
        "{message}"
    );
    assert!(!message.contains("panicked"), "{message}");

    // A plain table, but a trigger beside it: refused as apply refuses it.
    let triggered = dir.path().join("triggered.sqlite");
    common::registry(&triggered, &rows);
    rusqlite::Connection::open(&triggered)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER quiet AFTER UPDATE ON worker_registrations
             BEGIN UPDATE worker_registrations SET status = 'retired'; END;",
        )
        .unwrap();
    let out = registry_copy(&triggered, None, &to);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("trigger \"quiet\" on \"worker_registrations\""),
        "{}",
        text(&out)
    );

    // A plain registry, but a lease table that is a view hiding a lease.
    let clean = dir.path().join("clean.sqlite");
    common::registry(&clean, &rows);
    let leases = dir.path().join("leases.sqlite");
    common::leases(
        &leases,
        &[
            json!({"lease_id": "l-shown", "status": "active", "owner_worker_identity": "w-shown"}),
            json!({"lease_id": "l-hidden", "status": "active", "owner_worker_identity": "w-hidden"}),
        ],
    );
    rusqlite::Connection::open(&leases)
        .unwrap()
        .execute_batch(
            "ALTER TABLE workflow_leases RENAME TO all_leases;
             CREATE VIEW workflow_leases AS
                 SELECT * FROM all_leases WHERE lease_id <> 'l-hidden';",
        )
        .unwrap();
    let out = registry_copy(&clean, Some(&leases), &to);
    let message = text(&out);
    assert_eq!(out.status.code(), Some(1), "{message}");
    assert!(
        message.contains("lease store")
            && message.contains("\"workflow_leases\" is a view, not a table")
            && message.contains("Nothing was written"),
        "{message}"
    );
    if let Some(db) = &db {
        assert_eq!(pg_table_count(db), 0, "nothing was created either");
    }
}

// Finding 30.9: a lease column the copy cannot hold was refused with two
// equal tokens that "read back differently".
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn registry_copy_says_which_lease_column_did_not_read_back() {
    let Some(db) = postgres("copy_lease_column") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (pid, start) = dead_process();
    let registry = dir.path().join("registry.sqlite");
    common::registry(&registry, &[stale_row("w-1", pid, &start)]);
    let leases = dir.path().join("leases.sqlite");
    common::leases(
        &leases,
        &[json!({"lease_id": "l-1", "status": "active", "owner_worker_identity": "w-1"})],
    );
    rusqlite::Connection::open(&leases)
        .unwrap()
        .execute_batch(
            "ALTER TABLE workflow_leases ADD COLUMN note TEXT;
             UPDATE workflow_leases SET note = 'kept by the control plane';",
        )
        .unwrap();
    let out = registry_copy(&registry, Some(&leases), &db.url);
    let message = text(&out);
    assert_eq!(out.status.code(), Some(1), "{message}");
    assert!(
        message.contains(
            "active lease l-1 column `note` reads back as absent (was text kept by the control plane)"
        ),
        "{message}"
    );
    assert!(
        message.contains("drop `note` from the source's table, or copy without --leases"),
        "{message}"
    );
    assert!(message.contains("nothing was committed"), "{message}");
    assert!(!message.contains("token"), "{message}");
    let copied: i64 = db
        .client()
        .query_one("SELECT count(*) FROM worker_registrations", &[])
        .map(|r| r.get(0))
        .unwrap_or(0);
    assert_eq!(copied, 0, "the copy was rolled back");
}

/// A lease store whose columns have no declared type, as a control plane
/// may create it: SQLite keeps each value's own storage class, so a
/// session can be the REAL 42.0.
fn untyped_lease_store(path: &Path, leases: &[(&str, &str, f64)]) {
    let _ = std::fs::remove_file(path);
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE workflow_leases (lease_id TEXT PRIMARY KEY, role, target, status,
             session_id, owner_session_id, owner_pid, session_pid, generation,
             owner_worker_identity, acquired_at, expires_at);",
    )
    .unwrap();
    for (id, column, value) in leases {
        conn.execute(
            &format!("INSERT INTO workflow_leases (lease_id, status, {column}) VALUES (?1, 'active', ?2)"),
            rusqlite::params![id, value],
        )
        .unwrap();
    }
}

// Finding 30.10: a lease naming a session or an identity as a REAL
// (`42.0`) did not protect the row naming it as text (`"42"`), though the
// two have one canonical text; plan listed the row as a candidate, and
// apply (whose re-plan reads the leases the same way) would retire it.
#[test]
fn a_lease_naming_a_session_or_identity_by_another_type_still_protects_it() {
    let mut rows = Vec::new();
    for id in ["w-session", "9000", "w-free"] {
        let (pid, start) = dead_process();
        rows.push(stale_row(id, pid, &start));
    }
    rows[0]["session_id"] = json!("42");
    let stores = Stores::new(&rows);
    // A plan made before the control plane took the leases.
    let (old_plan, planned) = common::save_plan(&stores);
    assert_eq!(
        planned["candidate_worker_identities"],
        json!(["w-session", "9000", "w-free"])
    );
    untyped_lease_store(
        &stores.leases,
        &[
            ("l-session", "owner_session_id", 42.0),
            ("l-owner", "owner_worker_identity", 9000.0),
        ],
    );
    let stored: String = rusqlite::Connection::open(&stores.leases)
        .unwrap()
        .query_row(
            "SELECT typeof(owner_session_id) FROM workflow_leases WHERE lease_id = 'l-session'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, "real");

    // Plan now protects both rows.
    let plan = stores.plan_json();
    let (candidates, preserved) = verdicts(&plan);
    assert_eq!(candidates, vec!["w-free".to_string()], "{plan}");
    for w in ["w-session", "9000"] {
        assert!(
            preserved.contains(&(w.into(), "protected_active_workflow_owner".into())),
            "{w}: {preserved:?}"
        );
    }
    let sessions = &plan["protected_inputs"]["session_ids"];
    assert_eq!(sessions, &json!(["42", "42.0"]), "{plan}");

    // Apply of the plan made before the leases: its re-plan under the lock
    // sees the same protections, so it retires nothing.
    let (code, report) = common::apply_cli(&stores, &old_plan, "controller-prgs", &[]);
    assert_ne!(code, Some(0), "{report}");
    assert_eq!(report["outcome"], "candidate_set_moved", "{report}");
    assert_eq!(report["retired_count"], 0, "{report}");
    for w in ["w-session", "9000", "w-free"] {
        assert_eq!(status_of(&stores.registry, w), "active", "{w}");
    }
    // Apply of the fresh plan retires the unprotected row only.
    let (fresh_plan, _) = common::save_plan(&stores);
    let (code, report) = common::apply_cli(&stores, &fresh_plan, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(status_of(&stores.registry, "w-free"), "retired");
    assert_eq!(status_of(&stores.registry, "w-session"), "active");
    assert_eq!(status_of(&stores.registry, "9000"), "active");
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
    scope_indexes(&stores.registry);
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
#[cfg_attr(
    not(fr_python_mcp),
    ignore = "needs python3 with the mcp package (pip install mcp==2.3.0; then touch build.rs)"
)]
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
#[cfg_attr(
    not(fr_python_mcp),
    ignore = "needs python3 with the mcp package (pip install mcp==2.3.0; then touch build.rs)"
)]
fn a_duplicated_key_in_serve_tool_arguments_is_refused() {
    let Some((stores, all)) = attack_serve("duplicate-key") else {
        return;
    };
    assert!(all.contains("a JSON-RPC error naming the key"), "{all}");
    for w in ["w-dead-1", "w-dead-2", "w-dead-3"] {
        assert_eq!(status_of(&stores.registry, w), "active", "{w}");
    }
}
