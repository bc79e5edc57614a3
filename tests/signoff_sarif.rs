//! SARIF logs of the review commands that judge a change rather than a
//! set: `policy validate` (a rejected policy, a file out of layout),
//! `policy diff` (a loosening) and `grants --against` (a grant widened, a
//! typo warned of). Each log is checked by Microsoft's SARIF multitool and
//! each finding's place is read back from the file it names.

mod common;

use common::reports::*;
use common::*;
use serde_json::Value;
use std::path::Path;

/// The results of a log, and each one's (rule, file, line, column).
fn places(stdout: &[u8]) -> Vec<(String, String, usize, usize)> {
    let log: Value = serde_json::from_slice(stdout).expect("a SARIF log");
    assert_eq!(log["version"], "2.1.0");
    log["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let at = &r["locations"][0]["physicalLocation"];
            (
                r["ruleId"].as_str().unwrap().to_string(),
                at["artifactLocation"]["uri"].as_str().unwrap().to_string(),
                at["region"]["startLine"].as_u64().unwrap() as usize,
                at["region"]["startColumn"].as_u64().unwrap() as usize,
            )
        })
        .collect()
}

/// The line (1-based) of `file` that holds `needle`.
fn line_of(file: &Path, needle: &str) -> usize {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle} is not in {}", file.display()))
        + 1
}

/// `policy validate --format sarif` of the folder `folder` (the built-in
/// set when `None`).
fn validate(folder: Option<&Path>) -> std::process::Output {
    let mut args: Vec<&str> = Vec::new();
    if let Some(f) = folder {
        args.extend(["--policies", f.to_str().unwrap()]);
    }
    args.extend(["--format", "sarif", "policy", "validate"]);
    run(&args)
}

fn valid(stdout: &[u8]) {
    if let Some(problems) = sarif_problems(stdout) {
        assert!(problems.is_empty(), "{problems:?}");
    }
}

/// A policy that compares a string with a number is rejected at the
/// comparison (exit 3, the log still written); a file out of Cedar's
/// layout is a finding at its first line out of it; the built-in set has
/// none.
#[test]
fn a_rejected_policy_is_sarif_at_its_place() {
    let broken = policy_folder(false);
    let file = broken.path().join("retirement.cedar");
    let policy_text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        policy_text.replace(
            "when { resource.pid_probe != \"dead\" };",
            "when { resource.pid_probe != 5 };",
        ),
    )
    .unwrap();
    let out = validate(Some(broken.path()));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let found = places(&out.stdout);
    let line = line_of(&file, "resource.pid_probe != 5");
    assert!(
        found.iter().any(|(rule, uri, l, c)| rule == "FR1003"
            && uri == "retirement.cedar"
            && *l == line
            && *c > 1),
        "{found:?} (line {line})"
    );
    valid(&out.stdout);

    let untidy = policy_folder(false);
    let file = untidy.path().join("capabilities.cedar");
    let policy_text = std::fs::read_to_string(&file).unwrap();
    let first = policy_text
        .lines()
        .position(|l| l.starts_with("permit"))
        .unwrap();
    let mut lines: Vec<String> = policy_text.lines().map(str::to_string).collect();
    lines[first] = format!("permit   {}", &lines[first]["permit".len()..].trim_start());
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let out = validate(Some(untidy.path()));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(
        places(&out.stdout),
        vec![("FR1004".into(), "capabilities.cedar".into(), first + 1, 1)]
    );
    valid(&out.stdout);

    let out = validate(None);
    assert!(out.status.success(), "{}", text(&out));
    assert!(places(&out.stdout).is_empty());
    valid(&out.stdout);

    // A folder that lacks its schema still gets a log, naming the file.
    let lacking = policy_folder(false);
    std::fs::remove_file(lacking.path().join("schema.cedarschema")).unwrap();
    let out = validate(Some(lacking.path()));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(
        places(&out.stdout),
        vec![("FR1003".into(), "schema.cedarschema".into(), 1, 1)]
    );
    valid(&out.stdout);

    // Columns count characters, as the log declares: three two-byte
    // letters before the error move it three columns, not six.
    let wide = policy_folder(false);
    let file = wide.path().join("retirement.cedar");
    let policy_text = std::fs::read_to_string(&file).unwrap();
    let at = "when { resource.pid_probe != \"dead\" };";
    let column_with = |literal: &str| {
        let edited =
            format!("when {{ resource.pid_probe != \"{literal}\" && resource.pid_probe != 5 }};");
        std::fs::write(&file, policy_text.replace(at, &edited)).unwrap();
        let out = validate(Some(wide.path()));
        let found = places(&out.stdout);
        found.iter().find(|f| f.0 == "FR1003").map(|f| f.3).unwrap()
    };
    assert_eq!(column_with("ééé"), column_with("") + 3);
}

/// `policy diff` from the built-in set to one whose pid-alive forbid can
/// no longer match: the retire action loosened, located at that policy's
/// head in NEW's file, with the counterexample; exit 2 as for a person.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_loosening_is_sarif_at_the_policy_that_changed() {
    if skip_unless(
        cvc5_available(),
        "cvc5 (Debian package; .ci/run installs it)",
    ) {
        return;
    }
    let builtin = policy_folder(false);
    let loosened = policy_folder(false);
    let file = loosened.path().join("retirement.cedar");
    let policy_text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        policy_text.replace(
            "when { resource.pid_probe != \"dead\" };",
            "when { resource.pid_probe == \"no such answer\" };",
        ),
    )
    .unwrap();
    let out = run(&[
        "--format",
        "sarif",
        "policy",
        "diff",
        builtin.path().to_str().unwrap(),
        loosened.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let found = places(&out.stdout);
    let head = line_of(&file, "@id(\"pid-alive\")");
    assert_eq!(
        found,
        vec![("FR1005".into(), "retirement.cedar".into(), head, 1)],
        "only retire loosened, at pid-alive"
    );
    let log: Value = serde_json::from_slice(&out.stdout).unwrap();
    let result = &log["runs"][0]["results"][0];
    assert_eq!(result["properties"]["action"], "retire");
    assert!(result["properties"]["counterexamples"][0]["case"]["request"].is_object());
    valid(&out.stdout);
}

/// `grants --against`: a profile that gains apply is a finding at its name
/// in the new profiles.json, a role misspelt a warning at its own; exit 2.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_widened_grant_is_sarif_at_the_profile() {
    if skip_unless(
        cvc5_available(),
        "cvc5 (Debian package; .ci/run installs it)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.json");
    std::fs::write(
        &old,
        r#"{"profiles": {"ctl": {"role": "controller", "allowed_operations": ["gitea.read"]}}}"#,
    )
    .unwrap();
    let new = dir.path().join("prod profiles é.json");
    std::fs::write(
        &new,
        "{\"profiles\": {\n  \"ctl\": {\n    \"role\": \"controller\",\n    \
         \"allowed_operations\": [\"gitea.read\", \"gitea.worker_registry.retire\"]\n  },\n  \
         \"rec\": {\"role\": \"reconciller\", \"allowed_operations\": [\"gitea.read\"]}\n}}\n",
    )
    .unwrap();
    let out = run(&[
        "--format",
        "sarif",
        "grants",
        "--profiles",
        new.to_str().unwrap(),
        "--against",
        old.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let found = places(&out.stdout);
    let ctl = line_of(&new, "\"ctl\"");
    let rec = line_of(&new, "\"rec\"");
    assert!(
        found.contains(&(
            "FR1006".into(),
            "prod%20profiles%20%C3%A9.json".into(),
            ctl,
            1
        )),
        "{found:?}"
    );
    assert!(
        found.contains(&(
            "FR1007".into(),
            "prod%20profiles%20%C3%A9.json".into(),
            rec,
            1
        )),
        "{found:?}"
    );
    let log: Value = serde_json::from_slice(&out.stdout).unwrap();
    let levels: Vec<(&str, &str)> = log["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["ruleId"].as_str().unwrap(), r["level"].as_str().unwrap()))
        .collect();
    assert!(levels.contains(&("FR1007", "warning")), "{levels:?}");
    assert!(
        !found.iter().any(|(rule, ..)| rule == "FR1001"),
        "the capability proofs hold"
    );
    valid(&out.stdout);
}
