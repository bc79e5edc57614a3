//! Hosts applying their scoped plans at once on PostgreSQL (issue 54): an
//! apply of one host must not be refused by another host's apply (their
//! scopes share no row), and a real change of a host's scope still
//! refuses it, even when the change first shows as a serialization
//! failure that apply answers by running its transaction again. Hosts are
//! simulated as `tests/multi_host.rs` does (`common::hosts`): each process
//! runs in a UTS namespace named as its host.

mod common;

use common::hosts::*;
use serde_json::{json, Value};
use std::path::Path;

/// How many hosts apply at once.
const HOSTS_AT_ONCE: usize = 8;
/// Stale rows of each host (its candidates).
const STALE: usize = 12;

fn host(h: usize) -> String {
    format!("conc-{h}")
}

/// Each host's stale rows, every key its own (no row is another host's
/// peer), on dead pids of this boot.
fn fleet() -> Vec<Value> {
    let (_, boot) = common::host_and_boot();
    let mut rows = Vec::new();
    for h in 0..HOSTS_AT_ONCE {
        for j in 0..STALE {
            let n = h * 100 + j;
            rows.push(json!({
                "worker_identity": format!("w-{h}-{j}"),
                "client_name": "codex",
                "client_instance_id": format!("inst-codex-20260730T100000Z-{n:012x}"),
                "instance_id_source": "launcher",
                "session_id": format!("s-{n}"),
                "generation_id": format!("g-{n}"),
                "process_identity": format!("proc-{n}"),
                "role": "author", "profile": "author-prgs", "namespace": "author",
                "remote": "prgs", "repository_binding": "prgs/gitea-tools",
                "pid": 2_000_000_001_i64 + n as i64,
                "started_at": "2026-01-01T00:00:00Z",
                "last_heartbeat_at": "2026-01-01T00:10:00Z",
                "heartbeat_ttl_seconds": 900.0,
                "fencing_epoch": 1,
                "status": "active",
                "host_id": host(h), "boot_id": boot, "process_start_time": "ticks-5",
            }));
        }
    }
    rows
}

/// The fleet in a fresh PostgreSQL database with the documented roles:
/// the database, the folder of `profiles.json`, the apply role's URL.
fn on_postgres(tag: &str) -> Option<(common::PgDb, tempfile::TempDir, String)> {
    if !can_make_hosts() {
        return None;
    }
    let db = common::postgres(tag)?;
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases) = (dir.path().join("r.sqlite"), dir.path().join("l.sqlite"));
    common::registry(&registry, &fleet());
    let out = common::run(&[
        "registry",
        "versions",
        "--registry",
        registry.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    common::leases(&leases, &[]);
    profiles(dir.path());
    let roles = db.documented_roles();
    fleet_retire::copy::copy(&registry, Some(&leases), &roles.owner).unwrap();
    db.grant_documented(&roles);
    Some((db, dir, roles.apply))
}

/// `name`'s scoped plan saved in `dir`: its path and candidates.
fn save_plan(name: &str, stores: (&Path, &Path, &Path), dir: &Path) -> (String, Vec<String>) {
    let saved = dir.join(format!("{name}.json"));
    let (_, mut candidates) = save_scoped_plan(name, stores, &saved);
    let saved = saved.to_str().unwrap().to_string();
    candidates.sort();
    (saved, candidates)
}

fn apply(name: &str, saved: &str, stores: (&Path, &Path, &Path)) -> Value {
    let args = ["apply", saved, "--format", "json", "--max-retire", "1000"];
    let out = run_as(name, &args, stores);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("apply as {name}: {}", common::text(&out)))
}

fn retired(report: &Value) -> Vec<String> {
    let mut out: Vec<String> = report["retired"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|r| r["worker_identity"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Every host plans its scope, then all apply at the same moment, each
/// its whole plan in one transaction: every one applied, none refused,
/// each exactly its own candidates retired.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn hosts_applying_at_once_are_all_applied() {
    let Some((_db, dir, url)) = on_postgres("host_scope_at_once") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    let stores = (url, url, profiles.as_path());
    let plans: Vec<(String, Vec<String>)> = (0..HOSTS_AT_ONCE)
        .map(|h| save_plan(&host(h), stores, dir.path()))
        .collect();
    let ready = std::sync::Barrier::new(HOSTS_AT_ONCE);
    let reports: Vec<Value> = std::thread::scope(|s| {
        let runs: Vec<_> = plans
            .iter()
            .enumerate()
            .map(|(h, (saved, _))| {
                let ready = &ready;
                s.spawn(move || {
                    ready.wait();
                    apply(&host(h), saved, stores)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (h, (report, (_, candidates))) in reports.iter().zip(&plans).enumerate() {
        assert_eq!(candidates.len(), STALE, "host {h}'s plan");
        assert_eq!(report["outcome"], "applied", "host {h}: {report}");
        assert_eq!(&retired(report), candidates, "host {h}: {report}");
    }
}

/// A write that really changes a host's scope, committed while that
/// host's apply waits on it: the server rolls the apply's transaction back
/// (a serialization failure), apply runs it again, reads its scope again
/// and refuses; nothing is retired.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_real_change_of_the_scope_still_refuses_after_the_retry() {
    let Some((db, dir, url)) = on_postgres("host_scope_retry") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    let stores = (url, url, profiles.as_path());
    let name = host(0);
    let (saved, candidates) = save_plan(&name, stores, dir.path());
    assert_eq!(candidates.len(), STALE);
    // Another writer heartbeats one of the candidates (it is live again)
    // and holds its transaction open.
    let mut writer = db.client();
    let mut tx = writer.transaction().unwrap();
    tx.batch_execute(&format!(
        "UPDATE worker_registrations SET last_heartbeat_at = '2126-01-01T00:10:00Z' \
         WHERE worker_identity = '{}'",
        candidates[0]
    ))
    .unwrap();
    let mut watcher = db.client();
    let report = std::thread::scope(|s| {
        let applying = s.spawn(|| apply(&name, &saved, stores));
        // The apply's write waits for the writer's row lock.
        let started = std::time::Instant::now();
        while watcher
            .query_one(
                "SELECT count(*) FROM pg_catalog.pg_locks WHERE NOT granted",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 0
        {
            assert!(started.elapsed().as_secs() < 30, "the apply never waited");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        tx.commit().unwrap();
        applying.join().unwrap()
    });
    assert!(
        ["registry_revision_moved", "candidate_set_moved"]
            .contains(&report["outcome"].as_str().unwrap()),
        "{report}"
    );
    assert_eq!(report["transaction_attempts"], 2, "{report}");
    assert!(retired(&report).is_empty(), "{report}");
    let left: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM worker_registrations WHERE status = 'retired'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}
