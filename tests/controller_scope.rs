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
    let folder = common::policies_failing_the_scope_precondition(stores.dir.path());
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

/// While nothing changes, a resync does not plan the scope again: it
/// compares what the last full judgement rested on (the processes it
/// probed, the leases, the host's facts), reads nothing, and counts
/// `ticks_total{outcome="unchanged"}`. That cheap look still sees a death:
/// a worker whose real process is killed is retired within about an
/// interval, by a full judgement and the apply that reads the scope under
/// its lock.
#[test]
fn a_resync_with_nothing_changed_skips_planning_and_still_retires_the_dead() {
    let stores = stores();
    let mut w = worker(&stores, 1);
    let (c, port) = start_listening_with(&stores, "r", &["--interval", "1s"]);
    let scrape = || get(port, "/metrics", None).1;
    let unchanged = || {
        sample(
            &scrape(),
            "fleet_retire_controller_ticks_total{outcome=\"unchanged\"}",
        )
        .unwrap_or(0.0)
    };
    wait_for(Duration::from_secs(20), "two resyncs that skip", || {
        unchanged() >= 2.0
    });
    assert_eq!(
        sample(&scrape(), "fleet_retire_controller_last_tick_rows_read"),
        Some(0.0),
        "{}",
        std::fs::read_to_string(&c.log).unwrap()
    );
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("active"));
    kill_and_expire(std::slice::from_mut(&mut w));
    let took = wait_for(Duration::from_secs(10), "the retirement", || {
        status(&stores.registry, "w-1").as_deref() == Some("retired")
    });
    eprintln!("retired {took:?} after the kill and the heartbeat's expiry");
    assert!(
        c.outcomes().iter().any(|o| o == "applied"),
        "{:?}",
        c.outcomes()
    );
}

/// A change of own rows that leaves the scope's keys as they were is
/// patched into the kept scope: the tick it causes reads the changed rows
/// (the check's), not the scope. A change of a key (a new generation)
/// reads the scope again.
#[test]
fn a_tick_after_own_rows_changed_reads_those_rows_only() {
    let stores = stores();
    let _w: Vec<_> = (1..=3).map(|n| worker_with_ttl(&stores, n, 3600)).collect();
    let (c, port) = start_listening_with(&stores, "p", &["--interval", "1h"]);
    wait_for(Duration::from_secs(20), "a first tick", || ticks(&c) >= 1);
    let read = || {
        sample(
            &get(port, "/metrics", None).1,
            "fleet_retire_controller_last_tick_rows_read",
        )
    };
    assert_eq!(
        read(),
        Some(3.0),
        "{}",
        std::fs::read_to_string(&c.log).unwrap()
    );
    for (sql, rows) in [
        (
            "UPDATE worker_registrations SET fleet_run_id = 'run-a' WHERE worker_identity = 'w-2'",
            1.0,
        ),
        (
            "UPDATE worker_registrations SET fleet_run_id = 'run-b' \
             WHERE worker_identity IN ('w-1', 'w-3')",
            2.0,
        ),
        (
            "UPDATE worker_registrations SET generation_id = 'g-new' WHERE worker_identity = 'w-2'",
            3.0,
        ),
    ] {
        let before = ticks(&c);
        exec(&stores.registry, sql);
        wait_for(Duration::from_secs(10), "a tick after the change", || {
            ticks(&c) > before
        });
        assert_eq!(read(), Some(rows), "{sql}: {:?}", c.outcomes());
    }
}
