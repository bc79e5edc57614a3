//! Applying a host-scoped plan (issue 54): the scope is read and judged
//! again under the lock (from every row when its indexes cannot be
//! trusted there), a write to another host's rows outside it moves
//! nothing, a replay is `already_retired`, and only the plan's host may
//! apply it. Hosts are simulated as `tests/multi_host.rs` does
//! (`common::hosts`).

mod common;

use common::hosts::*;
use serde_json::Value;
use std::path::Path;

/// A row of host scope-b sharing no key with any other row: outside every
/// other host's scope.
const OUTSIDER: &str = "INSERT INTO worker_registrations (worker_identity, session_id, \
    generation_id, pid, status, host_id, last_heartbeat_at) VALUES ('w-outsider', 's-outsider', \
    'g-outsider', 999999999, 'active', 'scope-b', '2026-01-01T00:00:00Z')";
const OUTSIDER_BEATS: &str = "UPDATE worker_registrations SET last_heartbeat_at = \
    '2026-06-01T00:00:00Z', session_id = 's-outsider-2' WHERE worker_identity = 'w-outsider'";

/// Host scope-a plans its scope and saves it; another host's row outside
/// it is inserted and written; scope-a's scoped tokens do not move, and
/// its apply of the saved plan retires exactly the plan's candidates,
/// reading its scope under the lock; the same apply again is a replay.
fn a_scoped_apply_retires_its_plan_whatever_other_hosts_write(
    stores: (&Path, &Path, &Path),
    dir: &Path,
    write: &dyn Fn(&str),
) {
    let host = HOSTS[0];
    let saved = dir.join("plan.json");
    let saved_arg = saved.to_str().unwrap();
    let (plan, candidates) = save_scoped_plan(host, stores, &saved);
    assert!(!candidates.is_empty());
    write(OUTSIDER);
    write(OUTSIDER_BEATS);
    let again = plan_as(host, stores.0, stores.1, stores.2, true);
    for token in ["registry_fingerprint", "candidate_fingerprint"] {
        assert_eq!(
            again[token], plan[token],
            "{token} moved by another host's row"
        );
    }
    let apply = [
        "apply",
        saved_arg,
        "--format",
        "json",
        "--max-retire",
        "1000",
    ];
    let out = run_as(host, &apply, stores);
    assert!(out.status.success(), "{}", common::text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "applied", "{report}");
    assert_eq!(report["read_under_lock"]["scope"], "host_scope", "{report}");
    let mut retired: Vec<String> = report["retired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["worker_identity"].as_str().unwrap().to_string())
        .collect();
    retired.sort();
    let mut expected = candidates.clone();
    expected.sort();
    assert_eq!(retired, expected);
    // The same plan again: every requested worker is retired.
    let out = run_as(host, &apply, stores);
    let replay: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        replay["outcome"],
        "already_retired",
        "{}",
        common::text(&out)
    );
    // Another host may not apply scope-a's plan.
    let out = run_as(HOSTS[1], &apply, stores);
    let elsewhere: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(elsewhere["outcome"], "registry_revision_moved");
    assert!(
        common::text(&out).contains("applies only its own scope"),
        "{}",
        common::text(&out)
    );
}

#[test]
fn a_scoped_apply_on_sqlite_retires_its_plan_whatever_other_hosts_write() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let write = sqlite_exec(&registry);
    a_scoped_apply_retires_its_plan_whatever_other_hosts_write(
        (&registry, &leases, &profiles),
        dir.path(),
        &write,
    );
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_scoped_apply_on_postgres_retires_its_plan_whatever_other_hosts_write() {
    let Some((db, dir, url)) = on_postgres("host_scope_apply") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    let write = |sql: &str| db.client().batch_execute(sql).unwrap();
    a_scoped_apply_retires_its_plan_whatever_other_hosts_write(
        (url, url, &profiles),
        dir.path(),
        &write,
    );
}

/// Between a scoped plan and its apply, a live row of another host takes
/// the session of the plan's first candidate (copied from it, so every
/// storage class is the candidate's). The whole plan now keeps the
/// candidate (`conflicting_identity_evidence`); the scoped apply, reading
/// its scope again under the lock, must not retire it: it refuses, the
/// candidate set having moved.
fn a_peer_written_after_the_plan_stops_the_scoped_apply(
    stores: (&Path, &Path, &Path),
    dir: &Path,
    write: &dyn Fn(&str),
) {
    let saved = dir.join("plan.json");
    let saved_arg = saved.to_str().unwrap();
    let (_, candidates) = save_scoped_plan(HOSTS[0], stores, &saved);
    let candidate = &candidates[0];
    write(&format!(
        "CREATE TEMP TABLE peer AS SELECT * FROM worker_registrations \
         WHERE worker_identity = '{candidate}';
         UPDATE peer SET worker_identity = 'w-late-peer', host_id = '{}', status = 'active', \
         pid = 7, process_identity = 'proc-late', generation_id = 'g-late', \
         client_instance_id = '', last_heartbeat_at = '2126-01-01T00:10:00Z';
         INSERT INTO worker_registrations SELECT * FROM peer;
         DROP TABLE peer;",
        HOSTS[1]
    ));
    let whole = plan_as(HOSTS[0], stores.0, stores.1, stores.2, false);
    let kept = &entries(&whole)[candidate].0;
    assert!(
        kept.contains(&"conflicting_identity_evidence".to_string()),
        "{kept:?}"
    );
    let apply = [
        "apply",
        saved_arg,
        "--format",
        "json",
        "--max-retire",
        "1000",
    ];
    let out = run_as(HOSTS[0], &apply, stores);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["outcome"],
        "candidate_set_moved",
        "{}",
        common::text(&out)
    );
    assert!(report["retired"].as_array().is_none_or(|r| r.is_empty()));
}

#[test]
fn a_peer_written_after_the_plan_stops_the_scoped_apply_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let write = sqlite_exec(&registry);
    a_peer_written_after_the_plan_stops_the_scoped_apply(
        (&registry, &leases, &profiles),
        dir.path(),
        &write,
    );
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_peer_written_after_the_plan_stops_the_scoped_apply_on_postgres() {
    let Some((db, dir, url)) = on_postgres("host_scope_late_peer") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    let write = |sql: &str| db.client().batch_execute(sql).unwrap();
    a_peer_written_after_the_plan_stops_the_scoped_apply((url, url, &profiles), dir.path(), &write);
}

/// One of the scope's indexes replaced after the plan by one of another
/// shape: a scoped plan now stops, naming it; the saved plan's apply does
/// not trust the index either, but reads every row under its lock and
/// takes the scope from them, and retires the plan's candidates, saying so.
fn an_index_replaced_after_the_plan_sends_the_scoped_apply_to_the_whole_read(
    stores: (&Path, &Path, &Path),
    dir: &Path,
    write: &dyn Fn(&str),
) {
    let saved = dir.join("plan.json");
    let saved_arg = saved.to_str().unwrap();
    let args = [
        "plan",
        "--format",
        "json",
        "--canonical-repository",
        "prgs/gitea-tools",
        "--scope",
        "host",
    ];
    let out = run_as(
        HOSTS[0],
        &[&args[..], &["--out", saved_arg]].concat(),
        stores,
    );
    assert!(out.status.success(), "{}", common::text(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut candidates: Vec<&str> = plan["candidate_worker_identities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    candidates.sort();
    assert!(!candidates.is_empty());
    write(
        "DROP INDEX fleet_retire_scope_session; \
         CREATE INDEX fleet_retire_scope_session ON worker_registrations (session_id)",
    );
    let out = run_as(HOSTS[0], &args, stores);
    assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
    assert!(common::text(&out).contains("fleet_retire_scope_session is not ours"));
    let apply = [
        "apply",
        saved_arg,
        "--format",
        "json",
        "--max-retire",
        "1000",
    ];
    let out = run_as(HOSTS[0], &apply, stores);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "applied", "{}", common::text(&out));
    let read = &report["read_under_lock"];
    assert_eq!(read["scope"], "whole_registry", "{read}");
    let why = read["why"].as_str().unwrap();
    assert!(
        why.contains("fleet_retire_scope_session is not ours"),
        "{why}"
    );
    let mut retired: Vec<&str> = report["retired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["worker_identity"].as_str().unwrap())
        .collect();
    retired.sort();
    assert_eq!(retired, candidates);
}

#[test]
fn an_index_replaced_after_the_plan_sends_the_scoped_apply_to_the_whole_read_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let write = sqlite_exec(&registry);
    an_index_replaced_after_the_plan_sends_the_scoped_apply_to_the_whole_read(
        (&registry, &leases, &profiles),
        dir.path(),
        &write,
    );
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn an_index_replaced_after_the_plan_sends_the_scoped_apply_to_the_whole_read_on_postgres() {
    let Some((db, dir, url)) = on_postgres("host_scope_index_apply") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    let write = |sql: &str| db.client().batch_execute(sql).unwrap();
    an_index_replaced_after_the_plan_sends_the_scoped_apply_to_the_whole_read(
        (url, url, &profiles),
        dir.path(),
        &write,
    );
}

/// Tokens cannot cross between the scoped and the whole apply: a scoped
/// plan's tokens given as flags (the whole-registry apply) are refused
/// before any store is opened, and a whole plan's file made to name a
/// scope is refused as it is read (its tokens are not the scope's).
/// Nothing is retired either way.
#[test]
fn tokens_do_not_cross_between_scoped_and_whole_applies_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let stores = (&*registry, &*leases, &*profiles);
    let scoped = plan_as(HOSTS[0], &registry, &leases, &profiles, true);
    let workers = scoped["candidate_worker_identities"][0].as_str().unwrap();
    let text = |v: &Value| v.as_str().unwrap().to_string();
    let flags = [
        "apply".to_string(),
        "--format".into(),
        "json".into(),
        "--registry-fingerprint".into(),
        text(&scoped["registry_fingerprint"]),
        "--candidate-fingerprint".into(),
        text(&scoped["candidate_fingerprint"]),
        "--policy-fingerprint".into(),
        text(&scoped["policy_fingerprint"]),
        "--workers".into(),
        workers.into(),
        "--canonical-repository".into(),
        "prgs/gitea-tools".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = run_as(HOSTS[0], &flags, stores);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "registry_revision_moved", "{report}");
    // A whole plan's file, made to name this host's scope.
    let mut whole = plan_as(HOSTS[0], &registry, &leases, &profiles, false);
    whole["scope"] = scoped["scope"].clone();
    let forged = dir.path().join("forged.json");
    std::fs::write(&forged, whole.to_string()).unwrap();
    let args = ["apply", forged.to_str().unwrap(), "--format", "json"];
    let out = run_as(HOSTS[0], &args, stores);
    assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
    assert!(
        common::text(&out).contains("its `scope` and its tokens disagree"),
        "{}",
        common::text(&out)
    );
    let again = plan_as(HOSTS[0], &registry, &leases, &profiles, true);
    assert_eq!(again["candidate_count"], scoped["candidate_count"]);
}
