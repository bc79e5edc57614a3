//! What an operator reads (issue 52 §1): the fleet after an apply in the
//! plan's words, the command `plan --out` prints, each command's own
//! `--format` list, and a sample registry that shows a candidate on any
//! machine.

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;

/// Two eligible rows, three whose heartbeat is a minute old (and when),
/// two of another host, one with an untrusted identity.
fn kept_for_many_reasons() -> (Vec<Value>, chrono::DateTime<chrono::Utc>) {
    let dead = |id: &str, n: i64| stale_row(id, 4_194_305 + n, "ticks-1");
    let mut rows = vec![dead("w-eligible-1", 1), dead("w-eligible-2", 2)];
    let fresh = chrono::Utc::now() - chrono::Duration::seconds(60);
    for n in 3..6 {
        let mut row = dead(&format!("w-fresh-{n}"), n);
        row["last_heartbeat_at"] = json!(fresh.format("%Y-%m-%dT%H:%M:%SZ").to_string());
        rows.push(row);
    }
    for n in 6..8 {
        let mut row = dead(&format!("w-elsewhere-{n}"), n);
        row["host_id"] = json!("another-host.example");
        rows.push(row);
    }
    let mut legacy = dead("w-legacy", 8);
    legacy["client_instance_id"] = json!("legacy-pid-8");
    rows.push(legacy);
    for (n, row) in rows.iter_mut().enumerate() {
        row["namespace"] = json!(format!("ns-{n}"));
    }
    (rows, fresh)
}

/// A snapshot a person reads speaks the plan's words too: its stale rows
/// grouped by the reason a plan of the same read keeps each for, when the
/// leases and repository a plan needs are given, and otherwise a line
/// saying how to get them; its JSON stays the snapshot's own.
#[test]
fn a_snapshot_groups_its_stale_rows_by_the_plans_reasons() {
    let (rows, _) = kept_for_many_reasons();
    let stores = Stores::new(&rows);
    let mut args = stores.plan_args("controller-prgs");
    args[0] = "snapshot".into();
    let out = bin().args(&args).output().unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    for line in [
        "blockers: 8 (stale_orphaned_worker 8)",
        "  2 eligible_stale_orphan: may be retired now",
        "  3 heartbeat_not_expired: become eligible as their TTLs lapse, the first at ",
        "  2 host_binding_unproven: belong to other hosts: run there",
        "  1 untrusted_identity_provenance: have untrusted identities: relaunch them",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    assert!(!said.contains("- stale_orphaned_worker"), "{said}");
    // Without the leases: the snapshot's own findings, and how to group them.
    let without: Vec<&String> = args.iter().filter(|a| !a.contains("leases")).collect();
    let out = bin()
        .args(&without)
        .env_remove("FLEET_RETIRE_LEASES")
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("- stale_orphaned_worker"), "{said}");
    assert!(
        said.contains("give --leases and --canonical-repository"),
        "{said}"
    );
    // The JSON is the snapshot's, as the fixtures pin it.
    let out = bin()
        .args(["--format", "json"])
        .args(&args)
        .output()
        .unwrap();
    let doc: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(doc["active_blockers"].as_array().unwrap().len(), 8, "{doc}");
    assert!(doc.get("stale_by_reason").is_none(), "{doc}");
}

/// After a successful apply, the stale rows left are grouped by the reason
/// the plan keeps them, with what happens next; no stale row is listed as
/// a `stale_orphaned_worker` sending the reader back to `plan`.
#[test]
fn after_an_apply_the_residual_blockers_are_grouped_by_the_plans_reasons() {
    let (rows, fresh) = kept_for_many_reasons();
    let stores = Stores::new(&rows);
    let (plan, _) = save_plan(&stores);
    let out = bin()
        .args(&stores.apply_args("controller-prgs")[2..])
        .arg(&plan)
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    for line in [
        "after: 0 live, 6 stale, 2 historical; live fleet NOT SAFE (6 residual blocker(s))",
        "  3 heartbeat_not_expired: become eligible as their TTLs lapse, the first at ",
        "  2 host_binding_unproven: belong to other hosts: run there",
        "  1 untrusted_identity_provenance: have untrusted identities: relaunch them through \
         `fleet-retire launch`",
        "none of the plan's candidates left to retire",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    assert!(!said.contains("stale_orphaned_worker"), "{said}");
    let (_, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_eq!(report["outcome"], "already_retired", "{report}");
    // The JSON says the same (after a fresh apply of a new plan).
    let stores = Stores::new(&rows);
    let (plan, _) = save_plan(&stores);
    let (_, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    let groups = &report["residual"]["stale_by_reason"];
    assert_eq!(
        groups[0]["reason_code"], "heartbeat_not_expired",
        "{report}"
    );
    assert_eq!(groups[0]["count"], 3);
    let first = groups[0]["first_eligible_at"].as_str().unwrap();
    let expected = fresh + chrono::Duration::seconds(901);
    assert_eq!(first, expected.format("%Y-%m-%dT%H:%M:%SZ").to_string());
    assert_eq!(report["left"], 0);
}

/// `plan --out` prints an apply command that names no flag the operator did
/// not give and works where it was printed; a profile that may not apply
/// is replaced by a placeholder that says so; and a plan with nothing to
/// apply prints no apply command.
#[test]
fn plan_out_prints_a_command_only_when_there_is_something_to_apply() {
    let rows: Vec<Value> = (0..3)
        .map(|i| stale_row(&format!("w-{i}"), 4_194_305 + i, "ticks-1"))
        .collect();
    let stores = Stores::new(&rows);
    let out_path = stores.dir.path().join("plan.json");
    let note = |profile: &str, extra: &[(&str, &Path)]| {
        let mut args = stores.plan_args(profile);
        args.extend(["--out".into(), out_path.display().to_string()]);
        let out = bin()
            .args(&args)
            .envs(extra.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let said = note("controller-prgs", &[]);
    assert!(said.contains("--profile controller-prgs"), "{said}");
    assert!(!said.contains("NAME"), "{said}");
    // The same profile in the environment: the command need not name it.
    let said = note(
        "controller-prgs",
        &[("GITEA_MCP_PROFILE", Path::new("controller-prgs"))],
    );
    assert!(!said.contains(" --profile "), "{said}");
    // A reconciler with read alone may plan but not apply.
    std::fs::write(
        &stores.profiles,
        json!({"profiles": {"reconciler-prgs": {"role": "reconciler",
                                                "allowed_operations": ["gitea.read"]}}})
        .to_string(),
    )
    .unwrap();
    let said = note("reconciler-prgs", &[]);
    assert!(
        said.contains("--profile NAME") && said.contains("reconciler-prgs may not apply"),
        "{said}"
    );
    // Nothing to apply: no command.
    let mut live = stale_row("w-live", i64::from(std::process::id()), "ticks-1");
    live["last_heartbeat_at"] = json!(chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string());
    let stores = Stores::new(&[live]);
    let mut args = stores.plan_args("controller-prgs");
    let out_path = stores.dir.path().join("plan.json");
    args.extend(["--out".into(), out_path.display().to_string()]);
    let out = bin().args(&args).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(said.contains("0 candidate(s)): nothing to apply"), "{said}");
    assert!(!said.contains("fleet-retire apply"), "{said}");
}

/// Each subcommand's `--help` lists the formats it writes, and no other;
/// the root lists them all, and a format given before the subcommand is
/// still refused naming the commands that write it.
#[test]
fn each_commands_help_lists_only_its_own_formats() {
    let all = ["human", "json", "junit", "lcov", "sarif", "mutation-report"];
    let cases: [(&[&str], &[&str]); 7] = [
        (&["plan"], &["human", "json"]),
        (&["apply"], &["human", "json"]),
        (&["snapshot"], &["human", "json"]),
        (&["test"], &["human", "json", "junit", "lcov"]),
        (&["grants"], &["human", "json", "sarif"]),
        (&["policy", "verify"], &["human", "json", "junit", "sarif"]),
        (
            &["policy", "mutate"],
            &["human", "json", "sarif", "mutation-report"],
        ),
    ];
    for (command, own) in cases {
        let mut args = command.to_vec();
        args.push("--help");
        let help = text(&run(&args));
        let line = help
            .lines()
            .skip_while(|l| !l.contains("--format"))
            .take(12)
            .collect::<Vec<_>>()
            .join("\n");
        for format in all {
            let listed = line.contains(&format!("{format},"))
                || line.contains(&format!("{format}]"))
                || line.contains(&format!("- {format}:"))
                || line.contains(&format!("{format}:"));
            assert_eq!(
                listed,
                own.contains(&format),
                "{command:?} {format}:\n{line}"
            );
        }
    }
    let out = run(&["plan", "--format", "junit"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("[possible values: human, json]"),
        "{}",
        text(&out)
    );
    let out = run(&["--format", "junit", "policy", "list"]);
    assert!(
        text(&out).contains("--format junit is written by"),
        "{}",
        text(&out)
    );
}

/// The sample of the README's "try the sample", made for this machine,
/// shows candidates; the plan command it prints runs as printed.
#[test]
fn the_sample_registry_shows_candidates_on_this_machine() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("sample");
    let out = run(&["registry", "sample", "--out", folder.to_str().unwrap()]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let command = said
        .lines()
        .find_map(|l| l.trim().strip_prefix("fleet-retire "))
        .unwrap_or_else(|| panic!("no command in {said}"));
    let words: Vec<String> = command.split(' ').map(str::to_string).collect();
    let out = bin()
        .args(&words)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (candidates, preserved) = verdicts(&plan);
    assert_eq!(
        candidates,
        ["w-sample-author", "w-sample-reviewer"],
        "{plan}"
    );
    let reasons: Vec<&str> = preserved.iter().map(|(_, r)| r.as_str()).collect();
    for reason in [
        "already_terminal_registration",
        "untrusted_identity_provenance",
        "repository_binding_ambiguous",
        "protected_active_workflow_owner",
        "host_binding_unproven",
        "heartbeat_not_expired",
    ] {
        assert!(reasons.contains(&reason), "{reason}: {reasons:?}");
    }
    // A second sample into the same folder is refused, not overwritten.
    let out = run(&["registry", "sample", "--out", folder.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("exists already"));
}
