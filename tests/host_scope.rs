//! `plan --scope host` (issue 54): every host's scoped plan is the
//! whole-registry plan restricted to that host's active rows, verdict by
//! verdict, and counts its other rows without reading them; an index the
//! scoped read relies on that is not ours stops it. Hosts are simulated as
//! `tests/multi_host.rs` does (`common::hosts`).

mod common;

use common::hosts::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;

/// For every host: its scoped plan's entries are the whole plan's entries
/// of its active rows, verdict by verdict (every reason code); it counts
/// its other rows; its tokens are scoped and the whole plan's are not; and
/// it reads fewer rows than the registry holds. Across the hosts, the
/// verdicts compared have candidates and rest on every kind of peer fact.
fn each_host_plans_its_scope_as_the_whole_plan_does(
    registry: &Path,
    leases: &Path,
    profiles: &Path,
    seed: u64,
) {
    let mut candidates = 0;
    let mut reasons = std::collections::BTreeSet::new();
    for host in HOSTS {
        let whole = plan_as(host, registry, leases, profiles, false);
        let scoped = plan_as(host, registry, leases, profiles, true);
        let expected: BTreeMap<_, _> = entries(&whole)
            .into_iter()
            .filter(|(_, (_, h, s))| h == host && s == "active")
            .collect();
        let terminal = entries(&whole)
            .values()
            .filter(|(_, h, s)| h == host && s != "active")
            .count();
        let got = entries(&scoped);
        let differ: Vec<_> = got
            .keys()
            .chain(expected.keys())
            .filter(|k| got.get(*k) != expected.get(*k))
            .map(|k| (k, got.get(k), expected.get(k)))
            .collect();
        assert!(differ.is_empty(), "host {host}, seed {seed}: {differ:?}");
        assert_eq!(
            scoped["scope"]["terminal_rows"],
            json!(terminal),
            "host {host}"
        );
        assert_eq!(scoped["scope"]["host_id"], json!(host));
        for token in ["registry_fingerprint", "candidate_fingerprint"] {
            assert!(scoped[token].as_str().unwrap().starts_with("host-scope:"));
            assert!(!whole[token].as_str().unwrap().starts_with("host-scope:"));
        }
        candidates += scoped["candidate_count"].as_u64().unwrap();
        reasons.extend(
            entries(&scoped)
                .into_values()
                .flat_map(|(codes, _, _)| codes),
        );
        let read = scoped["scope"]["own_rows"].as_u64().unwrap()
            + scoped["scope"]["peer_rows"].as_u64().unwrap();
        assert!(
            read < whole["assessed_count"].as_u64().unwrap(),
            "host {host}"
        );
    }
    assert!(
        candidates > 0,
        "the registry has candidates to compare (seed {seed}): {reasons:?}"
    );
    for peer_fact in [
        "conflicting_identity_evidence",
        "client_instance_conflict",
        "protected_active_workflow_owner",
    ] {
        assert!(reasons.contains(peer_fact), "{peer_fact} in {reasons:?}");
    }
}

#[test]
fn every_hosts_scoped_plan_is_the_whole_plan_restricted_to_its_rows_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    each_host_plans_its_scope_as_the_whole_plan_does(&registry, &leases, &profiles, seed());
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn every_hosts_scoped_plan_is_the_whole_plan_restricted_to_its_rows_on_postgres() {
    let Some((_db, dir, url)) = on_postgres("host_scope") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    each_host_plans_its_scope_as_the_whole_plan_does(url, url, &profiles, seed());
}

/// A scoped read trusts no index it did not make: one missing, one of
/// another shape (other columns; over an expression) is named in the error,
/// with the step that makes it; plan without --scope still runs.
fn an_index_not_ours_stops_the_scoped_plan(stores: (&Path, &Path, &Path), ddl: &dyn Fn(&str)) {
    let cases = [
        (
            "DROP INDEX fleet_retire_scope_pid",
            "fleet_retire_scope_pid is missing",
        ),
        (
            "CREATE INDEX fleet_retire_scope_pid ON worker_registrations (pid, status)",
            "fleet_retire_scope_pid is not ours",
        ),
        (
            "DROP INDEX fleet_retire_scope_session",
            "fleet_retire_scope_session is missing",
        ),
        (
            "CREATE INDEX fleet_retire_scope_session ON worker_registrations (lower(session_id)) \
             WHERE status = 'active'",
            "fleet_retire_scope_session is not ours",
        ),
    ];
    let args = [
        "plan",
        "--format",
        "json",
        "--canonical-repository",
        "prgs/gitea-tools",
    ];
    let scoped = [&args[..], &["--scope", "host"]].concat();
    for (sql, named) in cases {
        ddl(sql);
        let out = run_as(HOSTS[0], &scoped, stores);
        assert_eq!(out.status.code(), Some(1), "{sql}: {}", common::text(&out));
        let text = common::text(&out);
        assert!(text.contains(named), "{sql}: {text}");
        assert!(text.contains("registry versions"), "{sql}: {text}");
        let whole = run_as(HOSTS[0], &args, stores);
        assert!(whole.status.success(), "{}", common::text(&whole));
    }
}

#[test]
fn an_index_not_ours_stops_the_scoped_plan_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let ddl = sqlite_exec(&registry);
    an_index_not_ours_stops_the_scoped_plan((&registry, &leases, &profiles), &ddl);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn an_index_not_ours_stops_the_scoped_plan_on_postgres() {
    let Some((db, dir, url)) = on_postgres("host_scope_index") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    // As the tables' owner: only it may make or drop their indexes.
    let owner = db.documented_roles().owner;
    let ddl = |sql: &str| {
        ::postgres::Client::connect(&owner, ::postgres::NoTls)
            .unwrap()
            .batch_execute(sql)
            .unwrap()
    };
    an_index_not_ours_stops_the_scoped_plan((url, url, &profiles), &ddl);
}

/// A peer the scoped read must find in another storage class: a row of
/// another host whose `pid` is a real infinity (SQLite keeps it a real in
/// an INTEGER column) derives the process identity `pid-inf`, which a
/// candidate of this host gives as text. The whole plan sees the two
/// share evidence and keeps the candidate; the scoped plan must too.
#[test]
fn a_peer_whose_pid_is_an_infinite_real_is_read_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let exec = sqlite_exec(&registry);
    let scoped = plan_as(HOSTS[0], &registry, &leases, &profiles, true);
    let candidate = scoped["candidates"][0]["worker_identity"]
        .as_str()
        .unwrap()
        .to_string();
    exec(&format!(
        "UPDATE worker_registrations SET process_identity = 'pid-inf' \
         WHERE worker_identity = '{candidate}';
         CREATE TEMP TABLE peer AS SELECT * FROM worker_registrations \
         WHERE worker_identity = '{candidate}';
         UPDATE peer SET worker_identity = 'w-peer-inf', host_id = '{}', pid = 9e999, \
         process_identity = NULL, session_id = 's-peer-inf', generation_id = 'g-peer-inf', \
         client_instance_id = '', last_heartbeat_at = '2126-01-01T00:10:00Z';
         INSERT INTO worker_registrations SELECT * FROM peer;",
        HOSTS[1]
    ));
    let whole = plan_as(HOSTS[0], &registry, &leases, &profiles, false);
    let kept = &entries(&whole)[&candidate].0;
    assert!(
        kept.contains(&"conflicting_identity_evidence".to_string()),
        "{kept:?}"
    );
    each_host_plans_its_scope_as_the_whole_plan_does(&registry, &leases, &profiles, seed());
}

/// A policy folder that passes a weaker reading of the scope's
/// precondition: a forbid on `hold_session_id` that fails (overflows) on
/// every row with a past heartbeat, so every such row, a terminal one
/// too, holds its session (an evaluation error is a yes). A candidate of
/// this host shares its session with a released row of another host only:
/// the whole plan keeps it; a scoped read never fetches the released row,
/// so `--scope host` must refuse the set rather than retire the candidate.
#[test]
fn a_policy_that_can_fail_on_a_terminal_peer_is_refused_for_the_scope_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let candidate = plan_as(HOSTS[0], &registry, &leases, &profiles, true)["candidates"][0]
        ["worker_identity"]
        .as_str()
        .unwrap()
        .to_string();
    sqlite_exec(&registry)(&format!(
        "UPDATE worker_registrations SET session_id = 's-attack' \
         WHERE worker_identity = '{candidate}';
         CREATE TEMP TABLE peer AS SELECT * FROM worker_registrations \
         WHERE worker_identity = '{candidate}';
         UPDATE peer SET worker_identity = 'w-released', host_id = '{}', status = 'released', \
         pid = 7, process_identity = 'proc-released', generation_id = 'g-released', \
         client_instance_id = '';
         INSERT INTO worker_registrations SELECT * FROM peer;",
        HOSTS[1]
    ));
    let folder = common::policies_failing_the_scope_precondition(dir.path());
    let args = [
        "plan",
        "--format",
        "json",
        "--canonical-repository",
        "prgs/gitea-tools",
        "--policies",
        folder.to_str().unwrap(),
    ];
    let stores = (&*registry, &*leases, &*profiles);
    let whole = run_as(HOSTS[0], &args, stores);
    assert!(whole.status.success(), "{}", common::text(&whole));
    let whole: serde_json::Value = serde_json::from_slice(&whole.stdout).unwrap();
    let kept = &entries(&whole)[&candidate].0;
    assert!(
        kept.contains(&"conflicting_identity_evidence".to_string()),
        "{kept:?}"
    );
    let scoped = run_as(
        HOSTS[0],
        &[&args[..], &["--scope", "host"]].concat(),
        stores,
    );
    let text = common::text(&scoped);
    assert_eq!(scoped.status.code(), Some(1), "{text}");
    assert!(text.contains("hold-fails-on-old-heartbeats"), "{text}");
}

/// Indexes of our names that are not to be trusted although their
/// statement is ours or nearly: all of them, when the database's
/// collation was recorded under another version than the server now has
/// (an upgrade of the C library reorders text, and an index built before
/// it can miss equal keys; set so here by the superuser); one left invalid (as a failed `CREATE
/// INDEX CONCURRENTLY` leaves it; set so here by the superuser), one over
/// an expression of a user's function that returns its argument. Each is
/// named before the scoped read trusts it.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_stale_collation_an_invalid_index_or_a_users_function_stops_the_scoped_plan_on_postgres() {
    let Some((db, dir, url)) = on_postgres("host_scope_index_invalid") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    let args = [
        "plan",
        "--format",
        "json",
        "--canonical-repository",
        "prgs/gitea-tools",
        "--scope",
        "host",
    ];
    for (sql, named) in [
        (
            "UPDATE pg_catalog.pg_database SET datcollversion = 'before-an-upgrade' \
             WHERE datname = pg_catalog.current_database()",
            "recorded as version before-an-upgrade",
        ),
        (
            "UPDATE pg_catalog.pg_database SET datcollversion = NULL \
             WHERE datname = pg_catalog.current_database(); \
             UPDATE pg_catalog.pg_index SET indisvalid = false \
             WHERE indexrelid = 'fleet_retire_scope_pid'::regclass",
            "invalid",
        ),
        (
            "CREATE FUNCTION same(text) RETURNS text IMMUTABLE LANGUAGE sql AS 'SELECT $1'; \
             DROP INDEX fleet_retire_scope_session; \
             CREATE INDEX fleet_retire_scope_session ON worker_registrations (same(session_id)) \
             WHERE status = 'active'",
            "same(session_id)",
        ),
    ] {
        db.client().batch_execute(sql).unwrap();
        let out = run_as(HOSTS[0], &args, (url, url, &profiles));
        let text = common::text(&out);
        assert_eq!(out.status.code(), Some(1), "{sql}: {text}");
        assert!(text.contains(named), "{sql}: {text}");
    }
}

/// Two rows of one identity by canonical text that SQLite's key holds
/// apart: a candidate's identity the text `b'x'`, and a released row of
/// another host whose identity is the blob `x` (its canonical text is
/// that very `b'x'`). The whole plan counts two rows and keeps the
/// candidate; the scoped read must fetch the blob row too.
#[test]
fn a_row_whose_identity_is_a_blob_of_the_same_text_is_read_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let scoped = plan_as(HOSTS[0], &registry, &leases, &profiles, true);
    let candidate = scoped["candidates"][0]["worker_identity"]
        .as_str()
        .unwrap()
        .to_string();
    sqlite_exec(&registry)(&format!(
        "UPDATE worker_registrations SET worker_identity = 'b''x''' \
         WHERE worker_identity = '{candidate}';
         INSERT INTO worker_registrations (worker_identity, status, host_id, session_id) \
         VALUES (X'78', 'released', '{}', 's-blob');",
        HOSTS[1]
    ));
    // Both rows render as `b'x'`: each plan's entry of this host's row.
    let mine = |plan: &serde_json::Value| -> Vec<serde_json::Value> {
        ["candidates", "preserved"]
            .iter()
            .flat_map(|list| plan[*list].as_array().unwrap().clone())
            .filter(|e| e["worker_identity"] == "b'x'" && e["evidence"]["host_id"] == HOSTS[0])
            .map(|e| e["reason_codes"].clone())
            .collect()
    };
    let whole = mine(&plan_as(HOSTS[0], &registry, &leases, &profiles, false));
    assert_eq!(whole.len(), 1, "{whole:?}");
    assert!(
        whole[0]
            .to_string()
            .contains("conflicting_identity_evidence"),
        "{whole:?}"
    );
    let scoped = mine(&plan_as(HOSTS[0], &registry, &leases, &profiles, true));
    assert_eq!(scoped, whole);
}
