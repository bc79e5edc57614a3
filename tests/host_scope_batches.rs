//! A host-scoped plan applied in batches (`apply PLAN.json --first N`,
//! issue 54): each batch after the first finds the scope moved by the
//! plan's own earlier batches alone, recognises them (`retired_since_plan`)
//! and retires the next candidates; a write by anyone else to this host's
//! rows, or to a peer that moves a candidate's verdict, still refuses;
//! `--all-batches` runs them all.
//! Hosts are simulated as `tests/multi_host.rs` does (`common::hosts`).

mod common;

use common::hosts::*;
use serde_json::Value;
use std::path::Path;

/// `plan --scope host --out` as host `HOSTS[0]`: the plan and its
/// candidates, in the plan's order.
fn save_plan(stores: (&Path, &Path, &Path), saved: &str) -> Vec<String> {
    save_scoped_plan(HOSTS[0], stores, Path::new(saved)).1
}

/// `apply PLAN --first 1` as host `HOSTS[0]`: its report.
fn one_batch(stores: (&Path, &Path, &Path), saved: &str) -> Value {
    let args = ["apply", saved, "--format", "json", "--first", "1"];
    let out = run_as(HOSTS[0], &args, stores);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::text(&out)))
}

fn retired(report: &Value) -> Vec<String> {
    report["retired"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|r| r["worker_identity"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Three batches of one each retire the plan's first three candidates in
/// turn, each later one naming the earlier ones as retired since the
/// plan; then a write to another of this host's active rows refuses the
/// next batch, and so (after a fresh plan) does a peer of another host
/// taking a candidate's session.
fn batches_of_a_scoped_plan(stores: (&Path, &Path, &Path), dir: &Path, write: &dyn Fn(&str)) {
    let saved = dir.join("plan.json");
    let saved = saved.to_str().unwrap();
    let first = save_plan(stores, saved);
    for n in 0..5 {
        write(&clone_of(&first[0], n));
    }
    let candidates = save_plan(stores, saved);
    assert!(candidates.len() >= 6, "{candidates:?}");
    for (n, expected) in candidates.iter().take(3).enumerate() {
        let report = one_batch(stores, saved);
        assert_eq!(report["outcome"], "applied", "batch {n}: {report}");
        assert_eq!(
            retired(&report),
            std::slice::from_ref(expected),
            "batch {n}"
        );
        assert_eq!(report["read_under_lock"]["scope"], "host_scope");
        let since: Vec<&str> = report["retired_since_plan"]
            .as_array()
            .map(|r| r.iter().map(|w| w.as_str().unwrap()).collect())
            .unwrap_or_default();
        assert_eq!(since, candidates[..n], "batch {n}: {report}");
    }
    // Another program writes one of this host's active rows (not a
    // candidate): the scope moved by more than the plan's own batches.
    write(&format!(
        "UPDATE worker_registrations SET generation_id = 'g-rewritten' \
         WHERE worker_identity = (SELECT min(worker_identity) FROM worker_registrations \
         WHERE host_id = '{}' AND status = 'active' AND worker_identity NOT IN ({}))",
        HOSTS[0],
        quoted(&candidates)
    ));
    let report = one_batch(stores, saved);
    assert_eq!(report["outcome"], "registry_revision_moved", "{report}");
    assert!(retired(&report).is_empty());
    // A fresh plan, one batch of it, then a live row of another host takes
    // the session of the plan's next candidate: its verdict moved.
    let candidates = save_plan(stores, saved);
    let report = one_batch(stores, saved);
    assert_eq!(report["outcome"], "applied", "{report}");
    let next = &candidates[1];
    write(&format!(
        "INSERT INTO worker_registrations (worker_identity, session_id, status, host_id, \
         pid, last_heartbeat_at) SELECT 'w-late-peer', session_id, 'active', '{}', 7, \
         '2126-01-01T00:10:00Z' FROM worker_registrations WHERE worker_identity = '{next}'",
        HOSTS[1]
    ));
    let report = one_batch(stores, saved);
    assert_eq!(report["outcome"], "candidate_set_moved", "{report}");
    assert!(retired(&report).is_empty());
    // A fresh plan, every batch of one in a row (`--all-batches`): each
    // candidate retired, none left in the scope.
    let before = save_plan(stores, saved);
    for n in 10..12 {
        write(&clone_of(&before[0], n));
    }
    let candidates = save_plan(stores, saved);
    assert!(candidates.len() >= 3, "{candidates:?}");
    let args = [
        "apply",
        saved,
        "--format",
        "json",
        "--first",
        "1",
        "--all-batches",
    ];
    let out = run_as(HOSTS[0], &args, stores);
    assert!(out.status.success(), "{}", common::text(&out));
    let left = save_plan(stores, &format!("{saved}.after"));
    assert!(
        left.iter().all(|w| !candidates.contains(w)),
        "{left:?} {candidates:?}"
    );
}

/// A copy of `candidate`'s row sharing no key with any other row: one
/// more candidate of the same host.
fn clone_of(candidate: &str, n: u32) -> String {
    format!(
        "INSERT INTO worker_registrations (worker_identity, client_name, client_instance_id, \
         instance_id_source, session_id, generation_id, role, profile, namespace, remote, \
         repository_binding, pid, started_at, last_heartbeat_at, heartbeat_ttl_seconds, \
         fencing_epoch, status, host_id, boot_id, process_start_time) \
         SELECT 'w-batch-{n}', client_name, 'inst-codex-20260730T100000Z-00000000b0{n:02}', \
         instance_id_source, 's-batch-{n}', 'g-batch-{n}', role, profile, namespace, remote, \
         repository_binding, {pid}, started_at, last_heartbeat_at, heartbeat_ttl_seconds, \
         fencing_epoch, status, host_id, boot_id, process_start_time \
         FROM worker_registrations WHERE worker_identity = '{candidate}'",
        pid = 2_000_000_100 + n
    )
}

fn quoted(identities: &[String]) -> String {
    identities
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn a_scoped_plan_applies_in_batches_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let write = sqlite_exec(&registry);
    batches_of_a_scoped_plan((&registry, &leases, &profiles), dir.path(), &write);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_scoped_plan_applies_in_batches_on_postgres() {
    let Some((db, dir, url)) = on_postgres("host_scope_batches") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    let write = |sql: &str| db.client().batch_execute(sql).unwrap();
    batches_of_a_scoped_plan((url, url, &profiles), dir.path(), &write);
}
