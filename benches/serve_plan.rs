//! `cargo bench --bench serve_plan`: sequential `plan_stale_worker_retirement`
//! calls on one `fleet-retire serve` over a 10,000-row realistic registry
//! (`../shared/bench/gen_registry.py`), spoken to as an MCP client would
//! (newline-delimited JSON-RPC on the server's stdin and stdout).
//!
//! Prints calls per second and the server's resident memory after the first
//! calls and after the last: a server that kept something per call would
//! grow. `SERVE_BENCH_CALLS` (default 1000) and `SERVE_BENCH_ROWS` (default
//! 10000) change the workload.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let calls: usize = std::env::var("SERVE_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let rows: usize = std::env::var("SERVE_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir().unwrap();
    let generator = Path::new("../shared/bench/gen_registry.py");
    if !generator.exists() {
        eprintln!("skipped: {} is not here", generator.display());
        return;
    }
    let made = Command::new("python3")
        .arg(generator)
        .args(["--rows", &rows.to_string(), "--out"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(made.success(), "the registry generator failed");
    let profiles = dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]}}}"#,
    )
    .unwrap();
    // The server registers itself in the registry it plans (one more row,
    // heartbeated every 15 s, as in a real fleet).
    let mut server = Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .arg("serve")
        .env("FLEET_RETIRE_REGISTRY", dir.path().join("registry.sqlite"))
        .env("FLEET_RETIRE_LEASES", dir.path().join("leases.sqlite"))
        .env("GITEA_MCP_CONFIG", &profiles)
        .env("GITEA_MCP_PROFILE", "controller-prgs")
        .env("GITEA_MCP_NAMESPACE", "controller")
        .env("FLEET_RETIRE_CANONICAL_REPOSITORY", "prgs/gitea-tools")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = server.id();
    let mut stdin = server.stdin.take().unwrap();
    let mut stdout = BufReader::with_capacity(1 << 20, server.stdout.take().unwrap());
    let mut line = String::new();
    let send = |stdin: &mut std::process::ChildStdin, text: String| {
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    };
    send(
        &mut stdin,
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#.into(),
    );
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("\"result\""), "initialize failed: {line}");
    send(
        &mut stdin,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.into(),
    );

    let mut first_rss = 0;
    let mut bytes = 0usize;
    let started = Instant::now();
    let mut warm = started;
    for i in 1..=calls {
        send(
            &mut stdin,
            format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"plan_stale_worker_retirement","arguments":{{}}}}}}"#
            ),
        );
        line.clear();
        stdout.read_line(&mut line).unwrap();
        assert!(
            line.contains("\"registry_fingerprint\"") && !line.contains("\"isError\":true"),
            "call {i} failed: {}",
            &line[..line.len().min(400)]
        );
        bytes += line.len();
        if i == 10 {
            first_rss = rss_kib(pid, "VmRSS:");
            warm = Instant::now();
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let steady = warm.elapsed().as_secs_f64();
    let last_rss = rss_kib(pid, "VmRSS:");
    let peak = rss_kib(pid, "VmHWM:");
    drop(stdin);
    let status = server.wait().unwrap();
    assert!(
        status.success(),
        "the server did not exit cleanly: {status}"
    );
    println!("serve_plan: {calls} sequential plan calls over {rows} realistic rows");
    println!(
        "  {:.1} calls/s overall ({:.2} s), {:.1} calls/s after the first 10; {:.1} MB of responses per call",
        calls as f64 / elapsed,
        elapsed,
        (calls.saturating_sub(10)) as f64 / steady,
        bytes as f64 / calls as f64 / 1e6
    );
    println!(
        "  server RSS after 10 calls {:.1} MB, after {calls} calls {:.1} MB (peak {:.1} MB)",
        first_rss as f64 / 1024.0,
        last_rss as f64 / 1024.0,
        peak as f64 / 1024.0
    );
}
