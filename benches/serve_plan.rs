//! `cargo bench --bench serve_plan`: `fleet-retire serve` measured as an MCP
//! client meets it (newline-delimited JSON-RPC on the server's stdin and
//! stdout), on realistic registries from `../shared/bench/gen_registry.py`.
//!
//! * `ratio`: a plan call through `serve` against `fleet-retire plan
//!   --format json` on the same registry, side by side in one run (calls
//!   interleaved, medians), at 10,000 and 100,000 rows. The target is at
//!   most 1.2.
//! * `largest`: at 1,000,000 rows, every kind of result a client can ask
//!   for (summary, a page of 1,000 preserved rows of each reason code, the
//!   whole document, a resource page, explain, the snapshot's summary and a
//!   page); prints the largest. The bound is 1 MiB.
//! * `concurrent`: the server's peak memory for one plan call, and for
//!   eight sent at once (10,000 rows) and two at once (100,000 rows), each
//!   on a fresh server. The target is under twice one call's.
//! * `sequential`: 1,000 plan calls one after another on 10,000 rows:
//!   calls per second, and resident memory after 10 calls and after the
//!   last (flat: nothing is kept per call).
//!
//! `SERVE_BENCH_PARTS` (comma-separated) picks parts; `SERVE_BENCH_CALLS`
//! (1000), `SERVE_BENCH_ROUNDS` (9) and `SERVE_BENCH_HUGE_ROWS` (1000000)
//! change the workload.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

const EXE: &str = env!("CARGO_BIN_EXE_fleet-retire");

fn main() {
    let generator = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/gen_registry.py");
    if !generator.exists() {
        println!("serve_plan: skipped ({} is not here)", generator.display());
        return;
    }
    let parts = std::env::var("SERVE_BENCH_PARTS")
        .unwrap_or_else(|_| "ratio,largest,concurrent,sequential".into());
    let wants = |p: &str| parts.split(',').any(|w| w.trim() == p);
    let fleets = Fleets {
        generator,
        root: tempfile::tempdir().unwrap(),
    };
    if wants("ratio") {
        for rows in [10_000, 100_000] {
            ratio(&fleets.made(rows), rows);
        }
    }
    if wants("largest") {
        largest(&fleets.made(count_from_env("SERVE_BENCH_HUGE_ROWS", 1_000_000)));
    }
    if wants("concurrent") {
        concurrent(&fleets.made(10_000), 10_000, 8);
        concurrent(&fleets.made(100_000), 100_000, 2);
    }
    if wants("sequential") {
        sequential(
            &fleets.made(10_000),
            count_from_env("SERVE_BENCH_CALLS", 1000),
        );
    }
}

/// Generated registries, one folder per size.
struct Fleets {
    generator: PathBuf,
    root: tempfile::TempDir,
}

impl Fleets {
    /// The folder of a `rows`-row fleet, generated on first use, with a
    /// profiles.json naming one controller that may read.
    fn made(&self, rows: usize) -> PathBuf {
        let dir = self.root.path().join(rows.to_string());
        if dir.join("registry.sqlite").exists() {
            return dir;
        }
        let made = Command::new("python3")
            .arg(&self.generator)
            .args(["--rows", &rows.to_string(), "--out"])
            .arg(&dir)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(made.success(), "the registry generator failed");
        std::fs::write(
            dir.join("profiles.json"),
            r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]}}}"#,
        )
        .unwrap();
        dir
    }
}

/// A plan through serve against the command line's, interleaved.
fn ratio(dir: &Path, rows: usize) {
    let rounds = count_from_env("SERVE_BENCH_ROUNDS", 9);
    let mut server = Server::start(dir);
    server.call("plan_stale_worker_retirement", "{}");
    let (mut served, mut cli) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        let reply = server.call("plan_stale_worker_retirement", "{}");
        served.push(started.elapsed().as_secs_f64());
        assert!(reply.contains("\"candidate_count\""), "{}", head(&reply));
        let started = Instant::now();
        let out = Command::new(EXE)
            .args(["--format", "json", "plan"])
            .args(store_args(dir))
            .args(["--canonical-repository", "prgs/gitea-tools"])
            .output()
            .unwrap();
        cli.push(started.elapsed().as_secs_f64());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (s, c) = (median(&mut served), median(&mut cli));
    let verdict = if s / c <= 1.2 {
        "within 1.2"
    } else {
        "OVER 1.2"
    };
    println!(
        "serve_plan ratio, {rows} rows: serve {s:.3} s, CLI plan --format json {c:.3} s (medians of {rounds}); serve/CLI {:.2} ({verdict})",
        s / c
    );
    server.stop();
}

/// Every kind of result at a large registry; prints the largest.
fn largest(dir: &Path) {
    let rows = count_rows(dir);
    let mut server = Server::start(dir);
    let summary = server.call("plan_stale_worker_retirement", "{}");
    let body = structured(&summary);
    let mut sizes = vec![("plan summary".to_string(), summary.len())];
    let codes = body["preserved_cursors"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (code, cursor) in &codes {
        let args = serde_json::json!({"preserved": {"cursor": cursor, "limit": 1000}});
        let page = server.call("plan_stale_worker_retirement", &args.to_string());
        sizes.push((format!("preserved page of {code}"), page.len()));
    }
    let whole = server.call("plan_stale_worker_retirement", r#"{"include":"all"}"#);
    sizes.push(("include all (refused)".into(), whole.len()));
    let uri = body["resource_uri"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let read = server.request(
        "resources/read",
        &serde_json::json!({ "uri": uri }).to_string(),
    );
    sizes.push(("resource page".into(), read.len()));
    if let Some(worker) = body["candidate_worker_identities"][0].as_str() {
        let args = serde_json::json!({ "worker_identity": worker });
        let explained = server.call("explain_worker_retirement", &args.to_string());
        sizes.push(("explain".into(), explained.len()));
    }
    let snapshot = server.call("snapshot_instance_fleet", "{}");
    sizes.push(("snapshot summary".into(), snapshot.len()));
    let page = server.call(
        "snapshot_instance_fleet",
        r#"{"page":{"list":"historical_workers","limit":1000}}"#,
    );
    sizes.push(("snapshot page".into(), page.len()));
    server.stop();
    let (what, size) = sizes.iter().max_by_key(|(_, n)| *n).unwrap();
    let verdict = if *size < 1 << 20 {
        "under 1 MiB"
    } else {
        "OVER 1 MiB"
    };
    println!(
        "serve_plan largest, {rows} rows: {} results, the largest {size} bytes ({what}; {verdict})",
        sizes.len()
    );
}

/// Peak server memory for one plan call and for `n` sent at once.
fn concurrent(dir: &Path, rows: usize, n: usize) {
    let peak = |calls: usize| {
        let mut server = Server::start(dir);
        let ids: Vec<u64> = (0..calls)
            .map(|_| {
                server.send(
                    "tools/call",
                    r#"{"name":"plan_stale_worker_retirement","arguments":{}}"#,
                )
            })
            .collect();
        for id in ids {
            let reply = server.reply(id);
            assert!(reply.contains("\"candidate_count\""), "{}", head(&reply));
        }
        let kib = rss_kib(server.child.id(), "VmHWM:");
        server.stop();
        kib as f64 / 1024.0
    };
    let (one, many) = (peak(1), peak(n));
    let verdict = if many < 2.0 * one {
        "under twice"
    } else {
        "NOT under twice"
    };
    println!(
        "serve_plan concurrent, {rows} rows: peak RSS one call {one:.0} MB, {n} at once {many:.0} MB ({:.2}×, {verdict})",
        many / one
    );
}

/// `calls` plan calls one after another: rate, and resident memory after
/// 10 calls, a tenth, half and all of them.
fn sequential(dir: &Path, calls: usize) {
    let mut server = Server::start(dir);
    let pid = server.child.id();
    let started = Instant::now();
    let checkpoints = [10, calls / 10, calls / 2, calls];
    let (mut rss, mut bytes) = (Vec::new(), 0);
    for i in 1..=calls {
        let reply = server.call("plan_stale_worker_retirement", "{}");
        assert!(reply.contains("\"candidate_count\""), "{}", head(&reply));
        bytes += reply.len();
        if checkpoints.contains(&i) {
            rss.push(format!(
                "{i}: {:.0} MB",
                rss_kib(pid, "VmRSS:") as f64 / 1024.0
            ));
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let peak = rss_kib(pid, "VmHWM:");
    server.stop();
    println!(
        "serve_plan sequential, {} rows: {calls} calls in {elapsed:.1} s ({:.1} calls/s), {:.0} KB per reply; RSS after {} (peak {:.0} MB)",
        count_rows(dir),
        calls as f64 / elapsed,
        bytes as f64 / calls as f64 / 1e3,
        rss.join(", "),
        peak as f64 / 1024.0
    );
}

/// A `fleet-retire serve` on a fleet's folder, as the controller, and the
/// client's end of its stdio.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    /// Replies read while waiting for another.
    early: std::collections::HashMap<u64, String>,
}

impl Server {
    /// Start and initialise. The server registers itself in the registry
    /// it plans (one more row, heartbeated every 15 s, as in a fleet).
    fn start(dir: &Path) -> Server {
        let mut child = Command::new(EXE)
            .arg("serve")
            .env("FLEET_RETIRE_REGISTRY", dir.join("registry.sqlite"))
            .env("FLEET_RETIRE_LEASES", dir.join("leases.sqlite"))
            .env("GITEA_MCP_CONFIG", dir.join("profiles.json"))
            .env("GITEA_MCP_PROFILE", "controller-prgs")
            .env("GITEA_MCP_NAMESPACE", "controller")
            .env("FLEET_RETIRE_CANONICAL_REPOSITORY", "prgs/gitea-tools")
            .env("FLEET_RETIRE_PLAN_DIR", dir.join("plans"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(match std::env::var_os("FLEET_RETIRE_LOG") {
                Some(_) => Stdio::inherit(),
                None => Stdio::null(),
            })
            .spawn()
            .unwrap();
        let mut server = Server {
            stdin: child.stdin.take(),
            stdout: BufReader::with_capacity(1 << 20, child.stdout.take().unwrap()),
            child,
            next_id: 0,
            early: Default::default(),
        };
        let init = server.request(
            "initialize",
            r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}"#,
        );
        assert!(init.contains("\"result\""), "initialize failed: {init}");
        server.write(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        server
    }

    fn write(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Send a request; returns its id.
    fn send(&mut self, method: &str, params: &str) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.write(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#
        ));
        id
    }

    /// The reply to request `id`; replies to others that come first are
    /// kept for their turn, notifications dropped.
    fn reply(&mut self, id: u64) -> String {
        if let Some(line) = self.early.remove(&id) {
            return line;
        }
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the server closed its output");
            let message: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            match message["id"].as_u64() {
                Some(got) if got == id => return line,
                Some(got) => drop(self.early.insert(got, line)),
                None => {}
            }
        }
    }

    fn request(&mut self, method: &str, params: &str) -> String {
        let id = self.send(method, params);
        self.reply(id)
    }

    /// A tools/call; the reply line.
    fn call(&mut self, tool: &str, args: &str) -> String {
        self.request(
            "tools/call",
            &format!(r#"{{"name":"{tool}","arguments":{args}}}"#),
        )
    }

    /// Close stdin and wait: the server releases its row and exits.
    fn stop(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "the server did not exit cleanly: {status}"
        );
    }
}

/// A reply's structured content.
fn structured(reply: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(reply).unwrap();
    v["result"]["structuredContent"].clone()
}

fn store_args(dir: &Path) -> Vec<String> {
    let path = |f: &str| dir.join(f).display().to_string();
    vec![
        "--registry".into(),
        path("registry.sqlite"),
        "--leases".into(),
        path("leases.sqlite"),
        "--profiles".into(),
        path("profiles.json"),
        "--profile".into(),
        "controller-prgs".into(),
    ]
}

fn count_rows(dir: &Path) -> usize {
    let name = dir.file_name().unwrap().to_string_lossy();
    name.parse().unwrap_or(0)
}

fn head(s: &str) -> &str {
    &s[..s.len().min(400)]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A count from the environment variable `name`, or `default`.
fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
