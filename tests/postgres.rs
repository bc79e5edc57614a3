//! The registry on PostgreSQL: the same content gives the same plan, the
//! same reason codes and byte-identical tokens as on SQLite; `registry
//! copy` proves what it copied; apply is one serializable transaction.
//!
//! These tests need a PostgreSQL cluster (FLEET_RETIRE_TEST_POSTGRES;
//! `.ci/run` starts one). Without it they say so and pass, except under
//! `CI=true`, where a missing cluster is a failure.

mod common;

use common::*;
use fleet_retire::fixture::Case;
use fleet_retire::policy::Policies;
use fleet_retire::row::{Row, COLUMNS};
use std::path::{Path, PathBuf};

/// Write rows into a new SQLite registry with every column, as stored.
fn sqlite_registry(path: &Path, rows: &[Row]) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(&fleet_retire::store::registry::create_sql().replace(" PRIMARY KEY", ""))
        .unwrap();
    let names: Vec<String> = COLUMNS
        .iter()
        .map(|c| format!("\"{}\"", c.name()))
        .collect();
    let marks: Vec<String> = (1..=COLUMNS.len()).map(|i| format!("?{i}")).collect();
    let sql = format!(
        "INSERT INTO worker_registrations ({}) VALUES ({})",
        names.join(", "),
        marks.join(", ")
    );
    for row in rows {
        let values: Vec<rusqlite::types::Value> = COLUMNS
            .iter()
            .map(|c| fleet_retire::store::registry::sql_value(row.get(*c)))
            .collect();
        conn.execute(&sql, rusqlite::params_from_iter(values))
            .unwrap();
    }
}

/// Write leases into a new SQLite lease store.
fn sqlite_leases(path: &Path, leases: &[fleet_retire::store::leases::Lease]) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(&fleet_retire::store::leases::create_sql())
        .unwrap();
    let names = fleet_retire::store::leases::COLUMNS;
    let marks: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    for l in leases {
        let values: Vec<rusqlite::types::Value> = fleet_retire::store::leases::LEASE_COLUMNS
            .iter()
            .map(|c| fleet_retire::store::registry::sql_value(l.get(*c).as_val()))
            .collect();
        conn.execute(
            &format!(
                "INSERT INTO workflow_leases ({}) VALUES ({})",
                names.join(", "),
                marks.join(", ")
            ),
            rusqlite::params_from_iter(values),
        )
        .unwrap();
    }
}

fn fixture_files() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("fixtures/plan")];
    let shared = PathBuf::from("../shared/fixtures/plan");
    if shared.is_dir() {
        dirs.push(shared);
    }
    let mut files = Vec::new();
    for d in dirs {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "json") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// One plan's outcome, as compared across the engines.
fn outcome(plan: &fleet_retire::plan::Plan) -> (String, String, Vec<(String, Vec<String>)>) {
    let mut verdicts: Vec<(String, Vec<String>)> = plan
        .entries
        .iter()
        .map(|e| {
            let id = plan.identity(e);
            let codes = e
                .reason_codes()
                .iter()
                .map(|r| r.code().to_string())
                .collect();
            (id, codes)
        })
        .collect();
    verdicts.sort();
    (
        plan.registry_fingerprint.clone(),
        plan.candidate_fingerprint.clone(),
        verdicts,
    )
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn every_plan_fixture_reads_the_same_from_sqlite_and_postgres() {
    let Some(db) = postgres("fixtures") else {
        return;
    };
    let policies = Policies::load(&fleet_retire::policy::PolicySource::Embedded).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut compared, mut refused) = (0, Vec::new());
    for (n, file) in fixture_files().iter().enumerate() {
        let Case::Plan(case) = fleet_retire::fixture::load(file).unwrap() else {
            continue;
        };
        let registry = dir.path().join(format!("r{n}.sqlite"));
        let leases = dir.path().join(format!("l{n}.sqlite"));
        sqlite_registry(&registry, &case.rows);
        sqlite_leases(&leases, &case.leases);
        let target = db.sibling(&format!("f{n}"));

        let copied = fleet_retire::copy::copy(&registry, Some(&leases), &target.url);
        let from_sqlite = fleet_retire::evidence::registry::load(&registry).unwrap();
        if let Err(e) = copied {
            // Only values a typed column cannot hold refuse a copy.
            let message = e.to_string();
            assert!(
                message.contains("cannot be copied as it is"),
                "{}: {message}",
                file.display()
            );
            assert!(
                from_sqlite
                    .iter()
                    .any(|r| fleet_retire::store::postgres::unrepresentable(r).is_some())
                    || message.contains("both have worker_identity"),
                "{}: {message}",
                file.display()
            );
            refused.push(file.display().to_string());
            continue;
        }
        let from_postgres = fleet_retire::evidence::registry::load(Path::new(&target.url)).unwrap();
        let leases_sqlite = fleet_retire::evidence::leases::load(&leases).unwrap();
        let leases_postgres = fleet_retire::evidence::leases::load(Path::new(&target.url)).unwrap();
        let plan_of = |rows: Vec<Row>, leases: &[fleet_retire::store::leases::Lease]| {
            let facts = fleet_retire::observe::RunFacts {
                now: case.now,
                host: case.host.clone(),
                canonical_repository: case.canonical_repository.clone(),
                protections: fleet_retire::evidence::leases::Protections::from_leases(leases),
                active_leases: Vec::new(),
            };
            fleet_retire::plan::plan(rows, facts, &case.probe, &policies).unwrap()
        };
        let a = outcome(&plan_of(from_sqlite, &leases_sqlite));
        let b = outcome(&plan_of(from_postgres, &leases_postgres));
        assert_eq!(
            a,
            b,
            "{}: SQLite and PostgreSQL plans differ",
            file.display()
        );
        assert_eq!(
            fleet_retire::fingerprint::external_state_fingerprint(
                leases_sqlite.iter().filter(|l| l.is_active())
            ),
            fleet_retire::fingerprint::external_state_fingerprint(
                leases_postgres.iter().filter(|l| l.is_active())
            ),
            "{}",
            file.display()
        );
        compared += 1;
    }
    eprintln!(
        "compared {compared} fixtures; {} refused by copy (values a typed column cannot hold): {refused:?}",
        refused.len()
    );
    assert!(compared >= 40, "only {compared} fixtures could be compared");
}

/// The fleet of `common::fleet` (three dead workers, one running), copied
/// into PostgreSQL with its lease store; the stores then point there.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn apply_on_postgres_retires_exactly_the_approved_rows_with_audit_then_replays() {
    let Some((stores, live, db)) = pg_fleet("apply") else {
        return;
    };
    let (plan_path, plan) = save_plan(&stores);
    assert_eq!(
        plan["candidate_worker_identities"],
        serde_json::json!(["w-dead-1", "w-dead-2", "w-dead-3"])
    );
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["outcome"], "applied");
    assert_eq!(report["retired_count"], 3);
    assert_eq!(
        pg_statuses(&db),
        vec![
            ("w-dead-1".into(), "retired".into()),
            ("w-dead-2".into(), "retired".into()),
            ("w-dead-3".into(), "retired".into()),
            ("w-running".into(), "active".into()),
        ]
    );
    let audit = db
        .client()
        .query(
            "SELECT worker_identity, registry_fingerprint, lease_store, host_id, evidence, \
             apply_id, os_uid FROM retirement_audit ORDER BY 1",
            &[],
        )
        .unwrap();
    assert_eq!(audit.len(), 3);
    let (host, _) = host_and_boot();
    // Values equal for every target are bound once, the others per
    // target: each row's evidence is its own worker's, the apply's id and
    // the user are the same on every row.
    let apply_id: Option<String> = audit[0].get(5);
    assert!(apply_id.as_deref().is_some_and(|a| a.len() == 32));
    for r in &audit {
        let evidence: serde_json::Value =
            serde_json::from_str(&r.get::<_, String>(4)).expect("evidence is JSON");
        assert_eq!(evidence["worker_identity"], r.get::<_, String>(0).as_str());
        assert_eq!(r.get::<_, Option<String>>(5), apply_id);
        assert_eq!(
            r.get::<_, Option<i64>>(6),
            Some(i64::from(nix::unistd::getuid().as_raw()))
        );
        assert_eq!(
            r.get::<_, String>(1),
            plan["registry_fingerprint"].as_str().unwrap()
        );
        assert_eq!(r.get::<_, String>(2), db.url_as("fleet_apply"));
        assert_eq!(
            r.get::<_, Option<String>>(3).as_deref(),
            Some(host.as_str())
        );
    }
    let before = pg_dump(&db);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["outcome"], "already_retired");
    assert_eq!(pg_dump(&db), before, "a replay changes nothing");
    drop(live);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_lease_taken_inside_the_postgres_transaction_rolls_everything_back() {
    let Some((stores, live, db)) = pg_fleet("lease_inside") else {
        return;
    };
    let lib = Lib::new(stores);
    let req = lib.request();
    let before = pg_dump(&db);
    let url = db.url.clone();
    let mut hook = move || {
        let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        c.execute(
            "INSERT INTO workflow_leases (lease_id, status, owner_worker_identity) \
             VALUES ('l-late', 'active', 'w-dead-2')",
            &[],
        )
        .unwrap();
    };
    let report = lib.run(
        &req,
        fleet_retire::apply::Hooks {
            before_first_write: Some(&mut hook),
            ..Default::default()
        },
    );
    assert_eq!(report.retired_count, 0, "{}", report.detail);
    assert!(!report.mutation_performed);
    assert!(
        report.detail.contains("leases changed"),
        "{:?}: {}",
        report.outcome,
        report.detail
    );
    // Only the lease itself was written: the registry is as it was, and
    // no audit row exists.
    let registry_of = |dump: &str| -> Vec<String> {
        dump.lines()
            .filter(|l| l.starts_with("worker_registrations"))
            .map(str::to_string)
            .collect()
    };
    let after = pg_dump(&db);
    assert_eq!(registry_of(&after), registry_of(&before));
    assert!(
        !after.contains("retirement_audit: ("),
        "no audit row: {after}"
    );
    assert!(after.contains("l-late"));
    drop(live);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_failure_at_commit_leaves_the_postgres_registry_as_it_was() {
    let Some((stores, live, db)) = pg_fleet("fail_commit") else {
        return;
    };
    let lib = Lib::new(stores);
    let req = lib.request();
    let before = pg_dump(&db);
    let report = lib.run(
        &req,
        fleet_retire::apply::Hooks {
            fail_commit: true,
            ..Default::default()
        },
    );
    assert_eq!(
        report.outcome,
        fleet_retire::apply::Outcome::TransactionFailed
    );
    assert_eq!(report.retired_count, 0);
    assert_eq!(pg_dump(&db), before);
    drop(live);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_trigger_on_the_postgres_registry_is_refused_before_any_write() {
    let Some((stores, live, db)) = pg_fleet("trigger") else {
        return;
    };
    // The attack: a trigger that retires a live worker beside each target.
    db.client()
        .batch_execute(
            "CREATE FUNCTION sneak() RETURNS trigger AS $$ BEGIN \
               UPDATE worker_registrations SET status = 'retired' WHERE worker_identity = 'w-running'; \
               RETURN NEW; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER sneak AFTER UPDATE ON worker_registrations \
               FOR EACH ROW WHEN (pg_trigger_depth() = 0) EXECUTE FUNCTION sneak();",
        )
        .unwrap();
    let (plan_path, _) = save_plan(&stores);
    let before = pg_dump(&db);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(2), "{report}");
    assert_eq!(report["outcome"], "registry_untrusted");
    assert!(
        report["detail"]
            .as_str()
            .unwrap()
            .contains("trigger \"sneak\""),
        "{report}"
    );
    assert_eq!(pg_dump(&db), before);
    drop(live);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn two_applies_that_cannot_both_be_serialized_end_with_one_refused_and_nothing_partial() {
    let Some((stores, live, db)) = pg_fleet("serializable") else {
        return;
    };
    let lib = Lib::new(stores);
    let mut req = lib.request();
    req.workers = vec!["w-dead-1".into()];
    // Inside this apply's transaction, after its authoritative read and
    // before its first write, another apply retires w-dead-2 and commits.
    // Each read what the other wrote: no serial order explains both.
    let (registry, profiles) = (db.url.clone(), lib.stores.profiles.clone());
    let (registry_fp, candidate_fp, policy_fp) = (
        req.registry_fingerprint.clone(),
        req.candidate_fingerprint.clone(),
        req.policy_fingerprint.clone(),
    );
    let mut other: Option<serde_json::Value> = None;
    let mut hook = || {
        let out = bin()
            .args([
                "--format",
                "json",
                "apply",
                "--registry",
                &registry,
                "--leases",
                &registry,
            ])
            .args([
                "--profiles",
                profiles.to_str().unwrap(),
                "--profile",
                "controller-prgs",
            ])
            .args(["--canonical-repository", "prgs/gitea-tools"])
            .args([
                "--registry-fingerprint",
                &registry_fp,
                "--candidate-fingerprint",
                &candidate_fp,
            ])
            .args(["--policy-fingerprint", &policy_fp, "--workers", "w-dead-2"])
            .output()
            .unwrap();
        other = Some(serde_json::from_slice(&out.stdout).unwrap());
    };
    let report = lib.run(
        &req,
        fleet_retire::apply::Hooks {
            before_first_write: Some(&mut hook),
            ..Default::default()
        },
    );
    let other = other.unwrap();
    assert_eq!(other["outcome"], "applied", "{other}");
    assert_eq!(
        report.outcome,
        fleet_retire::apply::Outcome::RegistryRevisionMoved,
        "{}",
        report.detail
    );
    assert!(report.detail.contains("concurrent"), "{}", report.detail);
    assert_eq!(report.retired_count, 0);
    let statuses = pg_statuses(&db);
    assert_eq!(statuses[0], ("w-dead-1".into(), "active".into()));
    assert_eq!(statuses[1], ("w-dead-2".into(), "retired".into()));
    let audited: Vec<String> = db
        .client()
        .query("SELECT worker_identity FROM retirement_audit", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(audited, vec!["w-dead-2".to_string()]);
    drop(live);
}

#[test]
#[cfg_attr(
    not(all(fr_postgres, fr_python_mcp)),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg)); and python3 with the mcp package (pip install mcp==2.3.0; then touch build.rs)"
)]
fn serve_on_postgres_registers_itself_and_plans_and_applies_for_an_mcp_client() {
    let python_mcp = std::process::Command::new("python3")
        .args(["-c", "import mcp.client.stdio"])
        .output()
        .is_ok_and(|o| o.status.success());
    if skip_unless(python_mcp, "python3 with the `mcp` package") {
        return;
    }
    let Some((stores, live, db)) = pg_fleet("serve") else {
        return;
    };
    let out = std::process::Command::new("python3")
        .arg("tests/mcp_client/plan_apply.py")
        .arg(env!("CARGO_BIN_EXE_fleet-retire"))
        .arg(&db.url)
        .arg(&db.url)
        .arg(&stores.profiles)
        .output()
        .unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines[0]["plan"],
        serde_json::json!(["w-dead-1", "w-dead-2", "w-dead-3"]),
        "{all}"
    );
    assert_eq!(lines[1]["apply"]["outcome"], "applied", "{all}");
    assert_eq!(lines[1]["apply"]["retired_count"], 3, "{all}");
    let statuses = pg_statuses(&db);
    // The server registered its own row there, and released it on exit.
    assert!(
        statuses.contains(&("w-serve-controller".into(), "released".into())),
        "{statuses:?}"
    );
    for w in ["w-dead-1", "w-dead-2", "w-dead-3"] {
        assert!(
            statuses.contains(&(w.into(), "retired".into())),
            "{statuses:?}"
        );
    }
    assert!(statuses.contains(&("w-running".into(), "active".into())));
    drop(live);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn registry_copy_refuses_what_it_cannot_copy_as_it_is_and_writes_nothing() {
    let Some(db) = postgres("copy_refusals") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry.sqlite");
    let (pid, start) = dead_process();
    let mut odd = stale_row("w-odd", pid, &start);
    odd["pid"] = serde_json::json!("abc");
    common::registry(&registry, &[stale_row("w-fine", pid, &start), odd]);
    let copy = |to: &str| {
        run(&[
            "registry",
            "copy",
            "--from",
            registry.to_str().unwrap(),
            "--to",
            to,
        ])
    };
    let out = copy(&db.url);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let message = text(&out);
    assert!(
        message.contains("row 2 (w-odd): `pid` holds text abc, which a BIGINT column cannot hold"),
        "{message}"
    );
    assert!(message.contains("Nothing was written"), "{message}");
    let tables: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "nothing was created either");

    // Into tables that already hold rows: refused, nothing merged.
    let clean = dir.path().join("clean.sqlite");
    common::registry(&clean, &[stale_row("w-fine", pid, &start)]);
    let first = run(&[
        "registry",
        "copy",
        "--from",
        clean.to_str().unwrap(),
        "--to",
        &db.url,
    ]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(text(&first).contains("registry token, source and copy"));
    let again = run(&[
        "registry",
        "copy",
        "--from",
        clean.to_str().unwrap(),
        "--to",
        &db.url,
    ]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again).contains("already holds 1 rows"),
        "{}",
        text(&again)
    );

    // A server that is not there, and a password in the URL, masked.
    let nowhere = run(&[
        "registry",
        "copy",
        "--from",
        clean.to_str().unwrap(),
        "--to",
        "postgres://fleet:s3cret@127.0.0.1:1/none",
    ]);
    assert_eq!(nowhere.status.code(), Some(1));
    let message = text(&nowhere);
    assert!(message.contains("cannot connect"), "{message}");
    assert!(message.contains("fleet:***@127.0.0.1:1"), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
    assert!(!message.contains("panicked"), "{message}");
    let garbled = run(&[
        "registry",
        "copy",
        "--from",
        clean.to_str().unwrap(),
        "--to",
        "postgres://%%bad",
    ]);
    assert_eq!(garbled.status.code(), Some(1));
    assert!(
        text(&garbled).contains("not a PostgreSQL URL this program can read"),
        "{}",
        text(&garbled)
    );
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_postgres_registry_of_another_shape_stops_the_plan_with_what_to_do() {
    let Some(db) = postgres("shapes") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let profiles = dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]}}}"#,
    )
    .unwrap();
    let plan = || {
        run(&[
            "plan",
            "--registry",
            &db.url,
            "--leases",
            &db.url,
            "--canonical-repository",
            "prgs/gitea-tools",
            "--profiles",
            profiles.to_str().unwrap(),
            "--profile",
            "controller-prgs",
        ])
    };
    let out = plan();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("has no `worker_registrations` table"),
        "{}",
        text(&out)
    );
    // A pid the server keeps as a boolean would not read as SQLite's would.
    db.client()
        .batch_execute(
            "CREATE TABLE worker_registrations (worker_identity TEXT PRIMARY KEY, pid BOOLEAN);
             INSERT INTO worker_registrations VALUES ('w-1', true);",
        )
        .unwrap();
    let out = plan();
    assert_eq!(out.status.code(), Some(1));
    let message = text(&out);
    assert!(message.contains("`pid` is boolean"), "{message}");
    assert!(
        message.contains("TEXT, BIGINT and DOUBLE PRECISION"),
        "{message}"
    );
    assert!(!message.contains("panicked"), "{message}");
    // No lease table: never read as "no leases".
    db.client()
        .batch_execute("DROP TABLE worker_registrations")
        .unwrap();
    db.client()
        .batch_execute(&fleet_retire::store::postgres::registry_create_sql())
        .unwrap();
    let out = plan();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("has no `workflow_leases` table"),
        "{}",
        text(&out)
    );
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_rule_or_row_level_security_on_the_postgres_registry_is_refused_before_any_write() {
    let Some((stores, live, db)) = pg_fleet("rule_rls") else {
        return;
    };
    let (plan_path, _) = save_plan(&stores);
    // A rule that rewrites every retirement into one of the live worker too.
    db.client()
        .batch_execute(
            "CREATE RULE sneak AS ON UPDATE TO worker_registrations DO ALSO \
             UPDATE worker_registrations SET status = 'retired' WHERE worker_identity = 'w-running'",
        )
        .unwrap();
    let before = pg_dump(&db);
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(2), "{report}");
    assert_eq!(report["outcome"], "registry_untrusted");
    assert!(
        report["detail"]
            .as_str()
            .unwrap()
            .contains("rule \"sneak\""),
        "{report}"
    );
    assert_eq!(pg_dump(&db), before);
    // Row-level security could hide rows from apply's read.
    db.client()
        .batch_execute(
            "DROP RULE sneak ON worker_registrations; \
             ALTER TABLE worker_registrations ENABLE ROW LEVEL SECURITY",
        )
        .unwrap();
    let (code, report) = apply_cli(&stores, &plan_path, "controller-prgs", &[]);
    assert_eq!(code, Some(2), "{report}");
    assert_eq!(report["outcome"], "registry_untrusted");
    assert!(
        report["detail"]
            .as_str()
            .unwrap()
            .contains("row-level security"),
        "{report}"
    );
    assert_eq!(pg_dump(&db), before);
    drop(live);
}

/// One crash trial's stores: `rows` copied into a fresh database, a plan
/// saved, and the `apply` arguments that retire all `n` of them.
fn crash_trial(k: usize, rows: &[serde_json::Value]) -> Option<(PgDb, Stores, Vec<String>)> {
    let db = postgres(&format!("crash{k}"))?;
    let mut stores = Stores::new(rows);
    fleet_retire::copy::copy(&stores.registry, Some(&stores.leases), &db.url).unwrap();
    stores.registry = PathBuf::from(&db.url);
    stores.leases = PathBuf::from(&db.url);
    let (plan_path, _) = save_plan(&stores);
    let mut args = stores.apply_args("controller-prgs");
    args.extend([
        plan_path.display().to_string(),
        "--max-retire".into(),
        rows.len().to_string(),
    ]);
    Some((db, stores, args))
}

/// Wait for `child`, reading its output as it comes (a report larger than
/// a pipe would otherwise stop it): its status and what it said.
fn finish(child: &mut KillOnDrop) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let mut stdout = child.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let mut said = Vec::new();
    let _ = child.0.stderr.take().unwrap().read_to_end(&mut said);
    let mut all = reader.join().unwrap();
    all.extend(said);
    (
        child.0.wait().unwrap(),
        String::from_utf8_lossy(&all).into_owned(),
    )
}

/// Rows retired, and audit rows naming a retired row, as a next reader
/// sees them; every row is either active or retired.
fn pg_state_after_crash(db: &PgDb, n: usize) -> (usize, usize) {
    let mut c = db.client();
    let count = |c: &mut ::postgres::Client, sql: &str| -> usize {
        c.query_one(sql, &[]).unwrap().get::<_, i64>(0) as usize
    };
    let active = count(
        &mut c,
        "SELECT count(*) FROM worker_registrations WHERE status = 'active'",
    );
    let retired = count(
        &mut c,
        "SELECT count(*) FROM worker_registrations WHERE status = 'retired'",
    );
    assert_eq!(active + retired, n);
    let audited = count(
        &mut c,
        "SELECT count(*) FROM retirement_audit a JOIN worker_registrations w \
         ON w.worker_identity = a.worker_identity AND w.status = 'retired'",
    );
    (retired, audited)
}

/// Issue 33 asked that nothing partial come of injected faults, through
/// the set write and the image read while the targets are checked: an
/// apply through PostgreSQL killed (SIGKILL) at random instants, or with
/// its server connections terminated at random instants, leaves the
/// registry wholly before (nothing retired, no audit row) or wholly after
/// (every target retired, one audit row each), and a cut-off apply ends
/// with a report or a message, never a panic.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn apply_on_postgres_killed_or_cut_off_at_random_instants_is_wholly_before_or_after() {
    let (pid, start) = dead_process();
    let n = 300;
    let rows: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let mut r = stale_row(&format!("w-{i:04}"), pid, &start);
            r["session_id"] = serde_json::json!(format!("sess-{i}"));
            r
        })
        .collect();
    let Some((db, _stores, args)) = crash_trial(0, &rows) else {
        return;
    };
    let started = std::time::Instant::now();
    let out = bin().args(&args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let full = started.elapsed();
    assert_eq!(pg_state_after_crash(&db, n), (n, n));
    let mut seed: u64 = u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15;
    let mut random = move || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % 1000
    };
    let (mut before, mut after) = (0, 0);
    for k in 1..=16 {
        let (db, _stores, args) = crash_trial(k, &rows).unwrap();
        let mut child = KillOnDrop(
            bin()
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let at = full.mul_f64(random() as f64 / 1000.0 * 1.1);
        std::thread::sleep(at);
        let kill = k % 2 == 0;
        if kill {
            let _ = child.0.kill();
        } else {
            db.client()
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    &[],
                )
                .unwrap();
        }
        let (status, said) = finish(&mut child);
        if !kill {
            assert!(
                status.code().is_some() && !said.contains("panicked"),
                "cut off at {at:?}: {status:?} {said}"
            );
        }
        match pg_state_after_crash(&db, n) {
            (0, 0) => before += 1,
            (r, a) if r == n && a == n => after += 1,
            other => panic!("kill={kill}, at {at:?}: a partial state {other:?}"),
        }
    }
    eprintln!("16 faults over {full:?}: {before} wholly before, {after} wholly after");
}
