//! The scoped read's bound (issue 54): one host's scoped read reads at
//! most its own active rows and the peer rows their verdicts name, through
//! the indexes, never by a sequential scan of the registry. On PostgreSQL
//! shown by the server's own account of each statement (`EXPLAIN
//! (ANALYZE, BUFFERS)`) and by the rows the plan says it read; on SQLite by
//! its query plans (`EXPLAIN QUERY PLAN`) and the rows read.

mod common;

use serde_json::Value;
use std::process::Command;

/// Rows in the registry: 100 hosts, one row in three active, the rest
/// retired (a fleet that never deletes a row); sessions shared by five
/// rows, instances by five neighbours, so every host's rows have peers on
/// other hosts.
const ROWS: u32 = 20_000;
const HOST: &str = "h-10";

const FILL: &str = "INSERT INTO worker_registrations (worker_identity, client_name, \
    client_instance_id, instance_id_source, session_id, generation_id, role, profile, \
    namespace, remote, repository_binding, pid, started_at, last_heartbeat_at, \
    heartbeat_ttl_seconds, fencing_epoch, status, host_id, boot_id, process_start_time) \
    SELECT 'w-' || i, 'codex', 'inst-codex-20260730T100000Z-' || lpad((i / 5)::text, 12, '0'), \
    'launcher', 's-' || (i % 3999), 'g-' || i, 'author', 'author-prgs', 'author', 'prgs', \
    'prgs/gitea-tools', 2000000000 + i, '2026-01-01T00:00:00Z', '2026-01-01T00:10:00Z', 900, 1, \
    CASE WHEN i % 3 = 0 THEN 'active' ELSE 'retired' END, 'h-' || (i % 100), 'b-1', 'ticks-1' \
    FROM generate_series(1, 20000) i";

/// This host's active rows, and the rows that share a key with one of them
/// as the peer facts join (docs/semantics.md §17), counted by the server
/// independently of the program.
const BOUND: &str = "WITH own AS (SELECT * FROM worker_registrations \
    WHERE host_id = 'h-10' AND status = 'active') \
    SELECT (SELECT count(*) FROM own), (SELECT count(*) FROM worker_registrations w \
    WHERE (w.host_id = 'h-10' AND w.status = 'active') IS NOT TRUE \
    AND (w.worker_identity IN (SELECT worker_identity FROM own) \
    OR (w.status = 'active' AND (w.session_id IN (SELECT session_id FROM own) \
    OR w.generation_id IN (SELECT generation_id FROM own) \
    OR w.pid IN (SELECT pid FROM own) \
    OR w.process_identity IN (SELECT process_identity FROM own) \
    OR w.process_identity IN (SELECT 'pid-' || pid FROM own) \
    OR w.client_instance_id IN (SELECT client_instance_id FROM own)))))";

/// The rows each scan node of a plan read from the registry table itself:
/// those it returned and those it read and removed (by its filter, or on
/// rechecking a lossy bitmap), from the node's own lines.
fn table_scans(plan: &str) -> Vec<(String, u64)> {
    let lines: Vec<&str> = plan.lines().collect();
    let number = |l: &str, after: &str| -> u64 {
        l.split(after)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number after {after:?} in {l:?}"))
    };
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !l.contains(" on worker_registrations") {
            continue;
        }
        let mut read = number(l.split("actual ").nth(1).unwrap_or_default(), "rows=");
        // The node's detail lines, up to the next node.
        for detail in lines[i + 1..].iter().take_while(|d| !d.contains("->")) {
            for removed in ["Rows Removed by Filter:", "Rows Removed by Index Recheck:"] {
                if detail.contains(removed) {
                    read += number(detail, removed);
                }
            }
        }
        out.push((l.trim().to_string(), read));
    }
    out
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_hosts_scoped_read_reads_its_rows_and_their_peers_through_indexes() {
    let Some(db) = common::postgres("host_scope_bound") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases) = (dir.path().join("r.sqlite"), dir.path().join("l.sqlite"));
    common::registry(&registry, &[]);
    common::leases(&leases, &[]);
    let roles = db.documented_roles();
    fleet_retire::copy::copy(&registry, Some(&leases), &roles.owner).unwrap();
    db.grant_documented(&roles);
    let mut owner = ::postgres::Client::connect(&roles.owner, ::postgres::NoTls).unwrap();
    owner.batch_execute(FILL).unwrap();
    // What autovacuum does on a live registry: statistics and the
    // visibility map the index-only count reads.
    owner
        .batch_execute("VACUUM ANALYZE worker_registrations")
        .unwrap();
    let bound = owner.query_one(BOUND, &[]).unwrap();
    let (own, peers): (i64, i64) = (bound.get(0), bound.get(1));
    assert!(own > 0 && peers > 0, "own {own}, peers {peers}");
    let bound = (own + peers) as u64;

    let label = roles.apply.clone();
    let mut client =
        fleet_retire::store::postgres::connect(&roles.apply, fleet_retire::error::Store::Registry)
            .unwrap();
    let plans = fleet_retire::store::postgres::scope::explain(&mut client, &label, HOST).unwrap();
    assert_eq!(plans.len(), 3, "{plans:#?}");
    for plan in &plans {
        eprintln!("{plan}\n");
        assert!(!plan.contains("Seq Scan"), "a sequential scan:\n{plan}");
        for (node, rows) in table_scans(plan) {
            assert!(rows <= bound, "{rows} rows > {bound}: {node}\n{plan}");
        }
    }
    assert!(
        plans[1].contains("Index Only Scan using fleet_retire_scope_host"),
        "the count reads the index alone:\n{}",
        plans[1]
    );

    // The plan itself, as host h-10: it read exactly its active rows and
    // their peers, a small part of the registry.
    let profiles = dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]}}}"#,
    )
    .unwrap();
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped the plan as host {HOST}: simulated hosts need root and unshare");
        return;
    }
    let script = format!(
        "hostname {HOST} && exec \"$BIN\" plan --scope host --format json --registry \"$R\" \
         --leases \"$R\" --profiles \"$P\" --profile controller-prgs \
         --canonical-repository prgs/gitea-tools"
    );
    let out = Command::new("unshare")
        .args(["--uts", "sh", "-c", &script])
        .env("BIN", env!("CARGO_BIN_EXE_fleet-retire"))
        .env("R", &roles.apply)
        .env("P", &profiles)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["scope"]["own_rows"], own, "{}", plan["scope"]);
    assert_eq!(plan["scope"]["peer_rows"], peers, "{}", plan["scope"]);
    let terminal = i64::from(ROWS / 100) - own;
    assert_eq!(plan["scope"]["terminal_rows"], terminal);
    assert!(bound * 20 < u64::from(ROWS), "{bound} of {ROWS} rows read");
}

#[test]
fn a_hosts_scoped_read_reads_its_rows_and_their_peers_through_indexes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("r.sqlite");
    let out = common::run(&[
        "registry",
        "create",
        "--registry",
        registry.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    let conn = rusqlite::Connection::open(&registry).unwrap();
    let fill = FILL
        .replace("lpad((i / 5)::text, 12, '0')", "printf('%012d', i / 5)")
        .replace(
            "FROM generate_series(1, 20000) i",
            "FROM (WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 20000) \
             SELECT i FROM s)",
        );
    conn.execute_batch(&fill).unwrap();
    let (own, peers): (i64, i64) = conn
        .query_row(BOUND, [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert!(own > 0 && peers > 0, "own {own}, peers {peers}");
    drop(conn);
    let plans = fleet_retire::store::sqlite::scope::explain(&registry, HOST).unwrap();
    assert!(plans.len() >= 3, "{plans:#?}");
    for plan in &plans {
        eprintln!("{plan}");
        assert!(
            plan.lines().all(|l| !l.starts_with("SCAN")),
            "a scan of the table:\n{plan}"
        );
    }
    assert!(
        plans[1].contains("COVERING INDEX fleet_retire_scope_host"),
        "the count reads the index alone:\n{}",
        plans[1]
    );
    let scope = fleet_retire::store::sqlite::scope::load(&registry, HOST).unwrap();
    assert_eq!(scope.own.len() as i64, own);
    assert_eq!(scope.peers.len() as i64, peers);
    assert_eq!(scope.terminal as i64, i64::from(ROWS / 100) - own);
}
