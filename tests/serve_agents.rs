//! `fleet-retire serve` as agents meet it: the official Python SDK
//! (`tests/mcp_client/agent.py`) and the official TypeScript SDK
//! (`tests/mcp_client/agent.mjs`) each drive the same script of checks
//! against a 100,000-row registry shaped like a long-running fleet: tools,
//! schemas and annotations, the plan summary, every preserved row paged and
//! compared with `fleet-retire plan --format json`, the plan's resource,
//! explain, apply with the plan's tokens, refusals, and the snapshot.
//!
//! The registry comes from `../shared/bench/gen_registry.py` when that is
//! here (bound to this machine: real pids are probed), otherwise from a
//! plainer generator of our own. Each client gets its own copy, since its
//! apply retires rows. Under `CI=true` a missing client fails the test.

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_fleet-retire");
const ROWS: usize = 100_000;

#[test]
#[cfg_attr(
    not(fr_python_mcp),
    ignore = "needs python3 with the mcp package (pip install mcp==2.3.0; then touch build.rs)"
)]
fn the_python_sdk_agent_passes_the_script_at_100k_rows() {
    let available = Command::new("python3")
        .args(["-c", "import mcp.client.stdio, jsonschema"])
        .output()
        .is_ok_and(|o| o.status.success());
    if skip_unless(
        available,
        "python3 with the `mcp` and `jsonschema` packages",
    ) {
        return;
    }
    run_agent(Command::new("python3").arg("tests/mcp_client/agent.py"));
}

#[test]
#[cfg_attr(
    not(fr_node_sdk),
    ignore = "needs the TypeScript MCP SDK ((cd tests/mcp_client && npm ci))"
)]
fn the_typescript_sdk_agent_passes_the_script_at_100k_rows() {
    let installed = Path::new("tests/mcp_client/node_modules/@modelcontextprotocol/sdk").is_dir();
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if skip_unless(
        installed && node,
        "node with tests/mcp_client installed (cd tests/mcp_client && npm ci)",
    ) {
        return;
    }
    run_agent(Command::new("node").arg("tests/mcp_client/agent.mjs"));
}

/// A client that starts a server per call (as the MCP Inspector's command
/// line does), through each SDK, on a 3,000-row registry of the same
/// shape: plans with one server, pages every preserved reason to the end
/// by offset with one server per page, and applies two batches of that
/// first plan with two more (`tests/mcp_client/per_call.py`).
#[test]
#[cfg_attr(
    not(fr_python_mcp),
    ignore = "needs python3 with the mcp package (pip install mcp==2.3.0; then touch build.rs)"
)]
fn a_python_sdk_client_with_a_server_per_call_pages_and_applies() {
    let available = Command::new("python3")
        .args(["-c", "import mcp"])
        .status()
        .is_ok_and(|s| s.success());
    if skip_unless(available, "python3 with the `mcp` package") {
        return;
    }
    let dir = generated_fleet(3_000);
    run_script_in(
        Command::new("python3").arg("tests/mcp_client/per_call.py"),
        dir.path(),
    );
}

/// The same, through the TypeScript SDK (`tests/mcp_client/per_call.mjs`).
#[test]
#[cfg_attr(
    not(fr_node_sdk),
    ignore = "needs the TypeScript MCP SDK ((cd tests/mcp_client && npm ci))"
)]
fn a_typescript_sdk_client_with_a_server_per_call_pages_and_applies() {
    let installed = Path::new("tests/mcp_client/node_modules/@modelcontextprotocol/sdk").is_dir();
    let node = Command::new("node")
        .arg("--version")
        .status()
        .is_ok_and(|s| s.success());
    if skip_unless(
        installed && node,
        "node with tests/mcp_client installed (cd tests/mcp_client && npm ci)",
    ) {
        return;
    }
    let dir = generated_fleet(3_000);
    run_script_in(
        Command::new("node").arg("tests/mcp_client/per_call.mjs"),
        dir.path(),
    );
}

/// What a model sees (issue 52), through the Python SDK on a 3,000-row
/// realistic registry: the aliases name the tool to prefer, the plans are
/// listed as resources under a template, a result's text carries its
/// structured content (abridged to the essential fields when both would
/// not fit in 1 MiB) so a text-only client plans, pages and applies from
/// the text alone, and arguments the schema does not allow come back as
/// tool results a model can correct (`tests/mcp_client/model_view.py`).
#[test]
fn what_a_model_sees_through_the_python_sdk() {
    if !python_sdk() {
        return;
    }
    let dir = generated_fleet(3_000);
    run_script_in(
        Command::new("python3").arg("tests/mcp_client/model_view.py"),
        dir.path(),
    );
}

/// The same, through the TypeScript SDK (`tests/mcp_client/model_view.mjs`).
#[test]
fn what_a_model_sees_through_the_typescript_sdk() {
    if !typescript_sdk() {
        return;
    }
    let dir = generated_fleet(3_000);
    run_script_in(
        Command::new("node").arg("tests/mcp_client/model_view.mjs"),
        dir.path(),
    );
}

/// The minimal Python client docs/serve.md shows plans and retires one
/// worker (`tests/mcp_client/minimal.py`).
#[test]
fn the_minimal_python_client_of_the_docs_plans_and_applies() {
    if !python_sdk() {
        return;
    }
    quoted_in_the_docs("tests/mcp_client/minimal.py", "import asyncio");
    run_minimal(Command::new("python3").arg("tests/mcp_client/minimal.py"));
}

/// The minimal TypeScript client docs/serve.md shows
/// (`tests/mcp_client/minimal.mjs`).
#[test]
fn the_minimal_typescript_client_of_the_docs_plans_and_applies() {
    if !typescript_sdk() {
        return;
    }
    quoted_in_the_docs("tests/mcp_client/minimal.mjs", "import { Client }");
    run_minimal(Command::new("node").arg("tests/mcp_client/minimal.mjs"));
}

/// docs/serve.md shows the client `script` word for word, from the line
/// that starts with `from` to its end.
fn quoted_in_the_docs(script: &str, from: &str) {
    let code = std::fs::read_to_string(script).unwrap();
    let shown = &code[code.find(from).unwrap()..];
    let docs = std::fs::read_to_string("docs/serve.md").unwrap();
    assert!(
        docs.contains(shown.trim_end()),
        "docs/serve.md no longer shows {script} as it is"
    );
}

/// Whether the Python SDK is here (under `CI=true`, its absence fails).
fn python_sdk() -> bool {
    let available = Command::new("python3")
        .args(["-c", "import mcp.client.stdio"])
        .status()
        .is_ok_and(|s| s.success());
    !skip_unless(available, "python3 with the `mcp` package")
}

/// Whether node and the TypeScript SDK are here (likewise).
fn typescript_sdk() -> bool {
    let installed = Path::new("tests/mcp_client/node_modules/@modelcontextprotocol/sdk").is_dir();
    let node = Command::new("node")
        .arg("--version")
        .status()
        .is_ok_and(|s| s.success());
    !skip_unless(
        installed && node,
        "node with tests/mcp_client installed (cd tests/mcp_client && npm ci)",
    )
}

/// Run a minimal client with `apply` on a small realistic fleet: it prints
/// the plan's summary, the apply's, and one worker retired.
fn run_minimal(client: &mut Command) {
    let dir = generated_fleet(2_000);
    heartbeat_the_live(&dir.path().join("registry.sqlite"));
    let child = KillOnDrop(
        client
            .arg(EXE)
            .arg(dir.path())
            .arg("apply")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = wait_with_deadline(child, Duration::from_secs(120));
    let all = text(&out);
    assert!(out.status.success(), "the minimal client failed:\n{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("rows assessed"), "{all}");
    assert!(stdout.contains("\napplied: "), "{all}");
    assert!(stdout.contains("retired: 1"), "{all}");
}

/// Run one agent script on a fresh copy of the registry; it must print
/// `all checks passed` in time ([`run_script_in`]).
fn run_agent(script: &mut Command) {
    let dir = tempfile::tempdir().unwrap();
    for file in ["registry.sqlite", "leases.sqlite", "profiles.json"] {
        std::fs::copy(fleet_dir().join(file), dir.path().join(file)).unwrap();
    }
    run_script_in(script, dir.path());
}

/// Run a client script on the fleet in `dir` (its live rows heartbeated to
/// now first); it must print `all checks passed` within ten minutes (two
/// 100,000-row scripts side by side on a loaded 2-core machine took 344 s).
fn run_script_in(script: &mut Command, dir: &Path) {
    heartbeat_the_live(&dir.join("registry.sqlite"));
    let child = KillOnDrop(
        script
            .arg(EXE)
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = wait_with_deadline(child, Duration::from_secs(600));
    let all = text(&out);
    eprintln!("{all}");
    assert!(out.status.success(), "the agent script failed:\n{all}");
    assert!(all.contains("all checks passed"), "{all}");
}

/// The generated fleet, made once per test run.
fn fleet_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| generated_fleet(ROWS)).path()
}

/// A fleet of `rows` from the shared generator (or our plainer one), with
/// profiles.json granting the controller plan and apply.
fn generated_fleet(rows: usize) -> tempfile::TempDir {
    {
        let dir = tempfile::tempdir().unwrap();
        let generator =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/gen_registry.py");
        if generator.is_file() {
            let ok = Command::new("python3")
                .arg(&generator)
                .args(["--rows", &rows.to_string(), "--out"])
                .arg(dir.path())
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "{} failed", generator.display());
        } else {
            eprintln!(
                "{} is not here: a plainer registry of our own",
                generator.display()
            );
            plain_fleet(dir.path(), rows);
        }
        scope_indexes(&dir.path().join("registry.sqlite"));
        std::fs::write(
            dir.path().join("profiles.json"),
            serde_json::json!({"profiles": {
                "controller-prgs": {"role": "controller",
                    "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}
            }})
            .to_string(),
        )
        .unwrap();
        dir
    }
}

/// A live fleet heartbeats: rows that looked live when generated are
/// brought to now, so that none crosses its TTL while the script runs and
/// the server's plan and the command line's judge the same registry.
fn heartbeat_the_live(registry: &Path) {
    let now = chrono::Utc::now();
    let iso = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let conn = rusqlite::Connection::open(registry).unwrap();
    conn.execute(
        "UPDATE worker_registrations SET last_heartbeat_at = ?1 \
         WHERE status = 'active' AND last_heartbeat_at > ?2 AND last_heartbeat_at <= ?1",
        [iso(now), iso(now - chrono::Duration::seconds(1800))],
    )
    .unwrap();
}
