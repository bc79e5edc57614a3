//! Failover under Patroni: a cluster of three PostgreSQL members run by
//! Debian's patroni with etcd, synchronous mode on, started by
//! `.ci/patroni-cluster` and stopped when the test ends, even when it
//! fails. The URL names all three members with
//! `target_session_attrs=read-write`.
//!
//! An apply acknowledged to the client just before the leader is killed
//! is on the new leader (synchronous replication: acknowledged means
//! durable), `apply-status` finds it there, and a running `serve` finds the
//! new leader and heartbeats again within seconds (the figure is printed).

mod common;

use common::patroni::*;
use common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The serve row's heartbeat stamp, read on the leader.
fn heartbeat_of(cluster: &Cluster, worker: &str) -> Option<String> {
    let mut client = ::postgres::Client::connect(&cluster.url, ::postgres::NoTls).ok()?;
    client
        .query_opt(
            "SELECT last_heartbeat_at FROM worker_registrations WHERE worker_identity = $1",
            &[&worker],
        )
        .ok()?
        .map(|r| r.get(0))
}

#[test]
#[cfg_attr(
    not(fr_patroni),
    ignore = "needs Debian's patroni, etcd-server and curl (.ci/run installs them)"
)]
fn an_acknowledged_apply_survives_a_failover_and_serve_follows_the_new_leader() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let (mut stores, live) = fleet();
    // As docs/multi-host.md sets it up: the owner copies, apply applies.
    let apply = common::roles::copied_as_documented(&stores, &cluster.url).apply;
    stores.registry = PathBuf::from(&apply);
    stores.leases = stores.registry.clone();
    let _serve = serve_heartbeating(&stores, "w-serve-failover", "sess-failover");
    let deadline = Instant::now() + Duration::from_secs(20);
    while heartbeat_of(&cluster, "w-serve-failover").is_none() {
        assert!(Instant::now() < deadline, "serve did not register");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (plan, _) = save_plan(&stores);
    let (code, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["retired_count"], 3, "{report}");
    // Acknowledged: kill the leader at once.
    let old = cluster.leader().expect("a leader");
    cluster.kill(old);
    let killed = Instant::now();
    let new = cluster
        .new_leader(old, Duration::from_secs(60))
        .expect("a new leader within 60 s");
    let elected = killed.elapsed();
    let mut client = cluster.client();
    let id = report["apply_id"].as_str().unwrap();
    let audited: i64 = client
        .query_one(
            "SELECT count(*) FROM retirement_audit WHERE apply_id = $1",
            &[&id],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        audited, 3,
        "the acknowledged apply is on the new leader (member {new})"
    );
    let status = bin()
        .args(["apply-status", id, "--registry", &cluster.url])
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", text(&status));
    // serve heartbeats on the new leader.
    let at_election = heartbeat_of(&cluster, "w-serve-failover");
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let now = heartbeat_of(&cluster, "w-serve-failover");
        if now.is_some() && now != at_election {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not heartbeat on the new leader"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "figures: leader {old} killed; member {new} elected after {:.1} s; serve heartbeating \
         on it {:.1} s after the kill",
        elected.as_secs_f64(),
        killed.elapsed().as_secs_f64()
    );
    drop(live);
}

/// The statuses of the fleet's three dead workers, and the audit rows of
/// `apply_id`, read on the leader.
fn state(url: &str, apply_id: Option<&str>) -> (Vec<String>, i64) {
    let mut client = connect(url);
    let retired: Vec<String> = client
        .query(
            "SELECT worker_identity FROM worker_registrations WHERE status = 'retired' \
             ORDER BY worker_identity",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let audited: i64 = client
        .query_one(
            "SELECT count(*) FROM retirement_audit WHERE apply_id = $1",
            &[&apply_id.unwrap_or("")],
        )
        .unwrap()
        .get(0);
    (retired, audited)
}

/// The leader killed at several moments of an apply: each trial ends
/// all-or-nothing on the new leader, as the apply says (applied: every
/// target retired with its audit row; failed: none; `outcome_unknown`:
/// whichever `apply-status` finds).
#[test]
#[cfg_attr(
    not(fr_patroni),
    ignore = "needs Debian's patroni, etcd-server and curl (.ci/run installs them)"
)]
fn the_leader_killed_during_an_apply_leaves_all_or_nothing_and_the_truth_is_told() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(cluster) = Cluster::start() else {
        return;
    };
    // 0: while apply waits for a lock another session holds (inside its
    // transaction); 1: as the apply starts. Each kill takes a member away
    // for good (three, then two; the last is the synchronous standby).
    for (trial, delay_ms) in [1000u64, 0].into_iter().enumerate() {
        let db = format!("trial{trial}");
        cluster
            .client()
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .unwrap();
        let url = cluster.url_of(&db);
        let (mut stores, live) = fleet();
        let url = common::roles::copied_as_documented(&stores, &url).apply;
        stores.registry = PathBuf::from(&url);
        stores.leases = stores.registry.clone();
        let (plan, _) = save_plan(&stores);
        cluster.wait_sync(Duration::from_secs(60));
        let mut holder = None;
        if trial == 0 {
            let mut client = connect(&url);
            client
                .batch_execute("BEGIN; LOCK TABLE worker_registrations IN EXCLUSIVE MODE")
                .unwrap();
            holder = Some(client);
        }
        let old = cluster.leader().expect("a leader");
        let child = spawn_piped(bin().args(stores.apply_args("controller-prgs")).arg(&plan));
        std::thread::sleep(Duration::from_millis(delay_ms));
        cluster.kill(old);
        let out = wait_with_deadline(child, Duration::from_secs(120));
        drop(holder);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("trial {trial}: {}", text(&out)));
        cluster
            .new_leader(old, Duration::from_secs(60))
            .expect("a new leader");
        let id = report["apply_id"].as_str();
        let (retired, audited) = state(&url, id);
        let all = ["w-dead-1", "w-dead-2", "w-dead-3"];
        match report["outcome"].as_str().unwrap() {
            "applied" => assert_eq!(
                (retired.as_slice(), audited),
                (&all.map(String::from)[..], 3)
            ),
            "outcome_unknown" => {
                let status = bin()
                    .args(["apply-status", id.unwrap(), "--registry", &url])
                    .output()
                    .unwrap();
                let committed = status.status.code() == Some(0);
                assert_eq!(committed, !retired.is_empty(), "{}", text(&status));
                assert_eq!(retired.len() as i64, audited);
                assert!(retired.is_empty() || retired.len() == 3, "{retired:?}");
            }
            _ => assert_eq!((retired.len(), audited), (0, 0), "{report}"),
        }
        eprintln!(
            "trial {trial}: leader killed {delay_ms} ms into the apply{}: {} ({} retired)",
            if trial == 0 {
                ", waiting for a lock"
            } else {
                ""
            },
            report["outcome"],
            retired.len()
        );
        drop(live);
    }
}
