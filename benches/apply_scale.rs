//! Benchmark: apply at scale while twenty workers heartbeat (issue 33).
//!
//! For each size (APPLY_SCALE_ROWS, default `100000,1000000`): a realistic
//! registry from `../shared/bench/gen_registry.py`, plus twenty live
//! workers of this process. On each engine (SQLite; PostgreSQL too when
//! FLEET_RETIRE_TEST_POSTGRES names a cluster, as the tests), the twenty
//! heartbeat their own rows every 200 ms through
//! `fleet_retire::worker::heartbeat` (a 5 s busy timeout on SQLite) while a
//! plan is made and saved (its planned rows kept), and then while
//! `--first 2000` of its candidates (APPLY_SCALE_TARGETS) are applied. It
//! prints the apply's outcome, `lock_held_ms`, how it read the registry
//! under the lock, and the heartbeats' latency during the apply (p50, p99,
//! slowest) and failures.
//!
//! The SQLite registry keeps row versions, as one made by `registry create`
//! or after a first apply does (`docs/apply.md`).
//!
//! Run with `cargo bench --bench apply_scale`.

use common::{percentile, Db};
use fleet_retire::apply::{apply, Hooks, Report};
use fleet_retire::evidence::probe::SystemProbe;
use fleet_retire::policy::{Policies, PolicySource};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

const WRITERS: usize = 20;

/// One engine's copy of a generated registry.
struct Location {
    engine: &'static str,
    registry: PathBuf,
    leases: PathBuf,
    _db: Option<Db>,
}

fn main() {
    let generator = Path::new("../shared/bench/gen_registry.py");
    if !generator.is_file() {
        println!("apply_scale: skipped, {} is not here", generator.display());
        return;
    }
    let sizes: Vec<usize> = std::env::var("APPLY_SCALE_ROWS")
        .unwrap_or_else(|_| "100000,1000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let targets: usize = std::env::var("APPLY_SCALE_TARGETS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let admin = std::env::var("FLEET_RETIRE_TEST_POSTGRES").ok();
    if admin.is_none() {
        println!("apply_scale: PostgreSQL skipped, FLEET_RETIRE_TEST_POSTGRES is not set");
    }
    for rows in sizes {
        let dir = tempfile::tempdir().unwrap();
        generate(generator, rows, dir.path());
        let writers = add_writers(&dir.path().join("registry.sqlite"));
        let mut locations = vec![sqlite_copy(dir.path())];
        if let Some(admin) = &admin {
            locations.push(postgres_copy(admin, dir.path(), rows));
        }
        for at in &locations {
            run(at, rows, targets, &writers, dir.path());
        }
    }
}

fn generate(generator: &Path, rows: usize, dir: &Path) {
    let started = Instant::now();
    let status = Command::new("python3")
        .arg(generator)
        .args(["--rows", &rows.to_string(), "--out"])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "gen_registry failed");
    std::fs::write(
        dir.join("profiles.json"),
        r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}}"#,
    )
    .unwrap();
    println!(
        "apply_scale: {rows} rows generated in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The registry migrated to every column this version writes (as a first
/// apply leaves it), and twenty live workers of this process heartbeating
/// now; their identities.
fn add_writers(registry: &Path) -> Vec<String> {
    let me = i64::from(std::process::id());
    let start = fleet_retire::evidence::probe::process_start_time(Path::new("/proc"), me);
    let host = fleet_retire::evidence::probe::HostFacts::observe(Path::new("/proc"));
    let now = fleet_retire::time::format_ts(fleet_retire::time::now());
    let conn = rusqlite::Connection::open(registry).unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    // Every column this version writes, as after a first apply.
    fleet_retire::store::registry::add_missing_columns(&tx, registry).unwrap();
    let ids: Vec<String> = (0..WRITERS).map(|i| format!("w-writer-{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        tx.execute(
            "INSERT INTO worker_registrations (worker_identity, client_name, client_instance_id,
             instance_id_source, session_id, generation_id, role, profile, namespace, remote,
             repository_binding, pid, started_at, last_heartbeat_at, heartbeat_ttl_seconds,
             fencing_epoch, status, host_id, boot_id, process_start_time, pid_namespace)
             VALUES (?1, 'codex', ?2, 'launcher', ?3, ?4, 'author', 'author-prgs', 'author',
             'prgs', 'prgs/gitea-tools', ?5, ?6, ?6, 900.0, 1, 'active', ?7, ?8, ?9, ?10)",
            rusqlite::params![
                id,
                format!("inst-codex-20261204T000000Z-{i:012x}"),
                format!("sess-writer-{i}"),
                format!("gen-writer-{i}"),
                me,
                now,
                host.host_id,
                host.boot_id,
                start,
                host.pid_namespace,
            ],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    ids
}

/// The SQLite registry as it is in steady state: with row versions.
fn sqlite_copy(dir: &Path) -> Location {
    let registry = dir.join("registry-sqlite.sqlite");
    std::fs::copy(dir.join("registry.sqlite"), &registry).unwrap();
    let conn = rusqlite::Connection::open(&registry).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    fleet_retire::store::sqlite::versions::install(&conn).unwrap();
    conn.execute_batch("COMMIT").unwrap();
    Location {
        engine: "sqlite",
        registry,
        leases: dir.join("leases.sqlite"),
        _db: None,
    }
}

fn postgres_copy(admin: &str, dir: &Path, rows: usize) -> Location {
    let db = Db::new(admin, &format!("scale{rows}"));
    let started = Instant::now();
    fleet_retire::copy::copy(
        &dir.join("registry.sqlite"),
        Some(&dir.join("leases.sqlite")),
        &db.url,
    )
    .unwrap();
    println!(
        "apply_scale: copied to PostgreSQL in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let url = PathBuf::from(&db.url);
    Location {
        engine: "postgres",
        registry: url.clone(),
        leases: url,
        _db: Some(db),
    }
}

/// Heartbeat latencies before (0) and during (1) the apply, and failures.
type Beats = ([Vec<Duration>; 2], usize);

fn run(at: &Location, rows: usize, targets: usize, writers: &[String], dir: &Path) {
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let probe = SystemProbe::new("/proc");
    let phase = Arc::new(AtomicUsize::new(0));
    let beats: Vec<_> = writers
        .iter()
        .map(|w| start_writer(w.clone(), &at.registry, &phase))
        .collect();
    let started = Instant::now();
    let req = common::plan_and_request(&at.registry, &at.leases, &policies, targets, Some(targets));
    let planned_in = started.elapsed();
    let profiles = dir.join("profiles.json");
    let ctx = common::apply_context(&at.registry, &at.leases, &profiles, &policies, &probe);
    std::thread::sleep(Duration::from_millis(500));
    phase.store(1, Ordering::SeqCst);
    let started = Instant::now();
    let report = apply(&req, &ctx, Hooks::default()).unwrap();
    let took = started.elapsed();
    phase.store(2, Ordering::SeqCst);
    let (during, failed) = join(beats);
    print_run(at.engine, rows, planned_in, took, &report);
    println!(
        "  heartbeats during the apply: {} beats of {WRITERS} writers every 200 ms, p50 {:.1} ms, \
         p99 {:.1} ms, slowest {:.1} ms, failed {failed}",
        during.len(),
        percentile(&during, 0.5),
        percentile(&during, 0.99),
        percentile(&during, 1.0)
    );
}

fn print_run(engine: &str, rows: usize, planned_in: Duration, took: Duration, report: &Report) {
    let read = serde_json::to_value(&report.read_under_lock).unwrap();
    println!(
        "apply_scale {engine}, {rows} rows: {:?}, {} retired, lock_held_ms {}, read under the \
         lock: {} {} rows{}; plan {:.2} s, apply {:.2} s, {} heartbeats tolerated",
        report.outcome,
        report.retired_count,
        report.lock_held_ms,
        read["scope"].as_str().unwrap_or("-"),
        read["rows"],
        read["why"]
            .as_str()
            .map(|w| format!(" ({w})"))
            .unwrap_or_default(),
        planned_in.as_secs_f64(),
        took.as_secs_f64(),
        report.heartbeats_tolerated
    );
    if !report.success || report.retired_count == 0 {
        println!("  detail: {}", report.detail);
    }
}

/// A thread heartbeating worker `w` every 200 ms until `phase` is 2,
/// timing each beat under the phase it began in.
fn start_writer(
    w: String,
    registry: &Path,
    phase: &Arc<AtomicUsize>,
) -> std::thread::JoinHandle<Beats> {
    let (phase, registry) = (phase.clone(), registry.to_path_buf());
    std::thread::spawn(move || {
        let mut seen: Beats = ([Vec::new(), Vec::new()], 0);
        loop {
            let now = phase.load(Ordering::SeqCst);
            if now == 2 {
                break;
            }
            let t = Instant::now();
            match fleet_retire::worker::heartbeat(
                &registry,
                &w,
                fleet_retire::worker::Writer::Owner,
            ) {
                Ok(_) => seen.0[now].push(t.elapsed()),
                Err(e) => {
                    seen.1 += 1;
                    eprintln!("heartbeat of {w} failed: {e}");
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        seen
    })
}

/// The beats during the apply, sorted, and the failures of all writers.
fn join(beats: Vec<std::thread::JoinHandle<Beats>>) -> (Vec<Duration>, usize) {
    let mut during = Vec::new();
    let mut failed = 0;
    for b in beats {
        let ([_, d], f) = b.join().unwrap();
        during.extend(d);
        failed += f;
    }
    during.sort();
    (during, failed)
}
