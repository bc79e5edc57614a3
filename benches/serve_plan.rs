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
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
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
    let calls = count_from_env("SERVE_BENCH_CALLS", 1000);
    let rows = count_from_env("SERVE_BENCH_ROWS", 10_000);
    let dir = tempfile::tempdir().unwrap();
    let generator = Path::new("../shared/bench/gen_registry.py");
    if !generator.exists() {
        eprintln!("skipped: {} is not here", generator.display());
        return;
    }
    let profiles = make_fleet(generator, dir.path(), rows);
    let mut server = start_server(dir.path(), &profiles);
    let pid = server.id();
    let mut client = Client {
        stdin: server.stdin.take().unwrap(),
        stdout: BufReader::with_capacity(1 << 20, server.stdout.take().unwrap()),
        line: String::new(),
    };
    client.initialize();
    let measured = client.plan_calls(calls, pid);
    drop(client);
    let status = server.wait().unwrap();
    assert!(
        status.success(),
        "the server did not exit cleanly: {status}"
    );
    measured.print(calls, rows);
}

/// A count from the environment variable `name`, or `default`.
fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Generate a realistic registry of `rows` rows (and its leases) in `dir`,
/// and a profiles.json with one controller; returns that file's path.
fn make_fleet(generator: &Path, dir: &Path, rows: usize) -> std::path::PathBuf {
    let made = Command::new("python3")
        .arg(generator)
        .args(["--rows", &rows.to_string(), "--out"])
        .arg(dir)
        .status()
        .unwrap();
    assert!(made.success(), "the registry generator failed");
    let profiles = dir.join("profiles.json");
    std::fs::write(
        &profiles,
        r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]}}}"#,
    )
    .unwrap();
    profiles
}

/// Start `fleet-retire serve` on the fleet in `dir`, as the controller.
/// The server registers itself in the registry it plans (one more row,
/// heartbeated every 15 s, as in a real fleet).
fn start_server(dir: &Path, profiles: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .arg("serve")
        .env("FLEET_RETIRE_REGISTRY", dir.join("registry.sqlite"))
        .env("FLEET_RETIRE_LEASES", dir.join("leases.sqlite"))
        .env("GITEA_MCP_CONFIG", profiles)
        .env("GITEA_MCP_PROFILE", "controller-prgs")
        .env("GITEA_MCP_NAMESPACE", "controller")
        .env("FLEET_RETIRE_CANONICAL_REPOSITORY", "prgs/gitea-tools")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The MCP client's end of the server's stdio: one JSON-RPC message a line.
struct Client {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The last line read.
    line: String,
}

/// What a run of plan calls measured.
struct Measured {
    /// Seconds for every call.
    elapsed: f64,
    /// Seconds for the calls after the first ten.
    steady: f64,
    /// Bytes of responses, in all.
    bytes: usize,
    /// The server's resident memory after ten calls, after the last, and
    /// at its peak (KiB).
    first_rss: u64,
    last_rss: u64,
    peak: u64,
}

impl Client {
    /// Write one message.
    fn send(&mut self, text: &str) {
        self.stdin.write_all(text.as_bytes()).unwrap();
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Read the next line into `self.line`.
    fn receive(&mut self) {
        self.line.clear();
        self.stdout.read_line(&mut self.line).unwrap();
    }

    /// The MCP handshake: `initialize`, then `notifications/initialized`.
    fn initialize(&mut self) {
        self.send(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#,
        );
        self.receive();
        assert!(
            self.line.contains("\"result\""),
            "initialize failed: {}",
            self.line
        );
        self.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    }

    /// Make `calls` plan calls one after another, each checked, measuring
    /// time, response bytes and the server's (`pid`) memory.
    fn plan_calls(&mut self, calls: usize, pid: u32) -> Measured {
        let mut first_rss = 0;
        let mut bytes = 0usize;
        let started = Instant::now();
        let mut warm = started;
        for i in 1..=calls {
            self.send(&format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"plan_stale_worker_retirement","arguments":{{}}}}}}"#
            ));
            self.receive();
            let line = &self.line;
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
        Measured {
            elapsed: started.elapsed().as_secs_f64(),
            steady: warm.elapsed().as_secs_f64(),
            bytes,
            first_rss,
            last_rss: rss_kib(pid, "VmRSS:"),
            peak: rss_kib(pid, "VmHWM:"),
        }
    }
}

impl Measured {
    /// Print calls per second, bytes per call and memory.
    fn print(&self, calls: usize, rows: usize) {
        println!("serve_plan: {calls} sequential plan calls over {rows} realistic rows");
        println!(
            "  {:.1} calls/s overall ({:.2} s), {:.1} calls/s after the first 10; {:.1} MB of responses per call",
            calls as f64 / self.elapsed,
            self.elapsed,
            (calls.saturating_sub(10)) as f64 / self.steady,
            self.bytes as f64 / calls as f64 / 1e6
        );
        println!(
            "  server RSS after 10 calls {:.1} MB, after {calls} calls {:.1} MB (peak {:.1} MB)",
            self.first_rss as f64 / 1024.0,
            self.last_rss as f64 / 1024.0,
            self.peak as f64 / 1024.0
        );
    }
}
