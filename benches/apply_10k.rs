//! Benchmark: apply 10,000 approved candidates in one transaction (re-read,
//! re-plan, per-row re-probe, fence, guarded UPDATE and audit row each).
//! Target on the 2-core CI machine: median under 2 s.
//!
//! Run with `cargo bench --bench apply_10k` (APPLY_BENCH_ROWS, APPLY_BENCH_RUNS).
//!
//! A second case retires 2,000 workers over a lease store holding 20,000
//! released lease rows while a live worker heartbeats every 50 ms with a 5 s
//! busy timeout: it prints how long apply held the write lock and how many
//! heartbeats failed (the targets: under 1 s, and none).

use fleet_retire::apply::{apply, Hooks, Outcome, Request};

mod common;
use fleet_retire::evidence::leases::{self, Protections};
use fleet_retire::evidence::probe::{pid_alive, HostFacts, SystemProbe};
use fleet_retire::evidence::registry;
use fleet_retire::observe::RunFacts;
use fleet_retire::plan::plan;
use fleet_retire::policy::{Policies, PolicySource};
use rusqlite::{params, Connection};
use std::path::Path;
use std::time::{Duration, Instant};

fn generate(dir: &Path, rows: usize, released_leases: usize, host: &str, boot: &str) {
    // The registry schema as a worker creates it.
    let conn = fleet_retire::worker::open(&dir.join("registry.sqlite")).unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    {
        let mut stmt = tx
            .prepare(
                "INSERT INTO worker_registrations (worker_identity, client_name, client_instance_id,
                 instance_id_source, session_id, generation_id, role, profile, namespace, remote,
                 repository_binding, pid, started_at, last_heartbeat_at, heartbeat_ttl_seconds,
                 fencing_epoch, status, host_id, boot_id, process_start_time)
                 VALUES (?1, 'codex', ?2, 'launcher', ?3, ?4, 'author', 'author-prgs', 'author', 'prgs',
                 'prgs/gitea-tools', ?5, '2026-01-01T00:00:00Z', '2026-01-01T00:10:00Z', 900, 1,
                 'active', ?6, ?7, ?8)",
            )
            .unwrap();
        let mut pid = 4_000_000i64;
        for i in 0..rows {
            while pid_alive(pid) != Some(false) {
                pid += 1;
            }
            stmt.execute(params![
                format!("w-{i:06}"),
                format!("inst-codex-20260101T000000Z-{i:012x}"),
                format!("sess-{i:08}"),
                format!("gen-{i:08}"),
                pid,
                host,
                boot,
                format!("ticks-{i}"),
            ])
            .unwrap();
            pid += 1;
        }
    }
    tx.commit().unwrap();
    Connection::open(dir.join("leases.sqlite"))
        .unwrap()
        .execute_batch(&format!(
            "{};
             INSERT INTO workflow_leases (lease_id, status, owner_worker_identity) VALUES ('l-1', 'active', 'someone-else');",
            fleet_retire::store::leases::create_sql()
        ))
        .unwrap();
    let leases = Connection::open(dir.join("leases.sqlite")).unwrap();
    let tx = leases.unchecked_transaction().unwrap();
    for i in 0..released_leases {
        tx.execute(
            "INSERT INTO workflow_leases (lease_id, role, target, status, session_id, owner_pid,
             owner_worker_identity, acquired_at, expires_at)
             VALUES (?1, 'author', 'issue', 'released', ?2, ?3, ?4, '2026-01-01T00:00:00Z', '2026-01-01T01:00:00Z')",
            params![format!("l-old-{i}"), format!("sess-{:08}", i % 7919), 7_000_000 + i as i64, format!("w-{:06}", i % 997)],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    std::fs::write(
        dir.join("profiles.json"),
        r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}}"#,
    )
    .unwrap();
}

/// Plan the stores and request every candidate.
fn plan_and_request(
    reg: &Path,
    lease_path: &Path,
    host: &HostFacts,
    policies: &Policies,
    probe: &SystemProbe,
    max_retire: usize,
) -> (fleet_retire::plan::Plan, Request) {
    let p = plan(
        registry::load(reg).unwrap(),
        RunFacts {
            now: fleet_retire::time::now(),
            host: host.clone(),
            canonical_repository: Some("prgs/gitea-tools".into()),
            protections: Protections::from_leases(&leases::load(lease_path).unwrap()),
            active_leases: Vec::new(),
        },
        probe,
        policies,
    )
    .unwrap();
    let req = common::request_for(&p, max_retire);
    (p, req)
}

fn main() {
    ten_thousand();
    under_load();
}

/// 2,000 targets, 20,000 released lease rows, a live worker heartbeating.
fn under_load() {
    let (rows, released) = (2_000, 20_000);
    let dir = tempfile::tempdir().unwrap();
    let facts_host = HostFacts::observe(Path::new("/proc"));
    let (Some(host), Some(boot)) = (facts_host.host_id.clone(), facts_host.boot_id.clone()) else {
        return;
    };
    generate(dir.path(), rows, released, &host, &boot);
    let reg = dir.path().join("registry.sqlite");
    let lease_path = dir.path().join("leases.sqlite");
    // A live worker's row, outside the plan's candidates.
    let beat = Connection::open(&reg).unwrap();
    beat.execute(
        "INSERT INTO worker_registrations (worker_identity, status, last_heartbeat_at) VALUES ('w-live', 'active', ?1)",
        [fleet_retire::time::format_ts(fleet_retire::time::now())],
    )
    .unwrap();
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let probe = SystemProbe::new("/proc");
    let (p, req) = plan_and_request(&reg, &lease_path, &facts_host, &policies, &probe, rows);
    assert_eq!(req.workers.len(), rows);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let heartbeats = {
        let (stop, reg) = (stop.clone(), reg.clone());
        std::thread::spawn(move || {
            let conn = Connection::open(&reg).unwrap();
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            let (mut ok, mut failed, mut worst) = (0u32, 0u32, Duration::ZERO);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t = Instant::now();
                match conn.execute(
                    "UPDATE worker_registrations SET last_heartbeat_at = ?1 WHERE worker_identity = 'w-live'",
                    [fleet_retire::time::format_ts(fleet_retire::time::now())],
                ) {
                    Ok(_) => ok += 1,
                    Err(_) => failed += 1,
                }
                worst = worst.max(t.elapsed());
                std::thread::sleep(Duration::from_millis(50));
            }
            (ok, failed, worst)
        })
    };
    std::thread::sleep(Duration::from_millis(2100));
    let profiles = dir.path().join("profiles.json");
    let ctx = common::apply_context(&reg, &lease_path, &profiles, &policies, &probe);
    // The heartbeats move the registry token: apply with the plan's rows,
    // as a saved plan would.
    let req = Request {
        planned: Some(std::sync::Arc::new(
            fleet_retire::plan::planned::PlannedRows::of(&p),
        )),
        first: None,
        ..req
    };
    let started = Instant::now();
    let report = apply(&req, &ctx, Hooks::default()).unwrap();
    let total = started.elapsed();
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, failed, worst) = heartbeats.join().unwrap();
    println!(
        "apply under load: {} of {rows} retired ({:?}) over {released} released lease rows; \
         lock held {} ms (apply {:.3} s); heartbeats every 50 ms: {ok} ok, {failed} failed, \
         slowest {:.0} ms",
        report.retired_count,
        report.outcome,
        report.lock_held_ms,
        total.as_secs_f64(),
        worst.as_secs_f64() * 1000.0
    );
}

fn ten_thousand() {
    let rows: usize = std::env::var("APPLY_BENCH_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let runs: usize = std::env::var("APPLY_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().unwrap();
    let facts_host = HostFacts::observe(Path::new("/proc"));
    let (Some(host), Some(boot)) = (facts_host.host_id.clone(), facts_host.boot_id.clone()) else {
        println!("apply_10k: skipped, this machine's host or boot id is unknown");
        return;
    };
    let template = dir.path().join("template");
    std::fs::create_dir_all(&template).unwrap();
    generate(&template, rows, 0, &host, &boot);
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let probe = SystemProbe::new("/proc");

    for run in 0..runs {
        let work = dir.path().join(format!("run-{run}"));
        std::fs::create_dir_all(&work).unwrap();
        for f in ["registry.sqlite", "leases.sqlite", "profiles.json"] {
            std::fs::copy(template.join(f), work.join(f)).unwrap();
        }
    }
    // An operator's profiles.json is not seconds old: apply trusts an
    // unchanged stat of an older file instead of reading it before every
    // write (a just-written one is read every time).
    std::thread::sleep(Duration::from_millis(2100));
    let mut times = Vec::new();
    for run in 0..runs {
        let work = dir.path().join(format!("run-{run}"));
        let reg = work.join("registry.sqlite");
        let lease_path = work.join("leases.sqlite");
        let (_, req) = plan_and_request(&reg, &lease_path, &facts_host, &policies, &probe, rows);
        assert_eq!(
            req.workers.len(),
            rows,
            "every generated row is a candidate"
        );
        let profiles = work.join("profiles.json");
        let ctx = common::apply_context(&reg, &lease_path, &profiles, &policies, &probe);
        let start = Instant::now();
        let report = apply(&req, &ctx, Hooks::default()).unwrap();
        times.push(start.elapsed().as_secs_f64());
        assert_eq!(report.outcome, Outcome::Applied, "{}", report.detail);
        eprintln!(
            "  run {run}: {:.3} s, of which the write lock {} ms",
            times[times.len() - 1],
            report.lock_held_ms
        );
        assert_eq!(report.retired_count, rows);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "apply_10k: rows={rows} runs={runs} median={:.3}s min={:.3}s max={:.3}s",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1]
    );
}
