//! Operator faults, tried for real: closed pipes, signals, a crashed writer's
//! journal, a full disk, an unwritable registry and malformed inputs.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_fleet-retire");

/// Processes still carrying the demo's worker mark for demo `pid`.
fn demo_workers_of(pid: u32) -> Vec<String> {
    let mark = format!("FLEET_RETIRE_DEMO_WORKER={pid}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == mark.as_bytes()))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn demo_dirs_of(pid: u32) -> Vec<String> {
    let prefix = format!("fleet-retire-demo-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

fn wait_for(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_demo_under_a_closed_pipe_leaves_nothing_and_exits_0() {
    let mut demo = spawn_demo();
    let pid = demo.id();
    {
        // `demo | head -5`: read five lines, then close the pipe.
        let mut lines = BufReader::new(demo.0.stdout.take().unwrap()).lines();
        for _ in 0..5 {
            lines.next().unwrap().unwrap();
        }
    }
    let status = wait_for(&mut demo.0, Duration::from_secs(30));
    let mut err = String::new();
    demo.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{err}"
    );
    assert!(demo_workers_of(pid).is_empty(), "orphaned workers");
    assert!(demo_dirs_of(pid).is_empty(), "the demo directory is left");
}

#[test]
fn the_demo_under_sigint_and_sigterm_leaves_nothing() {
    for signal in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
    ] {
        let mut demo = spawn_demo();
        let pid = demo.id();
        let mut lines = BufReader::new(demo.0.stdout.take().unwrap()).lines();
        // Workers are running once step 2 begins.
        loop {
            let line = lines.next().unwrap().unwrap();
            if line.starts_with("== 2.") {
                break;
            }
        }
        assert!(!demo_workers_of(pid).is_empty());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
        let status = wait_for(&mut demo.0, Duration::from_secs(30));
        let mut err = String::new();
        demo.0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert_eq!(status.code(), Some(1), "{signal}: {err}");
        assert!(err.contains("interrupted"), "{err}");
        assert!(
            demo_workers_of(pid).is_empty(),
            "{signal}: orphaned workers"
        );
        assert!(
            demo_dirs_of(pid).is_empty(),
            "{signal}: the directory is left"
        );
    }
}

/// Many rows, so the output is larger than a pipe's buffer.
fn big_stores() -> Stores {
    stale_stores(2000)
}

/// `n` stale rows of one dead process, each with its own identity and
/// session.
fn stale_stores(n: usize) -> Stores {
    let (pid, start) = dead_process();
    let rows: Vec<Value> = (0..n)
        .map(|i| {
            let mut r = stale_row(&format!("w-{i:07}"), pid, &start);
            r["session_id"] = json!(format!("sess-{i}"));
            r
        })
        .collect();
    Stores::new(&rows)
}

#[test]
fn a_closed_stdout_ends_plan_and_snapshot_quietly() {
    let stores = big_stores();
    let mut snapshot_args = vec![
        "--format".to_string(),
        "json".into(),
        "snapshot".into(),
        "--registry".into(),
        stores.registry.display().to_string(),
        "--profiles".into(),
        stores.profiles.display().to_string(),
        "--profile".into(),
        "controller-prgs".into(),
    ];
    let mut plan_args = vec!["--format".to_string(), "json".into()];
    plan_args.extend(stores.plan_args("controller-prgs"));
    for args in [std::mem::take(&mut snapshot_args), plan_args] {
        let mut child = Command::new(EXE)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            let mut first = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut first)
                .unwrap();
        }
        let (status, err) = finish(&mut child, Duration::from_secs(30));
        assert_eq!(status.code(), Some(0), "{}: {err}", args[2]);
        assert!(err.is_empty(), "{}: {err}", args[2]);
    }
}

#[test]
fn a_committed_apply_whose_report_cannot_be_written_exits_0() {
    let (pid, start) = dead_process();
    let stores = Stores::new(&[stale_row("w-dead", pid, &start)]);
    let plan_path = stores.dir.path().join("plan.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), plan_path.display().to_string()]);
    assert!(bin().args(&args).output().unwrap().status.success());
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(&plan_path)
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("could not be written")
            && err.contains("1 worker(s) were retired (outcome applied)"),
        "{err}"
    );
    let status: String = rusqlite::Connection::open(&stores.registry)
        .unwrap()
        .query_row(
            "SELECT status FROM worker_registrations WHERE worker_identity = 'w-dead'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(status, "retired");
}

#[test]
fn a_writer_killed_mid_transaction_is_rolled_back_by_the_next_reader() {
    let (pid, start) = dead_process();
    let stores = Stores::new(&[stale_row("w-dead", pid, &start)]);
    // A writer in rollback-journal mode spills a change into the file and
    // is killed before COMMIT, leaving a hot journal.
    let script = r#"
import os, signal, sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA journal_mode=DELETE")
c.execute("PRAGMA cache_size=1")
c.execute("BEGIN IMMEDIATE")
c.execute("UPDATE worker_registrations SET status = 'released'")
c.execute("CREATE TABLE filler (x)")
c.executemany("INSERT INTO filler VALUES (?)", [("x" * 500,) for _ in range(2000)])
os.kill(os.getpid(), signal.SIGKILL)
"#;
    let crashed = Command::new("python3")
        .args(["-c", script])
        .arg(&stores.registry)
        .status()
        .unwrap();
    assert!(!crashed.success());
    let journal = Path::new(&format!("{}-journal", stores.registry.display())).to_path_buf();
    assert!(
        std::fs::metadata(&journal).unwrap().len() > 0,
        "no hot journal"
    );
    let mut args = vec!["--format".to_string(), "json".into()];
    args.extend(stores.plan_args("controller-prgs"));
    let out = bin().args(&args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("hot journal"), "the recovery is said");
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["candidate_worker_identities"], json!(["w-dead"]));
    let out = bin()
        .args([
            "snapshot",
            "--registry",
            stores.registry.to_str().unwrap(),
            "--profiles",
            stores.profiles.to_str().unwrap(),
            "--profile",
            "controller-prgs",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    let status: String = conn
        .query_row("SELECT status FROM worker_registrations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(status, "active", "the interrupted transaction is undone");
    let filler: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'filler'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(filler, 0);
}

#[test]
fn an_unwritable_registry_is_registry_unavailable_with_the_permission_needed() {
    let (pid, start) = dead_process();
    let stores = Stores::new(&[stale_row("w-dead", pid, &start)]);
    let plan_path = stores.dir.path().join("plan.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), plan_path.display().to_string()]);
    assert!(bin().args(&args).output().unwrap().status.success());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(stores.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for f in std::fs::read_dir(stores.dir.path()).unwrap() {
        std::fs::set_permissions(f.unwrap().path(), std::fs::Permissions::from_mode(0o644))
            .unwrap();
    }
    let before = std::fs::read(&stores.registry).unwrap();
    // A copy of the binary the unprivileged user can execute wherever this
    // checkout lives.
    let exe = stores.dir.path().join("fleet-retire");
    std::fs::copy(EXE, &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Apply as an unprivileged user who may read but not write the registry.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args(stores.apply_args("controller-prgs"))
        .arg(&plan_path)
        .output()
        .unwrap();
    if skip_unless(
        !String::from_utf8_lossy(&out.stderr).contains("setpriv:"),
        "setpriv (running a command as another user)",
    ) {
        return;
    }
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert_eq!(report["outcome"], "registry_unavailable", "{report}");
    let detail = report["detail"].as_str().unwrap();
    assert!(
        detail.contains(&stores.registry.display().to_string())
            && detail.contains("not writable")
            && detail.contains("uid 65534"),
        "{detail}"
    );
    assert_eq!(std::fs::read(&stores.registry).unwrap(), before);
}

#[test]
fn malformed_inputs_are_refused_with_what_to_fix() {
    let (pid, start) = dead_process();
    let stores = Stores::new(&[stale_row("w-dead", pid, &start)]);
    let plan_path = stores.dir.path().join("plan.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), plan_path.display().to_string()]);
    assert!(bin().args(&args).output().unwrap().status.success());
    let plan: Value = serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    let before = std::fs::read(&stores.registry).unwrap();
    let apply_with = |extra: &[&str], plan_file: &Path| {
        bin()
            .args(stores.apply_args("controller-prgs"))
            .args(extra)
            .arg(plan_file)
            .output()
            .unwrap()
    };
    let expect = |out: std::process::Output, needle: &str| {
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{needle}: {all}");
        assert!(all.contains(needle), "{needle}: {all}");
        assert!(
            !all.contains("panicked") && !all.contains("internal error"),
            "{all}"
        );
    };
    expect(
        apply_with(&["--busy-timeout-ms", "4294967296"], &plan_path),
        "--busy-timeout-ms",
    );
    expect(
        apply_with(&[], Path::new("/dev/zero")),
        "not a regular file",
    );
    let mut args = stores.apply_args("controller-prgs");
    let at = args.iter().position(|a| a == "--profiles").unwrap();
    args[at + 1] = "/dev/zero".into();
    expect(
        bin().args(&args).arg(&plan_path).output().unwrap(),
        "not a regular file",
    );
    let write = |name: &str, text: String| {
        let p = stores.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let bom = write("bom.json", format!("\u{feff}{plan}"));
    expect(apply_with(&[], &bom), "byte-order mark");
    let mut wrong = plan.clone();
    wrong["registry_fingerprint"] = json!(42);
    let wrong = write("wrong-type.json", wrong.to_string());
    expect(
        apply_with(&[], &wrong),
        "`registry_fingerprint` must be a string",
    );
    let mut ids = plan.clone();
    ids["candidate_worker_identities"] = json!(["w-dead", 7]);
    let ids = write("ids.json", ids.to_string());
    expect(
        apply_with(&[], &ids),
        "`candidate_worker_identities[1]` must be a string",
    );
    let profiles_bom = write(
        "profiles-bom.json",
        format!(
            "\u{feff}{}",
            std::fs::read_to_string(&stores.profiles).unwrap()
        ),
    );
    let mut args = stores.apply_args("controller-prgs");
    args[at + 1] = profiles_bom.display().to_string();
    expect(
        bin().args(&args).arg(&plan_path).output().unwrap(),
        "byte-order mark",
    );
    assert_eq!(std::fs::read(&stores.registry).unwrap(), before);
}

/// Statuses and audit rows after a crash, as the next reader sees them.
fn state_after_crash(registry: &Path) -> (usize, usize, usize) {
    // Opening read-write lets SQLite roll back a hot journal (or replay the
    // WAL), as any next writer or our readers do.
    let conn = rusqlite::Connection::open(registry).unwrap();
    let count = |sql: &str| -> usize {
        conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap_or(0) as usize
    };
    let active = count("SELECT count(*) FROM worker_registrations WHERE status = 'active'");
    let retired = count("SELECT count(*) FROM worker_registrations WHERE status = 'retired'");
    let audited = count(
        "SELECT count(*) FROM retirement_audit a JOIN worker_registrations w \
         ON w.worker_identity = a.worker_identity AND w.status = 'retired'",
    );
    (active, retired, audited)
}

#[test]
fn apply_killed_at_random_instants_leaves_the_registry_wholly_before_or_after() {
    let (pid, start) = dead_process();
    let n = 300;
    let rows: Vec<Value> = (0..n)
        .map(|i| {
            let mut r = stale_row(&format!("w-{i:04}"), pid, &start);
            r["session_id"] = json!(format!("sess-{i}"));
            r
        })
        .collect();
    let template = Stores::new(&rows);
    let plan_path = template.dir.path().join("plan.json");
    let mut args = template.plan_args("controller-prgs");
    args.extend(["--out".into(), plan_path.display().to_string()]);
    assert!(bin().args(&args).output().unwrap().status.success());
    // How long one apply takes here, to spread the kills over it.
    let probe_dir = tempfile::tempdir().unwrap();
    let copy = |dir: &Path, wal: bool| -> Vec<String> {
        for f in [
            "registry.sqlite",
            "leases.sqlite",
            "profiles.json",
            "plan.json",
        ] {
            std::fs::copy(template.dir.path().join(f), dir.join(f)).unwrap();
        }
        if wal {
            rusqlite::Connection::open(dir.join("registry.sqlite"))
                .unwrap()
                .pragma_update(None, "journal_mode", "WAL")
                .unwrap();
        }
        vec![
            "--format".into(),
            "json".into(),
            "apply".into(),
            dir.join("plan.json").display().to_string(),
            "--max-retire".into(),
            n.to_string(),
            "--registry".into(),
            dir.join("registry.sqlite").display().to_string(),
            "--leases".into(),
            dir.join("leases.sqlite").display().to_string(),
            "--profiles".into(),
            dir.join("profiles.json").display().to_string(),
            "--profile".into(),
            "controller-prgs".into(),
        ]
    };
    let args = copy(probe_dir.path(), false);
    let t = Instant::now();
    let out = bin().args(&args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let full = t.elapsed();
    let mut seed: u64 = u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15;
    let mut random = move || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        seed >> 33
    };
    let (mut before, mut after) = (0, 0);
    for wal in [false, true] {
        for _ in 0..15 {
            let dir = tempfile::tempdir().unwrap();
            let args = copy(dir.path(), wal);
            let mut child = KillOnDrop(
                bin()
                    .args(&args)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            let at = full.mul_f64((random() % 1000) as f64 / 1000.0 * 1.1);
            std::thread::sleep(at);
            let _ = child.0.kill();
            let _ = child.0.wait();
            let (active, retired, audited) = state_after_crash(&dir.path().join("registry.sqlite"));
            match (active, retired) {
                (a, 0) if a == n => {
                    assert_eq!(audited, 0);
                    before += 1;
                }
                (0, r) if r == n => {
                    assert_eq!(audited, n, "one audit row per retired worker");
                    after += 1;
                }
                other => panic!("wal={wal}, killed at {at:?}: a partial state {other:?}"),
            }
        }
    }
    eprintln!("30 kills: {before} wholly before, {after} wholly after");
}

#[test]
fn a_heartbeating_writer_never_fails_during_an_apply_over_many_lease_rows() {
    let (pid, start) = dead_process();
    let n = 500;
    let mut rows: Vec<Value> = (0..n)
        .map(|i| {
            let mut r = stale_row(&format!("w-{i:04}"), pid, &start);
            r["session_id"] = json!(format!("sess-{i}"));
            r
        })
        .collect();
    // A live worker (this test's own process), outside the candidates.
    let mut live = stale_row(
        "w-live",
        i64::from(std::process::id()),
        &start_time(std::process::id()),
    );
    live["session_id"] = json!("sess-live");
    live["namespace"] = json!("reviewer");
    live["client_instance_id"] = json!("inst-codex-20260730T100000Z-0123456789ab");
    live["last_heartbeat_at"] = json!(fleet_retire::time::format_ts(fleet_retire::time::now()));
    rows.push(live);
    let stores = Stores::new(&rows);
    let leases = rusqlite::Connection::open(&stores.leases).unwrap();
    let tx = leases.unchecked_transaction().unwrap();
    for i in 0..20_000 {
        tx.execute(
            "INSERT INTO workflow_leases (lease_id, status, owner_worker_identity, owner_pid) \
             VALUES (?1, 'released', ?2, ?3)",
            rusqlite::params![format!("l-{i}"), format!("w-{:04}", i % n), 9_000_000 + i],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    let plan_path = stores.dir.path().join("plan.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), plan_path.display().to_string()]);
    assert!(bin().args(&args).output().unwrap().status.success());

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, registry) = (stop.clone(), stores.registry.clone());
        std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(&registry).unwrap();
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match conn.execute(
                    "UPDATE worker_registrations SET last_heartbeat_at = ?1 WHERE worker_identity = 'w-live'",
                    [fleet_retire::time::format_ts(fleet_retire::time::now())],
                ) {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(e.to_string()),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (ok, failed)
        })
    };
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .args(["--max-retire", "1000"])
        .arg(&plan_path)
        .output()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, failed) = writer.join().unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(report["outcome"], "applied", "{report}");
    assert_eq!(report["retired_count"], n);
    assert!(
        failed.is_empty(),
        "{} heartbeats failed: {failed:?}",
        failed.len()
    );
    assert!(ok > 0);
    let held = report["lock_held_ms"].as_u64().unwrap();
    eprintln!("lock held {held} ms; {ok} heartbeats, none failed");
    assert!(held < 5_000, "the lock was held {held} ms");
}

/// A saved plan of a large registry is far over the 16 MiB cap on other
/// inputs (a million rows make gigabytes). Apply streams it, keeping only
/// the header, the candidates and `planned_rows`; a duplicated top-level
/// key is still refused, naming it.
#[test]
fn a_saved_plan_larger_than_other_inputs_is_applied_and_duplicates_refused() {
    let (pid, start) = dead_process();
    let stores = Stores::new(&[stale_row("w-dead", pid, &start)]);
    let plan_path = stores.dir.path().join("plan.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), plan_path.display().to_string()]);
    assert!(bin().args(&args).output().unwrap().status.success());
    let saved = std::fs::read_to_string(&plan_path).unwrap();
    let body = saved.trim_end().strip_suffix('}').unwrap();
    let before = std::fs::read(&stores.registry).unwrap();

    let twice = stores.dir.path().join("twice.json");
    std::fs::write(
        &twice,
        format!("{body},\n\"candidate_worker_identities\": [\"w-other\"]\n}}"),
    )
    .unwrap();
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(&twice)
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("duplicate key \"candidate_worker_identities\""),
        "{all}"
    );
    assert_eq!(std::fs::read(&stores.registry).unwrap(), before);

    let big = stores.dir.path().join("big.json");
    let padding = "x".repeat(20 << 20);
    std::fs::write(
        &big,
        format!("{body},\n\"evidence_archive\": [\"{padding}\"]\n}}"),
    )
    .unwrap();
    assert!(std::fs::metadata(&big).unwrap().len() > 16 << 20);
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(&big)
        .output()
        .unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(report["outcome"], "applied", "{report}");
    assert_eq!(status_of(&stores.registry, "w-dead"), "retired");
}

/// A worker list longer than a command line holds is given as `@FILE`.
#[test]
fn workers_are_read_from_a_file_with_at() {
    let (pid, start) = dead_process();
    let stores = Stores::new(&[
        stale_row("w-dead", pid, &start),
        stale_row("w-dead-2", pid, &start),
    ]);
    let out = bin()
        .args(stores.plan_args("controller-prgs"))
        .args(["--format", "json"])
        .output()
        .unwrap();
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = stores.dir.path().join("workers.txt");
    std::fs::write(&list, "w-dead\nw-dead-2\n").unwrap();
    let fp = |k: &str| plan[k].as_str().unwrap().to_string();
    let mut args = stores.apply_args("controller-prgs");
    args.extend([
        "--registry-fingerprint".into(),
        fp("registry_fingerprint"),
        "--candidate-fingerprint".into(),
        fp("candidate_fingerprint"),
        "--policy-fingerprint".into(),
        fp("policy_fingerprint"),
        "--canonical-repository".into(),
        "prgs/gitea-tools".into(),
    ]);
    let missing = bin()
        .args(&args)
        .args(["--workers", "@/nonexistent/workers.txt"])
        .output()
        .unwrap();
    let all = text(&missing);
    assert_eq!(missing.status.code(), Some(1), "{all}");
    assert!(
        all.contains("--workers /nonexistent/workers.txt: cannot open"),
        "{all}"
    );
    let out = bin()
        .args(&args)
        .arg("--workers")
        .arg(format!("@{}", list.display()))
        .output()
        .unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(report["outcome"], "applied", "{report}");
    assert_eq!(report["retired_count"], 2, "{report}");
    assert_eq!(status_of(&stores.registry, "w-dead-2"), "retired");
}

/// Workers starting together on a registry from before a column was added
/// each open it for writing; the first migrates it and the others must find
/// it migrated, not fail with "duplicate column name" (one `serve` of fifty
/// did, and exited).
#[test]
fn workers_opening_an_old_registry_together_migrate_it_once() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.sqlite");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(
                "CREATE TABLE worker_registrations (worker_identity TEXT PRIMARY KEY, pid INTEGER,
                 status TEXT, last_heartbeat_at TEXT);
                 INSERT INTO worker_registrations VALUES ('w-old', 1, 'active', '2026-01-01T00:00:00Z');",
            )
            .unwrap();
        let barrier = std::sync::Barrier::new(16);
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        fleet_retire::worker::open(&path)
                            .map(drop)
                            .map_err(|e| e.to_string())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &results {
            assert!(r.is_ok(), "{r:?}");
        }
        let columns: Vec<String> = rusqlite::Connection::open(&path)
            .unwrap()
            .prepare("SELECT name FROM pragma_table_info('worker_registrations')")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(columns.iter().any(|c| c == "pid_namespace"), "{columns:?}");
        assert_eq!(
            columns.iter().filter(|c| *c == "pid_namespace").count(),
            1,
            "{columns:?}"
        );
    }
}

/// Text that is not UTF-8 stops the plan, naming the row and column. The
/// reader checks a whole batch of texts at once, so the attack is two
/// neighbouring texts that are each half of one character: together they
/// are valid UTF-8, apart neither is.
#[test]
fn text_that_is_not_utf8_is_refused_even_when_neighbours_complete_it() {
    let (pid, start) = dead_process();
    let rows: Vec<Value> = (0..3)
        .map(|i| stale_row(&format!("w-{i}"), pid, &start))
        .collect();
    for (sql, row, column) in [
        // Row 2's role ends with the lead byte of "é", its profile starts
        // with the continuation byte.
        (
            "UPDATE worker_registrations SET role = CAST(x'617574686f72c3' AS TEXT), \
             profile = CAST(x'a9617574686f72' AS TEXT) WHERE worker_identity = 'w-1'",
            2,
            "role",
        ),
        (
            "UPDATE worker_registrations SET host_id = CAST(x'ff' AS TEXT) WHERE worker_identity = 'w-2'",
            3,
            "host_id",
        ),
    ] {
        let stores = Stores::new(&rows);
        let conn = rusqlite::Connection::open(&stores.registry).unwrap();
        conn.execute(sql, []).unwrap();
        drop(conn);
        let out = bin().args(stores.plan_args("controller-prgs")).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let said = text(&out);
        assert!(
            said.contains(&format!("row {row}: column `{column}`: text is not valid UTF-8")),
            "{said}"
        );
    }
}

/// A registry large enough that reading it maps tens of megabytes and
/// takes a while: `n` stale rows, copied in by SQL from the first ones.
fn large_registry(n: usize) -> Stores {
    let stores = stale_stores(500);
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('worker_registrations')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let select: Vec<String> = columns
        .iter()
        .map(|c| match c.as_str() {
            "worker_identity" => format!("worker_identity || '-' || ?1 AS {c}"),
            "session_id" => format!("session_id || '-' || ?1 AS {c}"),
            other => format!("\"{other}\""),
        })
        .collect();
    let copy = format!(
        "INSERT INTO worker_registrations SELECT {} FROM worker_registrations WHERE rowid <= 500",
        select.join(", ")
    );
    let tx = conn.unchecked_transaction().unwrap();
    for k in 1..n / 500 {
        tx.execute(&copy, [k as i64]).unwrap();
    }
    tx.commit().unwrap();
    stores
}

/// Wait for `child` (killing it past `limit`) and read what it wrote to
/// stderr.
fn finish(child: &mut std::process::Child, limit: Duration) -> (std::process::ExitStatus, String) {
    let status = wait_for(child, limit);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err)
}

/// The attack on the mapped read: a process that ignores SQLite's locks
/// cuts the registry short while `plan` reads it. Whenever the cut lands,
/// plan ends with its rows or with exit 1 and a message, never killed by a
/// signal (a mapped page past the new end raises SIGBUS, which plan turns
/// into its message) and never with a panic.
#[test]
fn a_registry_cut_short_under_a_running_plan_ends_in_a_message_not_a_signal() {
    use std::os::unix::process::ExitStatusExt;
    let stores = large_registry(60_000);
    let pristine = std::fs::read(&stores.registry).unwrap();
    assert!(
        pristine.len() > 12 << 20,
        "the registry is {} bytes",
        pristine.len()
    );
    let mut args = vec!["--format".to_string(), "json".into()];
    args.extend(stores.plan_args("controller-prgs"));
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for attempt in 0..12u64 {
        std::fs::write(&stores.registry, &pristine).unwrap();
        let child = KillOnDrop(
            Command::new(EXE)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        // Cut at a different moment each time: from before the read starts
        // to well into it.
        std::thread::sleep(Duration::from_millis(5 + attempt * 6));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&stores.registry)
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
        let mut child = child;
        let (status, err) = finish(&mut child.0, Duration::from_secs(60));
        assert_eq!(
            status.signal(),
            None,
            "attempt {attempt}: killed by a signal; {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("internal error"),
            "{err}"
        );
        match status.code() {
            Some(0) => *outcomes.entry("read whole".into()).or_default() += 1,
            Some(1) => {
                assert!(
                    err.starts_with("fleet-retire: "),
                    "attempt {attempt}: {err}"
                );
                assert!(
                    err.contains("registry") || err.contains("store file"),
                    "{err}"
                );
                let kind = if err.contains("mapped into memory") {
                    "bus error"
                } else {
                    "SQLite error"
                };
                *outcomes.entry(kind.into()).or_default() += 1;
            }
            other => panic!("attempt {attempt}: exit {other:?}: {err}"),
        }
    }
    eprintln!("outcomes: {outcomes:?}");
}

/// SIGBUS, however it arrives, ends the process with the plain message
/// and exit 1 (a long-running `serve` here, its handler long installed).
#[test]
fn a_bus_error_ends_the_process_with_a_message_and_exit_1() {
    use std::os::unix::process::ExitStatusExt;
    let stores = Stores::new(&[]);
    let mut child = KillOnDrop(
        serve_command(&stores, "w-bus", "sess-bus")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.0.try_wait().unwrap().is_none(), "serve ended early");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGBUS,
    )
    .unwrap();
    let (status, err) = finish(&mut child.0, Duration::from_secs(10));
    assert_eq!(status.signal(), None, "{err}");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("could not be read where it was mapped into memory"),
        "{err}"
    );
    assert!(err.contains("Nothing was changed"), "{err}");
}
