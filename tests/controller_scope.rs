//! `fleet-retire controller` plans its own host's scope (issues 53 and
//! 54), and between ticks checks only which rows changed (issue 53 §3):
//! real SQLite registries, controllers as child processes, rows of
//! another host written beside this host's with `rusqlite`.

mod common;

use common::controller::*;
use common::text;
use std::time::Duration;

/// `n` active rows of another host, copies of `w-1`'s with keys of their
/// own (so none of them is a peer of this host's rows).
fn other_host_rows(registry: &std::path::Path, n: usize) {
    let conn = rusqlite::Connection::open(registry).unwrap();
    conn.execute_batch(
        "CREATE TEMP TABLE t AS SELECT * FROM worker_registrations WHERE worker_identity = 'w-1'",
    )
    .unwrap();
    for i in 0..n {
        conn.execute_batch(&format!(
            "UPDATE t SET worker_identity = 'o-{i}', host_id = 'another-host', \
             session_id = 's-o-{i}', generation_id = 'g-o-{i}', process_identity = 'p-o-{i}', \
             pid = {pid}, client_instance_id = 'inst-o-{i}';
             INSERT INTO worker_registrations SELECT * FROM t;",
            pid = 3_000_000 + i
        ))
        .unwrap();
    }
}

fn exec(registry: &std::path::Path, sql: &str) {
    rusqlite::Connection::open(registry)
        .unwrap()
        .execute_batch(sql)
        .unwrap();
}

/// The ticks a controller logged.
fn ticks(c: &Controller) -> usize {
    c.outcomes().len()
}

/// A tick reads this host's active row and nothing of the 200 rows of
/// another host; writes to those rows, and a heartbeat of its own live
/// row, cost a check that reads the changed rows and runs no tick; a
/// change of its own row runs a tick, which reads that host's scope (one
/// row) again. The resync interval is an hour, so only the signal drives.
#[test]
fn a_tick_reads_its_hosts_scope_and_a_change_elsewhere_costs_a_check() {
    let stores = stores();
    let _w = worker_with_ttl(&stores, 1, 3600);
    other_host_rows(&stores.registry, 200);
    let (c, port) = start_listening_with(&stores, "s", &["--interval", "1h"]);
    wait_for(Duration::from_secs(20), "a first tick", || ticks(&c) >= 1);
    let metric = |name: &str| sample(&get(port, "/metrics", None).1, name);
    assert_eq!(
        metric("fleet_retire_controller_last_tick_rows_read"),
        Some(1.0),
        "{}",
        std::fs::read_to_string(&c.log).unwrap()
    );
    let first = ticks(&c);
    // Elsewhere: 50 rows of the other host, then a heartbeat-only write of
    // this host's live row.
    exec(
        &stores.registry,
        "UPDATE worker_registrations SET last_heartbeat_at = last_heartbeat_at \
         WHERE worker_identity IN (SELECT worker_identity FROM worker_registrations \
         WHERE host_id = 'another-host' LIMIT 50)",
    );
    exec(
        &stores.registry,
        "UPDATE worker_registrations SET last_heartbeat_at = last_heartbeat_at \
         WHERE worker_identity = 'w-1'",
    );
    let scrape = || get(port, "/metrics", None).1;
    wait_for(Duration::from_secs(10), "a check finding changes", || {
        sample(
            &scrape(),
            "fleet_retire_controller_checks_total{found=\"elsewhere\"}",
        )
        .is_some_and(|n| n >= 1.0)
    });
    std::thread::sleep(RETRY * 4);
    assert_eq!(ticks(&c), first, "{:?}", c.outcomes());
    assert!(
        sample(&scrape(), "fleet_retire_controller_rows_read_total").unwrap() <= 1.0 + 51.0 + 1.0,
        "{}",
        scrape()
    );
    // Here: this host's row changed in what a verdict reads.
    exec(
        &stores.registry,
        "UPDATE worker_registrations SET generation_id = 'g-moved' WHERE worker_identity = 'w-1'",
    );
    wait_for(Duration::from_secs(10), "a tick after the change", || {
        ticks(&c) > first
    });
    assert_eq!(
        metric("fleet_retire_controller_last_tick_rows_read"),
        Some(1.0)
    );
}

/// A policy set that does not keep a host's scope exact (a first-stage
/// policy that reads a heartbeat: the scoped read does not fetch by it) is
/// refused at start, naming the policy and the way out; `--scope registry`
/// runs with it.
#[test]
fn a_policy_set_the_scope_cannot_keep_exact_is_refused_at_start() {
    let stores = stores();
    let folder = stores.dir.path().join("policies");
    std::fs::create_dir(&folder).unwrap();
    for name in [
        "schema.cedarschema",
        "capabilities.cedar",
        "retirement.cedar",
    ] {
        let mut text = fleet_retire::policy::embedded(name).to_string();
        if name == "retirement.cedar" {
            text.push_str(
                "\n@id(\"hold-fails-on-old-heartbeats\")\n\
                 @reason(\"conflicting_identity_evidence\")\n@order(\"10\")\n\
                 @description(\"fails on a past heartbeat\")\n\
                 forbid (principal, action == FleetRetire::Action::\"hold_session_id\", resource)\n\
                 when { resource.heartbeat_age_us + 9223372036854775807 > 0 };\n",
            );
        }
        std::fs::write(folder.join(name), text).unwrap();
    }
    let policies = folder.to_str().unwrap();
    let refused = once(&stores, "controller-prgs", &["--policies", policies]);
    let said = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    for needed in ["hold-fails-on-old-heartbeats", "--scope registry"] {
        assert!(said.contains(needed), "{needed}: {said}");
    }
    let whole = once(
        &stores,
        "controller-prgs",
        &["--policies", policies, "--scope", "registry", "--dry-run"],
    );
    assert_eq!(whole.status.code(), Some(0), "{}", text(&whole));
}

/// While the checks find nothing of the scope changed, a resync plans the
/// scope the last tick read again without reading it (0 rows), and what it
/// finds is the registry's: a worker that dies is retired by such a tick
/// (its process probed afresh), through the apply that reads the scope
/// under its lock.
#[test]
fn a_resync_with_nothing_changed_reads_nothing_and_still_retires_the_dead() {
    let stores = stores();
    let mut w = worker(&stores, 1);
    let (c, port) = start_listening_with(&stores, "r", &["--interval", "1s"]);
    wait_for(Duration::from_secs(20), "three ticks", || ticks(&c) >= 3);
    let scrape = || get(port, "/metrics", None).1;
    assert_eq!(
        sample(&scrape(), "fleet_retire_controller_last_tick_rows_read"),
        Some(0.0),
        "{}",
        std::fs::read_to_string(&c.log).unwrap()
    );
    kill_and_expire(std::slice::from_mut(&mut w));
    wait_for(Duration::from_secs(15), "the retirement", || {
        status(&stores.registry, "w-1").as_deref() == Some("retired")
    });
}
