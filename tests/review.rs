//! Tools for reviewers and operators: explain, grants, export to Cedar's CLI.

mod common;

use common::*;
use fleet_retire::fixture::{collect, load, Case};
use fleet_retire::policy::{Policies, PolicySource};
use serde_json::{json, Value};
use std::path::Path;

fn fixture_dirs() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("fixtures/plan")];
    if root.join("../shared/fixtures/plan").is_dir() {
        dirs.push(root.join("../shared/fixtures/plan"));
    }
    dirs
}

#[test]
fn explain_agrees_with_plan_on_every_fixture_row() {
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let mut checked = 0;
    for file in collect(&fixture_dirs()).unwrap() {
        let Case::Plan(case) = load(&file).unwrap() else {
            continue;
        };
        let plan = case.plan(&policies).unwrap();
        for entry in &plan.entries {
            let e = fleet_retire::explain::explain_entry(&plan, entry, &policies);
            let forbidding: Vec<&Value> = e["policies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["effect"] == "forbid" && p["verdict"] == "satisfied")
                .collect();
            // explain's own reading: retire iff no forbid is satisfied; the
            // primary reason is the lowest-order satisfied forbid.
            let retire = forbidding.is_empty();
            assert_eq!(
                retire,
                entry.is_candidate(),
                "{} row {}",
                file.display(),
                entry.index
            );
            if !retire {
                let lowest = forbidding
                    .iter()
                    .min_by_key(|p| p["order"].as_u64().unwrap())
                    .unwrap();
                assert_eq!(
                    lowest["reason"],
                    entry.reason().code(),
                    "{} row {}",
                    file.display(),
                    entry.index
                );
            }
            assert!(e["policies"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["verdict"] != "errored"));
            checked += 1;
        }
    }
    assert!(checked > 30);
}

#[test]
fn explain_on_the_command_line() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/plan/lease-protects-session.json"
    );
    let out = run(&[
        "--format",
        "json",
        "explain",
        "--worker",
        "w-1",
        "--fixture",
        fixture,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["reason_code"], "protected_active_workflow_owner");
    let lease = v[0]["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy_id"] == "active-lease-owner")
        .unwrap();
    assert_eq!(lease["verdict"], "satisfied");
    // The lease that protects it is named by its id.
    assert_eq!(
        v[0]["protecting_leases"],
        json!([{"lease_id": "l-1", "role": "author", "target": "issue-1",
                "names": ["session_id=sess-w-1"]}])
    );
    // The human form shows the evidence a field a line, values as JSON.
    let out = run(&["explain", "--worker", "w-1", "--fixture", fixture]);
    let human = text(&out);
    assert!(human.contains("  evidence:\n"), "{human}");
    assert!(
        human
            .lines()
            .any(|l| l.trim_start().starts_with("protected_by_active_leases")
                && l.contains("session_id=")),
        "{human}"
    );
    assert!(
        human.contains(
            "lease \"l-1\" (role \"author\", target \"issue-1\") names session_id=sess-w-1"
        ),
        "{human}"
    );
    let out = run(&["explain", "--worker", "nobody", "--fixture", fixture]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("nobody"));
}

#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn grants_against_reports_an_added_retire_grant() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.json");
    let new = dir.path().join("new.json");
    std::fs::write(
        &old,
        json!({"profiles": {
            "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]},
            "author-prgs": {"role": "author", "allowed_operations": ["gitea.read"]}
        }})
        .to_string(),
    )
    .unwrap();
    std::fs::write(&new, json!({"profiles": {
        "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
        "author-prgs": {"role": "author", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}
    }}).to_string()).unwrap();
    let out = run(&[
        "--format",
        "json",
        "grants",
        "--profiles",
        new.to_str().unwrap(),
        "--against",
        old.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a widened grant stops CI as a loosened policy does: {}",
        text(&out)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["changes"],
        json!([{"profile": "controller-prgs", "operation": "apply", "change": "granted"}]),
        "only the controller gains apply; the author's grant changes nothing"
    );
    assert_eq!(v["grants"]["author-prgs"]["apply"], false);
    let out = run(&[
        "grants",
        "--profiles",
        new.to_str().unwrap(),
        "--against",
        old.to_str().unwrap(),
    ]);
    assert!(
        text(&out).contains("+ GRANTS apply for controller-prgs"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("PROVED apply-only-controller-or-reconciler-with-retire [apply]"),
        "{}",
        text(&out)
    );
}

/// Without the solver `grants --against` still shows the table and what
/// changed, marks the proofs as not run, keeps the widening's exit code
/// and ends with a verdict.
#[test]
fn grants_against_without_the_solver_shows_the_changes_and_a_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.json");
    let new = dir.path().join("new.json");
    let profiles = |ops: &[&str]| {
        json!({"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ops}}})
            .to_string()
    };
    std::fs::write(&old, profiles(&["gitea.read"])).unwrap();
    std::fs::write(
        &new,
        profiles(&["gitea.read", "gitea.worker_registry.retire"]),
    )
    .unwrap();
    let grants = |format: &str| {
        bin()
            .args(["--format", format, "grants", "--profiles"])
            .arg(&new)
            .arg("--against")
            .arg(&old)
            .env("PATH", dir.path())
            .output()
            .unwrap()
    };
    let out = grants("human");
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("+ GRANTS apply for controller-prgs"),
        "{said}"
    );
    assert!(
        said.contains("proofs not run:") && said.contains("cvc5"),
        "{said}"
    );
    let last = said.trim_end().lines().last().unwrap();
    assert!(
        last.starts_with("verdict: 1 grant(s) widened") && last.contains("not proved"),
        "{said}"
    );
    let out = grants("json");
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["proofs_not_run"].as_str().unwrap().contains("cvc5"),
        "{v}"
    );
    assert!(v["verdict"].as_str().unwrap().contains("widened"), "{v}");
    assert_eq!(v["changes"][0]["change"], "granted");
}

/// A role or operation mistyped in profiles.json is denied without a word
/// from the policies: grants warns, naming what was probably meant; a
/// revoked grant alone exits 0 under `--against`.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn grants_catches_a_mistyped_role_and_operation() {
    let dir = tempfile::tempdir().unwrap();
    let profiles = dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        json!({"profiles": {
            "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retrie", "gitea.pr.create"]},
            "reconciler-prgs": {"role": "Reconciler", "allowed_operations": ["gitea.read"]},
            "author-prgs": {"role": "author", "allowed_operations": ["gitea.read"]}
        }})
        .to_string(),
    )
    .unwrap();
    let out = run(&[
        "--format",
        "json",
        "grants",
        "--profiles",
        profiles.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let warnings: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("\"gitea.worker_registry.retrie\"")
                && w.contains("did you mean \"gitea.worker_registry.retire\"")),
        "{warnings:?}"
    );
    assert!(
        warnings.iter().any(|w| w.contains("role \"Reconciler\"")
            && w.contains("did you mean \"reconciler\"")),
        "{warnings:?}"
    );
    // Another tool's operation and a fleet role are nobody's typo.
    assert!(!warnings
        .iter()
        .any(|w| w.contains("gitea.pr.create") || w.contains("\"author\"")));
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let old = dir.path().join("old.json");
    std::fs::write(
        &old,
        json!({"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}})
            .to_string(),
    )
    .unwrap();
    let out = run(&[
        "grants",
        "--profiles",
        profiles.to_str().unwrap(),
        "--against",
        old.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "only revoked: {}", text(&out));
}

/// The statements an operator relies on are proved over the capability
/// policies in use: a capabilities.cedar that lets any role apply fails
/// the proof, with the counterexample, whatever profiles.json says.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn grants_against_proves_only_controllers_and_reconcilers_can_apply() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    for f in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
    ] {
        std::fs::copy(root.join("policies").join(f), policies.join(f)).unwrap();
    }
    let caps = policies.join("capabilities.cedar");
    let text_before = std::fs::read_to_string(&caps).unwrap();
    let weakened = text_before.replacen(
        "  principal.allowed_operations.contains(\"gitea.worker_registry.retire\") &&\n  [\"controller\", \"reconciler\"].contains(principal.role)",
        "  principal.allowed_operations.contains(\"gitea.worker_registry.retire\")",
        1,
    );
    assert_ne!(weakened, text_before);
    std::fs::write(&caps, weakened).unwrap();
    let profiles = dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        json!({"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]}}})
            .to_string(),
    )
    .unwrap();
    let out = run(&[
        "--policies",
        policies.to_str().unwrap(),
        "--format",
        "json",
        "grants",
        "--profiles",
        profiles.to_str().unwrap(),
        "--against",
        profiles.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed: Vec<&Value> = v["proofs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["holds"] == false)
        .collect();
    assert!(
        failed.iter().any(
            |p| p["id"] == "apply-only-controller-or-reconciler-with-retire"
                && p["counterexample"].as_str().unwrap().contains("role")
        ),
        "{failed:?}"
    );
    // The same proof fails in policy verify.
    let out = run(&["--policies", policies.to_str().unwrap(), "policy", "verify"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out).contains("FAILED apply-only-controller-or-reconciler-with-retire"));
}

/// A profile written twice reads one way to a person and another to a
/// parser: grants (and everything else) refuses the file, naming the key.
#[test]
fn grants_flags_a_duplicated_profile() {
    let dir = tempfile::tempdir().unwrap();
    let profiles = dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        r#"{"profiles": {
  "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]},
  "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}
}}"#,
    )
    .unwrap();
    let out = run(&["grants", "--profiles", profiles.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out);
    assert!(
        said.contains("duplicate key \"controller-prgs\" at $.profiles.controller-prgs")
            && said.contains("line 3"),
        "{said}"
    );
    assert!(
        !said.contains("PROFILE"),
        "no table for a file the program refuses: {said}"
    );
}

#[test]
fn exported_fixtures_pass_with_cedars_own_cli() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(&[
        "test",
        root.join("fixtures/plan").to_str().unwrap(),
        root.join("fixtures/capabilities").to_str().unwrap(),
        "--export-cedar",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".tests.json"))
        .collect();
    assert!(files.len() > 30);
    let cedar = std::process::Command::new("cedar")
        .arg("--version")
        .output();
    if !cedar.is_ok_and(|o| o.status.success()) {
        // CI installs it: there a missing CLI must not pass as a skip.
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "the cedar CLI is required under CI=true; .ci/run installs it"
        );
        eprintln!("skipped: the cedar CLI is not installed (cargo install cedar-policy-cli)");
        return;
    }
    for f in files {
        let out = std::process::Command::new("cedar")
            .current_dir(dir.path())
            .args([
                "run-tests",
                "--policies",
                "policies.cedar",
                "--schema",
                "schema.cedarschema",
                "--tests",
            ])
            .arg(f.file_name().unwrap())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {}", f.display(), text(&out));
    }
}

/// A malformed fixture is refused with its file and the member at fault, and
/// exit 1: a typo in `expect` must never pass as "not checked".
#[test]
fn a_malformed_fixture_names_its_file_and_member() {
    let dir = tempfile::tempdir().unwrap();
    let base = json!({
        "name": "x", "now": "2026-07-30T12:00:00Z",
        "context": {"host_id": "h", "boot_id": "b", "canonical_repository": "prgs/gitea-tools"},
        "processes": {}, "rows": [], "leases": [], "expect": {}
    });
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "typo.json",
            json!({"expect": {"candidate": []}}),
            "in `expect`: unknown field `candidate`",
        ),
        (
            "wrong.json",
            json!({"expect": {"preserved": {"w-1": 7}}}),
            "field `expect.preserved.w-1` must be a string",
        ),
        (
            "code.json",
            json!({"expect": {"preserved": {"w-1": "pid_is_dead"}}}),
            "field `expect.preserved.w-1`: \"pid_is_dead\" is not a known reason code",
        ),
        (
            "alive.json",
            json!({"processes": {"17": {"start_time": "t"}}}),
            "field `processes.17.alive`: required",
        ),
        (
            "class.json",
            json!({"leases": null, "expect": null, "snapshot": {"expect": {"active_blockers": ["pid_colision"]}}}),
            "\"pid_colision\" is not a finding class",
        ),
    ];
    for (file, patch, want) in cases {
        let mut doc = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            doc[k] = v.clone();
        }
        let path = dir.path().join(file);
        std::fs::write(&path, doc.to_string()).unwrap();
        let out = run(&["test", path.to_str().unwrap()]);
        // Reported among the run's results (`ERROR file` and what is wrong).
        let err = text(&out);
        assert_eq!(out.status.code(), Some(1), "{file}: {err}");
        assert!(err.contains(path.to_str().unwrap()), "{file}: {err}");
        assert!(err.contains(want), "{file}: want {want:?} in {err}");
    }
}

/// `test --coverage` against what the fixtures say by hand: per case, the
/// forbids it reports deciding carry exactly the primary reason codes the
/// case expects of its preserved rows, and the retire permit decides
/// exactly the cases that expect a candidate.
#[test]
fn coverage_of_our_fixtures_matches_what_they_expect() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = bin()
        .current_dir(root)
        .args([
            "--format",
            "json",
            "test",
            "fixtures/plan",
            "fixtures/capabilities",
            "--coverage",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let policies = report["coverage"]["policies"].as_array().unwrap();
    let mut want: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for file in collect(&[root.join("fixtures/plan")]).unwrap() {
        let Case::Plan(case) = load(&file).unwrap() else {
            continue;
        };
        let label = format!(
            "{} ({})",
            case.name,
            file.strip_prefix(root).unwrap().display()
        );
        let codes = want.entry(label).or_default();
        codes.extend(
            case.expect
                .preserved
                .iter()
                .flatten()
                .map(|(_, c)| c.clone()),
        );
        if case
            .expect
            .candidates
            .as_ref()
            .is_some_and(|c| !c.is_empty())
        {
            codes.insert("candidate".into());
        }
    }
    let mut got: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = want
        .keys()
        .map(|k| (k.clone(), Default::default()))
        .collect();
    for p in policies {
        let code = if p["id"] == "retire-when-nothing-forbids" {
            "candidate".to_string()
        } else if p["file"] == "retirement.cedar" && p["effect"] == "forbid" {
            p["reason"].as_str().unwrap().to_string()
        } else {
            continue;
        };
        for case in p["decided"].as_array().unwrap() {
            if let Some(codes) = got.get_mut(case.as_str().unwrap()) {
                codes.insert(code.clone());
            }
        }
    }
    assert_eq!(got, want);
    // Capability cases: the malformed-entry forbid decides the malformed case.
    let malformed = policies
        .iter()
        .find(|p| p["id"] == "unknown-or-malformed-profile")
        .unwrap();
    assert!(malformed["decided"][0]
        .as_str()
        .unwrap()
        .contains("malformed-entries.json"));
}

/// With the solver: our fixtures reach 100 %, the forbids that never
/// decide are exactly the ones proved never to, and --min-coverage fails a
/// run that falls short.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn our_fixtures_reach_full_coverage_and_min_coverage_gates() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = |paths: &[&str], min: &str| {
        bin()
            .current_dir(root)
            .args(["--format", "json", "test"])
            .args(paths)
            .args(["--coverage", "--min-coverage", min])
            .output()
            .unwrap()
    };
    let out = run(&["fixtures/plan", "fixtures/capabilities"], "100");
    assert!(out.status.success(), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["coverage"]["forbids_deciding_percent"], 100.0);
    for p in report["coverage"]["policies"].as_array().unwrap() {
        if p["effect"] != "forbid" {
            continue;
        }
        let decides = !p["decided"].as_array().unwrap().is_empty();
        assert_eq!(
            p["never_primary"] == true,
            !decides,
            "a forbid that never decides must be proved never to, and only such: {p}"
        );
    }
    // One fixture alone covers little: the gate fails with exit 1.
    let out = run(&["fixtures/plan/pid-alive.json"], "90");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("below --min-coverage 90"),
        "{}",
        text(&out)
    );
}

/// `fixture capture` with the stores' registry, leases and profile; the
/// selection comes after.
fn capture_args(stores: &Stores) -> Vec<String> {
    let mut args: Vec<String> = ["fixture", "capture"].map(String::from).to_vec();
    args.extend(stores.plan_args("controller-prgs").into_iter().skip(1));
    args
}

/// A copy of the built-in policy folder without the policy `id`.
fn policies_without(id: &str) -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
    ] {
        std::fs::copy(root.join("policies").join(f), dir.path().join(f)).unwrap();
    }
    let path = dir.path().join("retirement.cedar");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find(&format!("@id(\"{id}\")")).unwrap();
    let end = start + text[start..].find("\n};\n").unwrap() + 4;
    std::fs::write(&path, format!("{}{}", &text[..start], &text[end..])).unwrap();
    dir
}

/// A live worker and a dead one sharing a session, a leased dead row, and a
/// row of another instance; one lease names the leased row. The sleeper,
/// the stores, and the live and dead processes' pid (and the live start).
fn captured_fleet() -> (KillOnDrop, Stores, i64, String, i64) {
    let sleeper = KillOnDrop(spawn_sleeper());
    let live_pid = sleeper.id() as i64;
    let live_start = start_time(sleeper.id());
    let now = fleet_retire::time::format_ts(fleet_retire::time::now());
    let mut live = stale_row("w-live", live_pid, &live_start);
    live["session_id"] = json!("sess-shared");
    live["last_heartbeat_at"] = json!(now);
    live["token_fingerprint"] = json!("tok-SECRET-live");
    let (dead_pid, dead_start) = dead_process();
    let mut dead = stale_row("w-dead", dead_pid, &dead_start);
    dead["session_id"] = json!("sess-shared");
    dead["token_fingerprint"] = json!("tok-SECRET-dead");
    let mut leased = stale_row("w-leased", dead_pid, &dead_start);
    leased["pid"] = json!(dead_pid + 100_000);
    leased["remote"] = json!("https://bot:hunter2@git.example/prgs");
    let mut unrelated = stale_row("w-unrelated", dead_pid + 200_000, &dead_start);
    unrelated["client_instance_id"] = json!("inst-codex-20260730T100000Z-0000000000ff");
    let stores = Stores::new(&[live, dead, leased, unrelated]);
    std::fs::remove_file(&stores.leases).unwrap();
    leases(
        &stores.leases,
        &[
            json!({"lease_id": "l-1", "role": "author", "target": "pr-1", "status": "active",
                   "owner_worker_identity": "w-leased"}),
            json!({"lease_id": "l-2", "role": "author", "target": "pr-2", "status": "active",
                   "owner_worker_identity": "w-elsewhere"}),
        ],
    );
    (sleeper, stores, live_pid, live_start, dead_pid)
}

/// The acceptance of `fixture capture`: a real registry with real
/// processes (a live worker and dead ones) and a real lease store. The
/// captured case holds the rows that bear on the chosen ones, the probe
/// answers and the lease, hides the secrets, passes at once, and fails once
/// the deciding policy is deleted.
#[test]
fn a_captured_case_passes_and_fails_once_its_deciding_policy_is_gone() {
    let (sleeper, stores, live_pid, live_start, dead_pid) = captured_fleet();
    let out_path = stores.dir.path().join("captured.json");
    let out = bin()
        .args(capture_args(&stores))
        .args([
            "--worker",
            "w-dead",
            "--worker",
            "w-leased",
            "--out",
            out_path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("replaced"), "{}", text(&out));
    let written = std::fs::read_to_string(&out_path).unwrap();
    assert!(
        !written.contains("SECRET") && !written.contains("hunter2"),
        "{written}"
    );
    let case: Value = serde_json::from_str(&written).unwrap();
    let ids: Vec<&str> = case["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["worker_identity"].as_str().unwrap())
        .collect();
    // The session peer comes along (and the slot's other claimants); the
    // row of another instance does not.
    assert_eq!(ids, ["w-live", "w-dead", "w-leased"]);
    assert_eq!(case["leases"].as_array().unwrap().len(), 1);
    assert_eq!(case["leases"][0]["lease_id"], "l-1");
    assert_eq!(
        case["processes"][live_pid.to_string()],
        json!({"alive": true, "start_time": live_start})
    );
    assert_eq!(case["processes"][dead_pid.to_string()]["alive"], false);
    assert_eq!(
        case["expect"]["preserved"]["w-dead"],
        "conflicting_identity_evidence"
    );
    assert_eq!(
        case["expect"]["preserved"]["w-leased"],
        "protected_active_workflow_owner"
    );
    assert_eq!(case["expect"]["preserved"]["w-live"], "worker_live");

    // Passes at once, even after the sleeper is gone: the probes are given.
    drop(sleeper);
    let pass = bin().arg("test").arg(&out_path).output().unwrap();
    assert!(pass.status.success(), "{}", text(&pass));
    // Without the deciding policy the dead row would be retired.
    let without = policies_without("identity-evidence-shared");
    let fail = bin()
        .arg("--policies")
        .arg(without.path())
        .arg("test")
        .arg(&out_path)
        .output()
        .unwrap();
    assert_eq!(fail.status.code(), Some(1), "{}", text(&fail));
    assert!(
        text(&fail).contains("\"w-dead\": want conflicting_identity_evidence"),
        "{}",
        text(&fail)
    );

    // A selection that matches nothing is an error that says so.
    let none = bin()
        .args(capture_args(&stores))
        .args(["--worker", "w-nobody"])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(1));
    assert!(text(&none).contains("no row of"), "{}", text(&none));
}

/// `explain --format json` gives the retire request exactly as evaluated;
/// Cedar's own CLI, given those entities, that request and the policy
/// files, decides every row of every plan fixture as the plan did.
#[test]
fn explained_requests_replay_with_cedars_own_cli() {
    if skip_unless(
        std::process::Command::new("cedar")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "the cedar CLI (cargo install cedar-policy-cli)",
    ) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies.cedar");
    let texts: Vec<String> = ["retirement.cedar", "capabilities.cedar"]
        .iter()
        .map(|f| std::fs::read_to_string(root.join("policies").join(f)).unwrap())
        .collect();
    std::fs::write(&policies, texts.join("\n")).unwrap();
    let (mut allowed, mut denied) = (0, 0);
    for file in collect(&[root.join("fixtures/plan")]).unwrap() {
        let case: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let mut ids: Vec<&str> = case["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["worker_identity"].as_str())
            .filter(|id| !id.trim().is_empty())
            .collect();
        ids.dedup();
        for id in ids {
            let out = run(&[
                "--format",
                "json",
                "explain",
                "--worker",
                id,
                "--fixture",
                file.to_str().unwrap(),
            ]);
            assert!(out.status.success(), "{}: {}", file.display(), text(&out));
            let entries: Value = serde_json::from_slice(&out.stdout).unwrap();
            for e in entries.as_array().unwrap() {
                let c = &e["cedar_request"];
                let want = if e["decision"] == "retire" {
                    "allow"
                } else {
                    "deny"
                };
                assert_eq!(c["decision"], want, "{} {id}", file.display());
                let entities = dir.path().join("entities.json");
                let request = dir.path().join("request.json");
                std::fs::write(&entities, c["entities"].to_string()).unwrap();
                let keys = ["principal", "action", "resource", "context"];
                let req: serde_json::Map<String, Value> = keys
                    .iter()
                    .map(|k| (k.to_string(), c[*k].clone()))
                    .collect();
                std::fs::write(&request, Value::Object(req).to_string()).unwrap();
                let cli = std::process::Command::new("cedar")
                    .arg("authorize")
                    .arg("--policies")
                    .arg(&policies)
                    .arg("--schema")
                    .arg(root.join("policies/schema.cedarschema"))
                    .arg("--entities")
                    .arg(&entities)
                    .arg("--request-json")
                    .arg(&request)
                    .output()
                    .unwrap();
                let said = String::from_utf8_lossy(&cli.stdout).trim().to_lowercase();
                assert_eq!(said, want, "{} {id}: {}", file.display(), text(&cli));
                if want == "allow" {
                    allowed += 1;
                } else {
                    denied += 1;
                }
            }
        }
    }
    assert!(
        allowed > 3 && denied > 30,
        "{allowed} allowed, {denied} denied"
    );
}

/// `explain` reads the repository binding from the same variable as plan
/// and apply, so the operator guide's setup works for it too.
#[test]
fn explain_reads_the_canonical_repository_variable() {
    let (stores, live) = fleet();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .args([
            "explain",
            "--worker",
            "w-dead-1",
            "--registry",
            stores.registry.to_str().unwrap(),
            "--leases",
            stores.leases.to_str().unwrap(),
            "--profiles",
            stores.profiles.to_str().unwrap(),
            "--profile",
            "controller-prgs",
        ])
        .env("FLEET_RETIRE_CANONICAL_REPOSITORY", "prgs/gitea-tools")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("retire"), "{}", text(&out));
    drop(live);
}
