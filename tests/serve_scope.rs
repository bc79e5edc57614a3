//! `serve` plans this host's scope by default (issue 54): a plan call
//! without `scope` reads this host's rows and their peers (tokens
//! `host-scope:`), and its apply retires them; `scope: "registry"` is the
//! seed's plan of the whole registry; an unknown scope is an argument
//! error; a policy set or registry the scope cannot be read exactly from
//! is refused with the way out, never planned whole behind the agent's back.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, ChildStdout, Stdio};

/// A server on `stores`, spoken to one request at a time.
struct Client {
    _child: KillOnDrop,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Client {
    fn start(stores: &Stores, env: &[(&str, &std::path::Path)]) -> Client {
        let mut command = bin();
        command
            .arg("serve")
            .env("FLEET_RETIRE_REGISTRY", &stores.registry)
            .env("FLEET_RETIRE_LEASES", &stores.leases)
            .env("GITEA_MCP_CONFIG", &stores.profiles)
            .env("GITEA_MCP_PROFILE", "controller-prgs")
            .env("GITEA_MCP_NAMESPACE", "controller")
            .env("FLEET_RETIRE_CANONICAL_REPOSITORY", "prgs/gitea-tools")
            .env("FLEET_RETIRE_PLAN_DIR", stores.dir.path().join("plans"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = KillOnDrop(command.spawn().unwrap());
        let stdin = child.0.stdin.take().unwrap();
        let stdout = BufReader::new(child.0.stdout.take().unwrap());
        let mut client = Client {
            _child: child,
            stdin,
            stdout,
            next_id: 1,
        };
        let init = client.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "serve_scope", "version": "0"}}),
        );
        assert!(init.get("result").is_some(), "{init}");
        client.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        client
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The response to one request (notifications before it skipped).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the server closed"
            );
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    /// A tool's result: (isError, structured content).
    fn call(&mut self, tool: &str, arguments: Value) -> (bool, Value) {
        let reply = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        let result = &reply["result"];
        assert!(result.is_object(), "{reply}");
        (
            result["isError"] == json!(true),
            result["structuredContent"].clone(),
        )
    }
}

const FAR_HOST: &str = "serve-scope-far-host";

/// Two stale rows of this host and two of another host (one with a
/// session shared with no one, one the same shape), with the scope's
/// indexes when `indexes`.
fn stores(indexes: bool) -> Stores {
    let dead = 2_000_000_001_i64;
    let mut rows = vec![
        stale_row("w-own-1", dead, "ticks-5"),
        stale_row("w-own-2", dead + 1, "ticks-5"),
    ];
    for (i, id) in ["w-far-1", "w-far-2"].iter().enumerate() {
        let mut far = stale_row(id, dead + 2 + i as i64, "ticks-5");
        far["host_id"] = json!(FAR_HOST);
        far["boot_id"] = json!("00000000-0000-0000-0000-000000000000");
        rows.push(far);
    }
    let stores = Stores::new(&rows);
    if indexes {
        fleet_retire::store::sqlite::scope::install_indexes(&stores.registry).unwrap();
    }
    stores
}

fn identities(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn status_of(stores: &Stores, id: &str) -> String {
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    conn.query_row(
        "SELECT status FROM worker_registrations WHERE worker_identity = ?1",
        [id],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn a_default_plan_is_this_hosts_scope_and_its_apply_retires_its_candidates() {
    let stores = stores(true);
    let (host, _) = host_and_boot();
    let mut client = Client::start(&stores, &[]);
    let (failed, plan) = client.call("plan_stale_worker_retirement", json!({}));
    assert!(!failed, "{plan}");
    assert_eq!(plan["scope"]["kind"], "host", "{plan}");
    assert_eq!(plan["scope"]["host_id"], json!(host));
    // Its rows and the server's own registration.
    assert_eq!(plan["scope"]["own_rows"], 3, "{plan}");
    for token in ["registry_fingerprint", "candidate_fingerprint"] {
        assert!(
            plan[token].as_str().unwrap().starts_with("host-scope:"),
            "{plan}"
        );
    }
    assert_eq!(
        identities(&plan["candidate_worker_identities"]),
        ["w-own-1", "w-own-2"]
    );
    assert_eq!(plan["other_host_rows"], 0);
    // Not one row of the other host, on any page: the whole document,
    // the preserved rows, the resource.
    let (_, whole) = client.call("plan_stale_worker_retirement", json!({"include": "all"}));
    let (_, preserved) = client.call(
        "gitea_plan_stale_worker_retirement",
        json!({"preserved": {"limit": 10}}),
    );
    let read = client.request(
        "resources/read",
        json!({"uri": plan["resource_uri"].as_str().unwrap()}),
    );
    for page in [&whole, &preserved, &read] {
        assert!(!page.to_string().contains("w-far-"), "{page}");
    }
    assert_eq!(whole["scope"]["kind"], "host", "{whole}");
    assert!(read.to_string().contains("host-scope:"), "{read}");
    let (failed, applied) = client.call(
        "apply_stale_worker_retirement",
        json!({
            "registry_fingerprint": plan["registry_fingerprint"],
            "candidate_fingerprint": plan["candidate_fingerprint"],
            "policy_fingerprint": plan["policy_fingerprint"],
            "first": 2,
        }),
    );
    assert!(!failed, "{applied}");
    assert_eq!(applied["retired_count"], 2, "{applied}");
    for (id, status) in [
        ("w-own-1", "retired"),
        ("w-own-2", "retired"),
        ("w-far-1", "active"),
        ("w-far-2", "active"),
    ] {
        assert_eq!(status_of(&stores, id), status, "{id}");
    }
}

/// A server after this one recalls the scoped plan from the folder of
/// kept plans (the tokens carry the scope, the folder the rows: `first`
/// finds its candidates) and judges it on this host's scope under the
/// lock. That server's own registration is a row of this host added since
/// the plan, sharing no key with the targets: let pass and reported, as a
/// client that starts a server per call needs. A row added beside it that
/// shares a target's instance slot refuses the next apply of that plan.
#[test]
fn a_scoped_plan_kept_in_the_folder_is_judged_on_its_scope_by_the_next_server() {
    let stores = stores(true);
    let plan = Client::start(&stores, &[])
        .call("plan_stale_worker_retirement", json!({}))
        .1;
    let tokens = |first: u64| {
        json!({
            "registry_fingerprint": plan["registry_fingerprint"],
            "candidate_fingerprint": plan["candidate_fingerprint"],
            "policy_fingerprint": plan["policy_fingerprint"],
            "first": first,
        })
    };
    let mut next = Client::start(&stores, &[]);
    let (failed, applied) = next.call("apply_stale_worker_retirement", tokens(1));
    assert!(!failed, "{applied}");
    assert_eq!(applied["outcome"], "applied", "{applied}");
    assert_eq!(
        applied["read_under_lock"]["scope"], "host_scope",
        "{applied}"
    );
    assert_eq!(
        applied["rows_changed_since_plan"].as_array().map(Vec::len),
        Some(1),
        "the next server's own registration: {applied}"
    );
    let left: Vec<&str> = ["w-own-1", "w-own-2"]
        .into_iter()
        .filter(|w| status_of(&stores, w) == "active")
        .collect();
    assert_eq!(left.len(), 1, "one retired, one left: {applied}");
    // A row of this host in the left target's session, added now.
    let mut near = common::stale_row("w-own-near", 2_000_000_100, "ticks-5");
    near["session_id"] = json!(format!("sess-{}", left[0]));
    common::insert_row(
        &rusqlite::Connection::open(&stores.registry).unwrap(),
        &near,
    );
    let (failed, refused) = next.call("apply_stale_worker_retirement", tokens(1));
    assert!(failed, "{refused}");
    assert_eq!(refused["reason_code"], "candidate_set_moved", "{refused}");
    assert_eq!(status_of(&stores, left[0]), "active");
}

#[test]
fn scope_registry_is_the_seeds_whole_plan() {
    let stores = stores(true);
    let mut client = Client::start(&stores, &[]);
    let (failed, plan) = client.call("plan_stale_worker_retirement", json!({"scope": "registry"}));
    assert!(!failed, "{plan}");
    assert_eq!(plan["scope"], json!({"kind": "registry"}));
    let cli = run(&stores
        .plan_args("controller-prgs")
        .iter()
        .map(String::as_str)
        .chain(["--format", "json"])
        .collect::<Vec<_>>());
    assert!(cli.status.success(), "{}", text(&cli));
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    for token in [
        "registry_fingerprint",
        "candidate_fingerprint",
        "policy_fingerprint",
    ] {
        assert_eq!(plan[token], cli[token], "{token}");
    }
    assert!(plan["registry_fingerprint"]
        .as_str()
        .unwrap()
        .starts_with("registryfp-"));
    // The four rows and the server's own registration.
    assert_eq!(plan["assessed_count"], 5, "{plan}");
    assert_eq!(plan["other_host_rows"], 2, "{plan}");
}

#[test]
fn an_unknown_scope_is_an_argument_error() {
    let stores = stores(true);
    let mut client = Client::start(&stores, &[]);
    let (failed, refused) = client.call("plan_stale_worker_retirement", json!({"scope": "fleet"}));
    assert!(failed, "{refused}");
    assert_eq!(refused["reason_code"], "invalid_arguments", "{refused}");
    assert_eq!(refused["argument"], "scope", "{refused}");
    assert!(refused["what_to_do"].as_str().unwrap().contains("scope"));
}

/// The way out a refused scope names, and that nothing was planned whole
/// in its place.
fn assert_scope_refused(refused: &Value, says: &str) {
    assert_eq!(refused["reason_code"], "scope_unavailable", "{refused}");
    let todo = refused["what_to_do"].as_str().unwrap();
    assert!(todo.contains("scope \"registry\""), "{todo}");
    assert!(
        refused["detail"].as_str().unwrap().contains(says),
        "{refused}"
    );
    assert!(refused.get("registry_fingerprint").is_none(), "{refused}");
}

/// A policy set whose verdicts the scope's read cannot keep exact (the
/// precondition `tests/host_scope.rs` attacks) refuses the default plan;
/// `scope: "registry"` still plans.
#[test]
fn a_policy_set_failing_the_scope_precondition_refuses_the_default_plan() {
    let stores = stores(true);
    let folder = common::policies_failing_the_scope_precondition(stores.dir.path());
    let mut client = Client::start(&stores, &[("FLEET_RETIRE_POLICIES", &folder)]);
    let (failed, refused) = client.call("plan_stale_worker_retirement", json!({}));
    assert!(failed, "{refused}");
    assert_scope_refused(&refused, "hold-fails-on-old-heartbeats");
    let (failed, whole) = client.call("plan_stale_worker_retirement", json!({"scope": "registry"}));
    assert!(!failed, "{whole}");
}

/// A registry without the scope's indexes (made before them, never
/// upgraded) fails closed, naming both ways out.
#[test]
fn a_registry_without_the_scope_indexes_refuses_the_default_plan() {
    let stores = stores(false);
    let mut client = Client::start(&stores, &[]);
    let (failed, refused) = client.call("plan_stale_worker_retirement", json!({}));
    assert!(failed, "{refused}");
    assert_scope_refused(&refused, "index");
    let todo = refused["what_to_do"].as_str().unwrap();
    assert!(todo.contains("registry versions"), "{todo}");
    assert_eq!(status_of(&stores, "w-own-1"), "active");
}
