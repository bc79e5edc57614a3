//! `fleet-retire serve` driven by a client this project did not write (the
//! Python MCP SDK, `tests/mcp_client/drive.py`), and a fleet of real servers
//! heartbeating while a plan waits to be applied.

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_fleet-retire");

fn python_mcp_available() -> bool {
    Command::new("python3")
        .args(["-c", "import mcp.client.stdio"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
#[cfg_attr(
    not(fr_python_mcp),
    ignore = "needs python3 with the mcp package (pip install mcp==2.3.0; then touch build.rs)"
)]
fn an_independent_mcp_client_drives_the_server() {
    if skip_unless(python_mcp_available(), "python3 with the `mcp` package") {
        return;
    }
    let (stores, _live) = fleet();
    scope_indexes(&stores.registry);
    let driver = KillOnDrop(
        Command::new("python3")
            .arg("tests/mcp_client/drive.py")
            .arg(EXE)
            .arg(stores.dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = wait_with_deadline(driver, Duration::from_secs(120));
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("all checks passed"), "{all}");
    // Every server the client started has released its row or was killed:
    // none is left running.
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    let active_servers: Vec<(String, i64)> = conn
        .prepare(
            "SELECT worker_identity, pid FROM worker_registrations \
             WHERE status = 'active' AND transport = 'stdio'",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (w, pid) in &active_servers {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "server {w} (pid {pid}) is still running"
        );
    }
}

/// A `serve` process heartbeating every second, its stdin held open.
fn heartbeating_server(stores: &Stores, n: usize) -> KillOnDrop {
    KillOnDrop(
        serve_command(
            stores,
            &format!("w-live-{n:02}"),
            &format!("sess-live-{n:02}"),
        )
        .env("FLEET_RETIRE_HEARTBEAT_TTL", "5")
        .env("FLEET_RETIRE_HEARTBEAT_INTERVAL", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(stores.dir.path().join(format!("server-{n:02}.err"))).unwrap(),
        )
        .spawn()
        .unwrap(),
    )
}

fn saved_plan(stores: &Stores) -> (std::path::PathBuf, Value) {
    let path = stores.dir.path().join("plan.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), path.display().to_string()]);
    let out = bin().args(&args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let plan = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    (path, plan)
}

fn apply(stores: &Stores, plan: &std::path::Path) -> Value {
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(plan)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)))
}

#[test]
fn a_plan_applied_thirty_seconds_later_in_a_heartbeating_fleet() {
    let mut rows = Vec::new();
    for i in 1..=3 {
        let (pid, start) = dead_process();
        rows.push(stale_row(&format!("w-dead-{i}"), pid, &start));
    }
    let stores = Stores::new(&rows);
    let servers: Vec<KillOnDrop> = (0..50).map(|n| heartbeating_server(&stores, n)).collect();
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    let started = Instant::now();
    loop {
        let n: i64 = conn
            .query_row(
                "SELECT count(*) FROM worker_registrations WHERE worker_identity LIKE 'w-live-%'",
                [],
                |r| r.get(0),
            )
            .unwrap_or(0);
        if n == 50 {
            break;
        }
        if started.elapsed() > Duration::from_secs(90) {
            let said: Vec<String> = (0..50)
                .filter_map(|i| {
                    let p = stores.dir.path().join(format!("server-{i:02}.err"));
                    std::fs::read_to_string(p).ok().filter(|t| !t.is_empty())
                })
                .collect();
            panic!("{n} of 50 registered in 90 s; the servers said: {said:#?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (plan_path, plan) = saved_plan(&stores);
    assert_eq!(
        plan["candidate_worker_identities"],
        json!(["w-dead-1", "w-dead-2", "w-dead-3"])
    );
    assert_eq!(plan["planned_rows"]["rows"].as_array().unwrap().len(), 53);
    std::thread::sleep(Duration::from_secs(30));
    // Without the plan's rows the comparison is exact: refused.
    let bare_path = stores.dir.path().join("plan-bare.json");
    let mut bare = plan.clone();
    bare.as_object_mut().unwrap().remove("planned_rows");
    std::fs::write(&bare_path, bare.to_string()).unwrap();
    let report = apply(&stores, &bare_path);
    assert_eq!(report["outcome"], "registry_revision_moved", "{report}");
    // With them, heartbeats of live workers are tolerated.
    let report = apply(&stores, &plan_path);
    assert_eq!(report["outcome"], "applied", "{report}");
    assert_eq!(report["retired_count"], 3);
    let tolerated = report["heartbeats_tolerated"].as_u64().unwrap();
    assert!(tolerated >= 45, "the live servers heartbeated: {report}");
    assert!(report["heartbeats_tolerated_workers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w.as_str().unwrap().starts_with("w-live-")));
    let audit: i64 = conn
        .query_row(
            "SELECT count(*) FROM retirement_audit WHERE heartbeats_tolerated = ?1",
            [tolerated as i64],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(audit, 3, "each audit row records the tolerance");

    // A candidate whose heartbeat resumes between plan and apply is refused:
    // the plan's candidate token covered its old heartbeat.
    let (pid, start) = dead_process();
    let mut row = stale_row("w-resumes", pid, &start);
    row["session_id"] = json!("sess-resumes");
    insert_row(&conn, &row);
    let (plan_path, plan) = saved_plan(&stores);
    assert_eq!(plan["candidate_worker_identities"], json!(["w-resumes"]));
    std::thread::sleep(Duration::from_secs(2));
    conn.execute(
        "UPDATE worker_registrations SET last_heartbeat_at = ?1 WHERE worker_identity = 'w-resumes'",
        [fleet_retire::time::format_ts(fleet_retire::time::now())],
    )
    .unwrap();
    let report = apply(&stores, &plan_path);
    assert_eq!(report["outcome"], "registry_revision_moved", "{report}");
    assert!(
        report["detail"]
            .as_str()
            .unwrap()
            .contains("w-resumes\", a candidate of the plan, changed beyond its heartbeat"),
        "{report}"
    );
    let status: String = conn
        .query_row(
            "SELECT status FROM worker_registrations WHERE worker_identity = 'w-resumes'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(status, "active");
    drop(servers);
}

#[test]
fn sigterm_and_sigint_release_the_servers_row() {
    let stores = Stores::new(&[]);
    for (n, signal) in [
        (90, nix::sys::signal::Signal::SIGTERM),
        (91, nix::sys::signal::Signal::SIGINT),
    ] {
        let mut server = heartbeating_server(&stores, n);
        let identity = format!("w-live-{n:02}");
        let conn = rusqlite::Connection::open(&stores.registry).unwrap();
        let status = |conn: &rusqlite::Connection| -> Option<String> {
            conn.query_row(
                "SELECT status FROM worker_registrations WHERE worker_identity = ?1",
                [&identity],
                |r| r.get(0),
            )
            .ok()
        };
        let started = Instant::now();
        while status(&conn).is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "not registered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(status(&conn).as_deref(), Some("active"));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.id() as i32), signal).unwrap();
        let exit = server.0.wait().unwrap();
        assert!(exit.success(), "{signal}: {exit}");
        assert_eq!(status(&conn).as_deref(), Some("released"), "{signal}");
    }
}

/// The attack on the shutdown path: a supervisor sends SIGTERM while the
/// server is still registering (here it waits on a write lock we hold). The
/// signal must not kill it with its row left `active`; it registers, sees the
/// held signal and releases the row.
#[test]
fn a_signal_during_registration_still_releases_the_row() {
    let stores = Stores::new(&[]);
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut server = heartbeating_server(&stores, 92);
    // Registration has begun once the server holds the registry open.
    let registry = std::fs::canonicalize(&stores.registry).unwrap();
    let fds = format!("/proc/{}/fd", server.id());
    let started = Instant::now();
    while !std::fs::read_dir(&fds)
        .map(|d| {
            d.flatten()
                .any(|e| std::fs::read_link(e.path()).ok() == Some(registry.clone()))
        })
        .unwrap_or(false)
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the server never opened the registry"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the server died of the signal while registering"
    );
    conn.execute_batch("COMMIT").unwrap();
    let exit = server.0.wait().unwrap();
    assert!(exit.success(), "{exit}");
    let status: String = conn
        .query_row(
            "SELECT status FROM worker_registrations WHERE worker_identity = 'w-live-92'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(status, "released");
}
