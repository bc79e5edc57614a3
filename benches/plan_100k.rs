//! Benchmark: plan a registry read from SQLite, end to end in this process
//! (open, read, probe, observe, both Cedar stages, tokens, render the JSON
//! plan to a sink), for several registries:
//!
//! * `realistic`: `../shared/bench/gen_registry.py` (a long-running fleet's
//!   history: mostly historical rows, shuffled, random pids probed for
//!   real), when that generator is here;
//! * `generated`: this file's own generator (stale, released, live-looking
//!   and foreign-host rows over 20,000 instances, 50 active leases);
//! * the quadratic traps, 10,000 rows each beside a 10,000-row `generated`
//!   baseline: every row sharing one session, one pid, one identity, and
//!   10,000 active leases. Their time per row should match the baseline's.
//!
//! Every case prints the median wall time, the phase split of its median
//! run, the Cedar evaluations and the peak RSS (reset per case).
//!
//! Run with `cargo bench --bench plan_100k`. PLAN_BENCH_ROWS sets the size
//! of the first two cases (default 100,000), PLAN_BENCH_RUNS the timed runs
//! (default 5), PLAN_BENCH_CASES a comma-separated subset of case names.

use fleet_retire::evidence::leases::{self, Protections};
use fleet_retire::evidence::probe::{HostFacts, SystemProbe};
use fleet_retire::evidence::registry;
use fleet_retire::observe::RunFacts;
use fleet_retire::plan::plan;
use fleet_retire::policy::{Policies, PolicySource};
use rusqlite::{params, Connection};
use std::path::Path;
use std::time::Instant;

/// What a generated registry stresses.
#[derive(Clone, Copy, PartialEq)]
enum Trap {
    None,
    OneSession,
    OnePid,
    OneIdentity,
    ManyLeases,
}

fn generate(
    dir: &Path,
    rows: usize,
    host: &str,
    boot: &str,
    trap: Trap,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let reg = dir.join("registry.sqlite");
    if trap == Trap::OneIdentity {
        // A registry from before identities were unique: the trap needs
        // many rows with one identity.
        Connection::open(&reg)
            .unwrap()
            .execute_batch(
                &fleet_retire::store::registry::create_sql().replace("TEXT PRIMARY KEY", "TEXT"),
            )
            .unwrap();
    }
    // The registry schema as a worker creates it.
    let conn = fleet_retire::worker::open(&reg).unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    {
        let mut stmt = tx
            .prepare(
                "INSERT INTO worker_registrations (worker_identity, client_name, client_instance_id,
                 instance_id_source, session_id, generation_id, role, profile, namespace, remote,
                 repository_binding, pid, started_at, last_heartbeat_at, heartbeat_ttl_seconds,
                 fencing_epoch, status, host_id, boot_id, process_start_time)
                 VALUES (?1, 'codex', ?2, 'launcher', ?3, ?4, ?5, ?6, ?5, 'prgs', 'prgs/gitea-tools',
                 ?7, '2026-01-01T00:00:00Z', ?8, 900, 1, ?9, ?10, ?11, ?12)",
            )
            .unwrap();
        let namespaces = ["author", "reviewer", "merger", "controller", "reconciler"];
        for i in 0..rows {
            let ns = namespaces[i % 5];
            // A realistic mix: most rows stale and dead, some released, some
            // live-looking, some on another host.
            let status = if i % 10 == 0 { "released" } else { "active" };
            let heartbeat = if i % 7 == 0 {
                "2099-01-01T00:00:00Z"
            } else {
                "2026-01-01T00:10:00Z"
            };
            let row_host = if i % 13 == 0 { "elsewhere" } else { host };
            let pid = if trap == Trap::OnePid {
                4_000_001
            } else {
                4_000_000 + (i as i64 % 190_000)
            };
            let identity = if trap == Trap::OneIdentity {
                "w-author-shared".to_string()
            } else {
                format!("w-{ns}-{i:06}")
            };
            let session = if trap == Trap::OneSession {
                "sess-shared".to_string()
            } else {
                format!("sess-{:08}", i / 5)
            };
            stmt.execute(params![
                identity,
                format!("inst-codex-20260101T000000Z-{:012x}", i / 5),
                session,
                format!("gen-{i:08}"),
                ns,
                format!("{ns}-prgs"),
                pid,
                heartbeat,
                status,
                row_host,
                boot,
                format!("ticks-{i}"),
            ])
            .unwrap();
        }
    }
    tx.commit().unwrap();
    let leases = dir.join("leases.sqlite");
    let lc = Connection::open(&leases).unwrap();
    lc.execute_batch(&fleet_retire::store::leases::create_sql())
        .unwrap();
    let leases_count = if trap == Trap::ManyLeases { rows } else { 50 };
    for i in 0..leases_count {
        lc.execute(
            "INSERT INTO workflow_leases VALUES (?1, 'author', 'issue', 'active', ?2, NULL, NULL, NULL, NULL, ?3, NULL, NULL)",
            params![format!("l-{i}"), format!("sess-{:08}", i * 37), format!("w-author-{:06}", i * 101)],
        )
        .unwrap();
    }
    (reg, leases)
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Start a new peak-RSS measurement (Linux: writing 5 to clear_refs resets
/// VmHWM to the current RSS).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// One timed run's phases, in seconds.
struct Run {
    total: f64,
    read: f64,
    write: f64,
    stats: fleet_retire::plan::PlanStats,
    candidates: usize,
}

fn plan_once(reg: &Path, lease_path: &Path, policies: &Policies) -> Run {
    let start = Instant::now();
    let registry_rows = registry::load(reg).unwrap();
    let lease_rows = leases::load(lease_path).unwrap();
    let read = start.elapsed().as_secs_f64();
    let facts = RunFacts {
        now: fleet_retire::time::now(),
        host: HostFacts::observe(Path::new("/proc")),
        canonical_repository: Some("prgs/gitea-tools".into()),
        protections: Protections::from_leases(&lease_rows),
        active_leases: Vec::new(),
    };
    let p = plan(registry_rows, facts, &SystemProbe::new("/proc"), policies).unwrap();
    let written = Instant::now();
    let mut sink = std::io::BufWriter::new(std::io::sink());
    p.write_json(&mut sink).unwrap();
    let write = written.elapsed().as_secs_f64();
    let candidates = p.candidates().count();
    let stats = p.stats.clone();
    drop(p);
    fleet_retire::pool::give_back_memory();
    Run {
        total: start.elapsed().as_secs_f64(),
        read,
        write,
        stats,
        candidates,
    }
}

fn bench_case(name: &str, rows: usize, reg: &Path, lease_path: &Path, policies: &Policies) -> f64 {
    let runs = env_usize("PLAN_BENCH_RUNS", 5).max(1);
    reset_peak_rss();
    let mut done: Vec<Run> = (0..runs)
        .map(|_| plan_once(reg, lease_path, policies))
        .collect();
    done.sort_by(|a, b| a.total.partial_cmp(&b.total).unwrap());
    let m = &done[done.len() / 2];
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let s = &m.stats;
    println!(
        "plan_100k {name}: rows={rows} runs={runs} candidates={} median={:.3}s min={:.3}s max={:.3}s \
         ({:.2} us/row) peak_rss={:.0}MB",
        m.candidates,
        m.total,
        done[0].total,
        done[done.len() - 1].total,
        m.total * 1e6 / rows as f64,
        peak_rss_mb(),
    );
    println!(
        "  phases (ms): read {:.0}, observe {:.0}, first stage {:.0}, peers {:.0}, retire stage {:.0}, \
         tokens {:.0}, write {:.0}; Cedar evaluations: first stage {}, retire {}",
        m.read * 1e3,
        ms(s.observe),
        ms(s.first_stage),
        ms(s.peers),
        ms(s.retire_stage),
        ms(s.tokens),
        m.write * 1e3,
        s.first_stage_evaluations,
        s.retire_evaluations,
    );
    m.total * 1e6 / rows as f64
}

fn main() {
    // Every case plans many times in this one process, as `serve` does, so
    // the allocator is set up as `serve` sets it: with glibc's default of
    // eight arenas per core, the short-lived reading and pool threads of one
    // run leave freed memory in arenas the next run's threads do not pick,
    // and the peak grows from run to run (106 MB for the first realistic
    // run, 158 MB over five). A `plan` command runs once per process.
    fleet_retire::pool::limit_malloc_arenas();
    let rows = env_usize("PLAN_BENCH_ROWS", 100_000);
    let wanted = std::env::var("PLAN_BENCH_CASES").ok();
    let wants = |name: &str| {
        wanted
            .as_deref()
            .is_none_or(|w| w.split(',').any(|c| c.trim() == name))
    };
    let tmp = tempfile::tempdir().unwrap();
    // PLAN_BENCH_DIR keeps the generated stores for profiling.
    let keep = std::env::var_os("PLAN_BENCH_DIR").map(std::path::PathBuf::from);
    let root = keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let facts_host = HostFacts::observe(Path::new("/proc"));
    let host = facts_host
        .host_id
        .clone()
        .unwrap_or_else(|| "bench-host".into());
    let boot = facts_host
        .boot_id
        .clone()
        .unwrap_or_else(|| "bench-boot".into());
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let case_dir = |name: &str| {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    };

    if wants("realistic") {
        let generator =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/gen_registry.py");
        if generator.is_file() {
            let dir = case_dir("realistic");
            let ok = std::process::Command::new("python3")
                .arg(&generator)
                .args(["--rows", &rows.to_string(), "--out"])
                .arg(&dir)
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "{} failed", generator.display());
            bench_case(
                "realistic",
                rows,
                &dir.join("registry.sqlite"),
                &dir.join("leases.sqlite"),
                &policies,
            );
        } else {
            println!(
                "plan_100k realistic: skipped ({} is not here)",
                generator.display()
            );
        }
    }
    if wants("generated") {
        let (reg, lp) = generate(&case_dir("generated"), rows, &host, &boot, Trap::None);
        bench_case("generated", rows, &reg, &lp, &policies);
    }
    let traps = [
        ("generated-10k", Trap::None),
        ("one-session", Trap::OneSession),
        ("one-pid", Trap::OnePid),
        ("one-identity", Trap::OneIdentity),
        ("10k-leases", Trap::ManyLeases),
    ];
    let mut baseline = None;
    for (name, trap) in traps {
        if !wants(name) && !wants("traps") {
            continue;
        }
        let (reg, lp) = generate(&case_dir(name), 10_000, &host, &boot, trap);
        let per_row = bench_case(name, 10_000, &reg, &lp, &policies);
        match baseline {
            None if trap == Trap::None => baseline = Some(per_row),
            Some(b) => println!("  {:.1}x the baseline's time per row", per_row / b),
            None => {}
        }
    }
}
