//! An apply whose COMMIT went out and whose reply never came says
//! `outcome_unknown` (exit 5) with its apply id, never "nothing was
//! retired"; `fleet-retire apply-status APPLY_ID` then answers from the
//! registry's own audit, and the same plan applied again is refused by its
//! tokens after a COMMIT that took, and applies after one that did not.
//! A proxy of ours (`tests/common/pgproxy.rs`) stands between apply and a
//! real PostgreSQL server and loses the COMMIT, or only its reply.

mod common;

use common::pgproxy::{Lose, PgProxy};
use common::*;
use serde_json::Value;
use std::path::PathBuf;

fn status(db: &PgDb, apply_id: &str) -> (Option<i32>, Value) {
    let out = bin()
        .args([
            "--format",
            "json",
            "apply-status",
            apply_id,
            "--registry",
            &db.url,
        ])
        .output()
        .unwrap();
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out))),
    )
}

/// Plan on the database itself, apply through a proxy losing `lose`.
fn apply_losing(tag: &str, lose: Lose) -> Option<(PgDb, Stores, PathBuf, Value, KillOnDrop)> {
    let (mut stores, live, db) = pg_fleet(tag)?;
    let (plan, _) = save_plan(&stores);
    let proxy = PgProxy::start(db.host_port(), lose);
    stores.registry = PathBuf::from(db.at_port(proxy.port, ""));
    stores.leases = stores.registry.clone();
    let (code, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert!(
        proxy.fired.load(std::sync::atomic::Ordering::SeqCst),
        "{report}"
    );
    assert_eq!(code, Some(5), "{report}");
    assert_eq!(report["outcome"], "outcome_unknown", "{report}");
    let detail = report["detail"].as_str().unwrap();
    assert!(!detail.contains("nothing was retired"), "{detail}");
    assert!(detail.contains("apply-status"), "{detail}");
    stores.registry = PathBuf::from(&db.url);
    stores.leases = stores.registry.clone();
    Some((db, stores, plan, report, live))
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_commit_whose_reply_is_lost_is_unknown_then_found_committed() {
    let Some((db, stores, plan, report, live)) = apply_losing("lost_reply", Lose::Reply) else {
        return;
    };
    let id = report["apply_id"].as_str().unwrap();
    let (code, found) = status(&db, id);
    assert_eq!(code, Some(0), "{found}");
    assert_eq!(found["committed"], true);
    let retired: Vec<&str> = found["retired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["worker_identity"].as_str().unwrap())
        .collect();
    assert_eq!(retired, ["w-dead-1", "w-dead-2", "w-dead-3"]);
    // The same plan again: its tokens no longer match the registry.
    let (code, again) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_ne!(again["outcome"], "applied", "{again}");
    assert_eq!(again["retired_count"], 0, "{again}");
    assert!(matches!(code, Some(0) | Some(2)), "{again}");
    drop(live);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_lost_commit_is_unknown_then_found_not_committed_and_applies_again() {
    let Some((db, stores, plan, report, live)) = apply_losing("lost_commit", Lose::Commit) else {
        return;
    };
    let id = report["apply_id"].as_str().unwrap();
    let (code, found) = status(&db, id);
    assert_eq!(code, Some(2), "{found}");
    assert_eq!(found["committed"], false);
    let (code, again) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{again}");
    assert_eq!(again["outcome"], "applied", "{again}");
    assert_eq!(again["retired_count"], 3, "{again}");
    drop(live);
}

/// A connection that goes silent after COMMIT (the server froze, or a
/// proxy swallows its reply) is given up on after the reply bound, not
/// waited on for ever: `outcome_unknown` in seconds.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_commit_whose_reply_never_comes_is_given_up_on() {
    let Some((mut stores, live, db)) = pg_fleet("silent_reply") else {
        return;
    };
    let (plan, _) = save_plan(&stores);
    let proxy = PgProxy::start(db.host_port(), Lose::ReplySilently);
    stores.registry = PathBuf::from(db.at_port(proxy.port, ""));
    stores.leases = stores.registry.clone();
    let started = std::time::Instant::now();
    let child = spawn_piped(
        bin()
            .args(stores.apply_args("controller-prgs"))
            .arg(&plan)
            .env("FLEET_RETIRE_PG_REPLY_TIMEOUT", "3"),
    );
    let out = wait_with_deadline(child, std::time::Duration::from_secs(60));
    let took = started.elapsed();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(out.status.code(), Some(5), "{report}");
    assert_eq!(report["outcome"], "outcome_unknown", "{report}");
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    let (code, found) = status(&db, report["apply_id"].as_str().unwrap());
    assert_eq!(
        (code, &found["committed"]),
        (Some(0), &Value::Bool(true)),
        "{found}"
    );
    drop(live);
}

/// `apply-status` while a COMMIT writing that apply's audit rows is in
/// flight, on a database whose default isolation is REPEATABLE READ: it
/// waits for the COMMIT and answers committed (a snapshot taken before
/// its lock would have said "not committed"). A registry without an audit
/// table is not an answer but an error.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn apply_status_waits_for_a_commit_in_flight_and_needs_an_audit_table() {
    let Some((stores, live, db)) = pg_fleet("status_in_flight") else {
        return;
    };
    let (plan, _) = save_plan(&stores);
    let (code, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    let name = db.url.rsplit('/').next().unwrap().to_string();
    let mut admin = db.client();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET default_transaction_isolation = 'repeatable read'"
        ))
        .unwrap();
    let id = "f".repeat(32);
    let url = db.url.clone();
    let writer = std::thread::spawn({
        let id = id.clone();
        move || {
            let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
            let cols: Vec<String> = c
                .query(
                    "SELECT column_name::text FROM information_schema.columns \
                     WHERE table_name = 'retirement_audit' AND column_name NOT IN ('audit_id', 'apply_id')",
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            let cols = cols.join(", ");
            c.batch_execute(&format!(
                "BEGIN; INSERT INTO retirement_audit ({cols}, apply_id) \
                 SELECT {cols}, '{id}' FROM retirement_audit LIMIT 1; \
                 SELECT pg_sleep(3); COMMIT"
            ))
            .unwrap();
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let (code, found) = status(&db, &id);
    writer.join().unwrap();
    assert_eq!(
        (code, &found["committed"]),
        (Some(0), &Value::Bool(true)),
        "{found}"
    );

    let bare = Stores::new(&[]);
    let out = bin()
        .args(["apply-status", &id, "--registry"])
        .arg(&bare.registry)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("no retirement_audit table"),
        "{}",
        text(&out)
    );
    drop(live);
}

/// A lock wait apply allows (`--busy-timeout-ms`) is not a stall, for the
/// registry's connection nor for the lease store's beside it; a server
/// that accepts and never completes the connection is given up on.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_lock_wait_is_not_a_stall_and_a_mute_server_is_given_up_on() {
    let Some((stores, live, db)) = pg_fleet("lock_not_stall") else {
        return;
    };
    let (plan, _) = save_plan(&stores);
    let mut holder = db.client();
    holder
        .batch_execute("BEGIN; LOCK TABLE worker_registrations IN EXCLUSIVE MODE")
        .unwrap();
    let child = spawn_piped(
        bin()
            .args(stores.apply_args("controller-prgs"))
            .arg(&plan)
            .args(["--busy-timeout-ms", "60000"])
            .env("FLEET_RETIRE_PG_REPLY_TIMEOUT", "2"),
    );
    std::thread::sleep(std::time::Duration::from_secs(6));
    holder.batch_execute("COMMIT").unwrap();
    let out = wait_with_deadline(child, std::time::Duration::from_secs(60));
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(report["outcome"], "applied", "{report}");

    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port();
    let url = format!("postgres://fleet@127.0.0.1:{port}/x");
    let started = std::time::Instant::now();
    let child = spawn_piped(
        bin()
            .args(["heartbeat", "--registry", &url])
            .env("GITEA_MCP_WORKER_IDENTITY", "w-mute")
            .env("FLEET_RETIRE_PG_REPLY_TIMEOUT", "2"),
    );
    let out = wait_with_deadline(child, std::time::Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("did not complete it"), "{}", text(&out));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    drop(mute);
    drop(live);
}
