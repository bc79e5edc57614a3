//! Benchmark: the registry on PostgreSQL, beside SQLite.
//!
//! * `plan --format json` (output discarded) over the same realistic
//!   registry (`../shared/bench/gen_registry.py`) read from its SQLite file
//!   and from PostgreSQL after `registry copy`, interleaved, median of the
//!   runs, with peak RSS. The copy's own time is printed too.
//! * Heartbeat latency of 50 writers (each heartbeating its own row every
//!   50 ms through `fleet_retire::worker::heartbeat`, over the connection
//!   it keeps; its first beat, which connects, is not counted) before and
//!   during an apply of 2,000 targets in one SERIALIZABLE transaction: p50,
//!   p99 and the slowest, and how many failed.
//! * An apply of 10,000 targets (a registry of exactly those stale rows)
//!   on SQLite and on PostgreSQL, a fresh copy each run, interleaved: the
//!   median wall time of `apply` on each and their ratio (issue 33 §3 asks
//!   PostgreSQL for at most twice SQLite's).
//!
//! Needs a PostgreSQL cluster: FLEET_RETIRE_TEST_POSTGRES (as the tests;
//! `.ci/pg-cluster start DIR` prints one). Without it, it says so and ends.
//! POSTGRES_BENCH_ROWS sets the realistic registry's size (default
//! 100,000), POSTGRES_BENCH_RUNS the runs (default 5; at most 3 for the
//! 10,000 targets), POSTGRES_BENCH_PARTS which parts (default
//! `plan,heartbeats,10k`).
//!
//! Run with `cargo bench --bench postgres`.

use fleet_retire::apply::{apply, Hooks, Request};
use fleet_retire::evidence::probe::{pid_alive, HostFacts, SystemProbe};
use fleet_retire::policy::{Policies, PolicySource};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fleet-retire");

mod common;

use common::{percentile, Db};

/// Wall time and peak RSS (KiB) of a command that must succeed.
fn measure(cmd: &mut Command) -> (Duration, i64) {
    let (took, rss, ok) = common::measure(cmd);
    assert!(ok, "{cmd:?} failed");
    (took, rss)
}

fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn plan_cmd(registry: &str, leases: &str, profiles: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args([
        "--format",
        "json",
        "plan",
        "--registry",
        registry,
        "--leases",
        leases,
    ])
    .args([
        "--canonical-repository",
        "prgs/gitea-tools",
        "--profile",
        "controller-prgs",
    ])
    .arg("--profiles")
    .arg(profiles)
    .stdout(Stdio::null());
    c
}

fn plan_beside_sqlite(admin: &str) {
    let rows: usize = std::env::var("POSTGRES_BENCH_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let runs: usize = std::env::var("POSTGRES_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let generator = Path::new("../shared/bench/gen_registry.py");
    if !generator.is_file() {
        println!(
            "postgres plan: skipped, {} is not here",
            generator.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new("python3")
        .arg(generator)
        .args(["--rows", &rows.to_string(), "--out"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "gen_registry.py failed");
    let profiles = dir.path().join("profiles.json");
    std::fs::copy("fixtures/sample/profiles.json", &profiles).unwrap();
    let registry = dir.path().join("registry.sqlite");
    let leases = dir.path().join("leases.sqlite");
    let db = Db::new(admin, "plan");
    let (copy_time, _) = measure(
        Command::new(BIN)
            .args(["registry", "copy", "--from"])
            .arg(&registry)
            .arg("--leases")
            .arg(&leases)
            .args(["--to", &db.url])
            .stdout(Stdio::null()),
    );
    postgres::Client::connect(&db.url, postgres::NoTls)
        .unwrap()
        .batch_execute("VACUUM ANALYZE")
        .unwrap();
    let (reg, lea) = (registry.to_str().unwrap(), leases.to_str().unwrap());
    let (mut lite, mut pg) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        lite.push(measure(&mut plan_cmd(reg, lea, &profiles)));
        pg.push(measure(&mut plan_cmd(&db.url, &db.url, &profiles)));
    }
    let show = |name: &str, v: &[(Duration, i64)]| {
        let t = median(v.iter().map(|m| m.0.as_secs_f64()).collect());
        let rss = median(v.iter().map(|m| m.1).collect());
        println!(
            "postgres plan: {rows} realistic rows from {name}: median {t:.3} s over {runs} runs \
             (min {:.3}, max {:.3}), peak RSS {} MB",
            v.iter().map(|m| m.0.as_secs_f64()).fold(f64::MAX, f64::min),
            v.iter().map(|m| m.0.as_secs_f64()).fold(0.0, f64::max),
            rss / 1024
        );
    };
    show("SQLite", &lite);
    show("PostgreSQL", &pg);
    println!(
        "postgres plan: registry copy of {rows} rows: {:.3} s",
        copy_time.as_secs_f64()
    );
}

/// A SQLite registry with `targets` dead, eligible workers and `live`
/// workers of this process, copied into `db`.
fn fleet(db: &Db, dir: &Path, targets: usize, live: usize) -> Vec<String> {
    let host = HostFacts::observe(Path::new("/proc"));
    let (host_id, boot) = (host.host_id.unwrap(), host.boot_id.unwrap());
    let registry = dir.join("registry.sqlite");
    let conn = fleet_retire::worker::open(&registry).unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    let now = fleet_retire::time::format_ts(fleet_retire::time::now());
    let mut pid = 4_000_000i64;
    let ns = host.pid_namespace.clone();
    for i in 0..targets + live {
        let is_live = i >= targets;
        let my_pid = if is_live {
            i64::from(std::process::id())
        } else {
            while pid_alive(pid) != Some(false) {
                pid += 1;
            }
            pid += 1;
            pid - 1
        };
        tx.execute(
            "INSERT INTO worker_registrations (worker_identity, client_name, client_instance_id,
             instance_id_source, session_id, generation_id, role, profile, namespace, remote,
             repository_binding, pid, started_at, last_heartbeat_at, heartbeat_ttl_seconds,
             fencing_epoch, status, host_id, boot_id, process_start_time, pid_namespace)
             VALUES (?1, 'codex', ?2, 'launcher', ?3, ?4, 'author', 'author-prgs', 'author', 'prgs',
             'prgs/gitea-tools', ?5, '2026-01-01T00:00:00Z', ?6, 900.0, 1,
             'active', ?7, ?8, ?9, ?10)",
            rusqlite::params![
                if is_live {
                    format!("w-live-{i:03}")
                } else {
                    format!("w-{i:06}")
                },
                format!("inst-codex-20260101T000000Z-{i:012x}"),
                format!("sess-{i:08}"),
                format!("gen-{i:08}"),
                my_pid,
                if is_live {
                    now.as_str()
                } else {
                    "2026-01-01T00:10:00Z"
                },
                host_id,
                boot,
                format!("ticks-{i}"),
                ns,
            ],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    let leases = dir.join("leases.sqlite");
    rusqlite::Connection::open(&leases)
        .unwrap()
        .execute_batch(&fleet_retire::store::leases::create_sql())
        .unwrap();
    fleet_retire::copy::copy(&registry, Some(&leases), &db.url).unwrap();
    std::fs::write(
        dir.join("profiles.json"),
        r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}}"#,
    )
    .unwrap();
    (targets..targets + live)
        .map(|i| format!("w-live-{i:03}"))
        .collect()
}

/// A heartbeat writer's latencies before and during the apply, and how
/// many of its beats failed.
type Beats = ([Vec<Duration>; 2], i32);

fn heartbeats_during_apply(admin: &str) {
    let (targets, writers) = (2_000, 50);
    let db = Db::new(admin, "heartbeat");
    let dir = tempfile::tempdir().unwrap();
    let live = fleet(&db, dir.path(), targets, writers);
    let url = PathBuf::from(&db.url);
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let probe = SystemProbe::new("/proc");
    let req = retire_every_candidate(&url, &url, &policies, targets);

    // phase 0: before the apply; 1: during; 2: after.
    let phase = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let beats: Vec<_> = live
        .into_iter()
        .map(|w| start_writer(w, &url, &phase))
        .collect();
    // An operator's profiles.json is not seconds old (apply reads a fresh
    // one before every write), and the writers settle.
    std::thread::sleep(Duration::from_millis(2100));
    let profiles = dir.path().join("profiles.json");
    let ctx = common::apply_context(&url, &url, &profiles, &policies, &probe);
    phase.store(1, std::sync::atomic::Ordering::SeqCst);
    let started = Instant::now();
    let report = apply(&req, &ctx, Hooks::default()).unwrap();
    let took = started.elapsed();
    phase.store(2, std::sync::atomic::Ordering::SeqCst);
    let (before, during, failed) = join_writers(beats);
    println!(
        "postgres apply: {} of {targets} retired ({:?}, {} heartbeats tolerated) in {:.3} s, \
         transaction {} ms",
        report.retired_count,
        report.outcome,
        report.heartbeats_tolerated,
        took.as_secs_f64(),
        report.lock_held_ms
    );
    print_latencies(writers, &before, &during, failed);
}

/// Apply 10,000 targets on SQLite and on PostgreSQL, a fresh copy of the
/// same registry each run, interleaved; the medians and their ratio.
fn ten_thousand_beside_sqlite(admin: &str) {
    let targets = 10_000;
    let runs: usize = std::env::var("POSTGRES_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .min(3);
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let probe = SystemProbe::new("/proc");
    let (mut on_sqlite, mut on_postgres) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let db = Db::new(admin, &format!("tenk{run}"));
        let dir = tempfile::tempdir().unwrap();
        fleet(&db, dir.path(), targets, 0);
        let sqlite = dir.path().join("registry.sqlite");
        let url = PathBuf::from(&db.url);
        let profiles = dir.path().join("profiles.json");
        for (registry, leases, times) in [
            (&sqlite, dir.path().join("leases.sqlite"), &mut on_sqlite),
            (&url, url.clone(), &mut on_postgres),
        ] {
            let req = retire_every_candidate(registry, &leases, &policies, targets);
            let ctx = common::apply_context(registry, &leases, &profiles, &policies, &probe);
            let started = Instant::now();
            let report = apply(&req, &ctx, Hooks::default()).unwrap();
            times.push(started.elapsed().as_secs_f64());
            assert_eq!(report.retired_count, targets, "{}", report.detail);
        }
    }
    let (s, p) = (median(on_sqlite), median(on_postgres));
    println!(
        "apply of {targets} targets, median of {runs}: SQLite {s:.2} s, PostgreSQL {p:.2} s, \
         ratio {:.2}",
        p / s
    );
}

/// Plan the registry and ask to retire every candidate: there
/// must be `targets` of them.
fn retire_every_candidate(
    registry: &Path,
    leases: &Path,
    policies: &Policies,
    targets: usize,
) -> Request {
    let req = common::plan_and_request(registry, leases, policies, targets, None);
    assert_eq!(req.workers.len(), targets, "every dead row is a candidate");
    req
}

/// A thread that heartbeats worker `w` every 50 ms until `phase` is 2,
/// timing each beat under the phase it began in.
fn start_writer(
    w: String,
    url: &Path,
    phase: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> std::thread::JoinHandle<Beats> {
    let (phase, url) = (phase.clone(), url.to_path_buf());
    std::thread::spawn(move || {
        let mut seen: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
        let mut failed = 0;
        // The first beat connects (and is not a heartbeat's latency).
        fleet_retire::worker::heartbeat(&url, &w, fleet_retire::worker::Writer::Owner)
            .expect("the first heartbeat");
        loop {
            let now = phase.load(std::sync::atomic::Ordering::SeqCst);
            if now == 2 {
                break;
            }
            let t = Instant::now();
            match fleet_retire::worker::heartbeat(&url, &w, fleet_retire::worker::Writer::Owner) {
                Ok(_) => seen[now].push(t.elapsed()),
                Err(_) => failed += 1,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (seen, failed)
    })
}

/// Every writer's latencies before and during the apply, each sorted, and
/// the failures of all.
fn join_writers(beats: Vec<std::thread::JoinHandle<Beats>>) -> (Vec<Duration>, Vec<Duration>, i32) {
    let mut before = Vec::new();
    let mut during = Vec::new();
    let mut failed = 0;
    for b in beats {
        let ([b0, b1], f) = b.join().unwrap();
        before.extend(b0);
        during.extend(b1);
        failed += f;
    }
    before.sort();
    during.sort();
    (before, during, failed)
}

/// The heartbeat latencies before and during the apply, and the failures.
fn print_latencies(writers: usize, before: &[Duration], during: &[Duration], failed: i32) {
    for (name, v) in [("before the apply", before), ("during the apply", during)] {
        println!(
            "postgres heartbeats, {writers} writers every 50 ms, {name}: {} beats, p50 {:.1} ms, \
             p99 {:.1} ms, slowest {:.1} ms",
            v.len(),
            percentile(v, 0.5),
            percentile(v, 0.99),
            percentile(v, 1.0)
        );
    }
    println!("postgres heartbeats failed: {failed}");
}

fn main() {
    // FLEET_RETIRE_LOG=fleet_retire=debug shows where an apply's time goes.
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("FLEET_RETIRE_LOG").unwrap_or_default())
        .with_writer(std::io::stderr)
        .init();
    let Ok(admin) = std::env::var("FLEET_RETIRE_TEST_POSTGRES") else {
        println!(
            "postgres: skipped, FLEET_RETIRE_TEST_POSTGRES is not set (`.ci/pg-cluster start DIR` \
             starts a cluster and prints its URL)"
        );
        return;
    };
    let parts = std::env::var("POSTGRES_BENCH_PARTS").unwrap_or("plan,heartbeats,10k".into());
    let part = |name: &str| parts.split(',').any(|p| p.trim() == name);
    if part("plan") {
        plan_beside_sqlite(&admin);
    }
    if part("heartbeats") {
        heartbeats_during_apply(&admin);
    }
    if part("10k") {
        ten_thousand_beside_sqlite(&admin);
    }
}
