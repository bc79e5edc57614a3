//! A large plan retired batch by batch, as an operator does it (issue 52
//! §1): `apply PLAN --all-batches` (one transaction and one line per batch,
//! stopping at the first refusal, a SIGINT stopping between batches), and
//! every single batch saying what is left and the command for the next.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};

/// `n` stale rows of this machine whose pids are above the kernel's limit
/// (no process can hold them): `n` candidates.
fn stale_fleet(n: usize) -> Stores {
    let rows: Vec<Value> = (0..n)
        .map(|i| {
            let mut row = stale_row(&format!("w-{i:04}"), 4_194_305 + i as i64, "ticks-1");
            row["namespace"] = json!(format!("ns-{i}"));
            row
        })
        .collect();
    Stores::new(&rows)
}

/// The human arguments of `apply` for these stores (no `--format json`).
fn human_apply(stores: &Stores) -> Vec<String> {
    stores.apply_args("controller-prgs")[2..].to_vec()
}

/// The audit rows per apply id, in the order the applies ran.
fn batch_sizes(access: &StoreAccess) -> Vec<i64> {
    let sql = "SELECT count(*) FROM retirement_audit GROUP BY apply_id ORDER BY min(audit_id)";
    match access {
        StoreAccess::Sqlite { registry, .. } => rusqlite::Connection::open(registry)
            .unwrap()
            .prepare(sql)
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect(),
        StoreAccess::Postgres(db) => db
            .client()
            .query(sql, &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect(),
    }
}

fn retired(access: &StoreAccess) -> usize {
    access
        .statuses()
        .iter()
        .filter(|(_, s, _)| s == "retired")
        .count()
}

/// A printed `fleet-retire …` command, run with this build's binary in the
/// same environment (plus `env`).
fn run_printed(command: &str, env: &[(&str, &Path)]) -> std::process::Output {
    let rest = command
        .strip_prefix("fleet-retire ")
        .unwrap_or_else(|| panic!("not a fleet-retire command: {command}"));
    let exe = env!("CARGO_BIN_EXE_fleet-retire");
    let mut sh = Command::new("sh");
    sh.arg("-c").arg(format!("exec '{exe}' {rest}"));
    for (k, v) in env {
        sh.env(k, v);
    }
    sh.output().unwrap()
}

/// The text after `marker` on the line that holds it.
fn after<'a>(text: &'a str, marker: &str) -> &'a str {
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in {text}"));
    text[at + marker.len()..].lines().next().unwrap().trim()
}

macro_rules! on_both_engines {
    ($($body:ident),* $(,)?) => {$(
        mod $body {
            #[test]
            fn on_sqlite() {
                super::$body(super::Engine::Sqlite)
            }

            #[test]
            fn on_postgres() {
                super::$body(super::Engine::Postgres)
            }
        }
    )*};
}

on_both_engines!(all_batches_retire_the_plan_one_transaction_and_one_line_each);

/// 60 candidates in batches of 25: three transactions (25, 25, 10), a
/// progress line each with what is left, and every candidate retired.
fn all_batches_retire_the_plan_one_transaction_and_one_line_each(engine: Engine) {
    let Some((stores, access)) = onto(engine, "all_batches", stale_fleet(60)) else {
        return;
    };
    let (plan, _) = save_plan(&stores);
    let out = bin()
        .args(human_apply(&stores))
        .arg(&plan)
        .args(["--all-batches", "--first", "25"])
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    for line in [
        "batch 1 of 3: 25 retired, 35 left",
        "batch 2 of 3: 25 retired, 10 left",
        "batch 3 of 3: 10 retired, 0 left",
        "3 batch(es), 60 retired in",
        "none of the plan's candidates left",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    assert_eq!(batch_sizes(&access), [25, 25, 10]);
    assert_eq!(retired(&access), 60);
}

/// `--format json`: one document holding every batch (the progress lines go
/// to stderr), and the fleet after the last.
#[test]
fn all_batches_in_json_are_one_document() {
    let stores = stale_fleet(30);
    let (plan, _) = save_plan(&stores);
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(&plan)
        .args(["--all-batches", "--max-retire", "12"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["outcome"], "applied", "{doc}");
    assert_eq!(doc["batch_size"], 12);
    assert_eq!(doc["retired_count"], 30);
    assert_eq!(doc["left"], 0);
    let batches = doc["batches"].as_array().unwrap();
    let counts: Vec<&Value> = batches.iter().map(|b| &b["retired_count"]).collect();
    assert_eq!(counts, [&json!(12), &json!(12), &json!(6)]);
    assert_eq!(batches[1]["retired_before"], 12);
    assert_eq!(batches[2]["left"], 0);
    assert_eq!(doc["post_apply"]["stale_worker_count"], 0, "{doc}");
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(
        progress.contains("batch 3 of 3: 6 retired, 0 left"),
        "{progress}"
    );
}

/// A single batch ends with what is left and the command for the next; run
/// as printed, it takes the next batch of the same plan.
#[test]
fn a_single_batch_says_what_is_left_and_the_next_command_works() {
    let stores = stale_fleet(30);
    let (plan, _) = save_plan(&stores);
    let out = bin()
        .args(human_apply(&stores))
        .arg(&plan)
        .args(["--first", "10"])
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let next = after(&said, "20 of the plan's candidates left; next: ");
    assert!(next.ends_with("--first 10"), "{next}");
    let again = run_printed(next, &[]);
    let said = text(&again);
    assert!(said.contains("10 of the plan's candidates left"), "{said}");
    assert_eq!(status_of(&stores.registry, "w-0019"), "retired");
    assert_eq!(status_of(&stores.registry, "w-0020"), "active");
}

/// A saved plan asked whole beyond the blast radius is refused, and the
/// report names the command that retires it batch by batch.
#[test]
fn a_plan_beyond_the_blast_radius_names_the_command_for_its_batches() {
    let stores = stale_fleet(30);
    let (plan, _) = save_plan(&stores);
    let out = bin()
        .args(human_apply(&stores))
        .arg(&plan)
        .args(["--max-retire", "10"])
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    let next = after(&said, "next: ");
    assert!(next.ends_with("--max-retire 10 --all-batches"), "{next}");
    let finish = run_printed(next, &[]);
    assert_eq!(finish.status.code(), Some(0), "{}", text(&finish));
    assert!(text(&finish).contains("batch 3 of 3: 10 retired, 0 left"));
}

/// The stores and the operator given in the environment only: the printed
/// command names none of them, and works in that environment.
#[test]
fn a_printed_command_names_no_flag_the_environment_gave() {
    let stores = stale_fleet(30);
    let plan = stores.dir.path().join("plan.json");
    let env: [(&str, &Path); 5] = [
        ("FLEET_RETIRE_REGISTRY", &stores.registry),
        ("FLEET_RETIRE_LEASES", &stores.leases),
        ("GITEA_MCP_CONFIG", &stores.profiles),
        ("GITEA_MCP_PROFILE", Path::new("controller-prgs")),
        (
            "FLEET_RETIRE_CANONICAL_REPOSITORY",
            Path::new("prgs/gitea-tools"),
        ),
    ];
    let with_env = |args: &[&str]| {
        let mut c = bin();
        c.args(args).envs(env.iter().map(|(k, v)| (k, v)));
        c.output().unwrap()
    };
    let out = with_env(&["plan", "--out", plan.to_str().unwrap()]);
    let note = String::from_utf8_lossy(&out.stderr).to_string();
    let command = note
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("fleet-retire apply"))
        .unwrap_or_else(|| panic!("no command in {note}"));
    assert_eq!(
        command,
        format!("fleet-retire apply {}", plan.display()),
        "{note}"
    );
    let out = with_env(&["apply", plan.to_str().unwrap(), "--first", "10"]);
    let said = text(&out);
    let next = after(&said, "20 of the plan's candidates left; next: ");
    assert_eq!(
        next,
        format!("fleet-retire apply {} --first 10", plan.display())
    );
    let again = run_printed(next, &env);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert!(text(&again).contains("10 of the plan's candidates left"));
}

/// SIGINT while the batches run: the batch under way commits whole or not
/// at all, no batch starts after it, and the last lines say what is left
/// and the command that continues, which finishes the plan.
#[test]
fn sigint_stops_between_batches_with_what_is_left_and_how_to_continue() {
    let stores = stale_fleet(200);
    let (plan, _) = save_plan(&stores);
    let mut child = KillOnDrop(
        bin()
            .args(human_apply(&stores))
            .arg(&plan)
            .args(["--all-batches", "--first", "5"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("batch 1 of 40: 5 retired"), "{first}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = child.0.wait().unwrap();
    let said = rest.join("\n");
    assert_eq!(status.code(), Some(0), "{said}");
    let access = StoreAccess::Sqlite {
        registry: stores.registry.clone(),
        leases: stores.leases.clone(),
    };
    let done = retired(&access);
    assert!(done < 200, "stopped before the end: {said}");
    assert!(
        batch_sizes(&access).iter().all(|&n| n == 5),
        "whole batches only"
    );
    let left = format!("{} of the plan's candidates left", 200 - done);
    assert!(
        said.contains("interrupted") && said.contains(&left),
        "{left:?} in {said}"
    );
    let next = after(&said, "continue with: ");
    assert!(next.ends_with("--all-batches"), "{next}");
    let finish = run_printed(next, &[]);
    assert_eq!(finish.status.code(), Some(0), "{}", text(&finish));
    assert!(text(&finish).contains("none of the plan's candidates left"));
    assert_eq!(retired(&access), 200);
}

/// The first refusal stops the batches: nothing of that batch is
/// retired, no batch follows, and the exit code is the refusal's.
#[test]
fn the_first_refusal_stops_the_batches() {
    let stores = stale_fleet(30);
    let (plan, _) = save_plan(&stores);
    let conn = rusqlite::Connection::open(&stores.registry).unwrap();
    conn.execute(
        "UPDATE worker_registrations SET fencing_epoch = 9 WHERE worker_identity = 'w-0007'",
        [],
    )
    .unwrap();
    let out = bin()
        .args(human_apply(&stores))
        .arg(&plan)
        .args(["--all-batches", "--first", "10"])
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("batch 1: refused (registry_revision_moved)"),
        "{said}"
    );
    assert!(!said.contains("batch 2"), "{said}");
    assert!(
        said.contains("stopped at batch 1 (registry_revision_moved)"),
        "{said}"
    );
    assert_eq!(status_of(&stores.registry, "w-0000"), "active");
}
