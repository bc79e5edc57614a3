//! The real binary on real SQLite files and real processes.

mod common;

use common::*;
use serde_json::json;
use std::process::{Command, Stdio};

fn assert_clean_failure(out: &std::process::Output, code: i32, needles: &[&str]) {
    let all = text(out);
    assert_eq!(out.status.code(), Some(code), "exit code; output:\n{all}");
    assert!(!all.contains("panicked"), "must not panic:\n{all}");
    assert!(!all.contains("RUST_BACKTRACE"), "no backtrace hint:\n{all}");
    for n in needles {
        assert!(all.contains(n), "expected {n:?} in:\n{all}");
    }
}

#[test]
fn plan_leaves_the_registry_untouched() {
    let stores = Stores::new(&[stale_row("w-1", 3_999_999, "ticks-1")]);
    let before = std::fs::read(&stores.registry).unwrap();
    let mtime = std::fs::metadata(&stores.registry)
        .unwrap()
        .modified()
        .unwrap();
    let lease_before = std::fs::read(&stores.leases).unwrap();
    let files_before: Vec<_> = std::fs::read_dir(stores.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let plan = stores.plan_json();
    assert_eq!(plan["read_only"], json!(true));
    assert_eq!(plan["mutation_performed"], json!(false));
    assert_eq!(std::fs::read(&stores.registry).unwrap(), before);
    assert_eq!(
        std::fs::metadata(&stores.registry)
            .unwrap()
            .modified()
            .unwrap(),
        mtime
    );
    assert_eq!(std::fs::read(&stores.leases).unwrap(), lease_before);
    let files_after: Vec<_> = std::fs::read_dir(stores.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        files_before.len(),
        files_after.len(),
        "no journal or WAL files left behind"
    );
}

#[test]
fn plan_is_deterministic() {
    let stores = Stores::new(&[
        stale_row("w-1", 3_999_999, "ticks-1"),
        stale_row("w-2", 3_999_998, "ticks-2"),
    ]);
    let a = stores.plan_json();
    let b = stores.plan_json();
    for key in [
        "registry_fingerprint",
        "candidate_fingerprint",
        "policy_fingerprint",
    ] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert_eq!(verdicts(&a), verdicts(&b));
}

#[test]
fn an_old_registry_without_fencing_columns_is_read_not_altered() {
    let stores = Stores::new(&[]);
    std::fs::remove_file(&stores.registry).unwrap();
    let old: Vec<&str> = COLUMNS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| {
            ![
                "host_id",
                "boot_id",
                "process_start_time",
                "retired_at",
                "retired_by",
                "retirement_reason",
            ]
            .contains(n)
        })
        .collect();
    registry_with_columns(
        &stores.registry,
        Some(&old),
        &[stale_row("w-old", 3_999_999, "ticks-1")],
    );
    let before = std::fs::read(&stores.registry).unwrap();
    let plan = stores.plan_json();
    let (candidates, preserved) = verdicts(&plan);
    assert!(candidates.is_empty());
    assert_eq!(
        preserved,
        vec![(
            "w-old".to_string(),
            "incomplete_registry_identity".to_string()
        )]
    );
    assert_eq!(
        std::fs::read(&stores.registry).unwrap(),
        before,
        "plan must not migrate"
    );
}

#[test]
fn real_processes_alive_reused_and_dead() {
    let mut child = Command::new("sleep")
        .arg("60")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let real_start = start_time(pid);
    let stores = Stores::new(&[
        stale_row("w-running", pid as i64, &real_start),
        stale_row("w-reused", pid as i64, "ticks-1"),
    ]);
    // Same pid, two registrations: also shared identity evidence? No: the
    // pid is alive but neither row is live (heartbeats expired) or unknown.
    let plan = stores.plan_json();
    let (_, preserved) = verdicts(&plan);
    assert!(
        preserved.contains(&("w-running".into(), "pid_alive".into())),
        "{preserved:?}"
    );
    assert!(
        preserved.contains(&("w-reused".into(), "pid_reuse_detected".into())),
        "{preserved:?}"
    );

    child.kill().unwrap();
    child.wait().unwrap();
    let stores = Stores::new(&[stale_row("w-gone", pid as i64, &real_start)]);
    let (candidates, preserved) = verdicts(&stores.plan_json());
    assert_eq!(candidates, vec!["w-gone".to_string()], "{preserved:?}");
}

#[test]
fn missing_and_corrupt_registries_are_clear_errors() {
    let stores = Stores::new(&[]);
    let missing = stores.dir.path().join("nope.sqlite");
    let mut args = stores.plan_args("controller-prgs");
    args[2] = missing.display().to_string();
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(&out, 1, &["nope.sqlite", "no such file", "--registry"]);

    let junk = stores.dir.path().join("junk.sqlite");
    std::fs::write(
        &junk,
        b"this is not a database, just text padding it out to a page or so".repeat(100),
    )
    .unwrap();
    args[2] = junk.display().to_string();
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(&out, 1, &["junk.sqlite", "not a SQLite database"]);

    let empty_db = stores.dir.path().join("empty.sqlite");
    rusqlite::Connection::open(&empty_db)
        .unwrap()
        .execute_batch("CREATE TABLE other (x);")
        .unwrap();
    args[2] = empty_db.display().to_string();
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(&out, 1, &["empty.sqlite", "worker_registrations"]);
}

#[test]
fn a_lease_store_that_cannot_be_read_stops_the_plan() {
    let stores = Stores::new(&[stale_row("w-1", 3_999_999, "ticks-1")]);
    let mut args = stores.plan_args("controller-prgs");
    args[4] = stores
        .dir
        .path()
        .join("missing-leases.sqlite")
        .display()
        .to_string();
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(
        &out,
        1,
        &["missing-leases.sqlite", "never read as \"no leases\""],
    );

    let no_table = stores.dir.path().join("no-table.sqlite");
    rusqlite::Connection::open(&no_table)
        .unwrap()
        .execute_batch("CREATE TABLE x (y);")
        .unwrap();
    args[4] = no_table.display().to_string();
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(&out, 1, &["no-table.sqlite", "workflow_leases"]);

    let junk = stores.dir.path().join("junk-leases.sqlite");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    args[4] = junk.display().to_string();
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(&out, 1, &["junk-leases.sqlite"]);
}

#[test]
fn an_active_lease_in_the_store_protects_its_worker() {
    let stores = Stores::new(&[
        stale_row("w-1", 3_999_999, "ticks-1"),
        stale_row("w-2", 3_999_998, "ticks-2"),
    ]);
    std::fs::remove_file(&stores.leases).unwrap();
    leases(
        &stores.leases,
        &[json!({"lease_id": "l-1", "status": "active", "owner_session_id": "sess-w-2"})],
    );
    let (candidates, preserved) = verdicts(&stores.plan_json());
    assert_eq!(candidates, vec!["w-1".to_string()]);
    assert_eq!(
        preserved,
        vec![(
            "w-2".to_string(),
            "protected_active_workflow_owner".to_string()
        )]
    );
}

fn policy_copy(stores: &Stores) -> std::path::PathBuf {
    let dir = stores.dir.path().join("policies");
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
    ] {
        std::fs::copy(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("policies")
                .join(f),
            dir.join(f),
        )
        .unwrap();
    }
    dir
}

#[test]
fn a_broken_policy_file_names_file_line_and_column() {
    let stores = Stores::new(&[]);
    let dir = policy_copy(&stores);
    let path = dir.join("retirement.cedar");
    let text_before = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text_before.replace(
            "when { resource.status != \"active\" };",
            "when { resource.status != };",
        ),
    )
    .unwrap();
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--policies".into(), dir.display().to_string()]);
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(&out, 3, &["retirement.cedar:"]);
    let all = text(&out);
    let line = text_before
        .lines()
        .position(|l| l.contains("when { resource.status != \"active\" };"))
        .unwrap()
        + 1;
    assert!(
        all.contains(&format!("retirement.cedar:{line}:")),
        "line {line} named in:\n{all}"
    );

    // A type error (validation, not parsing) is also rejected with its place.
    std::fs::write(
        &path,
        text_before.replace(
            "resource.identity_row_count > 1",
            "resource.identity_row_count > \"1\"",
        ),
    )
    .unwrap();
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(&out, 3, &["retirement.cedar:"]);

    // A forbid without @reason is refused.
    std::fs::write(
        &path,
        text_before.replace("@reason(\"already_terminal_registration\")\n", ""),
    )
    .unwrap();
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(&out, 3, &["status-not-active", "@reason"]);

    std::fs::remove_file(&path).unwrap();
    let out = bin().args(&args).output().unwrap();
    assert_clean_failure(&out, 3, &["retirement.cedar", "cannot open"]);
}

#[test]
fn capability_denials_say_what_is_missing() {
    let stores = Stores::new(&[]);
    let out = bin()
        .args(stores.plan_args("author-prgs"))
        .output()
        .unwrap();
    assert_clean_failure(&out, 2, &["author-prgs", "plan", "role"]);
    let out = bin().args(stores.plan_args("reader")).output().unwrap();
    assert_clean_failure(&out, 2, &["reader", "gitea.read"]);
    let out = bin().args(stores.plan_args("ghost")).output().unwrap();
    assert_clean_failure(&out, 2, &["ghost", "no such profile"]);
    let mut args = stores.plan_args("controller-prgs");
    args.truncate(7);
    let out = bin()
        .args(&args)
        .env_remove("GITEA_MCP_CONFIG")
        .env_remove("GITEA_MCP_PROFILE")
        .output()
        .unwrap();
    assert_clean_failure(&out, 2, &["--profiles"]);
    std::fs::write(&stores.profiles, "{\"profiles\": [1, 2]}").unwrap();
    let out = bin()
        .args(stores.plan_args("controller-prgs"))
        .output()
        .unwrap();
    assert_clean_failure(&out, 1, &["profiles.json", "\"profiles\" object"]);
}

#[test]
fn a_malformed_fixture_names_the_file_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.json");
    std::fs::write(&f, json!({"name": "x", "now": "2026-07-30T12:00:00Z", "context": {}, "processes": {"abc": {"alive": true}}, "rows": [], "leases": [], "expect": {}}).to_string()).unwrap();
    let out = run(&["test", f.to_str().unwrap()]);
    assert_clean_failure(&out, 1, &["bad.json", "processes.abc"]);
    std::fs::write(&f, "{not json").unwrap();
    let out = run(&["test", f.to_str().unwrap()]);
    assert_clean_failure(&out, 1, &["bad.json", "line 1"]);
    std::fs::write(&f, json!({"name": "x", "now": "2026-07-30 12:00:00Z", "context": {}, "processes": {}, "rows": [], "leases": [], "expect": {}}).to_string()).unwrap();
    let out = run(&["test", f.to_str().unwrap()]);
    assert_clean_failure(&out, 1, &["bad.json", "`now`"]);
}

#[test]
fn the_fixture_runner_reports_failures_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/plan/pid-alive.json"
    ))
    .unwrap();
    std::fs::write(dir.path().join("a.json"), &good).unwrap();
    std::fs::write(
        dir.path().join("b.json"),
        good.replace("\"w-1\": \"pid_alive\"", "\"w-1\": \"worker_live\""),
    )
    .unwrap();
    let out = run(&["test", dir.path().to_str().unwrap()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("PASS pid_alive"), "{all}");
    assert!(all.contains("want worker_live, got pid_alive"), "{all}");
    assert!(
        all.lines().any(|l| l == "1 passed, 1 failed, 0 errors"),
        "{all}"
    );
    // A malformed file between them is an error of its own: the run goes
    // on to the next file and ends with one summary.
    std::fs::write(dir.path().join("a2-malformed.json"), "{not json").unwrap();
    let out = run(&["test", dir.path().to_str().unwrap()]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("ERROR ") && all.contains("a2-malformed.json"),
        "{all}"
    );
    assert!(
        all.contains("want worker_live, got pid_alive"),
        "the file after it ran: {all}"
    );
    assert!(
        all.lines().any(|l| l == "1 passed, 1 failed, 1 errors"),
        "{all}"
    );
    // The same run as JSON: every case with its file and status.
    let out = run(&["--format", "json", "test", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(
        (
            doc["passed"].clone(),
            doc["failed"].clone(),
            doc["errors"].clone()
        ),
        (json!(1), json!(1), json!(1))
    );
    let statuses: Vec<(String, String)> = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let file = c["file"].as_str().unwrap();
            let name = std::path::Path::new(file)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (name, c["status"].as_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(
        statuses,
        [
            ("a.json", "pass"),
            ("a2-malformed.json", "error"),
            ("b.json", "fail")
        ]
        .map(|(f, s)| (f.to_string(), s.to_string()))
    );
    let failing = &doc["cases"][2];
    assert!(
        failing["details"][0]
            .as_str()
            .unwrap()
            .contains("want worker_live, got pid_alive"),
        "{failing}"
    );
    // The same as fields: what was compared, expected and actual.
    let difference = &failing["differences"][0];
    assert_eq!(difference["expected"], "worker_live", "{failing}");
    assert_eq!(difference["actual"], "pid_alive", "{failing}");
    assert!(
        difference["what"]
            .as_str()
            .unwrap()
            .starts_with("preserved"),
        "{failing}"
    );
}

#[test]
fn a_wal_registry_in_use_is_planned_from_its_latest_commit() {
    // Workers write the registry concurrently; in WAL mode the newest rows
    // may sit in the -wal file. Plan must see them and write nothing.
    let stores = Stores::new(&[stale_row("w-1", 3_999_999, "ticks-1")]);
    let writer = rusqlite::Connection::open(&stores.registry).unwrap();
    let mode: String = writer
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    writer
        .execute_batch("PRAGMA wal_autocheckpoint=0;")
        .unwrap();
    writer
        .execute(
            "UPDATE worker_registrations SET status = 'released' WHERE worker_identity = 'w-1'",
            [],
        )
        .unwrap();
    let main_file = std::fs::read(&stores.registry).unwrap();
    let (candidates, preserved) = verdicts(&stores.plan_json());
    assert!(candidates.is_empty());
    assert_eq!(
        preserved,
        vec![(
            "w-1".to_string(),
            "already_terminal_registration".to_string()
        )]
    );
    assert_eq!(std::fs::read(&stores.registry).unwrap(), main_file);
    drop(writer);
}

/// A person reads the counts and the candidates; preserved rows (tens of
/// thousands in a long-running fleet) are listed only when asked for.
#[test]
fn human_plan_lists_candidates_and_counts_and_preserved_rows_on_request() {
    let (stores, _live) = common::fleet();
    let human = |extra: &[&str]| {
        let out = common::bin()
            .args(stores.plan_args("controller-prgs"))
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let default = human(&[]);
    assert!(
        default.contains("4 rows assessed: 3 may be retired, 1 preserved"),
        "{default}"
    );
    assert!(default.contains("PRESERVED BECAUSE"), "{default}");
    assert!(
        default
            .lines()
            .any(|l| l.starts_with("pid_alive") && l.ends_with(" 1")),
        "{default}"
    );
    for i in 1..=3 {
        assert!(default.contains(&format!("w-dead-{i}")), "{default}");
    }
    assert!(!default.contains("w-running"), "{default}");
    assert!(
        default.contains("(1 preserved row(s) not listed: --all"),
        "{default}"
    );
    for asked in [&["--all"][..], &["--limit", "1"][..]] {
        let listed = human(asked);
        assert!(
            listed
                .lines()
                .any(|l| l.starts_with("w-running") && l.contains("keep")),
            "{listed}"
        );
        assert!(!listed.contains("preserved row(s) not listed"), "{listed}");
        // --limit caps the candidates too.
        assert_eq!(
            listed.contains("(2 candidate(s) not listed"),
            asked[0] == "--limit",
            "{listed}"
        );
    }
    let out = common::bin()
        .args(stores.plan_args("controller-prgs"))
        .args(["--all", "--limit", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
}

/// The conventions people bring from other tools: completions and a man
/// page from the command-line definitions, a JSON error envelope under
/// `--format json`, a folder given as a file named as such, and a
/// mistyped profile answered with the one meant.
#[test]
fn the_cli_keeps_the_conventions_users_expect() {
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("fleet-retire") && script.contains("snapshot"),
            "{shell}"
        );
    }
    let out = run(&["man"]);
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.contains(".TH fleet-retire 1") && page.contains("completions"),
        "{page}"
    );
    // A required flag that was not given is named with its variable too.
    let mut serve = bin();
    for var in [
        "FLEET_RETIRE_REGISTRY",
        "FLEET_RETIRE_LEASES",
        "GITEA_MCP_CONFIG",
        "GITEA_MCP_PROFILE",
        "GITEA_MCP_NAMESPACE",
    ] {
        serve.env_remove(var);
    }
    let out = serve.arg("serve").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--namespace <NS>: or set GITEA_MCP_NAMESPACE"),
        "{err}"
    );
    let help = text(&run(&["registry", "--help"]));
    assert!(help.contains("create") && help.contains("copy"), "{help}");
    let help = text(&run(&["plan", "--help"]));
    assert!(help.contains("postgres://"), "{help}");

    let stores = Stores::new(&[]);
    let mut args: Vec<String> = vec!["--format".into(), "json".into()];
    args.extend(stores.plan_args("controller-prgs"));
    let at = args.iter().position(|a| a == "--registry").unwrap() + 1;
    args[at] = stores.dir.path().display().to_string();
    let out = bin().args(&args).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let envelope: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("a JSON error envelope on stdout");
    assert_eq!(envelope["error"]["kind"], "registry", "{envelope}");
    assert_eq!(envelope["error"]["exit_code"], 1);
    assert_eq!(envelope["error"]["reason_code"], "registry_unavailable");
    assert!(envelope["error"]["what_to_do"]
        .as_str()
        .is_some_and(|w| !w.is_empty()));
    let message = envelope["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("is a folder, not a SQLite file"),
        "{message}"
    );
    // A command line that cannot be read is a JSON error too.
    let out = bin()
        .args(["--format", "json", "apply", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let envelope: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("a JSON usage error on stdout");
    assert_eq!(envelope["error"]["kind"], "usage", "{envelope}");
    assert_eq!(envelope["error"]["reason_code"], "bad_usage", "{envelope}");
    assert!(envelope["error"]["detail"]
        .as_str()
        .unwrap()
        .contains("--bogus"));

    // plan --out says what it wrote; no apply command, with no candidate
    // (issue 52; tests/operator_output.rs covers a plan with some).
    let saved = stores.dir.path().join("saved.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), saved.display().to_string()]);
    let out = bin().args(&args).output().unwrap();
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(
        note.contains("wrote the plan to")
            && note.contains("0 candidate(s)): nothing to apply")
            && !note.contains("fleet-retire apply"),
        "{note}"
    );
    // What the saved plan holds: tests/plan_file.rs.
    let mut args = stores.plan_args("controller-prgs");
    let at = args.iter().position(|a| a == "controller-prgs").unwrap();
    args[at] = "controler-prgs".into();
    let out = bin().args(&args).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("did you mean \"controller-prgs\"?"),
        "{}",
        text(&out)
    );
}

/// Human outputs stay under a screen whatever the registry's size: each
/// list shows its first 20 (`--limit N`, `--all`) and says how many more
/// there are; JSON keeps every row.
#[test]
fn human_outputs_summarise_long_lists() {
    let rows: Vec<serde_json::Value> = (0..30)
        .map(|i| {
            let (pid, start) = dead_process();
            stale_row(&format!("w-dead-{i:02}"), pid, &start)
        })
        .collect();
    let stores = Stores::new(&rows);
    let plan = bin()
        .args(stores.plan_args("controller-prgs"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&plan.stdout);
    assert_eq!(table.matches(" retire ").count(), 20, "{table}");
    assert!(table.contains("(10 candidate(s) not listed"), "{table}");
    let mut all = stores.plan_args("controller-prgs");
    all.push("--all".into());
    let table = String::from_utf8_lossy(&bin().args(&all).output().unwrap().stdout).into_owned();
    assert_eq!(table.matches(" retire ").count(), 30, "{table}");

    let saved = stores.dir.path().join("plan.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), saved.display().to_string()]);
    assert!(bin().args(&args).output().unwrap().status.success());
    // The human apply report: the apply args without `--format json`.
    let mut apply: Vec<String> = stores.apply_args("controller-prgs")[2..].to_vec();
    apply.extend([
        saved.display().to_string(),
        "--first".into(),
        "25".into(),
        "--max-retire".into(),
        "25".into(),
    ]);
    let out = bin().args(&apply).output().unwrap();
    let report = text(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report.matches("  retired w-dead-").count(), 20, "{report}");
    assert!(report.contains("… and 5 more retired"), "{report}");
}

/// A report that cannot be written (a full disk) is a warning that says
/// what the apply did: a refusal retired nothing and left no audit row.
#[test]
fn an_unwritable_report_says_what_the_apply_did() {
    let stores = Stores::new(&[]);
    let (plan_path, _) = save_plan(&stores);
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = bin()
        .args(&stores.apply_args("author-prgs")[2..])
        .arg(&plan_path)
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the apply report could not be written"),
        "{err}"
    );
    assert!(err.contains("nothing was retired (outcome "), "{err}");
    assert!(!err.contains("retirement_audit"), "{err}");
}

/// A batch (`--first N`) says what it asked for: `first` and the plan's
/// candidates it walked, not every candidate of the plan, whether it was
/// applied or refused before its targets were chosen.
#[test]
fn a_batch_reports_the_batch_it_asked_for() {
    let rows: Vec<serde_json::Value> = (0..12)
        .map(|i| {
            let (pid, start) = dead_process();
            stale_row(&format!("w-dead-{i:02}"), pid, &start)
        })
        .collect();
    let stores = Stores::new(&rows);
    let saved = stores.dir.path().join("plan.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), saved.display().to_string()]);
    assert!(bin().args(&args).output().unwrap().status.success());
    let batch = |profile: &str| {
        let mut apply = stores.apply_args(profile);
        apply.extend([saved.display().to_string(), "--first".into(), "3".into()]);
        let out = bin().args(&apply).output().unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let denied = batch("author-prgs");
    assert_eq!(denied["outcome"], "permission_denied", "{denied}");
    assert_eq!(denied["first"], 3, "{denied}");
    assert_eq!(denied["requested"], serde_json::json!([]), "{denied}");
    let applied = batch("controller-prgs");
    assert_eq!(applied["outcome"], "applied", "{applied}");
    assert_eq!(applied["first"], 3, "{applied}");
    assert_eq!(
        applied["requested"],
        serde_json::json!(["w-dead-00", "w-dead-01", "w-dead-02"]),
        "{applied}"
    );
}

/// Long work says what it is doing on a terminal (stderr, a spinner with
/// the step), and nothing of it reaches a pipe. The terminal is a
/// pseudo-terminal made by util-linux `script`.
#[test]
fn plan_shows_its_progress_on_a_terminal_only() {
    let script = Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if skip_unless(script, "util-linux `script` (a pseudo-terminal)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    plain_fleet(dir.path(), 30_000);
    let stores = Stores::new(&[]);
    let mut args = stores.plan_args("controller-prgs");
    assert_eq!(
        (args[1].as_str(), args[3].as_str()),
        ("--registry", "--leases")
    );
    args[2] = dir.path().join("registry.sqlite").display().to_string();
    args[4] = dir.path().join("leases.sqlite").display().to_string();
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_fleet-retire").to_string())
        .chain(args.iter().cloned())
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect();
    let out = Command::new("script")
        .args([
            "-qec",
            &format!("{} >/dev/null", quoted.join(" ")),
            "/dev/null",
        ])
        .output()
        .unwrap();
    let terminal = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{terminal}");
    assert!(
        terminal.contains("planning: reading the registry and leases"),
        "{terminal}"
    );
    let piped = bin().args(&args).output().unwrap();
    assert!(piped.status.success());
    assert!(
        !String::from_utf8_lossy(&piped.stderr).contains("planning:"),
        "{}",
        text(&piped)
    );
}

/// One JSON error contract: a refused apply's document carries the same
/// `error` block every failing command prints under `--format json`, beside
/// its own report; an applied one carries none.
#[test]
fn a_refused_apply_carries_the_json_error_block() {
    let (stores, live) = fleet();
    let (plan, _) = save_plan(&stores);
    let (code, report) = apply_cli(&stores, &plan, "author-prgs", &[]);
    assert_eq!(code, Some(2), "{report}");
    let error = &report["error"];
    assert_eq!(error["kind"], "refused", "{report}");
    assert_eq!(error["exit_code"], 2);
    assert_eq!(error["reason_code"], report["outcome"]);
    assert_eq!(error["reason_code"], "permission_denied");
    assert!(error["what_to_do"]
        .as_str()
        .unwrap()
        .contains("gitea.worker_registry.retire"));
    assert!(!error["message"].as_str().unwrap().is_empty());
    let (code, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert!(report.get("error").is_none(), "{report}");
    drop(live);
}
