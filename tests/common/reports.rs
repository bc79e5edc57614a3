//! The sign-off reports' validators, and the policy folders the sign-off
//! tests judge: the built-in set copied, with or without its properties,
//! and weakened.

use super::{skip_unless, text};
use serde_json::Value;

/// A SARIF log validated by Microsoft's SARIF multitool
/// (`tests/validators`): the validator's own findings, except SARIF2005
/// (the tool has no public information URI to give).
pub fn sarif_problems(log: &[u8]) -> Option<Vec<String>> {
    let tool = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/validators/node_modules/.bin/sarif-multitool");
    if skip_unless(
        tool.is_file(),
        "the SARIF multitool (cd tests/validators && npm ci)",
    ) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.sarif"), dir.path().join("out.sarif"));
    std::fs::write(&input, log).unwrap();
    let ran = std::process::Command::new(&tool)
        .arg("validate")
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .unwrap();
    assert!(ran.status.success(), "{}", text(&ran));
    let checked: Value = serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap();
    Some(
        checked["runs"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["results"].as_array().cloned().unwrap_or_default())
            .filter(|r| r["ruleId"] != "SARIF2005")
            .map(|r| r.to_string())
            .collect(),
    )
}

/// A copy of the built-in policy folder, with or without its properties
/// (without: an empty `properties/`, so the folder is judged by none).
pub fn policy_folder(with_properties: bool) -> tempfile::TempDir {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("properties")).unwrap();
    let mut files = vec![
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
    ];
    if with_properties {
        files.extend([
            "properties/retirement.cedar",
            "properties/capabilities.cedar",
        ]);
    }
    for f in files {
        std::fs::copy(source.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// The built-in folder, properties included, with its pid-alive forbid
/// (its block of retirement.cedar) deleted: a weakening the properties
/// about pids catch.
pub fn without_pid_alive() -> tempfile::TempDir {
    let dir = policy_folder(true);
    let path = dir.path().join("retirement.cedar");
    let policy_text = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = policy_text
        .split("\n\n")
        .filter(|b| !b.contains("@id(\"pid-alive\")"))
        .collect();
    assert_eq!(
        kept.len() + 1,
        policy_text.split("\n\n").count(),
        "pid-alive removed"
    );
    std::fs::write(&path, kept.join("\n\n")).unwrap();
    dir
}

/// `policy mutate --format mutation-report`, validated against the schema
/// its package ships (`tests/validators/mutation_report.mjs`); a report the
/// schema refuses is refused, so the check can fail.
pub fn mutation_report_valid(report: &[u8]) -> Option<bool> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/validators");
    let installed = dir
        .join("node_modules/mutation-testing-report-schema")
        .is_dir();
    if skip_unless(
        installed,
        "the mutation-testing report schema (cd tests/validators && npm ci)",
    ) {
        return None;
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), report).unwrap();
    let out = std::process::Command::new("node")
        .arg(dir.join("mutation_report.mjs"))
        .arg(file.path())
        .output()
        .unwrap();
    Some(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("valid"))
}
