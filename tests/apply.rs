//! Apply, end to end: real SQLite files, real child processes, the real
//! binary where the path goes through the command line, and the library's
//! test seams where a step must happen inside the transaction.

mod common;

use common::*;
use fleet_retire::apply::{Hooks, Outcome};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

fn statuses(path: &Path) -> Vec<(String, String, Option<String>)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT worker_identity, status, retired_by FROM worker_registrations ORDER BY worker_identity")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn audit_rows(path: &Path) -> Vec<(String, String)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let exists: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'retirement_audit'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    if exists == 0 {
        return Vec::new();
    }
    let mut stmt = conn
        .prepare(
            "SELECT worker_identity, registry_fingerprint FROM retirement_audit ORDER BY audit_id",
        )
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn happy_path_retires_exactly_the_approved_rows_then_replays_idempotently() {
    let (stores, live) = fleet();
    let (plan_path, plan) = save_plan(&stores);
    assert_eq!(
        plan["candidate_worker_identities"],
        json!(["w-dead-1", "w-dead-2", "w-dead-3"])
    );
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["outcome"], "applied");
    assert_eq!(report["retired_count"], 3);
    assert_eq!(report["mutation_performed"], true);
    let st = statuses(&stores.registry);
    for (id, status, by) in &st {
        if id == "w-running" {
            assert_eq!(status, "active");
            assert_eq!(by, &None);
        } else {
            assert_eq!(status, "retired", "{id}");
            assert_eq!(by.as_deref(), Some("controller-prgs"));
        }
    }
    assert_eq!(st.len(), 4, "nothing is deleted");
    let audit = audit_rows(&stores.registry);
    assert_eq!(audit.len(), 3);
    assert!(audit
        .iter()
        .all(|(_, fp)| fp == plan["registry_fingerprint"].as_str().unwrap()));

    let before = dump(&stores.registry);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["outcome"], "already_retired");
    assert_eq!(report["mutation_performed"], false);
    assert_eq!(dump(&stores.registry), before, "a replay changes nothing");
    drop(live);
}

#[test]
fn a_lease_acquired_between_plan_and_apply_moves_the_candidate_set() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores);
    let conn = rusqlite::Connection::open(&stores.leases).unwrap();
    conn.execute(
        "INSERT INTO workflow_leases (lease_id, status, owner_worker_identity) VALUES ('l-new', 'active', 'w-dead-2')",
        [],
    )
    .unwrap();
    let before = dump(&stores.registry);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(2), "{report}");
    assert_eq!(report["outcome"], "candidate_set_moved");
    assert_eq!(report["retired_count"], 0);
    assert_eq!(dump(&stores.registry), before);
    drop(live);
}

#[test]
fn a_heartbeat_between_plan_and_apply_moves_the_registry() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores);
    rusqlite::Connection::open(&stores.registry)
        .unwrap()
        .execute(
            "UPDATE worker_registrations SET last_heartbeat_at = '2026-01-01T00:20:00Z' WHERE worker_identity = 'w-dead-1'",
            [],
        )
        .unwrap();
    let before = dump(&stores.registry);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(2));
    assert_eq!(report["outcome"], "registry_revision_moved");
    assert_eq!(dump(&stores.registry), before);
    drop(live);
}

#[test]
fn another_hosts_heartbeat_is_tolerated_though_its_pid_is_free_here() {
    // A live worker of host B whose pid is free on this host: this host's
    // probe says "dead", yet its heartbeat (it is live on B) must not
    // refuse the apply of this host's dead workers.
    let (stores, live) = fleet();
    let now = |offset_s: i64| {
        fleet_retire::time::format_ts(fleet_retire::time::now() + offset_s * 1_000_000)
    };
    let mut other = stale_row("w-host-b", 4_000_123, "ticks-1");
    other["host_id"] = json!("host-b");
    other["last_heartbeat_at"] = json!(now(0));
    insert_row(
        &rusqlite::Connection::open(&stores.registry).unwrap(),
        &other,
    );
    let (plan_path, plan) = save_plan(&stores);
    assert_eq!(
        plan["fencing_context"]["other_host_rows"], 1,
        "{}",
        plan["fencing_context"]
    );
    rusqlite::Connection::open(&stores.registry)
        .unwrap()
        .execute(
            "UPDATE worker_registrations SET last_heartbeat_at = ?1 WHERE worker_identity = 'w-host-b'",
            [now(2)],
        )
        .unwrap();
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["outcome"], "applied");
    assert_eq!(report["retired_count"], 3);
    assert_eq!(report["heartbeats_tolerated_workers"], json!(["w-host-b"]));
    assert_eq!(status_of(&stores.registry, "w-host-b"), "active");
    drop(live);
}

#[test]
fn author_reviewer_and_merger_are_denied_even_with_the_permission() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores);
    std::fs::write(
        &stores.profiles,
        json!({"profiles": {
            "author-prgs": {"role": "author", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
            "reviewer-prgs": {"role": "reviewer", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
            "merger-prgs": {"role": "merger", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
            "controller-read": {"role": "controller", "allowed_operations": ["gitea.read"]}
        }})
        .to_string(),
    )
    .unwrap();
    let before = dump(&stores.registry);
    for profile in [
        "author-prgs",
        "reviewer-prgs",
        "merger-prgs",
        "controller-read",
    ] {
        let (code, report) = apply_cli(&stores, &plan_path, profile, &[]);
        assert_eq!(code, Some(2), "{profile}: {report}");
        assert_eq!(report["outcome"], "permission_denied", "{profile}");
        assert!(report["detail"].as_str().unwrap().contains(profile));
    }
    assert_eq!(dump(&stores.registry), before);
    drop(live);
}

#[test]
fn the_blast_radius_limit_refuses_and_can_be_raised() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores);
    let before = dump(&stores.registry);
    let (code, report) = apply_cli(
        &stores,
        &plan_path,
        "controller-prgs",
        &["--max-retire", "2"],
    );
    assert_eq!(code, Some(2));
    assert_eq!(report["outcome"], "blast_radius_exceeded");
    assert!(report["detail"].as_str().unwrap().contains("--max-retire"));
    assert_eq!(dump(&stores.registry), before);
    let (code, report) = apply_cli(
        &stores,
        &plan_path,
        "controller-prgs",
        &["--max-retire", "3"],
    );
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["retired_count"], 3);
    drop(live);
}

#[test]
fn a_subset_may_be_requested_and_repeats_and_strangers_are_reported() {
    let (stores, live) = fleet();
    let (_, plan) = save_plan(&stores);
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .args([
            "--canonical-repository",
            "prgs/gitea-tools",
            "--registry-fingerprint",
            plan["registry_fingerprint"].as_str().unwrap(),
            "--candidate-fingerprint",
            plan["candidate_fingerprint"].as_str().unwrap(),
            "--policy-fingerprint",
            plan["policy_fingerprint"].as_str().unwrap(),
            "--workers",
            "w-dead-2, w-dead-2,w-running,w-ghost",
        ])
        .output()
        .unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["retired_count"], 1);
    assert_eq!(report["retired"][0]["worker_identity"], "w-dead-2");
    let kept: Vec<(String, String)> = report["preserved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["worker_identity"].as_str().unwrap().into(),
                k["reason_code"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        kept,
        vec![
            ("w-running".to_string(), "not_in_current_plan".to_string()),
            ("w-ghost".to_string(), "registration_missing".to_string())
        ]
    );
    let st = statuses(&stores.registry);
    assert_eq!(st.iter().filter(|(_, s, _)| s == "retired").count(), 1);
    drop(live);
}

#[test]
fn a_changed_policy_set_is_refused() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores);
    let mut plan: Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    plan["policy_fingerprint"] = json!("sha256:0000");
    std::fs::write(&plan_path, plan.to_string()).unwrap();
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(2));
    assert_eq!(report["outcome"], "policy_set_moved");
    drop(live);
}

#[test]
fn two_applies_at_once_retire_each_row_once() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores);
    let spawn = || {
        bin()
            .args(stores.apply_args("controller-prgs"))
            .arg(&plan_path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let outcomes: Vec<String> = [a, b]
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let v: Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
            v["outcome"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| *o == "applied").count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .any(|o| o == "registry_revision_moved" || o == "already_retired"),
        "{outcomes:?}"
    );
    let audit = audit_rows(&stores.registry);
    assert_eq!(audit.len(), 3, "each row retired exactly once: {audit:?}");
    drop(live);
}

#[test]
fn apply_migrates_an_old_registry_first() {
    let (pid, start) = dead_process();
    let stores = Stores::new(&[]);
    std::fs::remove_file(&stores.registry).unwrap();
    let old: Vec<&str> = COLUMNS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| {
            ![
                "retired_at",
                "retired_by",
                "retirement_reason",
                "token_fingerprint",
            ]
            .contains(n)
        })
        .collect();
    registry_with_columns(
        &stores.registry,
        Some(&old),
        &[stale_row("w-old", pid, &start)],
    );
    let (plan_path, _) = save_plan(&stores);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["retired_count"], 1);
    assert_eq!(
        statuses(&stores.registry)[0].2.as_deref(),
        Some("controller-prgs")
    );
}

// --- Steps inside the transaction, through the library's test seams (common::Lib). ---

#[test]
fn a_lease_acquired_inside_the_transaction_rolls_everything_back() {
    let (stores, live) = fleet();
    let lib = Lib::new(stores);
    let req = lib.request();
    let before = dump(&lib.stores.registry);
    let leases = lib.stores.leases.clone();
    let mut hook = move || {
        rusqlite::Connection::open(&leases)
            .unwrap()
            .execute("INSERT INTO workflow_leases (lease_id, status, owner_pid) VALUES ('l-late', 'active', 1)", [])
            .unwrap();
    };
    let report = lib.run(
        &req,
        Hooks {
            before_first_write: Some(&mut hook),
            fail_commit: false,
            ..Default::default()
        },
    );
    assert_eq!(
        report.outcome,
        Outcome::TransactionFailed,
        "{}",
        report.detail
    );
    assert!(!report.success);
    assert_eq!(report.retired_count, 0);
    assert!(
        report.detail.contains("leases changed"),
        "{}",
        report.detail
    );
    assert_eq!(
        dump(&lib.stores.registry),
        before,
        "no retired row, no audit table"
    );
    drop(live);
}

#[test]
fn a_revoked_permission_before_the_first_write_retires_nothing() {
    let (stores, live) = fleet();
    let lib = Lib::new(stores);
    let req = lib.request();
    let before = dump(&lib.stores.registry);
    let profiles = lib.stores.profiles.clone();
    let mut hook = move || {
        std::fs::write(
            &profiles,
            json!({"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]}}}).to_string(),
        )
        .unwrap();
    };
    let report = lib.run(
        &req,
        Hooks {
            before_first_write: Some(&mut hook),
            fail_commit: false,
            ..Default::default()
        },
    );
    assert_eq!(
        report.outcome,
        Outcome::PermissionDenied,
        "{}",
        report.detail
    );
    assert_eq!(report.retired_count, 0);
    assert_eq!(dump(&lib.stores.registry), before);
    drop(live);
}

#[test]
fn a_failure_at_commit_leaves_the_registry_as_it_was() {
    let (stores, live) = fleet();
    let lib = Lib::new(stores);
    let req = lib.request();
    let before = dump(&lib.stores.registry);
    let report = lib.run(
        &req,
        Hooks {
            before_first_write: None,
            fail_commit: true,
            ..Default::default()
        },
    );
    assert_eq!(report.outcome, Outcome::TransactionFailed);
    assert!(!report.success);
    assert!(!report.mutation_performed);
    assert_eq!(report.retired_count, 0);
    assert_eq!(dump(&lib.stores.registry), before);
    drop(live);
}

#[test]
fn a_locked_registry_is_waited_for_within_the_busy_timeout() {
    let (stores, live) = fleet();
    let (plan_path, _) = save_plan(&stores);
    let holder = rusqlite::Connection::open(&stores.registry).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Short timeout while the lock is held: fails cleanly, retires nothing.
    let (code, report) = apply_cli(
        &stores,
        &plan_path,
        "controller-prgs",
        &["--busy-timeout-ms", "200"],
    );
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["outcome"], "transaction_failed");
    // Released soon after: a patient apply goes through.
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        holder.execute_batch("COMMIT").unwrap();
    });
    let (code, report) = apply_cli(
        &stores,
        &plan_path,
        "controller-prgs",
        &["--busy-timeout-ms", "10000"],
    );
    release.join().unwrap();
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["retired_count"], 3);
    drop(live);
}

/// The summary after COMMIT is built from the transaction's own rows with
/// its writes applied: it must say what a fresh read of the file says.
#[test]
fn the_post_apply_summary_is_the_registry_as_committed() {
    let (stores, live) = fleet();
    let lib = Lib::new(stores);
    let mut req = lib.request();
    assert_eq!(req.workers.len(), 3, "{:?}", req.workers);
    // Two of the three dead workers: one stays stale.
    req.workers.truncate(2);
    let report = lib.run(&req, Hooks::default());
    assert_eq!(report.outcome, Outcome::Applied, "{}", report.detail);
    assert_eq!(report.retired_count, 2);
    let summary = report.post_apply.clone().expect("a summary after COMMIT");
    let rows = fleet_retire::evidence::registry::load(&lib.stores.registry).unwrap();
    let snap = fleet_retire::snapshot::Snapshot::take(
        &rows,
        &fleet_retire::snapshot::Options {
            now: fleet_retire::time::now(),
            canonical_repository: Some("prgs/gitea-tools".into()),
            host_id: fleet_retire::evidence::probe::HostFacts::observe(Path::new("/proc")).host_id,
            ..Default::default()
        },
        &lib.probe,
    );
    let mut expected = fleet_retire::apply::fleet_summary(&snap);
    expected["snapshot_at"] = summary["snapshot_at"].clone();
    assert_eq!(summary, expected);
    assert_eq!(summary["historical_worker_count"], 2);
    // The third dead worker and the running one (its heartbeat is old).
    assert_eq!(summary["stale_worker_count"], 2);
    drop(live);
}
