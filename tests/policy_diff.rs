//! `policy diff` on real policy folders: a loosened forbid, a tightened
//! one, a reordering, a first-stage change in the dangerous direction, and
//! a git revision; each counterexample saved as a fixture and run.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A copy of the built-in policies with `edit` applied to retirement.cedar.
fn edited(edit: impl Fn(&str) -> String) -> tempfile::TempDir {
    edited_file("retirement.cedar", edit)
}

/// A copy of the built-in policies with `edit` applied to `file`.
fn edited_file(file: &str, edit: impl Fn(&str) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
    ] {
        std::fs::copy(root().join("policies").join(f), dir.path().join(f)).unwrap();
    }
    let path = dir.path().join(file);
    let before = std::fs::read_to_string(&path).unwrap();
    let after = edit(&before);
    assert_ne!(before, after, "the edit changed nothing");
    std::fs::write(&path, after).unwrap();
    dir
}

/// `policy diff OLD NEW --format json` (plus `extra`): exit code and report.
fn diff(old: &str, new: &Path, extra: &[&str]) -> (i32, Value) {
    let out = bin()
        .current_dir(root())
        .args(["--format", "json", "policy", "diff", old])
        .arg(new)
        .args(extra)
        .output()
        .unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    (out.status.code().unwrap(), report)
}

fn change_of<'a>(report: &'a Value, action: &str) -> &'a Value {
    report["proved"]["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["action"] == action)
        .unwrap_or_else(|| panic!("no {action} in {report}"))
}

const DEFAULT_TTL: &str = "       900000000)))";

#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_loosened_forbid_is_loosened_with_a_counterexample_that_new_retires_and_old_keeps() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    // The 900-second default TTL shortened to 600: rows between 600 and 900
    // seconds stale become retirable.
    let new = edited(|t| t.replace(DEFAULT_TTL, "       600000000)))"));
    let saved = tempfile::tempdir().unwrap();
    let (code, report) = diff(
        "policies",
        new.path(),
        &[
            "--fixtures",
            "fixtures/plan",
            "--save-counterexamples",
            saved.path().to_str().unwrap(),
        ],
    );
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["overall"], "loosened");
    let retire = change_of(&report, "retire");
    assert_eq!(retire["change"], "loosened", "{retire}");
    for action in [
        "hold_session_id",
        "hold_pid",
        "claim_instance_slot",
        "occupy_instance_slot",
        "apply",
    ] {
        assert_eq!(change_of(&report, action)["change"], "equivalent");
    }
    let notes = report["proved"]["policies"].as_array().unwrap();
    assert!(notes
        .iter()
        .any(|p| p["id"] == "heartbeat-not-expired" && p["status"] == "changed"));
    // Observed on our fixtures: only candidates gained, from heartbeat_not_expired.
    let observed = report["observed"].as_array().unwrap();
    assert!(!observed.is_empty());
    assert!(observed.iter().all(|o| o["old"] == "heartbeat_not_expired"
        && o["new"] == "candidate"
        && o["loosens"] == true));

    // The counterexample, saved: OLD keeps the row (PASS), NEW retires it.
    let case = saved.path().join("retire-loosening-0.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&case).unwrap()).unwrap();
    assert_eq!(doc["expect"]["decision"], "deny");
    let worker = doc["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["uid"]["type"] == "FleetRetire::Worker")
        .unwrap();
    let age = worker["attrs"]["heartbeat_age_us"].as_i64().unwrap();
    assert!(
        (600_000_001..=900_000_000).contains(&age),
        "the counterexample's heartbeat age {age} µs is not in the loosened band"
    );
    plausible(&doc, &retire["counterexamples"][0]);
    let old = bin().arg("test").arg(&case).output().unwrap();
    assert!(old.status.success(), "{}", text(&old));
    let with_new = bin()
        .arg("--policies")
        .arg(new.path())
        .arg("test")
        .arg(&case)
        .output()
        .unwrap();
    assert_eq!(with_new.status.code(), Some(1), "{}", text(&with_new));
    assert!(text(&with_new).contains("decision: want deny, got allow"));
}

/// A counterexample as a person reads it: a realistic row (the run and
/// the worker named as a plan names them, on this host and boot, every
/// count at least 0, no Long at its limit) that differs from the realistic
/// row only in its few deciding attributes, said in one sentence.
fn plausible(case: &Value, found: &Value) {
    let sentence = found["sentence"].as_str().unwrap();
    assert!(
        sentence.starts_with("a worker ") && sentence.ends_with("by NEW and kept by OLD"),
        "{sentence}"
    );
    let deciding: Vec<&str> = found["deciding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(!deciding.is_empty() && deciding.len() <= 2, "{deciding:?}");
    assert_eq!(case["request"]["principal"]["id"], "current");
    assert_eq!(case["request"]["resource"]["id"], "row-0");
    let entity = |kind: &str| {
        case["entities"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["uid"]["type"] == format!("FleetRetire::{kind}"))
            .unwrap()["attrs"]
            .clone()
    };
    let (run, worker) = (entity("Run"), entity("Worker"));
    for (kind, attrs) in [("Run", &run), ("Worker", &worker)] {
        let realistic = fleet_retire::counterexample::base::realistic(kind)
            .unwrap()
            .1;
        for (attr, value) in attrs.as_object().unwrap() {
            let named = format!("{kind}.{attr}");
            // Set to agree with a deciding attribute (a TTL of sign 0 is 0 µs).
            let implied = ["ttl_us", "ttl_sign", "heartbeat_age_us", "live_start_time"];
            if !deciding.contains(&named.as_str()) && !implied.contains(&attr.as_str()) {
                assert_eq!(
                    value, &realistic[attr],
                    "{named} is not the realistic row's"
                );
            }
            if let Some(n) = value.as_i64() {
                assert!((0..i64::MAX / 2).contains(&n), "{named} is {n}");
            }
        }
    }
    assert_eq!(run["boot_id"], worker["boot_id"]);
    assert_eq!(run["host_id"], worker["host_id"]);
    assert!(case["description"]
        .as_str()
        .unwrap()
        .contains(&sentence[2..]));
}

/// The realistic row counterexamples start from is one the built-in set
/// retires, and its operator one it lets do everything: as fixture cases,
/// they pass.
#[test]
fn the_realistic_row_is_retired_and_its_operator_allowed() {
    let realistic = |kind: &str| {
        let (id, attrs) = fleet_retire::counterexample::base::realistic(kind).unwrap();
        serde_json::json!({"uid": {"type": format!("FleetRetire::{kind}"), "id": id},
                           "attrs": attrs, "parents": []})
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cases = vec![("retire", "Run", "Worker")];
    for op in ["snapshot", "plan", "apply"] {
        cases.push((op, "Operator", "Registry"));
    }
    for (action, principal, resource) in cases {
        let (p, r) = (realistic(principal), realistic(resource));
        let case = serde_json::json!({
            "name": format!("the realistic {resource}: {action}"),
            "request": {"principal": p["uid"], "resource": r["uid"],
                        "action": {"type": "FleetRetire::Action", "id": action}},
            "entities": [p, r],
            "expect": {"decision": "allow"},
        });
        let file = dir.path().join(format!("{action}.json"));
        std::fs::write(&file, case.to_string()).unwrap();
    }
    let out = bin().arg("test").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("4 passed"), "{}", text(&out));
}

#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_tightened_forbid_is_tightened_and_exits_zero() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let new = edited(|t| t.replace(DEFAULT_TTL, "       1200000000)))"));
    let (code, report) = diff("policies", new.path(), &["--fixtures", "fixtures/plan"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["overall"], "tightened");
    let retire = change_of(&report, "retire");
    assert_eq!(retire["change"], "tightened");
    assert_eq!(retire["allows_more"], false);
    let cex = &retire["counterexamples"][0];
    assert_eq!(cex["direction"], "tightening");
    assert_eq!(cex["case"]["expect"]["decision"], "allow");
}

#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_reordering_is_equivalent() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    // Move the heartbeat forbid's block to the end of the file.
    let new = edited(|t| {
        let start = t.find("@id(\"heartbeat-not-expired\")").unwrap();
        let end = start + t[start..].find("\n};\n").unwrap() + 4;
        format!("{}{}\n{}", &t[..start], &t[end..], &t[start..end])
    });
    let (code, report) = diff("policies", new.path(), &["--fixtures", "fixtures/plan"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["overall"], "equivalent");
    for a in report["proved"]["actions"].as_array().unwrap() {
        assert_eq!(a["change"], "equivalent", "{a}");
        assert!(a["counterexamples"].as_array().unwrap().is_empty());
    }
    assert!(report["observed"].as_array().unwrap().is_empty());
    assert!(report["proved"]["policies"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["status"] == "unchanged"));
}

/// For a first-stage action the dangerous direction is the other one: a
/// row that no longer counts as holding its identity evidence stops
/// protecting the rows that share it.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn fewer_rows_holding_identity_evidence_is_a_loosening() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    // An active row whose pid cannot be probed no longer holds its evidence.
    let new = edited(|t| {
        t.replacen(
            "   resource.pid_probe == \"unknown\" ||\n   !resource.heartbeat_parsed)\n};",
            "   !resource.heartbeat_parsed)\n};",
            1,
        )
    });
    let (code, report) = diff("policies", new.path(), &["--fixtures", "fixtures/plan"]);
    let hold = change_of(&report, "hold_session_id");
    assert_eq!(hold["allows_more"], false, "{hold}");
    assert_eq!(hold["allows_fewer"], true, "{hold}");
    assert_eq!(hold["change"], "loosened");
    assert_eq!(hold["counterexamples"][0]["direction"], "loosening");
    assert_eq!(change_of(&report, "retire")["change"], "equivalent");
    assert_eq!(report["overall"], "loosened");
    assert_eq!(code, 2);
    // Our fixture of a pid shared with an unprobeable worker shows it.
    assert!(
        report["observed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["loosens"] == true && o["new"] == "candidate"),
        "{}",
        report["observed"]
    );
}

#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_git_revision_reads_its_policies_folder() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    if !root().join(".git").exists() {
        eprintln!("skipped: not a git checkout");
        return;
    }
    let (code, report) = diff("HEAD", Path::new("HEAD:policies"), &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["overall"], "equivalent");
    assert_eq!(report["proved"]["old"], "git HEAD:policies");
    let out = bin()
        .current_dir(root())
        .args(["policy", "diff", "no-such-revision-xyz", "policies"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("neither a policy folder nor a git revision"),
        "{}",
        text(&out)
    );
}

/// The registry flags: one reading of a real registry, real probes, judged
/// under both sets.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_registry_shows_the_rows_whose_verdict_moves() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let (pid, start) = dead_process();
    let now = fleet_retire::time::now();
    let stamp = |ago_s: i64| fleet_retire::time::format_ts(now - ago_s * 1_000_000);
    // A TTL that is not a number falls back to the default, 900 s; 700 s
    // without a heartbeat is fresh under OLD and stale under NEW's 600 s.
    let mut between = stale_row("w-between", pid, &start);
    between["heartbeat_ttl_seconds"] = "abc".into();
    between["last_heartbeat_at"] = stamp(700).into();
    let stores = Stores::new(&[between]);
    let new = edited(|t| t.replace(DEFAULT_TTL, "       600000000)))"));
    let (code, report) = diff(
        "policies",
        new.path(),
        &[
            "--registry",
            stores.registry.to_str().unwrap(),
            "--leases",
            stores.leases.to_str().unwrap(),
            "--canonical-repository",
            "prgs/gitea-tools",
        ],
    );
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["registry_rows"], 1);
    let observed = report["observed"].as_array().unwrap();
    assert_eq!(observed.len(), 1, "{report}");
    assert_eq!(observed[0]["subject"], "w-between");
    assert_eq!(observed[0]["old"], "heartbeat_not_expired");
    assert_eq!(observed[0]["new"], "candidate");
}

/// A capability change: apply without the role check lets any role with
/// the permission apply. The counterexample is an operator NEW grants and
/// OLD refuses, and it runs as a fixture case.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_loosened_capability_names_the_operator_new_grants() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let dir = edited_file("capabilities.cedar", |t| {
        t.replacen(
            "  principal.allowed_operations.contains(\"gitea.worker_registry.retire\") &&\n  [\"controller\", \"reconciler\"].contains(principal.role)",
            "  principal.allowed_operations.contains(\"gitea.worker_registry.retire\")",
            1,
        )
    });
    let saved = tempfile::tempdir().unwrap();
    let (code, report) = diff(
        "policies",
        dir.path(),
        &[
            "--fixtures",
            "fixtures/capabilities",
            "--save-counterexamples",
            saved.path().to_str().unwrap(),
        ],
    );
    assert_eq!(code, 2, "{report}");
    let apply = change_of(&report, "apply");
    assert_eq!(apply["change"], "loosened");
    for action in ["retire", "snapshot", "plan"] {
        assert_eq!(change_of(&report, action)["change"], "equivalent");
    }
    let case = &apply["counterexamples"][0]["case"];
    let operator = case["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["uid"]["type"] == "FleetRetire::Operator")
        .unwrap();
    let role = operator["attrs"]["role"].as_str().unwrap();
    assert!(
        role != "controller" && role != "reconciler",
        "the operator NEW grants holds another role: {operator}"
    );
    // A role profiles.json holds, not one the solver made up; the rest of
    // the operator as a controller's.
    assert_eq!(role, "author", "{operator}");
    assert_eq!(
        apply["counterexamples"][0]["deciding"],
        serde_json::json!(["Operator.role"])
    );
    assert_eq!(
        operator["attrs"]["allowed_operations"],
        serde_json::json!(["gitea.read", "gitea.worker_registry.retire"])
    );
    // The fixtures show it too: some author or similar gains apply.
    assert!(report["observed"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["new"] == "allow" && o["loosens"] == true));
    let file = saved.path().join("apply-loosening-0.json");
    let old = bin().arg("test").arg(&file).output().unwrap();
    assert!(old.status.success(), "{}", text(&old));
    let new = bin()
        .arg("--policies")
        .arg(dir.path())
        .arg("test")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(new.status.code(), Some(1), "{}", text(&new));
}
