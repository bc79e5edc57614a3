//! Benchmark: the command line on a realistic registry (a long-running
//! fleet's history: mostly historical rows, shuffled, random pids probed for
//! real), made by `../shared/bench/gen_registry.py`. Each command runs as a
//! child process; its wall time and peak resident memory (from `wait4`) are
//! printed, median of the runs:
//!
//! * `snapshot` (human) and `--format json snapshot`, output discarded;
//! * `plan --format json`, output discarded;
//! * `apply` of the first 10,000 candidates (`--workers @FILE`) on a fresh
//!   copy of the registry, with the write lock's hold time from its report.
//!
//! After the plan cases it times the seed's own Python planner on the same
//! registry (`tests/differential/time_seed.py`) and prints the ratio.
//!
//! The plan cases also print their last run's phase split and Cedar
//! evaluation counts (the plan's debug log).
//!
//! Run with `cargo bench --bench realistic`. REALISTIC_ROWS sets the size
//! (default 100,000; 1,000,000 takes about a minute to generate),
//! REALISTIC_RUNS the number of runs (default 3). Rows whose heartbeat is
//! recent get one in the far future (still fresh: a future stamp counts as
//! fresh), so the candidate set holds still between plan and apply.

use common::measure;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_fleet-retire");

fn median<T: Copy + Ord>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

struct Fleet {
    _dir: tempfile::TempDir,
    dir: PathBuf,
}

impl Fleet {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
    fn store_args(&self) -> Vec<String> {
        [
            "--registry",
            self.path("registry.sqlite").to_str().unwrap(),
            "--leases",
            self.path("leases.sqlite").to_str().unwrap(),
            "--canonical-repository",
            "prgs/gitea-tools",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(self.operator_args())
        .collect()
    }
    fn operator_args(&self) -> Vec<String> {
        vec![
            "--profiles".into(),
            self.path("profiles.json").display().to_string(),
            "--profile".into(),
            "controller-prgs".into(),
        ]
    }
}

fn generate(generator: &Path, rows: usize) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let started = Instant::now();
    let ok = Command::new("python3")
        .arg(generator)
        .args(["--rows", &rows.to_string(), "--out"])
        .arg(&path)
        .status()
        .expect("run python3")
        .success();
    assert!(ok, "gen_registry.py failed");
    let conn = rusqlite::Connection::open(path.join("registry.sqlite")).unwrap();
    let frozen = conn
        .execute(
            "UPDATE worker_registrations SET last_heartbeat_at = '2099-01-01T00:00:00Z'
             WHERE status = 'active'
               AND last_heartbeat_at > strftime('%Y-%m-%dT%H:%M:%SZ', 'now', '-3 hours')",
            [],
        )
        .unwrap();
    drop(conn);
    std::fs::copy(
        path.join("registry.sqlite"),
        path.join("registry.orig.sqlite"),
    )
    .unwrap();
    std::fs::write(
        path.join("profiles.json"),
        r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}}"#,
    )
    .unwrap();
    println!(
        "generated {rows} rows in {:.1?} ({frozen} recent heartbeats moved to 2099)",
        started.elapsed()
    );
    Fleet {
        _dir: dir,
        dir: path,
    }
}

/// Plan to a file and take the header and the first 10,000 candidates from
/// it (one top-level key per line, so nothing large is parsed).
fn plan_for_apply(fleet: &Fleet) -> (Vec<String>, usize) {
    let out = fleet.path("plan.json");
    let ok = Command::new(BIN)
        .arg("plan")
        .args(fleet.store_args())
        .args(["--format", "json"])
        .stdout(std::fs::File::create(&out).unwrap())
        .status()
        .unwrap()
        .success();
    assert!(ok, "plan failed");
    let text = std::fs::read_to_string(&out).unwrap();
    let mut args = Vec::new();
    let mut count = 0;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(": ") else {
            continue;
        };
        let value = value.trim_end_matches(',');
        match key {
            "\"registry_fingerprint\"" | "\"candidate_fingerprint\"" | "\"policy_fingerprint\"" => {
                let flag = format!("--{}", key.trim_matches('"').replace('_', "-"));
                args.push(flag);
                args.push(serde_json::from_str::<String>(value).unwrap());
            }
            "\"candidate_worker_identities\"" => {
                let ids: Vec<String> = serde_json::from_str(value).unwrap();
                let chosen: Vec<&String> = ids.iter().take(10_000).collect();
                count = chosen.len();
                std::fs::write(
                    fleet.path("workers.json"),
                    serde_json::to_string(&chosen).unwrap(),
                )
                .unwrap();
                break;
            }
            _ => {}
        }
    }
    std::fs::remove_file(&out).unwrap();
    args.push("--workers".into());
    args.push(format!("@{}", fleet.path("workers.json").display()));
    (args, count)
}

/// The seed's own planner on the same registry, end to end (read, probe,
/// plan, render JSON; `tests/differential/time_seed.py`), once, against
/// `ours`, the median of `plan --format json`.
fn python_reference(fleet: &Fleet, ours: f64) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("tests/differential/time_seed.py"))
        .arg(root.join("../shared/seed"))
        .arg(fleet.path("registry.sqlite"))
        .arg(fleet.path("leases.sqlite"))
        .arg("prgs/gitea-tools")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let line = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let seconds = line
                .split_whitespace()
                .find_map(|f| f.strip_prefix("seconds="))
                .and_then(|v| v.parse::<f64>().ok());
            match seconds {
                Some(py) => println!(
                    "python reference (the seed's planner, same rows): {py:.3} s; \
                     plan --format json is {:.1}x faster",
                    py / ours
                ),
                None => println!("python reference: unreadable output {line:?}"),
            }
        }
        Ok(o) => println!(
            "python reference: skipped ({})",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("failed")
        ),
        Err(e) => println!("python reference: skipped (python3: {e})"),
    }
}

fn main() {
    let generator = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/gen_registry.py");
    if !generator.is_file() {
        println!(
            "skipped: {} is not here (the realistic registry generator)",
            generator.display()
        );
        return;
    }
    let rows = count_from_env("REALISTIC_ROWS", 100_000);
    let runs = count_from_env("REALISTIC_RUNS", 3);
    let fleet = generate(&generator, rows);
    let mut plan_json_median = None;
    for (name, args) in &read_cases(&fleet) {
        let seconds = time_read_case(&fleet, name, args, rows, runs);
        if *name == "plan --format json" {
            plan_json_median = Some(seconds);
        }
    }
    if let Some(ours) = plan_json_median {
        python_reference(&fleet, ours);
    }
    time_apply(&fleet, rows, runs);
}

/// A count from the environment variable `name`, or `default`.
fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `/dev/null`, for output that is not kept.
fn null() -> Stdio {
    Stdio::from(std::fs::File::create("/dev/null").unwrap())
}

/// The commands that only read the fleet, named, with their arguments.
fn read_cases(fleet: &Fleet) -> Vec<(&'static str, Vec<String>)> {
    vec![
        (
            "snapshot (human)",
            [
                vec![
                    "snapshot".into(),
                    "--registry".into(),
                    fleet.path("registry.sqlite").display().to_string(),
                ],
                fleet.operator_args(),
            ]
            .concat(),
        ),
        (
            "snapshot --format json",
            [
                vec![
                    "--format".into(),
                    "json".into(),
                    "snapshot".into(),
                    "--registry".into(),
                    fleet.path("registry.sqlite").display().to_string(),
                ],
                fleet.operator_args(),
            ]
            .concat(),
        ),
        (
            "plan --format json",
            [
                vec!["--format".into(), "json".into(), "plan".into()],
                fleet.store_args(),
            ]
            .concat(),
        ),
        (
            "plan (human)",
            [vec!["plan".into()], fleet.store_args()].concat(),
        ),
    ]
}

/// Run one reading command `runs` times; print its median time and peak
/// memory, and its last run's phases (from the plan's debug log). Returns
/// the median in seconds.
fn time_read_case(fleet: &Fleet, name: &str, args: &[String], rows: usize, runs: usize) -> f64 {
    let mut times = Vec::new();
    let mut peaks = Vec::new();
    let log = fleet.path("plan.log");
    for _ in 0..runs {
        // The plan logs its phase split and Cedar evaluation counts.
        let (t, peak, ok) = measure(
            Command::new(BIN)
                .args(args)
                .env(
                    "FLEET_RETIRE_LOG",
                    "fleet_retire::plan=debug,fleet_retire::cli::plan=debug",
                )
                .stdout(null())
                .stderr(std::fs::File::create(&log).unwrap()),
        );
        assert!(ok, "{name} failed");
        times.push(t);
        peaks.push(peak);
    }
    println!(
        "{name:<24} {rows} rows: median {:.3} s, peak {} MB (runs: {:?})",
        median(times.clone()).as_secs_f64(),
        median(peaks) / 1024,
        times
            .iter()
            .map(|t| format!("{:.2}", t.as_secs_f64()))
            .collect::<Vec<_>>()
    );
    // The last run's phases, without the log's timestamps.
    for line in std::fs::read_to_string(&log).unwrap_or_default().lines() {
        if let Some(at) = line.find("fleet_retire::") {
            println!("  {}", &line[at..]);
        }
    }
    median(times).as_secs_f64()
}

/// Apply the first 10,000 candidates `runs` times, each on a fresh copy of
/// the registry, and print the median time, peak memory and lock hold.
fn time_apply(fleet: &Fleet, rows: usize, runs: usize) {
    let mut times = Vec::new();
    let mut peaks = Vec::new();
    let mut locks = Vec::new();
    for _ in 0..runs {
        std::fs::copy(
            fleet.path("registry.orig.sqlite"),
            fleet.path("registry.sqlite"),
        )
        .unwrap();
        let (args, count) = plan_for_apply(fleet);
        let report = fleet.path("apply.json");
        let (t, peak, ok) = measure(
            Command::new(BIN)
                .args(["--format", "json", "apply"])
                .args(fleet.store_args())
                .args(&args)
                .args(["--max-retire", &count.to_string()])
                .stdout(std::fs::File::create(&report).unwrap()),
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert!(ok, "apply failed: {}", doc["detail"]);
        assert_eq!(doc["retired_count"], count, "{}", doc["detail"]);
        times.push(t);
        peaks.push(peak);
        locks.push(doc["lock_held_ms"].as_u64().unwrap());
    }
    println!(
        "apply of 10,000 in {rows} rows: median {:.3} s, peak {} MB, lock held median {} ms (runs: {:?})",
        median(times.clone()).as_secs_f64(),
        median(peaks) / 1024,
        median(locks),
        times.iter().map(|t| format!("{:.2}", t.as_secs_f64())).collect::<Vec<_>>()
    );
}
