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
//! SQLite runs three ways: a registry as the seed made it, without row
//! versions, in each journal mode (rollback and WAL), applied first with
//! `--first 1` (the first apply, which installs the bookkeeping) and then
//! `--first 2000` from the same plan; and one with row versions, as
//! `registry create` or a first apply leaves it (`docs/apply.md`).
//!
//! Churn beside the targets (issue 44 §2): throughout the plan and the
//! applies a thread starts a short-lived process every 20 ms (each takes
//! the next pid, which rows of the registry hold), and five processes
//! are placed, by steering the kernel's next pid (root only), on the pids
//! of dead candidates that are no target, so those rows move to
//! `pid_reuse_detected` between the plan and the apply. Every apply must
//! still be `applied`; the rows that moved are counted (`verdicts_moved`).
//!
//! PostgreSQL runs as a registry copied in with `registry copy`, which
//! installs the change record (`store::postgres::versions`), so apply
//! judges outside its transaction from the first.
//!
//! APPLY_SCALE_ENGINES picks the engines (default `sqlite,postgres`),
//! APPLY_SCALE_RUNS how many plans and applies of `--first 2000` follow
//! one another on each registry (default 1; each retires the next 2,000).
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

mod churn;
mod common;

const WRITERS: usize = 20;

/// One engine's copy of a generated registry.
struct Location {
    engine: &'static str,
    registry: PathBuf,
    leases: PathBuf,
    /// A registry without row versions: its first apply is measured too.
    first_apply: bool,
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
    let engines = std::env::var("APPLY_SCALE_ENGINES").unwrap_or_else(|_| "sqlite,postgres".into());
    let runs: usize = std::env::var("APPLY_SCALE_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let admin = std::env::var("FLEET_RETIRE_TEST_POSTGRES")
        .ok()
        .filter(|_| engines.contains("postgres"));
    if admin.is_none() {
        println!("apply_scale: PostgreSQL skipped, FLEET_RETIRE_TEST_POSTGRES is not set");
    }
    for rows in sizes {
        let dir = tempfile::tempdir().unwrap();
        generate(generator, rows, dir.path());
        let writers = add_writers(&dir.path().join("registry.sqlite"));
        let mut locations = Vec::new();
        if engines.contains("sqlite") {
            locations.push(seed_made_copy(dir.path(), "delete"));
            locations.push(seed_made_copy(dir.path(), "wal"));
            locations.push(sqlite_copy(dir.path()));
        }
        if let Some(admin) = &admin {
            locations.push(postgres_copy(admin, dir.path(), rows));
        }
        for at in &locations {
            for i in 0..runs {
                run(
                    at,
                    i == 0 && at.first_apply,
                    rows,
                    targets,
                    &writers,
                    dir.path(),
                );
            }
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
        engine: "sqlite with row versions",
        registry,
        leases: dir.join("leases.sqlite"),
        first_apply: false,
        _db: None,
    }
}

/// The SQLite registry as the seed leaves it: no row versions, in the
/// journal mode `mode` (`delete` or `wal`).
fn seed_made_copy(dir: &Path, mode: &'static str) -> Location {
    let registry = dir.join(format!("registry-seed-{mode}.sqlite"));
    std::fs::copy(dir.join("registry.sqlite"), &registry).unwrap();
    let conn = rusqlite::Connection::open(&registry).unwrap();
    let set: String = conn
        .query_row(&format!("PRAGMA journal_mode = {mode}"), [], |r| r.get(0))
        .unwrap();
    assert_eq!(set, mode);
    Location {
        engine: if mode == "wal" {
            "sqlite as the seed made it, WAL"
        } else {
            "sqlite as the seed made it, rollback journal"
        },
        registry,
        leases: dir.join("leases.sqlite"),
        first_apply: true,
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
        first_apply: false,
        _db: Some(db),
    }
}

/// Heartbeat latencies before (0) and during (1) the apply, and failures.
type Beats = ([Vec<Duration>; 2], usize);

fn run(
    at: &Location,
    first_apply: bool,
    rows: usize,
    targets: usize,
    writers: &[String],
    dir: &Path,
) {
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let probe = SystemProbe::new("/proc");
    let phase = Arc::new(AtomicUsize::new(0));
    let beats: Vec<_> = writers
        .iter()
        .map(|w| start_writer(w.clone(), &at.registry, &phase))
        .collect();
    let churn = churn::Churn::start();
    let started = Instant::now();
    let (mut req, bystanders) =
        churn::plan_with_bystanders(&at.registry, &at.leases, &policies, targets + 1);
    let planned_in = started.elapsed();
    let placed = churn::place_on(&bystanders, 5);
    println!(
        "  churn: {} processes placed on pids of dead candidates beside the targets",
        placed.len()
    );
    let profiles = dir.join("profiles.json");
    let ctx = common::apply_context(&at.registry, &at.leases, &profiles, &policies, &probe);
    std::thread::sleep(Duration::from_millis(500));
    phase.store(1, Ordering::SeqCst);
    if first_apply {
        req.first = Some(1);
        let started = Instant::now();
        let report = apply(&req, &ctx, Hooks::default()).unwrap();
        print_run(
            &format!("{}, first apply", at.engine),
            rows,
            planned_in,
            started.elapsed(),
            &report,
        );
    }
    req.first = Some(targets);
    let started = Instant::now();
    let report = apply(&req, &ctx, Hooks::default()).unwrap();
    let took = started.elapsed();
    phase.store(2, Ordering::SeqCst);
    let spawned = churn.stop();
    drop(placed);
    let (during, failed) = join(beats);
    print_run(at.engine, rows, planned_in, took, &report);
    println!(
        "  heartbeats during the applies: {} beats of {WRITERS} writers every 200 ms, p50 {:.1} ms, \
         p99 {:.1} ms, slowest {:.1} ms, failed {failed}; {spawned} short-lived processes started",
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
         lock: {} {} rows{}; plan {:.2} s, apply {:.2} s, {} heartbeats tolerated, {} verdicts \
         moved beside the targets, {} candidates added{}",
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
        report.heartbeats_tolerated,
        report.verdicts_moved.len(),
        report.candidates_added_since_plan.len(),
        report
            .versions_install_lock_ms
            .map(|ms| format!("; row versions installed first, lock held {ms} ms"))
            .unwrap_or_default()
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
