//! What a fixture author does, done as they would do it (issue 52 §3): run
//! the exported `run.sh` by its path, with and without Cedar's CLI; read a
//! failing case's report and run the `explain` command it prints; write a
//! case with `defaults`; trip over a key given twice.

mod common;

use common::*;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A fixture of ours with its `expect` replaced.
fn with_expect(fixture: &str, expect: Value) -> Value {
    let text = std::fs::read_to_string(root().join("fixtures/plan").join(fixture)).unwrap();
    let mut case: Value = serde_json::from_str(&text).unwrap();
    case["expect"] = expect;
    case
}

fn write(path: &Path, case: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(case).unwrap()).unwrap();
}

/// A folder of two cases, one passing and one whose expectation is wrong,
/// exported with `test --export-cedar`, which exits 1 (a case failed) and
/// writes the export all the same.
fn export_one_good_one_bad(dir: &Path) -> PathBuf {
    let cases = dir.join("cases");
    std::fs::create_dir_all(&cases).unwrap();
    std::fs::copy(
        root().join("fixtures/plan/pid-reuse.json"),
        cases.join("a-good.json"),
    )
    .unwrap();
    let wrong = json!({"candidates": [], "preserved": {"w-1": "heartbeat_not_expired"}});
    write(
        &cases.join("b-bad.json"),
        &with_expect("pid-reuse.json", wrong),
    );
    let out_dir = dir.join("out");
    let out = run(&[
        "test",
        cases.to_str().unwrap(),
        "--export-cedar",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    out_dir
}

/// `PATH` without any folder that holds a `cedar`.
fn path_without_cedar() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|d| !d.join("cedar").exists())
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// Run `out/run.sh` by its path, as the guide says, from the folder above.
fn run_script(out_dir: &Path, path: &str) -> Output {
    Command::new(out_dir.join("run.sh"))
        .current_dir(out_dir.parent().unwrap())
        .env("PATH", path)
        .output()
        .expect("run.sh runs by its path: it is executable")
}

#[test]
fn exported_run_sh_is_executable_and_says_how_to_install_a_missing_cedar() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = export_one_good_one_bad(dir.path());
    let mode = std::fs::metadata(out_dir.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "run.sh mode {mode:o}");
    let out = run_script(&out_dir, &path_without_cedar());
    let said = text(&out);
    assert_eq!(out.status.code(), Some(127), "{said}");
    assert!(
        said.contains("cargo install --locked cedar-policy-cli --version 4.14.1"),
        "{said}"
    );
    assert!(!said.contains("command not found"), "{said}");
}

#[test]
fn exported_run_sh_runs_every_file_and_summarises() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = export_one_good_one_bad(dir.path());
    // A stand-in `cedar` that fails the second file only: the script must
    // go on past the first failure's place and count both.
    let fake = dir.path().join("bin");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(
        fake.join("cedar"),
        "#!/bin/sh\ncase \"$*\" in *001-*) echo 'fail'; exit 1;; esac\necho ok\n",
    )
    .unwrap();
    std::fs::set_permissions(fake.join("cedar"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", fake.display(), path_without_cedar());
    let out = run_script(&out_dir, &path);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("== 000-a-good.tests.json"), "{said}");
    assert!(said.contains("== 001-b-bad.tests.json"), "{said}");
    assert!(
        said.contains("run.sh: 1 of 2 file(s) passed, 1 failed"),
        "{said}"
    );
    assert!(said.contains("failed: 001-b-bad.tests.json"), "{said}");
}

#[test]
fn exported_run_sh_with_cedars_own_cli_passes_the_good_and_fails_the_bad() {
    let has_cedar = Command::new("cedar")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if skip_unless(has_cedar, "the cedar CLI (cargo install cedar-policy-cli)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = export_one_good_one_bad(dir.path());
    let out = run_script(&out_dir, &std::env::var("PATH").unwrap());
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("run.sh: 1 of 2 file(s) passed, 1 failed"),
        "{said}"
    );
    assert!(said.contains("failed: 001-b-bad.tests.json"), "{said}");
    assert!(said.contains("missing reason"), "Cedar's own words: {said}");
}

/// The command after "to see why:" on the line following `decided`.
fn explain_command_after(report: &str, decided: &str) -> String {
    let mut lines = report.lines().skip_while(|l| !l.contains(decided));
    assert!(lines.next().is_some(), "no line with {decided:?}: {report}");
    let next = lines.next().unwrap_or_default();
    next.split_once("to see why: ")
        .unwrap_or_else(|| panic!("no command after {decided:?}: {report}"))
        .1
        .to_string()
}

/// Run a printed command in a shell, with the built binary first on PATH.
fn run_printed(command: &str, cwd: &Path) -> Output {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .parent()
        .unwrap();
    Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(cwd)
        .env(
            "PATH",
            format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
        )
        // An operator's registry variable must not stand in the way.
        .env("FLEET_RETIRE_REGISTRY", "/nonexistent/registry.sqlite")
        .env("FLEET_RETIRE_LEASES", "/nonexistent/leases.sqlite")
        .output()
        .unwrap()
}

#[test]
fn a_failing_case_names_the_deciding_policy_and_an_explain_command_that_works() {
    let dir = tempfile::tempdir().unwrap();
    // A folder and file name a shell would split or choke on.
    let cases = dir.path().join("my cases");
    std::fs::create_dir_all(&cases).unwrap();
    let kept = cases.join("kept it's.json");
    write(
        &kept,
        &with_expect(
            "pid-reuse.json",
            json!({"candidates": ["w-1"], "preserved": {}}),
        ),
    );
    let retired = cases.join("retired.json");
    let wrong = json!({"candidates": [], "preserved": {"w-1": "pid_alive"}});
    write(
        &retired,
        &with_expect("eligible-different-boot.json", wrong),
    );
    let out = bin()
        .current_dir(dir.path())
        .args(["test", "my cases"])
        .output()
        .unwrap();
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(!report.contains("(not expected)"), "{report}");
    assert!(
        report.contains("preserved \"w-1\": want not preserved, got pid_reuse_detected"),
        "{report}"
    );
    let kept_line = "w-1 (row 1): kept by forbid `pid-number-reused` (pid_reuse_detected)";
    let command = explain_command_after(&report, kept_line);
    assert_eq!(
        command,
        r#"fleet-retire explain --fixture 'my cases/kept it'"'"'s.json' --worker w-1"#
    );
    let explained = run_printed(&command, dir.path());
    let said = text(&explained);
    assert!(explained.status.success(), "{command}: {said}");
    assert!(said.contains("keep — pid_reuse_detected"), "{said}");
    assert!(
        said.lines()
            .any(|l| l.contains("FORBIDS") && l.contains("pid-number-reused")),
        "{said}"
    );

    let retired_line =
        "w-1 (row 1): retired by permit `retire-when-nothing-forbids` (eligible_stale_orphan)";
    let command = explain_command_after(&report, retired_line);
    let explained = run_printed(&command, dir.path());
    assert!(
        explained.status.success(),
        "{command}: {}",
        text(&explained)
    );
    assert!(text(&explained).contains("retire — eligible_stale_orphan"));
}

#[test]
fn the_explain_command_carries_the_runs_policies_and_json_says_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("case.json");
    write(
        &case,
        &with_expect("pid-reuse.json", json!({"preserved": {"w-1": "pid_alive"}})),
    );
    let policies = root().join("policies");
    let out = run(&[
        "--format",
        "json",
        "--policies",
        policies.to_str().unwrap(),
        "test",
        case.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let decided = &doc["cases"][0]["decided"][0];
    assert_eq!(decided["worker"], "w-1", "{doc}");
    assert_eq!(
        decided["rows"],
        json!([{"worker": "w-1", "row": 1, "decision": "keep", "effect": "forbid",
                "policies": ["pid-number-reused"], "reason": "pid_reuse_detected"}])
    );
    let command = decided["explain"].as_str().unwrap();
    assert!(
        command.starts_with(&format!(
            "fleet-retire --policies {} explain",
            policies.display()
        )),
        "{command}"
    );
    let explained = run_printed(command, dir.path());
    assert!(
        explained.status.success(),
        "{command}: {}",
        text(&explained)
    );
}

#[test]
fn a_case_with_defaults_passes_fleet_retire_test() {
    let fixture = root().join("fixtures/plan/defaults-shared-columns.json");
    let out = run(&["test", fixture.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("1 passed, 0 failed, 0 errors"));
    // The same rows written out in full are the same case.
    let mut case: Value =
        serde_json::from_str(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    let defaults = case["defaults"].as_object().unwrap().clone();
    for row in case["rows"].as_array_mut().unwrap() {
        let own = row.as_object().unwrap().clone();
        let mut full = defaults.clone();
        full.extend(own);
        *row = Value::Object(full);
    }
    case.as_object_mut().unwrap().remove("defaults");
    let dir = tempfile::tempdir().unwrap();
    let spelt_out = dir.path().join("spelt-out.json");
    write(&spelt_out, &case);
    let out = run(&["test", spelt_out.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_bad_defaults_names_the_file_and_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let base: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/plan/defaults-shared-columns.json"))
            .unwrap(),
    )
    .unwrap();
    let bad: Vec<(&str, Value, &str)> = vec![
        (
            "list.json",
            json!([1]),
            "field `defaults`: must be an object",
        ),
        (
            "null.json",
            Value::Null,
            "field `defaults`: must be an object",
        ),
        (
            "typo.json",
            json!({"hots_id": "build-01"}),
            "field `defaults.hots_id`: is not a registry column",
        ),
        (
            "value.json",
            json!({"pid": [4242]}),
            "field `defaults.pid`: expected null, a boolean, a number or a string",
        ),
    ];
    for (name, defaults, said) in bad {
        let mut case = base.clone();
        case["defaults"] = defaults;
        let file = dir.path().join(name);
        write(&file, &case);
        let out = run(&["test", file.to_str().unwrap()]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{all}");
        assert!(all.contains(&format!("ERROR {}", file.display())), "{all}");
        assert!(
            all.contains(&format!("fixture {}: {said}", file.display())),
            "{name}: {all}"
        );
    }
    // A case without rows has nothing to apply defaults to.
    let capability = dir.path().join("capability.json");
    let mut case: Value = serde_json::from_str(
        &std::fs::read_to_string(first_json(&root().join("fixtures/capabilities"))).unwrap(),
    )
    .unwrap();
    case["defaults"] = json!({"status": "active"});
    write(&capability, &case);
    let out = run(&["test", capability.to_str().unwrap()]);
    assert!(
        text(&out).contains("field `defaults`: gives the columns shared by `rows`"),
        "{}",
        text(&out)
    );
}

fn first_json(dir: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files.remove(0)
}

#[test]
fn a_duplicate_key_is_placed_once_with_a_hint_that_fits() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("twice.json");
    std::fs::write(&fixture, "{\n  \"name\": \"a\",\n  \"name\": \"b\"\n}\n").unwrap();
    let profiles = dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        "{\"profiles\": {\n  \"p\": {\"role\": \"reader\", \"allowed_operations\": []},\n  \
         \"p\": {\"role\": \"reader\", \"allowed_operations\": []}\n}}\n",
    )
    .unwrap();
    let fixture_out = run(&["test", fixture.to_str().unwrap()]);
    let profiles_out = run(&["grants", "--profiles", profiles.to_str().unwrap()]);
    for (out, key) in [
        (fixture_out, "\"name\" at $.name"),
        (profiles_out, "\"p\" at $.profiles.p"),
    ] {
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{all}");
        let line = all
            .lines()
            .find(|l| l.contains("duplicate key"))
            .unwrap_or_else(|| panic!("{all}"));
        assert!(
            line.contains(&format!("duplicate key {key} (line 3, column")),
            "{line}"
        );
        assert_eq!(line.matches("line 3").count(), 1, "{line}");
        assert!(!line.contains("not valid JSON"), "{line}");
        assert!(!line.contains("GITEA_MCP_CONFIG"), "{line}");
        assert!(
            line.ends_with("keep the one you mean and delete the other"),
            "{line}"
        );
    }
    // A profiles file that is not there still says how to name one.
    let missing = dir.path().join("missing.json");
    let out = run(&["grants", "--profiles", missing.to_str().unwrap()]);
    assert!(
        text(&out).contains("pass profiles.json with --profiles or GITEA_MCP_CONFIG"),
        "{}",
        text(&out)
    );
}
