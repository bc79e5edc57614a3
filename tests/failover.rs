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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn plan_at(stores: &Stores, url: &str, wait: &str) -> KillOnDrop {
    let mut args = stores.plan_args("controller-prgs");
    for (i, a) in args.clone().iter().enumerate() {
        if a == "--registry" || a == "--leases" {
            args[i + 1] = url.to_string();
        }
    }
    KillOnDrop(
        bin()
            .args(&args)
            .env("FLEET_RETIRE_PG_FAILOVER_WAIT", wait)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn a_command_waits_for_a_writable_member_for_a_bounded_time() {
    let Some((stores, live, db)) = pg_fleet("election") else {
        return;
    };
    let after = db.url.split_once('@').map_or(db.url.as_str(), |(_, h)| h);
    let upstream = after.split('/').next().unwrap().to_string();
    let (user, rest) = db.url.split_once('@').unwrap();
    let name = rest.rsplit('/').next().unwrap();
    let port = free_port();
    let url = format!("{user}@127.0.0.1:{port}/{name}?target_session_attrs=read-write");

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
    let proxy = PgProxy::start_on(port, upstream, Lose::Reply);
    let out = wait_with_deadline(child, Duration::from_secs(40));
    assert!(out.status.success(), "{}", text(&out));
    assert!(started.elapsed() >= Duration::from_secs(2));
    drop(proxy);

    // One server, no writable member asked for: no wait by default.
    let single = format!("{user}@127.0.0.1:{}/{name}", free_port());
    let started = Instant::now();
    let mut args = stores.plan_args("controller-prgs");
    for (i, a) in args.clone().iter().enumerate() {
        if a == "--registry" || a == "--leases" {
            args[i + 1] = single.clone();
        }
    }
    let out = bin()
        .args(&args)
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
