//! Sign-off artifacts in the standard formats CI systems read, checked by
//! the ecosystem's own parsers: JUnit XML read by Python's `junitparser`
//! (`fleet-retire test --format junit`; `policy verify --format junit` is
//! checked beside the proofs in `tests/policies.rs`).

mod common;

use common::reports::*;
use common::*;
use serde_json::Value;

/// A folder holding a passing, a failing and a malformed fixture: one
/// suite per file, one case each, the failure saying what was expected
/// and what came out, the malformed file an error; exit 1.
#[test]
fn test_results_are_junit_a_ci_system_reads() {
    let dir = tempfile::tempdir().unwrap();
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/plan/lease-protects-session.json"
    );
    let good: Value = serde_json::from_str(&std::fs::read_to_string(source).unwrap()).unwrap();
    std::fs::write(dir.path().join("a-pass.json"), good.to_string()).unwrap();
    let mut bad = good.clone();
    bad["name"] = Value::from("expects a retirement <that> & does not happen");
    bad["expect"]["candidates"] = serde_json::json!(["w-1"]);
    std::fs::write(dir.path().join("b-fail.json"), bad.to_string()).unwrap();
    std::fs::write(dir.path().join("c-malformed.json"), "{\"rows\": [").unwrap();
    let out = run(&["--format", "junit", "test", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let Some(report) = junit_read(&out.stdout) else {
        return;
    };
    assert_eq!(
        (&report["tests"], &report["failures"], &report["errors"]),
        (&Value::from(3), &Value::from(1), &Value::from(1)),
        "{report}"
    );
    let suites = report["suites"].as_array().unwrap();
    assert_eq!(suites.len(), 3, "{report}");
    let case = |i: usize| &suites[i]["cases"][0];
    assert_eq!(case(0)["result"], "passed", "{report}");
    assert_eq!(case(1)["result"], "failure", "{report}");
    assert_eq!(
        case(1)["name"],
        "expects a retirement <that> & does not happen",
        "{report}"
    );
    assert!(
        case(1)["message"].as_str().unwrap().contains("w-1"),
        "{report}"
    );
    assert_eq!(case(2)["result"], "error", "{report}");
    assert!(suites[2]["name"]
        .as_str()
        .unwrap()
        .ends_with("c-malformed.json"));

    // A command that writes no JUnit says which do.
    let out = run(&["--format", "junit", "policy", "list"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("--format junit is written by `fleet-retire test`"),
        "{}",
        text(&out)
    );
}

/// `policy verify --format junit` on the built-in set with its pid-alive
/// forbid deleted: a suite per property file (and one for the never-errors
/// proofs), the broken property a failure with its counterexample, exit 4.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn proofs_are_junit_a_ci_system_reads() {
    if skip_unless(
        cvc5_available(),
        "cvc5 (Debian package; .ci/run installs it)",
    ) {
        return;
    }
    let dir = without_pid_alive();
    let out = run(&[
        "--policies",
        dir.path().to_str().unwrap(),
        "--format",
        "junit",
        "policy",
        "verify",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let Some(report) = junit_read(&out.stdout) else {
        return;
    };
    let suites = report["suites"].as_array().unwrap();
    let names: Vec<&str> = suites.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert!(
        names
            .iter()
            .any(|n| n.ends_with("properties/retirement.cedar")),
        "{names:?}"
    );
    assert!(names.contains(&"retirement.cedar"), "{names:?}");
    let failed: Vec<&Value> = suites
        .iter()
        .flat_map(|s| s["cases"].as_array().unwrap())
        .filter(|c| c["result"] == "failure")
        .collect();
    assert!(!failed.is_empty(), "{report}");
    // The properties about pids, and nothing else.
    let names: Vec<&str> = failed.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("retire-only-dead-pids [")),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("retire-only-dead-pids [")
                || n.starts_with("retire-never-a-running-pid [")),
        "{names:?}"
    );
    assert_eq!(report["failures"], failed.len(), "{report}");
}

/// `test --coverage --format lcov`: a tracefile Debian's `lcov` summarises
/// and `genhtml` renders from the working directory it was made in, as
/// coverage services map it (sources named from there); run on the capability
/// fixtures alone, each eligibility policy is a function never entered, at
/// the line of its `@id` in retirement.cedar.
#[test]
fn coverage_is_lcov_that_lcov_and_genhtml_read() {
    let lcov = std::process::Command::new("lcov").arg("--version").output();
    if skip_unless(
        lcov.is_ok_and(|o| o.status.success()),
        "lcov (Debian package; .ci/run installs it)",
    ) {
        return;
    }
    let policies = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("coverage.info");
    // From a folder of the reviewer's own, with a copy of the policies.
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(&policies)
        .arg(work.join("pol"))
        .status()
        .unwrap();
    assert!(copied.success());
    let out = bin()
        .args([
            "--policies",
            "pol",
            "--format",
            "lcov",
            "test",
            "--coverage",
        ])
        .arg(fixtures.join("capabilities"))
        .current_dir(&work)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(&trace, &out.stdout).unwrap();
    let info = String::from_utf8(out.stdout).unwrap();
    let source = std::fs::read_to_string(policies.join("retirement.cedar")).unwrap();
    let line = source
        .lines()
        .position(|l| l.contains("@id(\"worker-live\")"))
        .unwrap()
        + 1;
    assert!(info.contains(&format!("FN:{line},worker-live\n")), "{info}");
    assert!(info.contains("FNDA:0,worker-live\n"), "{info}");
    assert!(info.contains("SF:pol/capabilities.cedar\n"), "{info}");
    // The built-in set is named as this repository's `policies/`.
    let built_in = bin()
        .args(["--format", "lcov", "test", "--coverage"])
        .arg(fixtures.join("capabilities"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&built_in.stdout).contains("SF:policies/capabilities.cedar\n"));

    let summary = std::process::Command::new("lcov")
        .arg("--summary")
        .arg(&trace)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&summary.stdout),
        String::from_utf8_lossy(&summary.stderr)
    );
    assert!(summary.status.success(), "{said}");
    assert!(!said.contains("WARNING"), "{said}");
    assert!(said.contains("functions..:"), "{said}");
    assert!(!said.contains("functions..: 100.0%"), "{said}");
    let html = dir.path().join("html");
    let rendered = std::process::Command::new("genhtml")
        .arg("-q")
        .arg("-o")
        .arg(&html)
        .arg(&trace)
        .current_dir(&work)
        .output()
        .unwrap();
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    assert!(html.join("index.html").is_file());
}

/// `policy verify --format sarif` on the set with its pid-alive forbid
/// deleted: the broken property a finding at its `@id` line in its
/// property file, with its counterexample; valid SARIF 2.1.0.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn failed_proofs_are_sarif_located_at_the_property() {
    if skip_unless(
        cvc5_available(),
        "cvc5 (Debian package; .ci/run installs it)",
    ) {
        return;
    }
    let weakened = without_pid_alive();
    let out = run(&[
        "--policies",
        weakened.path().to_str().unwrap(),
        "--format",
        "sarif",
        "policy",
        "verify",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let log: Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = log["runs"][0]["results"].as_array().unwrap();
    let properties =
        std::fs::read_to_string(weakened.path().join("properties/retirement.cedar")).unwrap();
    let dead_pids = results
        .iter()
        .find(|r| r["properties"]["id"] == "retire-only-dead-pids")
        .expect("the broken property is a finding");
    let place = &dead_pids["locations"][0]["physicalLocation"];
    assert_eq!(
        place["artifactLocation"]["uri"],
        "properties/retirement.cedar"
    );
    let line = place["region"]["startLine"].as_u64().unwrap() as usize;
    assert!(
        properties
            .lines()
            .nth(line - 1)
            .unwrap()
            .contains("@id(\"retire-only-dead-pids\")"),
        "line {line} is not the property's head"
    );
    assert!(dead_pids["properties"]["counterexample"].is_string());
    if let Some(problems) = sarif_problems(&out.stdout) {
        assert!(problems.is_empty(), "{problems:?}");
    }
}

/// `policy mutate --format sarif` on a folder whose (empty) properties
/// kill nothing: each survivor a finding, the comparison mutant at the
/// comparison's own line and column, with the case that would kill it;
/// valid SARIF 2.1.0.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn survivors_are_sarif_located_at_the_mutated_text() {
    if skip_unless(
        cvc5_available(),
        "cvc5 (Debian package; .ci/run installs it)",
    ) {
        return;
    }
    let unguarded = policy_folder(false);
    let policy_text = std::fs::read_to_string(unguarded.path().join("retirement.cedar")).unwrap();
    let out = run(&[
        "--policies",
        unguarded.path().to_str().unwrap(),
        "--format",
        "sarif",
        "policy",
        "mutate",
        "--only",
        "pid-alive",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let log: Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = log["runs"][0]["results"].as_array().unwrap();
    assert!(!results.is_empty(), "{log}");
    let compared = results
        .iter()
        .find(|r| r["properties"]["operator"] == "comparison")
        .expect("a comparison survivor");
    let region = &compared["locations"][0]["physicalLocation"]["region"];
    let (line, column) = (
        region["startLine"].as_u64().unwrap() as usize,
        region["startColumn"].as_u64().unwrap() as usize,
    );
    let before = compared["properties"]["before"].as_str().unwrap();
    let at_line = policy_text.lines().nth(line - 1).unwrap();
    assert_eq!(
        at_line
            .chars()
            .skip(column - 1)
            .collect::<String>()
            .get(..before.len()),
        Some(before),
        "{at_line}"
    );
    // The region ends where the mutated text does.
    assert_eq!(region["endLine"].as_u64().unwrap() as usize, line);
    assert_eq!(
        region["endColumn"].as_u64().unwrap() as usize,
        column + before.chars().count()
    );
    assert!(compared["properties"]["witness"].is_object(), "{compared}");
    if let Some(problems) = sarif_problems(&out.stdout) {
        assert!(problems.is_empty(), "{problems:?}");
    }
}

/// The built-in set's mutants of one forbid, each killed by a property
/// (named in `killedBy`, listed among the test files), and a folder whose
/// empty properties kill nothing: its comparison mutant `Survived` at the
/// comparison's own place. Both reports are valid; one with a status the
/// schema does not know is not.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn mutants_are_a_mutation_testing_report() {
    if skip_unless(
        cvc5_available(),
        "cvc5 (Debian package; .ci/run installs it)",
    ) {
        return;
    }
    let args = |dir: Option<&str>| {
        let mut a: Vec<&str> = Vec::new();
        if let Some(d) = dir {
            a.extend(["--policies", d]);
        }
        a.extend([
            "--format",
            "mutation-report",
            "policy",
            "mutate",
            "--only",
            "pid-alive",
        ]);
        run(&a)
    };
    let built_in = args(None);
    assert!(built_in.status.success(), "{}", text(&built_in));
    let report: Value = serde_json::from_slice(&built_in.stdout).unwrap();
    assert_eq!(report["schemaVersion"], "2");
    let mutants = report["files"]["retirement.cedar"]["mutants"]
        .as_array()
        .unwrap();
    let killed: Vec<&Value> = mutants.iter().filter(|m| m["status"] == "Killed").collect();
    assert!(!killed.is_empty(), "{report:.800}");
    let property_ids: Vec<&str> = report["testFiles"]["properties/retirement.cedar"]["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    for m in &killed {
        let by = m["killedBy"][0].as_str().unwrap();
        assert!(property_ids.contains(&by), "{by} is not a listed test");
    }
    assert!(mutants
        .iter()
        .all(|m| m["status"] != "Ignored" || m["statusReason"].is_string()));

    let unguarded = policy_folder(false);
    let out = args(Some(unguarded.path().to_str().unwrap()));
    assert!(out.status.success(), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let compared = report["files"]["retirement.cedar"]["mutants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mutatorName"] == "comparison")
        .expect("a comparison mutant")
        .clone();
    assert_eq!(compared["status"], "Survived");
    let source = report["files"]["retirement.cedar"]["source"]
        .as_str()
        .unwrap();
    let start = &compared["location"]["start"];
    let line = source
        .lines()
        .nth(start["line"].as_u64().unwrap() as usize - 1)
        .unwrap();
    let from: String = line
        .chars()
        .skip(start["column"].as_u64().unwrap() as usize - 1)
        .collect();
    assert!(from.starts_with("resource.pid_probe != \"dead\""), "{from}");

    for valid in [&built_in.stdout, &out.stdout] {
        if let Some(ok) = mutation_report_valid(valid) {
            assert!(ok, "the schema refused the report");
        }
    }
    let mut broken = report.clone();
    broken["files"]["retirement.cedar"]["mutants"][0]["status"] = Value::from("Bogus");
    if let Some(ok) = mutation_report_valid(broken.to_string().as_bytes()) {
        assert!(!ok, "the schema took a status it does not know");
    }
}

/// `policy verify` lists its proofs in one order: run twice, the built-in
/// set prints the same bytes, and a weakened set's SARIF log (failures,
/// counterexamples and all) and JUnit log (but for the seconds each proof
/// took) are the same each time.
#[test]
fn verify_prints_the_same_bytes_every_run() {
    if skip_unless(
        cvc5_available(),
        "cvc5 (Debian package; .ci/run installs it)",
    ) {
        return;
    }
    let (first, second) = (run(&["policy", "verify"]), run(&["policy", "verify"]));
    assert!(first.status.success(), "{}", text(&first));
    assert_eq!(text(&first), text(&second));
    let weakened = without_pid_alive();
    let folder = weakened.path().to_str().unwrap();
    let sarif = || {
        run(&[
            "--policies",
            folder,
            "--format",
            "sarif",
            "policy",
            "verify",
        ])
    };
    assert_eq!(text(&sarif()), text(&sarif()));
    let junit = || {
        let out = run(&[
            "--policies",
            folder,
            "--format",
            "junit",
            "policy",
            "verify",
        ]);
        let xml = String::from_utf8(out.stdout).unwrap();
        let mut kept = String::new();
        for piece in xml.split(" time=\"") {
            // Each piece after the first starts with the seconds and a quote.
            kept.push_str(piece.split_once('"').map_or(piece, |(_, rest)| rest));
        }
        kept
    };
    assert_eq!(junit(), junit());
}
