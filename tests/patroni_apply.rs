//! Apply under Patroni where the failure lands inside it: the COMMIT's
//! reply lost between apply and the leader (a proxy of ours,
//! `common::pgproxy`), and the leader SIGKILLed just before the write of
//! a 200-target apply and between its write and its COMMIT (the effect
//! check). Each trial ends all-or-nothing on the new leader, as the apply
//! says; `outcome_unknown` is settled by `apply-status` there. After each
//! kill the old leader is started again and rejoins, so every trial has
//! three members.

mod common;

use common::patroni::*;
use common::pgproxy::{Lose, PgProxy};
use common::*;
use fleet_retire::apply::{Hooks, Outcome};
use std::path::PathBuf;
use std::time::Duration;

/// A database `db` on the cluster holding `targets` dead workers and one
/// live one; the stores (registry and leases there) and the live guard.
fn fleet_on(cluster: &Cluster, db: &str, targets: usize) -> (Stores, KillOnDrop, String) {
    cluster
        .client()
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .unwrap();
    let url = cluster.url_of(db);
    let live = KillOnDrop(spawn_sleeper());
    let mut rows: Vec<serde_json::Value> = (0..targets)
        .map(|i| {
            let (pid, start) = dead_process();
            stale_row(&format!("w-dead-{i:03}"), pid, &start)
        })
        .collect();
    rows.push(stale_row(
        "w-running",
        live.id() as i64,
        &start_time(live.id()),
    ));
    let mut stores = Stores::new(&rows);
    // As docs/multi-host.md sets it up: the owner copies, apply applies.
    let url = common::roles::copied_as_documented(&stores, &url).apply;
    stores.registry = PathBuf::from(&url);
    stores.leases = stores.registry.clone();
    (stores, live, url)
}

/// Retired rows and this apply's audit rows, on the leader.
fn counted(url: &str, apply_id: &str) -> (i64, i64) {
    let mut c = connect(url);
    let retired: i64 = c
        .query_one(
            "SELECT count(*) FROM worker_registrations WHERE status = 'retired'",
            &[],
        )
        .unwrap()
        .get(0);
    let audited: i64 = c
        .query_one(
            "SELECT count(*) FROM retirement_audit WHERE apply_id = $1",
            &[&apply_id],
        )
        .unwrap()
        .get(0);
    (retired, audited)
}

/// `apply-status` on the cluster: whether it says committed.
fn status_says_committed(url: &str, apply_id: &str) -> bool {
    let out = bin()
        .args(["apply-status", apply_id, "--registry", url])
        .output()
        .unwrap();
    assert!(matches!(out.status.code(), Some(0 | 2)), "{}", text(&out));
    out.status.code() == Some(0)
}

#[test]
#[cfg_attr(
    not(fr_patroni),
    ignore = "needs Debian's patroni, etcd-server and curl (.ci/run installs them)"
)]
fn a_lost_commit_reply_and_kills_inside_an_apply_leave_all_or_nothing_as_told() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(cluster) = Cluster::start() else {
        return;
    };
    lost_commit_reply(&cluster);
    for (trial, at) in ["before the write", "before COMMIT"]
        .into_iter()
        .enumerate()
    {
        killed_inside(&cluster, trial, at);
    }
}

/// The COMMIT reaches the leader through the proxy, whose reply never
/// reaches apply; then the leader dies. apply says `outcome_unknown` (exit
/// 5) and `apply-status` on the new leader tells what the cluster holds.
fn lost_commit_reply(cluster: &Cluster) {
    let (mut stores, live, url) = fleet_on(cluster, "lostreply", 3);
    let (plan, _) = save_plan(&stores);
    let old = cluster.leader().expect("a leader");
    let proxy = PgProxy::start(format!("127.0.0.1:{}", cluster.port_of(old)), Lose::Reply);
    let through = url
        .replacen(&cluster.hosts(), &format!("127.0.0.1:{}", proxy.port), 1)
        .replacen("?target_session_attrs=read-write", "", 1);
    stores.registry = PathBuf::from(&through);
    stores.leases = stores.registry.clone();
    let (code, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_eq!(
        (code, report["outcome"].as_str()),
        (Some(5), Some("outcome_unknown")),
        "{report}"
    );
    let id = report["apply_id"].as_str().unwrap().to_string();
    cluster.kill(old);
    cluster
        .new_leader(old, Duration::from_secs(60))
        .expect("a new leader");
    let committed = status_says_committed(&url, &id);
    let (retired, audited) = counted(&url, &id);
    assert_eq!((retired, audited), if committed { (3, 3) } else { (0, 0) });
    eprintln!("lost reply: outcome_unknown; apply-status on the new leader: committed {committed}");
    cluster.restart(old, Duration::from_secs(90));
    drop(live);
}

/// A 200-target apply through the library, the leader killed from a hook
/// at `at`: nothing commits, and apply says so.
fn killed_inside(cluster: &Cluster, trial: usize, at: &str) {
    let (stores, live, url) = fleet_on(cluster, &format!("killed{trial}"), 200);
    let lib = Lib::new(stores);
    let mut req = lib.request();
    req.max_retire = 500;
    assert_eq!(req.workers.len(), 200);
    let old = cluster.leader().expect("a leader");
    let killed = std::cell::Cell::new(false);
    let mut kill = || {
        cluster.kill(old);
        killed.set(true);
    };
    let hooks = if trial == 0 {
        Hooks {
            before_first_write: Some(&mut kill),
            ..Default::default()
        }
    } else {
        Hooks {
            before_commit: Some(&mut kill),
            ..Default::default()
        }
    };
    let report = lib.run(&req, hooks);
    assert!(
        killed.get(),
        "apply ended before the kill: {:?}: {}",
        report.outcome,
        report.detail
    );
    cluster
        .new_leader(old, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no new leader after a kill {at}: {}", cluster.logs()));
    let id = report.apply_id.clone().unwrap_or_default();
    let (retired, audited) = counted(&url, &id);
    match report.outcome {
        Outcome::OutcomeUnknown => {
            let committed = status_says_committed(&url, &id);
            assert_eq!(
                (retired, audited),
                if committed { (200, 200) } else { (0, 0) }
            );
        }
        Outcome::Applied => panic!("applied after its leader died {at}: {}", report.detail),
        _ => assert_eq!(
            (retired, audited),
            (0, 0),
            "{:?}: {}",
            report.outcome,
            report.detail
        ),
    }
    eprintln!(
        "leader killed {at}: {:?} ({retired} retired)",
        report.outcome
    );
    cluster.restart(old, Duration::from_secs(90));
    drop(live);
}

/// What one apply of the history said.
#[derive(Debug)]
struct Told {
    outcome: String,
    apply_id: Option<String>,
    retired: i64,
}

/// Plan and apply `--first 4` through the binary, on the cluster URL,
/// until `until`; every report kept.
fn applier(stores: &Stores, until: std::time::Instant, who: usize) -> Vec<Told> {
    let mut told = Vec::new();
    let plan = stores.dir.path().join(format!("plan-{who}.json"));
    while std::time::Instant::now() < until {
        let mut args = stores.plan_args("controller-prgs");
        args.extend(["--out".into(), plan.display().to_string()]);
        let planned = wait_with_deadline(spawn_piped(bin().args(&args)), Duration::from_secs(120));
        if !planned.status.success() {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let child = spawn_piped(
            bin()
                .args(stores.apply_args("controller-prgs"))
                .arg(&plan)
                .args(["--first", "4", "--max-retire", "1000"]),
        );
        let out = wait_with_deadline(child, Duration::from_secs(120));
        let Ok(report) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            continue; // refused before a report (a usage error would fail below)
        };
        told.push(Told {
            outcome: report["outcome"].as_str().unwrap_or("").to_string(),
            apply_id: report["apply_id"].as_str().map(String::from),
            retired: report["retired_count"].as_i64().unwrap_or(0),
        });
    }
    told
}

/// The history check: two appliers and twenty heartbeating workers while
/// the leader is killed (and started again) three times; then, on the
/// leader, every retired row has exactly one audit row, every apply
/// reported `applied` is there whole, every apply reported otherwise left
/// nothing, every `outcome_unknown` is what `apply-status` says, and no
/// live worker was retired.
#[test]
#[cfg_attr(
    not(fr_patroni),
    ignore = "needs Debian's patroni, etcd-server and curl (.ci/run installs them)"
)]
fn concurrent_appliers_and_workers_through_repeated_failovers_keep_the_history_true() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(cluster) = Cluster::start() else {
        return;
    };
    // Enough dead workers that the appliers, four at a time, are still at
    // work through the last failover.
    let (mut stores, live, url) = fleet_on(&cluster, "history", 900);
    let as_workers = common::roles::url_as(&url, "fleet_workers");
    let workers = add_live_workers(&as_workers, 20);
    stores.registry = PathBuf::from(&url);
    let until = std::time::Instant::now() + Duration::from_secs(75);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (told, failovers) = std::thread::scope(|s| {
        let beats: Vec<_> = workers
            .iter()
            .map(|w| s.spawn(|| beat(&as_workers, w, &stop)))
            .collect();
        let appliers: Vec<_> = (0..2)
            .map(|who| {
                s.spawn({
                    let stores = &stores;
                    move || applier(stores, until, who)
                })
            })
            .collect();
        let mut failovers = 0;
        while std::time::Instant::now() + Duration::from_secs(25) < until {
            std::thread::sleep(Duration::from_secs(6));
            let old = cluster.leader().expect("a leader");
            cluster.kill(old);
            cluster
                .new_leader(old, Duration::from_secs(60))
                .expect("a new leader");
            cluster.restart(old, Duration::from_secs(90));
            failovers += 1;
        }
        let told: Vec<Told> = appliers
            .into_iter()
            .flat_map(|a| a.join().unwrap())
            .collect();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for b in beats {
            b.join().unwrap();
        }
        (told, failovers)
    });
    check_history(&url, &told, &workers);
    let mut by_outcome = std::collections::BTreeMap::new();
    for t in &told {
        *by_outcome.entry(t.outcome.as_str()).or_insert(0) += 1;
    }
    eprintln!(
        "history: {failovers} failovers, {} applies: {by_outcome:?}",
        told.len()
    );
    assert!(
        failovers >= 2 && told.iter().any(|t| t.outcome == "applied"),
        "{told:?}"
    );
    drop(live);
}

/// `n` live workers of this process (its pid), each in an instance slot of
/// its own, heartbeating.
fn add_live_workers(url: &str, n: usize) -> Vec<String> {
    let me = std::process::id();
    let start = start_time(me);
    let mut c = connect(url);
    (0..n)
        .map(|i| {
            let id = format!("w-live-{i:02}");
            let row = stale_row(&id, i64::from(me), &start);
            c.execute(
                "INSERT INTO worker_registrations SELECT * FROM \
                 jsonb_populate_record(NULL::worker_registrations, $1::text::jsonb)",
                &[&row.to_string()],
            )
            .unwrap();
            c.execute(
                "UPDATE worker_registrations SET last_heartbeat_at = $2, \
                 client_instance_id = $3 WHERE worker_identity = $1",
                &[
                    &id,
                    &fleet_retire::time::format_ts(fleet_retire::time::now()),
                    &format!("inst-codex-20261205T000000Z-{i:012x}"),
                ],
            )
            .unwrap();
            id
        })
        .collect()
}

/// Heartbeat `worker` every 300 ms until `stop`; failures while no member
/// takes writes are expected and retried.
fn beat(url: &str, worker: &str, stop: &std::sync::atomic::AtomicBool) {
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let _ = fleet_retire::worker::heartbeat(
            std::path::Path::new(url),
            worker,
            fleet_retire::worker::Writer::Owner,
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The history's invariants, read on the leader.
fn check_history(url: &str, told: &[Told], workers: &[String]) {
    let mut c = connect(url);
    let twice: i64 = c
        .query_one(
            "SELECT count(*) FROM (SELECT worker_identity FROM retirement_audit \
             GROUP BY worker_identity HAVING count(*) <> 1) d",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(twice, 0, "a worker audited more than once");
    let unaudited: i64 = c
        .query_one(
            "SELECT count(*) FROM worker_registrations r WHERE r.status = 'retired' AND NOT EXISTS \
             (SELECT 1 FROM retirement_audit a WHERE a.worker_identity = r.worker_identity)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(unaudited, 0, "a retired row without its audit row");
    for t in told {
        let Some(id) = t.apply_id.as_deref() else {
            continue;
        };
        let (_, audited) = counted(url, id);
        match t.outcome.as_str() {
            "applied" => assert_eq!(audited, t.retired, "{t:?}"),
            "outcome_unknown" => {
                let committed = status_says_committed(url, id);
                assert_eq!(committed, audited > 0, "{t:?}");
            }
            _ => assert_eq!(audited, 0, "{t:?}"),
        }
    }
    for w in workers {
        let status: String = c
            .query_one(
                "SELECT status FROM worker_registrations WHERE worker_identity = $1",
                &[w],
            )
            .unwrap()
            .get(0);
        assert_eq!(status, "active", "live worker {w} was retired");
    }
}
