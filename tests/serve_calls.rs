//! The life of one `serve` call on the wire (newline-delimited JSON-RPC on a
//! real server's stdio): progress notifications before the result, a
//! cancelled call that stops and gets no reply while the server goes on,
//! calls sent together sharing one plan, and calls that reach a server
//! deciding to stop answered with why.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdin, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// A server on a fleet folder and the client's end of its stdio: lines in
/// from a reader thread, so a test can wait with a deadline.
struct Wire {
    child: KillOnDrop,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    /// What the server logs, read as it comes (a full pipe would stop it).
    log: Option<std::thread::JoinHandle<String>>,
}

impl Wire {
    fn start(dir: &Path, env: &[(&str, &str)]) -> Wire {
        let mut command = bin();
        command
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
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = KillOnDrop(command.spawn().unwrap());
        let stdout = child.0.stdout.take().unwrap();
        let mut stderr = child.0.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            let mut log = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
            log
        });
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                    return;
                }
            }
        });
        let mut wire = Wire {
            stdin: child.0.stdin.take(),
            child,
            lines,
            log: Some(log),
        };
        wire.send(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "serve_calls", "version": "0"}}}),
        );
        let init = wire
            .next(Duration::from_secs(30))
            .expect("initialize answered");
        assert!(init.get("result").is_some(), "{init}");
        wire.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        wire
    }

    fn send(&mut self, message: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        let sent = writeln!(stdin, "{message}").and_then(|_| stdin.flush());
        if let Err(e) = sent {
            let log = self.log();
            panic!("the server is gone ({e}); it logged:\n{log}");
        }
    }

    /// What the server logged, once it has exited.
    fn log(&mut self) -> String {
        let _ = self.child.0.wait();
        self.log
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default()
    }

    fn plan(&mut self, id: u64, meta: Option<Value>) {
        let mut params = json!({"name": "plan_stale_worker_retirement",
            "arguments": whole("plan_stale_worker_retirement", json!({}))});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
    }

    /// The next line, or `None` when none comes in time or the server has
    /// closed its output.
    fn next(&self, wait: Duration) -> Option<Value> {
        self.lines.recv_timeout(wait).ok()
    }

    /// Close stdin, wait for the exit, and return what it logged.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let started = Instant::now();
        while self.child.0.try_wait().unwrap().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the server did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.log()
    }
}

/// A plan call's arguments asking for the whole registry: these tests pin
/// the whole plan's calls (shared plans, pages, cursors, kept plans,
/// batches), as before `serve` planned this host's scope by default
/// (issue 54); `tests/serve_scope.rs` tests the default. A call to another
/// tool, or one that names its scope, is left as it is.
fn whole(tool: &str, mut arguments: Value) -> Value {
    if tool.ends_with("plan_stale_worker_retirement") && arguments.get("scope").is_none() {
        arguments["scope"] = json!("registry");
    }
    arguments
}

/// A fleet of `rows` plain rows and a controller who may read and retire.
fn fleet_of(rows: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    plain_fleet(dir.path(), rows);
    scope_indexes(&dir.path().join("registry.sqlite"));
    std::fs::write(
        dir.path().join("profiles.json"),
        json!({"profiles": {"controller-prgs": {"role": "controller",
            "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}})
        .to_string(),
    )
    .unwrap();
    dir
}

#[test]
fn progress_is_reported_in_order_and_before_the_result() {
    let dir = fleet_of(2_000);
    let mut wire = Wire::start(dir.path(), &[]);
    wire.plan(1, Some(json!({"progressToken": "p-1"})));
    let mut steps = Vec::new();
    let result = loop {
        let line = wire.next(Duration::from_secs(60)).expect("a reply");
        if line["method"] == "notifications/progress" {
            assert_eq!(line["params"]["progressToken"], "p-1", "{line}");
            steps.push((
                line["params"]["progress"].as_f64().unwrap(),
                line["params"]["message"].clone(),
            ));
        } else {
            break line;
        }
    };
    assert_eq!(result["id"], 1, "{result}");
    assert!(
        result["result"]["structuredContent"]["candidate_count"].is_u64(),
        "{result}"
    );
    let messages: Vec<&str> = steps.iter().map(|(_, m)| m.as_str().unwrap()).collect();
    assert_eq!(messages, ["read", "judged, tokens computed", "rendered"]);
    assert!(steps.windows(2).all(|w| w[0].0 < w[1].0), "{steps:?}");
    // A call without a token gets no notifications.
    wire.plan(2, None);
    assert_eq!(wire.next(Duration::from_secs(60)).unwrap()["id"], 2);
    wire.finish();
}

#[test]
fn a_cancelled_plan_stops_and_gets_no_reply_while_the_server_goes_on() {
    // Judging 60,000 rows in a test build takes well over a second: long
    // enough for the cancellation to arrive while it runs.
    let dir = fleet_of(60_000);
    let mut wire = Wire::start(dir.path(), &[("FLEET_RETIRE_LOG", "fleet_retire=debug")]);
    wire.plan(1, Some(json!({"progressToken": "p-1"})));
    let read = wire.next(Duration::from_secs(60)).expect("progress");
    assert_eq!(read["params"]["message"], "read", "{read}");
    wire.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": 1, "reason": "the agent changed its mind"}}),
    );
    wire.send(json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}));
    let mut replies = Vec::new();
    while let Some(line) = wire.next(Duration::from_secs(5)) {
        replies.push(line);
    }
    assert!(
        replies.iter().any(|l| l["id"] == 2),
        "the ping was not answered: {replies:?}"
    );
    assert!(
        !replies.iter().any(|l| l["id"] == 1),
        "the cancelled call was answered: {replies:?}"
    );
    // The server still plans, and the cancelled call never got to its
    // tokens: the one plan logged as done is the second call's.
    wire.plan(3, None);
    let answered = wire.next(Duration::from_secs(120)).expect("a reply");
    assert_eq!(answered["id"], 3, "{answered}");
    let log = wire.finish();
    assert_eq!(log.matches("judged in").count(), 1, "{log}");
}

#[test]
fn calls_sent_together_share_one_plan() {
    let dir = fleet_of(20_000);
    let mut wire = Wire::start(dir.path(), &[("FLEET_RETIRE_LOG", "fleet_retire=debug")]);
    for id in 1..=8 {
        wire.plan(id, None);
    }
    let mut tokens = std::collections::BTreeSet::new();
    for _ in 1..=8 {
        let line = wire.next(Duration::from_secs(120)).expect("a reply");
        tokens.insert(line["result"]["structuredContent"]["registry_fingerprint"].to_string());
    }
    let log = wire.finish();
    let computed = log.matches("judged in").count();
    assert!(
        (1..=2).contains(&computed),
        "{computed} plans computed for 8 calls: {log}"
    );
    assert!(tokens.len() <= computed, "{tokens:?}");
}

#[test]
fn calls_reaching_a_stopping_server_are_answered_with_why() {
    let dir = fleet_of(500);
    let mut wire = Wire::start(
        dir.path(),
        &[
            ("GITEA_MCP_WORKER_IDENTITY", "w-controller-self"),
            ("FLEET_RETIRE_HEARTBEAT_INTERVAL", "1"),
        ],
    );
    // Someone retires the server's own row; its next heartbeat finds out.
    rusqlite::Connection::open(dir.path().join("registry.sqlite"))
        .unwrap()
        .execute(
            "UPDATE worker_registrations SET status = 'retired' WHERE worker_identity = 'w-controller-self'",
            [],
        )
        .unwrap();
    // Two calls at a time, the second queued behind the first; each pair
    // answered before the next is sent, until the server says it stops.
    let (mut sent, mut stopping) = (0u64, None);
    let started = Instant::now();
    while stopping.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the server never stopped"
        );
        wire.plan(sent + 1, None);
        wire.plan(sent + 2, None);
        sent += 2;
        for _ in 0..2 {
            let Some(line) = wire.next(Duration::from_secs(30)) else {
                let log = wire.log();
                panic!(
                    "call {sent} or the one before it met the end of the stream, not an \
                     answer; the server logged:\n{log}"
                );
            };
            if line["result"]["structuredContent"]["reason_code"] == "server_stopping" {
                stopping = Some(line);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopping = stopping.unwrap();
    assert_eq!(stopping["result"]["isError"], true);
    let why = stopping["result"]["structuredContent"]["detail"]
        .as_str()
        .unwrap();
    assert!(
        why.contains("w-controller-self") && why.contains("no longer active"),
        "{why}"
    );
    wire.finish();
}

/// An attacker who writes registry rows cannot make a result outgrow the
/// bound: rows with 1.4 MB identities of quotes, backslashes and control
/// characters (each inflated again when escaped) are paged, read as the
/// resource and snapshotted, every reply under 1 MiB.
#[test]
fn hostile_rows_never_make_a_reply_over_one_mebibyte() {
    let dir = fleet_of(500);
    let conn = rusqlite::Connection::open(dir.path().join("registry.sqlite")).unwrap();
    for i in 0..12 {
        let identity = format!("{}{i}", "w-\"\\\u{1}".repeat(200_000));
        conn.execute_batch(
            "CREATE TEMP TABLE copied AS SELECT * FROM worker_registrations \
             WHERE rowid = (SELECT MIN(rowid) FROM worker_registrations)",
        )
        .unwrap();
        conn.execute(
            "UPDATE copied SET worker_identity = ?1, session_id = ?2",
            [identity, "\"".repeat(300_000)],
        )
        .unwrap();
        conn.execute_batch(
            "INSERT INTO worker_registrations SELECT * FROM copied; DROP TABLE copied;",
        )
        .unwrap();
    }
    drop(conn);
    let mut wire = Wire::start(dir.path(), &[]);
    let mut id = 0;
    let mut ask = |wire: &mut Wire, method: &str, params: Value| -> Value {
        id += 1;
        wire.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let reply = wire.next(Duration::from_secs(60)).expect("a reply");
        let size = reply.to_string().len();
        assert!(size < 1 << 20, "{method} {params}: a reply of {size} bytes");
        assert_ne!(reply["result"]["isError"], true, "{reply:.500}");
        reply["result"].clone()
    };
    let plan = |args: Value| {
        json!({"name": "plan_stale_worker_retirement",
            "arguments": whole("plan_stale_worker_retirement", args)})
    };
    let summary = ask(&mut wire, "tools/call", plan(json!({})))["structuredContent"].clone();
    // 500 rows, the 12 hostile ones, and the server's own.
    assert_eq!(summary["assessed_count"], 513, "{summary:.500}");
    let cursors = summary["preserved_cursors"].as_object().unwrap().clone();
    assert!(!cursors.is_empty());
    for cursor in cursors.values() {
        let mut next = Some(cursor.clone());
        while let Some(c) = next {
            let page = ask(
                &mut wire,
                "tools/call",
                plan(json!({"preserved": {"cursor": c, "limit": 1000}})),
            );
            next = page["structuredContent"].get("next_cursor").cloned();
        }
    }
    let mut uri = summary["resource_uri"].as_str().map(str::to_string);
    while let Some(u) = uri {
        let read = ask(&mut wire, "resources/read", json!({"uri": u}));
        let page: Value =
            serde_json::from_str(read["contents"][0]["text"].as_str().unwrap()).unwrap();
        uri = page["next_uri"].as_str().map(str::to_string);
    }
    let snapshot = |args: Value| json!({"name": "snapshot_instance_fleet", "arguments": args});
    ask(&mut wire, "tools/call", snapshot(json!({})));
    ask(
        &mut wire,
        "tools/call",
        snapshot(json!({"page": {"list": "workers", "limit": 1000}})),
    );
    wire.finish();
}

impl Wire {
    /// Call a tool and wait for its reply (progress notifications skipped).
    fn call(&mut self, id: u64, name: &str, arguments: Value) -> Value {
        let arguments = whole(name, arguments);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}}));
        loop {
            let line = self.next(Duration::from_secs(60)).expect("a reply");
            if line["id"] == id {
                return line["result"].clone();
            }
        }
    }
}

/// The apply tool retires a plan the server issued in batches with
/// `first`, each call passing over what earlier batches retired, without a
/// new plan; `first` for a plan the server does not keep is refused.
#[test]
fn the_apply_tool_retires_one_plan_in_batches_with_first() {
    let (stores, live) = fleet();
    let mut wire = Wire::start(stores.dir.path(), &[]);
    let plan = wire.call(1, "plan_stale_worker_retirement", json!({}));
    let plan = &plan["structuredContent"];
    let order: Vec<String> =
        serde_json::from_value(plan["candidate_worker_identities"].clone()).unwrap();
    assert_eq!(order.len(), 3, "{plan}");
    let args = |first: u64| {
        json!({
            "registry_fingerprint": plan["registry_fingerprint"],
            "candidate_fingerprint": plan["candidate_fingerprint"],
            "policy_fingerprint": plan["policy_fingerprint"],
            "first": first,
        })
    };
    let one = wire.call(2, "apply_stale_worker_retirement", args(1));
    assert_eq!(one["structuredContent"]["retired_count"], 1, "{one}");
    let two = wire.call(3, "apply_stale_worker_retirement", args(2));
    let two = &two["structuredContent"];
    assert_eq!(two["retired_count"], 2, "{two}");
    assert_eq!(two["retired_since_plan"], json!([order[0]]), "{two}");
    for w in &order {
        assert_eq!(status_of(&stores.registry, w), "retired", "{w}");
    }
    assert_eq!(status_of(&stores.registry, "w-running"), "active");
    let replay = wire.call(4, "apply_stale_worker_retirement", args(1));
    assert_eq!(
        replay["structuredContent"]["outcome"], "already_retired",
        "{replay}"
    );

    let mut stranger = args(1);
    stranger["registry_fingerprint"] = json!("registryfp-0000");
    let refused = wire.call(5, "apply_stale_worker_retirement", stranger);
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(refused.to_string().contains("plan_not_kept"), "{refused}");
    let mut both = args(1);
    both["worker_identities"] = json!([order[0]]);
    let refused = wire.call(6, "apply_stale_worker_retirement", both);
    assert!(refused.to_string().contains("exactly one of"), "{refused}");
    wire.finish();
    drop(live);
}

/// Found by CI: two plans of one server may share a registry token and
/// differ in their candidates (time passed: a heartbeat expired, nothing
/// was written). An apply of the first plan's tokens was held to the rows
/// of the second, whose verdicts do not make the first's candidate token,
/// and refused; a cursor of the first paged the second. A plan's rows, its
/// cursors and its resource are now found by both its tokens.
#[test]
fn two_plans_of_one_registry_token_are_told_apart_by_their_candidates() {
    let (stores, live) = fleet();
    let (pid, start) = dead_process();
    let mut expiring = stale_row("w-expiring", pid, &start);
    expiring["last_heartbeat_at"] = json!(fleet_retire::time::format_ts(fleet_retire::time::now()));
    expiring["heartbeat_ttl_seconds"] = json!(3.0);
    insert_row(
        &rusqlite::Connection::open(&stores.registry).unwrap(),
        &expiring,
    );
    let mut wire = Wire::start(stores.dir.path(), &[]);
    let first = wire.call(1, "plan_stale_worker_retirement", json!({}));
    let first = first["structuredContent"].clone();
    std::thread::sleep(Duration::from_secs(4));
    let second = wire.call(2, "plan_stale_worker_retirement", json!({}));
    let second = &second["structuredContent"];
    assert_eq!(
        second["registry_fingerprint"],
        first["registry_fingerprint"]
    );
    assert_ne!(
        second["candidate_fingerprint"],
        first["candidate_fingerprint"]
    );
    // The first plan's cursor pages the first plan, not the newer one of
    // the same registry token (found by CI, as the apply was).
    let cursor = first["preserved_cursors"]["heartbeat_not_expired"].clone();
    assert!(cursor.is_string(), "{first}");
    let page = wire.call(
        9,
        "plan_stale_worker_retirement",
        json!({"preserved": {"cursor": cursor}}),
    );
    let page = &page["structuredContent"];
    assert_eq!(
        page["candidate_fingerprint"],
        first["candidate_fingerprint"]
    );
    assert_eq!(
        page["preserved"][0]["worker_identity"], "w-expiring",
        "{page}"
    );
    assert_ne!(first["resource_uri"], second["resource_uri"]);
    let applied = wire.call(
        3,
        "apply_stale_worker_retirement",
        json!({
            "registry_fingerprint": first["registry_fingerprint"],
            "candidate_fingerprint": first["candidate_fingerprint"],
            "policy_fingerprint": first["policy_fingerprint"],
            "first": 3,
        }),
    );
    let applied = &applied["structuredContent"];
    assert_eq!(applied["outcome"], "applied", "{applied}");
    assert_eq!(applied["retired_count"], 3, "{applied}");
    assert_eq!(
        applied["candidates_added_since_plan"],
        json!(["w-expiring"]),
        "{applied}"
    );
    assert_eq!(status_of(&stores.registry, "w-expiring"), "active");
    wire.finish();
    drop(live);
}

/// Found by the independent attack: an apply cancelled while it waited
/// for the registry's lock still committed, and the client, whose SDK
/// drops the answer to a cancelled request, was told nothing. A cancelled
/// apply now retires nothing (it stops before the lock, or rolls back
/// before COMMIT), and the server's log says how it ended.
#[test]
fn a_cancelled_apply_retires_nothing_and_the_log_says_so() {
    let dir = fleet_of(200);
    let registry = dir.path().join("registry.sqlite");
    let mut wire = Wire::start(dir.path(), &[]);
    wire.plan(1, None);
    let plan = wire.next(Duration::from_secs(60)).expect("the plan");
    let plan = &plan["result"]["structuredContent"];
    let mut args = json!({});
    for token in [
        "registry_fingerprint",
        "candidate_fingerprint",
        "policy_fingerprint",
    ] {
        args[token] = plan[token].clone();
    }
    args["first"] = json!(3);
    // (The server's own row comes and goes; only retirements count.)
    let retired = || -> i64 {
        rusqlite::Connection::open(&registry)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM worker_registrations WHERE status = 'retired'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(retired(), 0);
    // Apply waits for this lock while the client gives up.
    let held = rusqlite::Connection::open(&registry).unwrap();
    held.execute_batch("BEGIN IMMEDIATE").unwrap();
    wire.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "apply_stale_worker_retirement", "arguments": args}}));
    std::thread::sleep(Duration::from_millis(1000));
    wire.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "the agent changed its mind"}}),
    );
    std::thread::sleep(Duration::from_millis(300));
    held.execute_batch("ROLLBACK").unwrap();
    wire.send(json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}));
    let mut replies = Vec::new();
    while let Some(line) = wire.next(Duration::from_secs(5)) {
        replies.push(line);
    }
    assert!(replies.iter().any(|l| l["id"] == 3), "{replies:?}");
    assert!(!replies.iter().any(|l| l["id"] == 2), "{replies:?}");
    let log = wire.finish();
    assert_eq!(retired(), 0, "the cancelled apply retired rows: {log}");
    let audited: i64 = rusqlite::Connection::open(&registry)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'retirement_audit'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(audited, 0, "no audit table was even created: {log}");
    assert!(log.contains("cancelled by the client"), "{log}");
    assert!(log.contains("nothing was retired"), "{log}");
}

/// A client that starts a server for every call (the MCP Inspector's CLI
/// does) cannot follow a cursor: only the server that sealed it can open
/// it. It pages a fresh plan by offset instead, and `next_offset` says
/// where the next page starts.
#[test]
fn a_client_that_starts_a_server_per_call_pages_by_offset() {
    let dir = fleet_of(300);
    let call = |wire: &mut Wire, id: u64, preserved: Value| -> Value {
        wire.send(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "plan_stale_worker_retirement",
            "arguments": {"preserved": preserved, "scope": "registry"}}}),
        );
        let reply = wire.next(Duration::from_secs(60)).expect("a reply");
        reply["result"]["structuredContent"].clone()
    };
    let ids = |page: &Value| -> Vec<String> {
        page["preserved"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["worker_identity"].as_str().unwrap().to_string())
            .collect()
    };
    let ask = json!({"reason_code": "host_binding_unproven", "limit": 5});
    let mut first = Wire::start(dir.path(), &[]);
    let one = call(&mut first, 1, ask.clone());
    assert_eq!(one["next_offset"], 5, "{one:.500}");
    let cursor = one["next_cursor"].clone();
    first.finish();
    let mut second = Wire::start(dir.path(), &[]);
    let refused = call(&mut second, 1, json!({"cursor": cursor}));
    assert_eq!(refused["reason_code"], "invalid_cursor", "{refused:.500}");
    let mut by_offset = ask.clone();
    by_offset["offset"] = json!(5);
    let two = call(&mut second, 2, by_offset);
    assert_eq!(two["next_offset"], 10, "{two:.500}");
    let (a, b) = (ids(&one), ids(&two));
    assert_eq!((a.len(), b.len()), (5, 5));
    assert!(a.iter().all(|w| !b.contains(w)), "{a:?} {b:?}");
    let both = call(&mut second, 3, json!({"cursor": "x", "offset": 5}));
    assert_eq!(both["reason_code"], "cursor_and_offset", "{both:.500}");
    second.finish();
}

/// While no member takes writes (a Patroni election: the leader gone,
/// none elected yet), a tool call is answered `registry_unavailable` once
/// the bounded wait for a writable member is over, and the server goes on;
/// the first call after a member answers again succeeds. The "cluster" is
/// a proxy of ours in front of the test server: dropped, and the server's
/// connections ended, nothing takes a connection at its port.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_call_while_no_member_takes_writes_is_answered_and_the_next_succeeds() {
    use common::pgproxy::{Lose, PgProxy};
    let Some((stores, live, db)) = pg_fleet("serve_election") else {
        return;
    };
    let proxy = PgProxy::start(db.host_port(), Lose::Commit);
    let port = proxy.port;
    let url = db.at_port(port, "?target_session_attrs=read-write");
    let mut wire = Wire::start(
        stores.dir.path(),
        &[
            ("FLEET_RETIRE_REGISTRY", url.as_str()),
            ("FLEET_RETIRE_LEASES", url.as_str()),
            ("FLEET_RETIRE_PG_FAILOVER_WAIT", "3"),
        ],
    );
    let code = |answer: &Value| answer["result"]["structuredContent"]["reason_code"].clone();
    wire.plan(1, None);
    let first = wire.next(Duration::from_secs(60)).expect("an answer");
    assert_ne!(first["result"]["isError"], true, "{first}");
    drop(proxy);
    db.client()
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'fleet-retire'",
            &[],
        )
        .unwrap();
    let started = Instant::now();
    wire.plan(2, None);
    let during = wire.next(Duration::from_secs(60)).expect("an answer");
    let took = started.elapsed();
    assert_eq!(code(&during), "registry_unavailable", "{during}");
    assert_eq!(during["result"]["isError"], true);
    assert!(took < Duration::from_secs(20), "answered after {took:?}");
    let _proxy = PgProxy::start_on(port, db.host_port(), Lose::Commit);
    wire.plan(3, None);
    let after = wire.next(Duration::from_secs(60)).expect("an answer");
    assert_ne!(after["result"]["isError"], true, "{after}");
    eprintln!("no writable member: answered registry_unavailable after {took:?}");
    wire.finish();
    drop(live);
}

/// The profiles of the kept-plan tests: a controller that may retire, and
/// a planner that may only read (plan, never apply).
fn controller_and_planner(profiles: &Path) {
    std::fs::write(
        profiles,
        json!({"profiles": {
            "controller-prgs": {"role": "controller",
                "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
            "planner-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]}}})
        .to_string(),
    )
    .unwrap();
}

/// A policy set other than the built-in one: the same policies with a line
/// of its own, so the same verdicts under another fingerprint.
fn another_policy_set(at: &Path) -> String {
    std::fs::create_dir_all(at).unwrap();
    for f in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
    ] {
        let mut t = std::fs::read_to_string(Path::new("policies").join(f)).unwrap();
        if f == "retirement.cedar" {
            t.push_str("\n// a set the controller was never launched with\n");
        }
        std::fs::write(at.join(f), t).unwrap();
    }
    at.display().to_string()
}

/// Plan once on a server started with `env` (sharing the plan folder) and
/// stop it, as a client that starts a server per call does: its tokens.
fn plan_on_a_server_of_its_own(dir: &Path, env: &[(&str, &str)]) -> Value {
    let mut wire = Wire::start(dir, env);
    let plan = wire.call(1, "plan_stale_worker_retirement", json!({}));
    assert_ne!(plan["isError"], true, "{plan}");
    wire.finish();
    plan["structuredContent"].clone()
}

/// Every audit row's three tokens, in order.
fn audited_tokens(registry: &Path) -> Vec<[String; 3]> {
    let conn = rusqlite::Connection::open(registry).unwrap();
    let Ok(mut stmt) = conn.prepare(
        "SELECT registry_fingerprint, candidate_fingerprint, policy_fingerprint \
         FROM retirement_audit ORDER BY audit_id",
    ) else {
        return Vec::new();
    };
    stmt.query_map([], |r| Ok([r.get(0)?, r.get(1)?, r.get(2)?]))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// An apply refused for pairing the tokens of a plan `made` under another
/// binding (`what` differs) with the controller's, saying what differs.
fn refused_as_made_elsewhere(refused: &Value, what: &str, made: &Value) {
    let body = &refused["structuredContent"];
    assert_eq!(refused["isError"], true, "{what}: {refused}");
    assert_eq!(
        body["reason_code"], "plan_made_elsewhere",
        "{what}: {refused}"
    );
    assert!(
        body["what_to_do"].as_str().unwrap().contains("plan"),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap();
    if what.contains("profile") {
        assert!(detail.contains("planner-prgs"), "{detail}");
    }
    if what.contains("policy set") {
        let theirs = made["policy_fingerprint"].as_str().unwrap();
        assert!(detail.contains(theirs), "{detail}");
    }
}

/// Finding 50.7: a kept plan was matched by its registry token, candidate
/// token and repository only. An agent paired a controller server's policy
/// token with the tokens of a plan made under another policy set by a
/// server with no retire right (both sharing one plan folder): the
/// controller retired, and the audit row recorded a pairing of tokens no
/// plan produced. A kept plan now vouches only for the policy set,
/// registry, repository and profile that made it; any other pairing is
/// refused (`plan_made_elsewhere`), and a controller's own plan still
/// applies from the next server.
#[test]
fn a_kept_plan_vouches_only_for_the_policy_set_registry_and_profile_that_made_it() {
    let (stores, live) = fleet();
    let dir = stores.dir.path();
    controller_and_planner(&stores.profiles);
    let built_in = stores.plan_json()["policy_fingerprint"].clone();
    let other = another_policy_set(&dir.join("other-policies"));
    let attacks = [
        (
            "another policy set and profile",
            vec![
                ("GITEA_MCP_PROFILE", "planner-prgs"),
                ("FLEET_RETIRE_POLICIES", other.as_str()),
            ],
        ),
        (
            "another profile",
            vec![("GITEA_MCP_PROFILE", "planner-prgs")],
        ),
        (
            "another policy set",
            vec![("FLEET_RETIRE_POLICIES", other.as_str())],
        ),
    ];
    for (what, env) in attacks {
        let made = plan_on_a_server_of_its_own(dir, &env);
        assert_eq!(
            made["candidate_worker_identities"]
                .as_array()
                .unwrap()
                .len(),
            3,
            "{made}"
        );
        for pick in [
            json!({"worker_identities": ["w-dead-1"]}),
            json!({"first": 1}),
        ] {
            let mut args = pick.clone();
            args["registry_fingerprint"] = made["registry_fingerprint"].clone();
            args["candidate_fingerprint"] = made["candidate_fingerprint"].clone();
            args["policy_fingerprint"] = built_in.clone();
            let mut controller = Wire::start(dir, &[]);
            let refused = controller.call(1, "apply_stale_worker_retirement", args);
            controller.finish();
            refused_as_made_elsewhere(&refused, what, &made);
            assert_eq!(
                status_of(&stores.registry, "w-dead-1"),
                "active",
                "{what} {pick}"
            );
        }
    }
    assert!(audited_tokens(&stores.registry).is_empty());
    // The controller's own plan, applied by the next server of its own.
    let mine = plan_on_a_server_of_its_own(dir, &[]);
    let mut controller = Wire::start(dir, &[]);
    let applied = controller.call(
        1,
        "apply_stale_worker_retirement",
        json!({
            "registry_fingerprint": mine["registry_fingerprint"],
            "candidate_fingerprint": mine["candidate_fingerprint"],
            "policy_fingerprint": mine["policy_fingerprint"],
            "first": 3,
        }),
    );
    controller.finish();
    assert_eq!(
        applied["structuredContent"]["retired_count"], 3,
        "{applied}"
    );
    let triple = [
        "registry_fingerprint",
        "candidate_fingerprint",
        "policy_fingerprint",
    ]
    .map(|t| mine[t].as_str().unwrap().to_string());
    let audited = audited_tokens(&stores.registry);
    assert_eq!(audited.len(), 3);
    assert!(
        audited.iter().all(|a| *a == triple),
        "{audited:?} {triple:?}"
    );
    drop(live);
}

/// A temporary file as a server killed while writing a kept plan leaves
/// it: part of a plan, unlocked (the kernel drops a dead writer's lock),
/// unchanged for an hour.
fn left_by_a_crash(folder: &Path, name: &str) -> std::path::PathBuf {
    let file = folder.join(name);
    std::fs::write(&file, "{\"registry_fingerprint\": \"registryfp-").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    file
}

/// Finding 50.8: a running server held its kept-plans folder open and
/// wrote through it, but pruned through the path, so once the folder was
/// renamed away it never pruned (40 plans left 40 files, against a bound
/// of 32); and a server killed while writing left its temporary file for
/// ever. The folder is now pruned through the descriptor held, and a
/// temporary file no live writer holds is removed once it is stale, while
/// a live writer's (locked) stays.
#[test]
fn a_renamed_kept_plans_folder_stays_bounded_and_loses_what_crashes_left() {
    let dir = fleet_of(50);
    let mut wire = Wire::start(dir.path(), &[]);
    let moved = dir.path().join("plans-moved");
    std::fs::rename(dir.path().join("plans"), &moved).unwrap();
    let crashed = [
        left_by_a_crash(&moved, ".registryfp-0a.candidatefp-0b.json.4242.tmp"),
        left_by_a_crash(
            &moved,
            ".registryfp-0a.candidatefp-0b.0c.json.4243.00ff.tmp",
        ),
    ];
    // Another server, alive, writing a plan: it holds its file's lock.
    let writing = left_by_a_crash(&moved, ".registryfp-0a.candidatefp-0c.0d.json.77.ee.tmp");
    let held = nix::fcntl::Flock::lock(
        std::fs::File::open(&writing).unwrap(),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("registry.sqlite")).unwrap();
    let mut tokens = std::collections::BTreeSet::new();
    for id in 1..=40u64 {
        // Each plan of its own registry token: a row's heartbeat moved.
        conn.execute(
            "UPDATE worker_registrations SET last_heartbeat_at = ?1 \
             WHERE worker_identity = (SELECT MIN(worker_identity) FROM worker_registrations)",
            [format!("2026-01-01T01:{id:02}:00Z")],
        )
        .unwrap();
        let plan = wire.call(id, "plan_stale_worker_retirement", json!({}));
        tokens.insert(plan["structuredContent"]["registry_fingerprint"].to_string());
    }
    assert_eq!(tokens.len(), 40);
    let left: Vec<String> = std::fs::read_dir(&moved)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let plans = left.iter().filter(|n| n.starts_with("registryfp-")).count();
    assert_eq!(plans, 32, "{left:?}");
    for file in crashed {
        assert!(!file.exists(), "{} was left: {left:?}", file.display());
    }
    assert!(writing.exists(), "a live writer's file was removed");
    assert_eq!(left.len(), 33, "{left:?}");
    drop(held);
    wire.finish();
}

/// The kept plans in `folder`: how many, and their bytes.
fn kept_plans(folder: &Path) -> (usize, u64) {
    std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("registryfp-"))
        .fold((0, 0), |(n, bytes), e| {
            (n + 1, bytes + e.metadata().unwrap().len())
        })
}

/// Issue 52: the kept-plans folder grew without a bound a user saw (33 MB
/// a 100,000-row plan, 32 plans kept). It is bounded in bytes too
/// (`--plan-dir-max-mib`, here 1 MiB: about one plan of this fleet), the
/// server says at start, at the default log level, where the folder is
/// and how far it grows, and the plan just written always stays for the
/// next server's apply.
#[test]
fn the_kept_plans_folder_is_bounded_in_bytes_and_the_log_says_where() {
    let dir = fleet_of(3_000);
    let folder = dir.path().join("plans");
    let bound = [("FLEET_RETIRE_PLAN_DIR_MAX_MIB", "1")];
    let mut plan = Value::Null;
    for _ in 0..4 {
        // A server per call: each registers a row, so each plan has a
        // registry token of its own.
        let mut wire = Wire::start(dir.path(), &bound);
        plan = wire.call(1, "plan_stale_worker_retirement", json!({}))["structuredContent"].clone();
        let log = wire.finish();
        let said = format!(
            "in {}: the newest 32 of the last 24 hours, at most 1.0 MiB",
            folder.display()
        );
        assert!(
            log.contains("INFO fleet_retire::start: kept plans") && log.contains(&said),
            "{log}"
        );
        let (files, bytes) = kept_plans(&folder);
        assert!(
            files == 1 || bytes <= 1 << 20,
            "{files} plans, {bytes} bytes"
        );
    }
    let (files, bytes) = kept_plans(&folder);
    assert!(
        files < 4,
        "the bound in bytes removed none: {files} plans, {bytes} bytes"
    );
    let mut next = Wire::start(dir.path(), &bound);
    let tokens = json!({
        "registry_fingerprint": plan["registry_fingerprint"],
        "candidate_fingerprint": plan["candidate_fingerprint"],
        "policy_fingerprint": plan["policy_fingerprint"],
        "first": 1,
    });
    let applied = next.call(1, "apply_stale_worker_retirement", tokens);
    assert_eq!(
        applied["structuredContent"]["outcome"], "applied",
        "{applied:.800}"
    );
    next.finish();
}
