//! The failover window: while a cluster elects a leader no member takes
//! writes, and a command connecting then waits for one (a bounded time)
//! instead of failing at once. Shown with a URL that asks for a writable
//! member at a port where nothing listens until, two seconds later, a
//! proxy to the real server opens there; a URL naming one server without
//! asking for a writable member fails at once, as a wrong port should.

mod common;

use common::pgproxy::{Lose, PgProxy};
use common::*;
use std::time::{Duration, Instant};

fn plan_at(stores: &Stores, url: &str, wait: &str) -> KillOnDrop {
    spawn_piped(
        bin()
            .args(stores_at(stores.plan_args("controller-prgs"), url))
            .env("FLEET_RETIRE_PG_FAILOVER_WAIT", wait),
    )
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_command_waits_for_a_writable_member_for_a_bounded_time() {
    let Some((stores, live, db)) = pg_fleet("election") else {
        return;
    };
    let port = free_port();
    let url = db.at_port(port, "?target_session_attrs=read-write");

    // Nothing there, and the wait is bounded: an error after it.
    let started = Instant::now();
    let out = wait_with_deadline(plan_at(&stores, &url, "2"), Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("cannot connect"), "{}", text(&out));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
        "{took:?}"
    );

    // A member answers two seconds in: the plan goes through.
    let started = Instant::now();
    let child = plan_at(&stores, &url, "20");
    std::thread::sleep(Duration::from_secs(2));
    let proxy = PgProxy::start_on(port, db.host_port(), Lose::Reply);
    let out = wait_with_deadline(child, Duration::from_secs(40));
    assert!(out.status.success(), "{}", text(&out));
    assert!(started.elapsed() >= Duration::from_secs(2));
    drop(proxy);

    // One server, no writable member asked for: no wait by default.
    let single = db.at_port(free_port(), "");
    let started = Instant::now();
    let out = bin()
        .args(stores_at(stores.plan_args("controller-prgs"), &single))
        .env_remove("FLEET_RETIRE_PG_FAILOVER_WAIT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(live);
}
