//! Benchmark of issue 54 ("A host reads its own rows") on PostgreSQL: a
//! fleet of `HOST_SCALE_HOSTS` hosts (default 1,000) sharing one registry
//! that never deletes a row (`host_scale/fleet.rs` says its shape),
//! generated here and written with `COPY`. For each size of
//! `HOST_SCALE_ROWS` (default `100000,1000000`), a database of its own is
//! filled, the parts of `HOST_SCALE_PARTS` run on it (default all), and it
//! is dropped:
//!
//! * `plan`: one host's scoped plan, and the whole plan (up to
//!   `HOST_SCALE_WHOLE_MAX` rows, default 1,000,000): median wall time and
//!   peak RSS of `HOST_SCALE_RUNS` (default 3);
//! * `apply`: one host's scoped apply of `HOST_SCALE_CANDIDATES` (2,000)
//!   candidates in one transaction, `HOST_SCALE_APPLY_RUNS` (10) times,
//!   beside `HOST_SCALE_WRITERS` (20) writers heartbeating other hosts,
//!   each every `HOST_SCALE_WRITER_MS` ms (default 0: flat out);
//! * `hosts`: `HOST_SCALE_APPLYING` (50) hosts applying at once, each
//!   trying again after a refusal up to `HOST_SCALE_TRIES` (3) tries;
//! * `beats`: heartbeats a second with the change record's trigger and
//!   without it (`HOST_SCALE_BEAT_WRITERS` 8, `HOST_SCALE_BEAT_SECS` 20).
//!
//! Hosts are simulated as the tests do: each command runs in a UTS
//! namespace named as the host (root and `unshare`). Before each size the
//! free disk is checked: a size whose estimate (`HOST_SCALE_BYTES_PER_ROW`,
//! default 1,500, replaced by what each fill measures) does not fit with
//! `HOST_SCALE_SPARE_GB` (8) GB to spare is cut to the largest that does,
//! and the bench says so. `HOST_SCALE_AUDIT_INDEX=1` adds an index on the
//! audit's `apply_id` (a diagnosis of docs/scale.md's "Hosts applying at
//! once", not a schema change).
//!
//! Needs FLEET_RETIRE_TEST_POSTGRES (as the tests): `cargo bench --bench
//! host_scale`.

#[path = "host_scale/apply.rs"]
mod apply;
#[path = "host_scale/beats.rs"]
mod beats;
mod common;
#[path = "host_scale/fleet.rs"]
mod fleet;
#[path = "host_scale/hosts.rs"]
mod hosts;
#[path = "host_scale/many.rs"]
mod many;
#[path = "host_scale/plan.rs"]
mod plan;

use common::Db;
use std::path::Path;
use std::time::Instant;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Free bytes where the cluster's data probably is (this machine's root).
fn free_bytes() -> u64 {
    let s = nix::sys::statvfs::statvfs("/").unwrap();
    s.blocks_available() * s.fragment_size()
}

/// `rows`, or the largest size (whole 100,000s) that fits the free disk
/// with `spare` bytes left at `per_row` bytes a row; `None` if none does.
fn fitting(rows: u64, per_row: u64, spare: u64) -> Option<u64> {
    let room = free_bytes().saturating_sub(spare);
    if rows * per_row <= room {
        return Some(rows);
    }
    let fits = room / per_row / 100_000 * 100_000;
    println!(
        "disk    {rows} rows need about {:.1} GB at {per_row} B a row; {:.1} GB free, {} GB kept \
         spare: {}",
        (rows * per_row) as f64 / 1e9,
        free_bytes() as f64 / 1e9,
        spare / 1_000_000_000,
        if fits == 0 {
            "skipped".to_string()
        } else {
            format!("running {fits} rows instead")
        }
    );
    (fits > 0).then_some(fits)
}

/// A database of `rows` rows, made and filled; its bytes a row.
fn make(admin: &str, shape: &fleet::Shape) -> (Db, u64) {
    let db = Db::new(admin, "host_scale");
    let mut c = postgres::Client::connect(&db.url, postgres::NoTls).unwrap();
    fleet_retire::store::postgres::create_or_migrate_registry(&mut c, "bench").unwrap();
    fleet_retire::store::postgres::create_leases(&mut c, "bench").unwrap();
    let t = Instant::now();
    let rows = fleet::fill(&db.url, shape);
    let copied = t.elapsed();
    fleet_retire::store::open::install_versions(Path::new(&db.url)).unwrap();
    fleet::stamp_and_analyze(&db.url);
    if std::env::var("HOST_SCALE_AUDIT_INDEX").is_ok_and(|v| v == "1") {
        // A diagnosis of docs/scale.md's finding, not the schema's: does
        // an index on the audit's apply id spare concurrent applies?
        c.batch_execute("CREATE INDEX bench_audit_by_apply ON retirement_audit (apply_id)")
            .unwrap();
    }
    let bytes = fleet::size(&db.url);
    println!(
        "fill    {rows} rows ({} hosts, {} active each): COPY {:.0} s, with indexes, change \
         record and VACUUM ANALYZE {:.0} s; {:.2} GB, {} B a row",
        shape.hosts,
        shape.active,
        copied.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        bytes as f64 / 1e9,
        bytes / rows
    );
    (db, bytes / rows)
}

fn profiles(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("profiles.json");
    std::fs::write(
        &p,
        r#"{"profiles": {"controller-prgs": {"role": "controller",
            "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}}"#,
    )
    .unwrap();
    p
}

/// The parts of `HOST_SCALE_PARTS` on one filled database.
fn parts(url: &str, rows: u64, hosts: u64, dir: &Path) {
    let want =
        std::env::var("HOST_SCALE_PARTS").unwrap_or_else(|_| "plan,apply,hosts,beats".into());
    let want: Vec<&str> = want.split(',').map(str::trim).collect();
    let profiles = profiles(dir);
    let s = hosts::Stores {
        url,
        profiles: &profiles,
    };
    if want.contains(&"plan") {
        let whole = rows <= env_or("HOST_SCALE_WHOLE_MAX", 1_000_000);
        plan::print(rows, &plan::run(&s, env_or("HOST_SCALE_RUNS", 3), whole));
    }
    if want.contains(&"apply") {
        let p = apply::Params {
            candidates: env_or("HOST_SCALE_CANDIDATES", 2000),
            runs: env_or("HOST_SCALE_APPLY_RUNS", 10),
            writers: env_or("HOST_SCALE_WRITERS", 20),
            every: std::time::Duration::from_millis(env_or("HOST_SCALE_WRITER_MS", 0)),
        };
        apply::run(&s, &p, dir);
    }
    if want.contains(&"hosts") {
        let tries = env_or("HOST_SCALE_TRIES", 3);
        many::run(&s, env_or("HOST_SCALE_APPLYING", 50), hosts, tries, dir);
    }
    if want.contains(&"beats") {
        beats::run(
            url,
            env_or("HOST_SCALE_BEAT_WRITERS", 8),
            env_or("HOST_SCALE_BEAT_SECS", 20),
        );
    }
}

fn main() {
    let Ok(admin) = std::env::var("FLEET_RETIRE_TEST_POSTGRES") else {
        eprintln!("host_scale: set FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster) to run it");
        return;
    };
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("host_scale: simulated hosts need root and unshare");
        return;
    }
    let hosts: u64 = env_or("HOST_SCALE_HOSTS", 1000);
    let active: u64 = env_or("HOST_SCALE_ACTIVE", 200);
    let spare = env_or::<u64>("HOST_SCALE_SPARE_GB", 8) * 1_000_000_000;
    let mut per_row: u64 = env_or("HOST_SCALE_BYTES_PER_ROW", 1500);
    let sizes: Vec<u64> = std::env::var("HOST_SCALE_ROWS")
        .unwrap_or_else(|_| "100000,1000000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("HOST_SCALE_ROWS: sizes, comma-separated")
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    for rows in sizes {
        // A third more than the database for the WAL and the index builds' sorts.
        let Some(rows) = fitting(rows, per_row * 4 / 3, spare) else {
            continue;
        };
        let shape = fleet::Shape {
            rows,
            hosts,
            active: active / 5 * 5,
        };
        let (db, measured) = make(&admin, &shape);
        per_row = measured;
        parts(&db.url, rows, hosts, dir.path());
        drop(db);
    }
}
