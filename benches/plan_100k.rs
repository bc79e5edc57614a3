//! Benchmark: plan a generated 100,000-row registry read from SQLite, end to
//! end (open, read, probe, observe, build entities, evaluate every row with
//! Cedar, tokens, render JSON). Target on the 2-core CI machine: median
//! under 1.0 s, peak memory under 300 MB.
//!
//! Run with `cargo bench --bench plan_100k`. Set PLAN_BENCH_ROWS to change
//! the size, PLAN_BENCH_RUNS the number of timed runs.

use fleet_retire::evidence::leases::{self, Protections};
use fleet_retire::evidence::probe::{HostFacts, SystemProbe};
use fleet_retire::evidence::registry;
use fleet_retire::observe::RunFacts;
use fleet_retire::plan::plan;
use fleet_retire::policy::{Policies, PolicySource};
use rusqlite::{params, Connection};
use std::path::Path;
use std::time::Instant;

fn generate(
    dir: &Path,
    rows: usize,
    host: &str,
    boot: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let reg = dir.join("registry.sqlite");
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
            let pid = 4_000_000 + (i as i64 % 190_000);
            stmt.execute(params![
                format!("w-{ns}-{i:06}"),
                format!("inst-codex-20260101T000000Z-{:012x}", i / 5),
                format!("sess-{:08}", i / 5),
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
    for i in 0..50 {
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

fn main() {
    let rows: usize = std::env::var("PLAN_BENCH_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let runs: usize = std::env::var("PLAN_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let tmp = tempfile::tempdir().unwrap();
    // PLAN_BENCH_DIR keeps the generated stores for profiling.
    let keep = std::env::var_os("PLAN_BENCH_DIR").map(std::path::PathBuf::from);
    let dir_path = keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let facts_host = HostFacts::observe(Path::new("/proc"));
    let host = facts_host
        .host_id
        .clone()
        .unwrap_or_else(|| "bench-host".into());
    let boot = facts_host
        .boot_id
        .clone()
        .unwrap_or_else(|| "bench-boot".into());
    let (reg, lease_path) = generate(&dir_path, rows, &host, &boot);
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let base_rss = peak_rss_mb();

    let mut times = Vec::new();
    let mut candidates = 0;
    for _ in 0..runs {
        let start = Instant::now();
        let registry_rows = registry::load(&reg).unwrap();
        let lease_rows = leases::load(&lease_path).unwrap();
        let facts = RunFacts {
            now: fleet_retire::time::now(),
            host: HostFacts::observe(Path::new("/proc")),
            canonical_repository: Some("prgs/gitea-tools".into()),
            protections: Protections::from_leases(&lease_rows),
        };
        let p = plan(registry_rows, facts, &SystemProbe::new("/proc"), &policies).unwrap();
        let mut sink = std::io::BufWriter::new(std::io::sink());
        p.write_json(&mut sink).unwrap();
        candidates = p.candidates().count();
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = times[times.len() / 2];
    println!(
        "plan_100k: rows={rows} runs={runs} candidates={candidates} median={median:.3}s min={:.3}s max={:.3}s peak_rss={:.0}MB (before planning {:.0}MB)",
        times[0],
        times[times.len() - 1],
        peak_rss_mb(),
        base_rss
    );
}
