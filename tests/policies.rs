//! The policies are the decision: deleting one must be visible, the fast
//! evaluation path must agree with Cedar's own authorizer, and every reason
//! code must be exercised by a fixture of ours.

use fleet_retire::evidence::leases::Protections;
use fleet_retire::fixture::{collect, load, Case, PlanCase};
use fleet_retire::observe::{observe_all, RunFacts};
use fleet_retire::policy::entities::{
    retire_action, run_entity, run_uid, worker_entity, worker_uid, Attr,
};
use fleet_retire::policy::eval::judge;
use fleet_retire::policy::memo::Abstraction;
use fleet_retire::policy::{Policies, PolicySource, POLICY_FILES, SCHEMA_FILE};
use fleet_retire::reasons::{Reason, ALL};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn policy_texts() -> Vec<(String, String)> {
    std::iter::once(SCHEMA_FILE)
        .chain(POLICY_FILES.iter().copied())
        .map(|f| {
            (
                f.to_string(),
                std::fs::read_to_string(root().join("policies").join(f)).unwrap(),
            )
        })
        .collect()
}

/// The policy set with the given eligibility policies removed.
fn without(ids: &[&str]) -> Policies {
    let texts: Vec<(String, String)> = policy_texts()
        .into_iter()
        .map(|(name, text)| {
            if name != "retirement.cedar" {
                return (name, text);
            }
            let kept: Vec<&str> = text
                .split("\n\n")
                .filter(|block| {
                    !ids.iter()
                        .any(|id| block.contains(&format!("@id(\"{id}\")")))
                })
                .collect();
            (name, kept.join("\n\n"))
        })
        .collect();
    let p = Policies::from_texts(&texts, "test".into())
        .expect("policies without some forbids still load");
    for id in ids {
        assert!(
            !p.rules.keys().any(|k| k.to_string() == *id),
            "policy {id} should have been removed"
        );
    }
    p
}

fn cases() -> Vec<(PathBuf, PlanCase)> {
    let mut dirs = vec![root().join("fixtures/plan")];
    let shared = root().join("../shared/fixtures/plan");
    if shared.is_dir() {
        dirs.push(shared);
    }
    collect(&dirs)
        .unwrap()
        .into_iter()
        .filter_map(|f| match load(&f).unwrap() {
            Case::Plan(c) => Some((f, *c)),
            Case::Capability(_) | Case::Snapshot(_) | Case::Entity(_) => None,
        })
        .collect()
}

fn our_cases() -> Vec<(PathBuf, PlanCase)> {
    cases()
        .into_iter()
        .filter(|(f, _)| f.starts_with(root().join("fixtures")))
        .collect()
}

fn failing_cases(policies: &Policies, cases: &[(PathBuf, PlanCase)]) -> Vec<String> {
    cases
        .iter()
        .filter(|(_, c)| !c.differences(&c.plan(policies).unwrap()).is_empty())
        .map(|(f, _)| f.display().to_string())
        .collect()
}

fn eligibility_forbids(p: &Policies) -> Vec<(String, Reason)> {
    p.ordered_rules()
        .into_iter()
        .filter_map(|r| r.reason.map(|reason| (r.id.clone(), reason)))
        .collect()
}

/// Policies whose every firing is accompanied by an earlier one with the
/// same code (docs/semantics.md, pitfall 5): removing them cannot change a verdict, only
/// the list of determining policies.
const SHADOWED: &[&str] = &[
    "proof-same-boot-pid-reused",
    "proof-same-boot-pid-alive",
    "ownership-not-stale",
];

#[test]
fn our_fixtures_pass_with_the_real_policies() {
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    assert_eq!(failing_cases(&p, &cases()), Vec::<String>::new());
}

#[test]
fn every_reason_code_has_a_fixture_of_ours() {
    let mut seen = std::collections::HashSet::new();
    for (_, c) in our_cases() {
        if let Some(p) = &c.expect.preserved {
            seen.extend(p.values().cloned());
        }
        if c.expect.candidates.as_ref().is_some_and(|c| !c.is_empty()) {
            seen.insert(Reason::Eligible.code().to_string());
        }
    }
    for r in ALL
        .iter()
        .filter(|r| r.is_policy_reason() || **r == Reason::Eligible)
    {
        if *r == Reason::AmbiguousOwnership {
            continue; // unreachable through plan; see the direct test below
        }
        assert!(
            seen.contains(r.code()),
            "no fixture of ours expects {}",
            r.code()
        );
    }
}

#[test]
fn every_policy_reason_code_has_a_policy_and_every_policy_a_known_code() {
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    let forbids = eligibility_forbids(&p);
    for r in ALL.iter().filter(|r| r.is_policy_reason()) {
        assert!(
            forbids.iter().any(|(_, code)| code == r),
            "no policy carries {}",
            r.code()
        );
    }
}

#[test]
fn deleting_the_policies_of_any_reason_code_fails_a_fixture_of_ours() {
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    let forbids = eligibility_forbids(&p);
    let ours = our_cases();
    for r in ALL
        .iter()
        .filter(|r| r.is_policy_reason() && **r != Reason::AmbiguousOwnership)
    {
        let ids: Vec<&str> = forbids
            .iter()
            .filter(|(_, c)| c == r)
            .map(|(id, _)| id.as_str())
            .collect();
        let failing = failing_cases(&without(&ids), &ours);
        assert!(
            !failing.is_empty(),
            "deleting {ids:?} ({}) fails no fixture",
            r.code()
        );
    }
}

#[test]
fn deleting_any_single_unshadowed_policy_fails_a_fixture_of_ours() {
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    let ours = our_cases();
    for (id, _) in eligibility_forbids(&p) {
        if SHADOWED.contains(&id.as_str()) {
            continue;
        }
        let failing = failing_cases(&without(&[&id]), &ours);
        assert!(!failing.is_empty(), "deleting {id} fails no fixture");
    }
}

#[test]
fn shadowed_policies_still_fire_on_our_fixtures() {
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    for id in SHADOWED {
        let fired = our_cases().iter().any(|(_, c)| {
            c.plan(&p)
                .unwrap()
                .entries
                .iter()
                .any(|e| e.verdict.forbids.iter().any(|r| r.id == *id))
        });
        assert!(fired, "{id} never determines a denial in our fixtures");
    }
}

/// The eligible fixture row, with its observation edited by hand.
fn judge_edited(
    policies: &Policies,
    edit: impl Fn(&mut fleet_retire::observe::Observation),
) -> fleet_retire::policy::eval::Verdict {
    let (_, case) = our_cases()
        .into_iter()
        .find(|(f, _)| f.ends_with("eligible-same-boot-dead-pid.json"))
        .unwrap();
    let facts = RunFacts {
        now: case.now,
        host: case.host.clone(),
        canonical_repository: case.canonical_repository.clone(),
        protections: Protections::from_leases(&case.leases),
        active_leases: Vec::new(),
    };
    let mut obs = observe_all(&case.rows, &facts, &case.probe);
    edit(&mut obs[0]);
    let entities = cedar_policy::Entities::from_entities(
        [
            run_entity(&facts),
            worker_entity(0, &case.rows[0], &obs[0], case.now),
        ]
        .map(cedar_policy::Entity::from),
        Some(&policies.schema),
    )
    .unwrap();
    judge(
        policies,
        &cedar_policy::Authorizer::new(),
        &entities,
        &run_uid().into(),
        &retire_action().into(),
        &worker_uid(0).into(),
    )
}

#[test]
fn ambiguous_ownership_still_fires_though_it_is_shadowed() {
    // Unreachable on its own (docs/semantics.md, pitfall 5): the row is not
    // stale exactly when it is not active or live, and those are forbidden
    // by earlier requirements (`policy verify` proves it shadowed). It still
    // fires beside them, so its reason code is listed.
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    assert!(
        judge_edited(&p, |_| {}).allowed,
        "the unedited row is eligible"
    );
    let v = judge_edited(&p, |o| o.pid.alive = None);
    assert!(!v.allowed);
    assert!(!v.reason_codes().contains(&Reason::AmbiguousOwnership));
    let (_, case) = our_cases()
        .into_iter()
        .find(|(f, _)| f.ends_with("eligible-same-boot-dead-pid.json"))
        .unwrap();
    let mut released = case.clone();
    released.rows[0].set(
        fleet_retire::row::Col::Status,
        fleet_retire::value::Value::Text("released".into()),
    );
    let planned = released.plan(&p).unwrap();
    let codes = planned.entries[0].reason_codes();
    assert_eq!(codes[0], Reason::AlreadyTerminal, "{codes:?}");
    assert!(codes.contains(&Reason::AmbiguousOwnership), "{codes:?}");
}

#[test]
fn the_fast_path_agrees_with_cedars_authorizer_on_every_row() {
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    let authorizer = cedar_policy::Authorizer::new();
    let mut rows = 0;
    for (file, case) in cases() {
        let planned = case.plan(&p).unwrap();
        let facts = &planned.facts;
        for (i, entry) in planned.entries.iter().enumerate() {
            // The plan's observations carry the first stage's peer facts.
            let obs = planned.observation(entry);
            let entities = cedar_policy::Entities::from_entities(
                [
                    run_entity(facts),
                    worker_entity(i, &case.rows[i], obs, facts.now),
                ]
                .map(cedar_policy::Entity::from),
                Some(&p.schema),
            )
            .unwrap();
            let reference = judge(
                &p,
                &authorizer,
                &entities,
                &run_uid().into(),
                &retire_action().into(),
                &worker_uid(i).into(),
            );
            let ids = |v: &fleet_retire::policy::eval::Verdict| {
                v.forbids.iter().map(|r| r.id.clone()).collect::<Vec<_>>()
            };
            assert_eq!(
                entry.verdict.allowed,
                reference.allowed,
                "{} row {i}",
                file.display()
            );
            assert_eq!(
                ids(&entry.verdict),
                ids(&reference),
                "{} row {i}",
                file.display()
            );
            assert_eq!(
                entry.verdict.errors.is_empty(),
                reference.errors.is_empty(),
                "{} row {i}",
                file.display()
            );
            rows += 1;
        }
    }
    assert!(rows > 30, "checked {rows} rows");
}

fn with_extra_policy(extra: &str) -> Policies {
    let texts: Vec<(String, String)> = policy_texts()
        .into_iter()
        .map(|(n, t)| {
            if n == "retirement.cedar" {
                (n, format!("{t}\n{extra}\n"))
            } else {
                (n, t)
            }
        })
        .collect();
    Policies::from_texts(&texts, "test".into()).unwrap()
}

/// Run facts of no host, no repository and no leases, at time zero.
fn facts_of_nowhere() -> RunFacts {
    RunFacts {
        now: 0,
        host: Default::default(),
        canonical_repository: None,
        protections: Default::default(),
        active_leases: Vec::new(),
    }
}

#[test]
fn the_memo_switches_off_when_a_policy_singles_out_a_row() {
    let p = with_extra_policy(
        "@id(\"only-row-1\")\n@reason(\"worker_live\")\n@order(\"5\")\nforbid (principal, action, resource)\nwhen { resource == FleetRetire::Worker::\"row-1\" };",
    );
    let facts = facts_of_nowhere();
    let run = fleet_retire::policy::entities::run_attrs(&facts);
    assert!(Abstraction::new(&p, &run).disabled().is_some());
    // Three rows in the same situation: only the singled-out one is kept.
    let (_, case) = our_cases()
        .into_iter()
        .find(|(f, _)| f.ends_with("instance-slot-dead-history.json"))
        .unwrap();
    let planned = case.plan(&p).unwrap();
    let kept: Vec<String> = planned.preserved().map(|e| planned.identity(e)).collect();
    assert_eq!(kept, vec!["w-2".to_string()]);

    let ext = with_extra_policy(
        "@id(\"ext\")\n@reason(\"worker_live\")\n@order(\"6\")\nforbid (principal, action, resource)\nwhen { decimal(\"1.0\").lessThan(decimal(\"0.5\")) };",
    );
    assert!(Abstraction::new(&ext, &run).disabled().is_some());
    let real = Policies::load(&PolicySource::Embedded).unwrap();
    assert!(
        Abstraction::new(&real, &run).disabled().is_none(),
        "our own policies allow the memo"
    );
}

#[test]
fn a_policy_that_errors_preserves_the_row() {
    // An extra forbid that always errors (an attribute the entity lacks is
    // not possible under strict validation, so use an overflow).
    let p = with_extra_policy(
        "@id(\"overflow\")\n@reason(\"worker_live\")\n@order(\"7\")\nforbid (principal, action == FleetRetire::Action::\"retire\", resource)\nwhen { resource.identity_row_count * 9223372036854775807 * 9223372036854775807 > 0 };",
    );
    let (_, case) = our_cases()
        .into_iter()
        .find(|(f, _)| f.ends_with("eligible-same-boot-dead-pid.json"))
        .unwrap();
    let planned = case.plan(&p).unwrap();
    assert_eq!(
        planned.candidates().count(),
        0,
        "an erroring forbid must not let the row through"
    );
    let e = &planned.entries[0];
    assert_eq!(e.reason(), Reason::PolicyEvaluationError);
}

#[test]
fn the_reason_code_page_lists_every_code() {
    let page = std::fs::read_to_string(root().join("docs/reason-codes.md")).unwrap();
    for r in ALL {
        assert!(
            page.contains(&format!("`{}`", r.code())),
            "docs/reason-codes.md lacks {}",
            r.code()
        );
    }
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    for (id, _) in eligibility_forbids(&p) {
        assert!(
            page.contains(&format!("`{id}`")),
            "docs/reason-codes.md lacks policy {id}"
        );
    }
}

fn cvc5_available() -> bool {
    std::process::Command::new(std::env::var("CVC5").unwrap_or_else(|_| "cvc5".into()))
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether cvc5 is here to prove with. CI installs it: there a missing
/// solver must not pass as a skip.
fn proofs_can_run() -> bool {
    if cvc5_available() {
        return true;
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "cvc5 is required under CI=true; .ci/run installs it"
    );
    eprintln!("skipped: cvc5 is not installed (Debian package cvc5; .ci/run installs it)");
    false
}

/// A copy of the built-in policy folder without the policy `id` (its
/// block of retirement.cedar, comments included).
fn copy_without(id: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_policies(dir.path());
    let path = dir.path().join("retirement.cedar");
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = text
        .split("\n\n")
        .filter(|b| !b.contains(&format!("@id(\"{id}\")")))
        .collect();
    assert_eq!(kept.len() + 1, text.split("\n\n").count(), "{id} removed");
    std::fs::write(&path, kept.join("\n\n")).unwrap();
    dir
}

fn copy_policies(dir: &Path) {
    std::fs::create_dir_all(dir.join("properties")).unwrap();
    for f in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
        "properties/retirement.cedar",
        "properties/capabilities.cedar",
    ] {
        std::fs::copy(root().join("policies").join(f), dir.join(f)).unwrap();
    }
}

fn fleet_retire(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn verify_proves_our_policies_and_catches_a_deleted_forbid() {
    if !proofs_can_run() {
        return;
    }
    let out = fleet_retire(&["policy", "verify"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("PROVED retire-only-dead-pids"), "{text}");
    assert!(
        text.lines().any(|l| l.ends_with(" proved, 0 failed")),
        "{text}"
    );

    // Weaken: delete the pid-alive forbid. A row from an earlier boot whose
    // pid now runs, with an expired heartbeat, would be retired.
    let dir = copy_without("pid-alive");
    let out = fleet_retire(&[
        "--policies",
        dir.path().to_str().unwrap(),
        "policy",
        "verify",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(text.contains("FAILED retire-only-dead-pids"), "{text}");
    // Failures first; --quiet prints them alone.
    assert!(text.starts_with("FAILED "), "{text}");
    let quiet = fleet_retire(&[
        "--policies",
        dir.path().to_str().unwrap(),
        "policy",
        "verify",
        "--quiet",
    ]);
    let quiet_text = String::from_utf8_lossy(&quiet.stdout);
    assert_eq!(quiet.status.code(), Some(4), "{quiet_text}");
    assert!(
        quiet_text.contains("FAILED retire-only-dead-pids"),
        "{quiet_text}"
    );
    assert!(
        !quiet_text.contains("PROVED") && !quiet_text.contains("DECIDES"),
        "{quiet_text}"
    );
    assert!(
        text.contains("counterexample") && text.contains("pid_probe"),
        "{text}"
    );
    assert!(
        text.contains("PROVED retire-only-expired-heartbeats"),
        "other properties still hold: {text}"
    );
}

#[test]
fn validate_names_problems_and_exits_3() {
    let out = fleet_retire(&["policy", "validate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    copy_policies(dir.path());
    let path = dir.path().join("capabilities.cedar");
    let text = std::fs::read_to_string(&path).unwrap();
    // Layout only: still valid, but not canonical.
    std::fs::write(
        &path,
        text.replacen("permit (\n  principal,", "permit (principal,", 1),
    )
    .unwrap();
    let out = fleet_retire(&[
        "--policies",
        dir.path().to_str().unwrap(),
        "policy",
        "validate",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("capabilities.cedar:") && err.contains("--fix-format"),
        "{err}"
    );
    let out = fleet_retire(&[
        "--policies",
        dir.path().to_str().unwrap(),
        "policy",
        "validate",
        "--fix-format",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A type error names file, line and column.
    std::fs::write(
        &path,
        text.replace(
            "principal.exists && principal.well_formed",
            "principal.exists && principal.role",
        ),
    )
    .unwrap();
    let out = fleet_retire(&[
        "--policies",
        dir.path().to_str().unwrap(),
        "policy",
        "validate",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    // Named with its folder, so a reviewer comparing two knows which.
    let shown = format!("{}:", dir.path().join("capabilities.cedar").display());
    let re_line = err.lines().any(|l| {
        l.strip_prefix(&shown).is_some_and(|rest| {
            rest.split(':')
                .nth(1)
                .is_some_and(|c| c.parse::<u32>().is_ok())
        })
    });
    assert!(re_line, "file:line:col expected: {err}");
}

#[test]
fn policy_list_matches_the_reason_codes_the_program_knows() {
    let out = fleet_retire(&["--format", "json", "policy", "list"]);
    assert!(out.status.success());
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: std::collections::BTreeSet<String> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["reason"].as_str().map(str::to_string))
        .collect();
    let known: std::collections::BTreeSet<String> = ALL
        .iter()
        .filter(|r| r.is_policy_reason())
        .map(|r| r.code().to_string())
        .collect();
    assert_eq!(
        listed, known,
        "no code without a policy, no policy without a code"
    );
    assert!(list
        .as_array()
        .unwrap()
        .iter()
        .all(|p| !p["description"].as_str().unwrap_or("").is_empty()));
}

/// Delete each eligibility forbid in turn. One that decides something on
/// its own must be guarded: some property proof fails with a counterexample
/// once it is gone. One that `policy verify` proves shadowed changes no
/// decision, so every proof still holds without it.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn deleting_any_forbid_fails_a_proof_or_is_proved_shadowed() {
    if !proofs_can_run() {
        return;
    }
    let verify = |dir: Option<&Path>| -> (Option<i32>, serde_json::Value) {
        let mut args: Vec<String> = Vec::new();
        if let Some(d) = dir {
            args.extend(["--policies".into(), d.display().to_string()]);
        }
        args.extend(["--format", "json", "policy", "verify"].map(String::from));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
            .args(&args)
            .output()
            .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
        });
        (out.status.code(), doc)
    };
    let (code, whole) = verify(None);
    assert_eq!(code, Some(0), "{whole:#}");
    let forbids = whole["forbids"].as_array().unwrap();
    let forbid_count = std::fs::read_to_string(root().join("policies/retirement.cedar"))
        .unwrap()
        .matches("\nforbid (")
        .count();
    assert_eq!(forbids.len(), forbid_count, "every forbid is classified");
    let (mut guarded, mut shadowed) = (0, 0);
    for f in forbids {
        let id = f["forbid"].as_str().unwrap();
        let dir = copy_without(id);
        let (code, doc) = verify(Some(dir.path()));
        let failed: Vec<&str> = doc["proofs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["holds"] == false)
            .map(|p| p["id"].as_str().unwrap())
            .collect();
        if f["shadowed"] == true {
            shadowed += 1;
            assert!(failed.is_empty(), "{id} is shadowed, yet {failed:?} fail");
            assert_eq!(code, Some(0), "{id}");
        } else {
            guarded += 1;
            assert!(!failed.is_empty(), "deleting {id} fails no proof");
            assert_eq!(code, Some(4), "{id}");
            let cex = doc["proofs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["holds"] == false)
                .unwrap();
            assert!(cex["counterexample"].is_string(), "{id}: {cex:#}");
        }
    }
    assert!(
        guarded > 10 && shadowed > 0,
        "{guarded} guarded, {shadowed} shadowed"
    );
}

/// Verdict, determining forbids and errors of every row, with and without
/// the memo.
fn verdicts_both_ways(case: &PlanCase, p: &Policies) -> (Vec<String>, Vec<String>) {
    let facts = RunFacts {
        now: case.now,
        host: case.host.clone(),
        canonical_repository: case.canonical_repository.clone(),
        protections: Protections::from_leases(&case.leases),
        active_leases: Vec::new(),
    };
    let run = |memo: bool| -> Vec<String> {
        let plan =
            fleet_retire::plan::plan_with(case.rows.clone(), facts.clone(), &case.probe, p, memo)
                .unwrap();
        plan.entries
            .iter()
            .map(|e| {
                let ids: Vec<&str> = e.verdict.forbids.iter().map(|r| r.id.as_str()).collect();
                format!(
                    "{} {:?} errors={}",
                    e.verdict.allowed,
                    ids,
                    e.verdict.errors.len()
                )
            })
            .collect()
    };
    (run(true), run(false))
}

/// The memo's abstraction (strings renamed, Longs kept only up to their
/// order against each other and the policies' literals) never changes a
/// verdict: every fixture, and random registries whose heartbeat ages,
/// TTLs, statuses, probes, sessions and slots vary row by row.
#[test]
fn memo_on_and_memo_off_agree_on_every_fixture_and_random_registries() {
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    for (file, case) in cases() {
        let (on, off) = verdicts_both_ways(&case, &p);
        assert_eq!(on, off, "{}", file.display());
    }
    let (_, template) = our_cases()
        .into_iter()
        .find(|(f, _)| f.ends_with("eligible-same-boot-dead-pid.json"))
        .unwrap();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut distinct_situations = 0;
    for round in 0..20 {
        let case = random_registry(&template, &mut rng, round);
        let (on, off) = verdicts_both_ways(&case, &p);
        assert_eq!(on, off, "round {round}");
        let mut kinds = on.clone();
        kinds.sort();
        kinds.dedup();
        distinct_situations += kinds.len();
    }
    assert!(
        distinct_situations > 40,
        "the random rows exercise few verdicts"
    );
}

/// A xorshift generator: the same random registries on every run.
struct XorShift(u64);

impl XorShift {
    /// The next number below `n`.
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Round `round` of the random registries: 200 rows made from the
/// template's first, with their probe answers, and 12 active leases.
fn random_registry(template: &PlanCase, rng: &mut XorShift, round: i32) -> PlanCase {
    use fleet_retire::value::Value as V;
    let ttls = [
        V::Int(900),
        V::Real(60.0),
        V::Real(0.25),
        V::Real(1e-5),
        V::Real(5e-7),
        V::Int(0),
        V::Int(-5),
        V::Text("1e3".into()),
        V::Text("abc".into()),
        V::Null,
        V::Real(900.000001),
    ];
    let mut case = template.clone();
    let base = case.rows[0].clone();
    case.rows.clear();
    case.probe.processes.clear();
    // Active leases on some of the rows' sessions, pids and identities
    // (and on strings the rows hold in other columns), so protected
    // strings of one set, of two and of none meet in the same run.
    case.leases = (0..12_i64).map(|l| random_lease(rng, round, l)).collect();
    for i in 0..200_i64 {
        let (row, observation) = random_row(rng, &base, &ttls, case.now, round, i);
        case.probe.processes.insert(10_000 + i, observation);
        case.rows.push(row);
    }
    case
}

/// Active lease `l` of round `round`, on a random session, owner session,
/// pid and worker identity.
fn random_lease(rng: &mut XorShift, round: i32, l: i64) -> fleet_retire::store::leases::Lease {
    use fleet_retire::value::Value as V;
    let text = |s: String| V::Text(s.into());
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("lease_id".to_string(), text(format!("lease-{l}")));
    fields.insert("status".to_string(), text("active".into()));
    fields.insert(
        "session_id".to_string(),
        text(format!("s-{}", rng.next(40))),
    );
    let owner_session = ["s-1".to_string(), format!("inst-{}", rng.next(8))];
    fields.insert(
        "owner_session_id".to_string(),
        text(owner_session[rng.next(2) as usize].clone()),
    );
    fields.insert(
        "owner_pid".to_string(),
        V::Int(10_000 + rng.next(260) as i64),
    );
    fields.insert(
        "owner_worker_identity".to_string(),
        text(format!("w-{round}-{}", rng.next(200))),
    );
    fleet_retire::store::leases::Lease::from_fields(fields)
}

/// Row `i` of round `round`: `base` with pid `10_000 + i`, a random
/// heartbeat age (one row in ten an unreadable stamp), TTL, status,
/// session, namespace and instance, with its pid's random probe answer.
fn random_row(
    rng: &mut XorShift,
    base: &fleet_retire::row::Row,
    ttls: &[fleet_retire::value::Value],
    now: i64,
    round: i32,
    i: i64,
) -> (
    fleet_retire::row::Row,
    fleet_retire::evidence::probe::PidObservation,
) {
    use fleet_retire::row::Col;
    use fleet_retire::value::Value as V;
    let mut r = base.clone();
    r.set(
        Col::WorkerIdentity,
        V::Text(format!("w-{round}-{i}").into()),
    );
    let age = rng.next(2_400) as i64 - 200; // -200 s .. +2200 s
    let micros = rng.next(1_000_000) as i64;
    let t = now - age * 1_000_000 - micros;
    let whole = fleet_retire::time::format_ts(t);
    let stamp = format!(
        "{}.{:06}Z",
        &whole[..whole.len() - 1],
        t.rem_euclid(1_000_000)
    );
    r.set(Col::LastHeartbeatAt, V::Text(stamp.into()));
    r.set(
        Col::HeartbeatTtlSeconds,
        ttls[rng.next(ttls.len() as u64) as usize].clone(),
    );
    let status = ["active", "active", "active", "released"][rng.next(4) as usize];
    r.set(Col::Status, V::Text(status.into()));
    r.set(
        Col::SessionId,
        V::Text(format!("s-{}", rng.next(30)).into()),
    );
    r.set(
        Col::Namespace,
        V::Text(format!("ns-{}", rng.next(5)).into()),
    );
    r.set(
        Col::ClientInstanceId,
        V::Text(format!("inst-{}", rng.next(8)).into()),
    );
    r.set(Col::Pid, V::Int(10_000 + i));
    let alive = [Some(false), Some(false), Some(true), None][rng.next(4) as usize];
    let observation = fleet_retire::evidence::probe::PidObservation {
        alive,
        start_time: r.get(Col::ProcessStartTime).as_text().map(str::to_string),
    };
    if rng.next(10) == 0 {
        r.set(Col::LastHeartbeatAt, V::Text("not a stamp".into()));
    }
    (r, observation)
}

/// `blank_fields` is keyed by its columns' bits, which is sound only if
/// every column name elsewhere in the row is written as itself. A policy
/// that asks whether a row's own string names one of its blank columns
/// (`role` and `namespace` are column names no policy of ours mentions)
/// must see rows that differ only there apart, with the memo as without.
#[test]
fn a_string_naming_a_blank_column_is_not_renamed() {
    use fleet_retire::row::Col;
    use fleet_retire::value::Value as V;
    let p = with_extra_policy(
        "@id(\"names-a-blank-column\")\n@reason(\"worker_live\")\n@order(\"5\")\n\
         forbid (principal, action == FleetRetire::Action::\"retire\", resource)\n\
         when { resource.blank_fields.contains(resource.client_instance_id) };",
    );
    let (_, mut case) = our_cases()
        .into_iter()
        .find(|(f, _)| f.ends_with("eligible-same-boot-dead-pid.json"))
        .unwrap();
    let base = case.rows[0].clone();
    case.rows.clear();
    // Each row's `role` is blank; its instance id (each its own, so the
    // rows' slots agree) is `role` (a blank column's name), `namespace` (a
    // column's name, not blank here) or an ordinary id.
    for (i, instance) in ["role", "inst-a", "namespace", "inst-b"]
        .into_iter()
        .enumerate()
    {
        let mut r = base.clone();
        r.set(Col::WorkerIdentity, V::Text(format!("w-{i}").into()));
        r.set(Col::Role, V::Null);
        r.set(Col::ClientInstanceId, V::Text(instance.into()));
        case.rows.push(r);
    }
    let (on, off) = verdicts_both_ways(&case, &p);
    assert_eq!(on, off);
    let named = |i: usize| on[i].contains("names-a-blank-column");
    assert!(named(0), "{on:#?}");
    assert!(!named(1) && !named(2) && !named(3), "{on:#?}");
}

/// The same on a realistic 10,000-row registry (`../shared/bench/
/// gen_registry.py`: a long-running fleet's history bound to this machine),
/// its pids probed for real once and those answers given to both runs.
#[test]
fn memo_on_and_memo_off_agree_on_a_realistic_registry() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generator = root.join("../shared/bench/gen_registry.py");
    if !generator.is_file() {
        eprintln!("skipped: {} is not here", generator.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ok = std::process::Command::new("python3")
        .arg(&generator)
        .args(["--rows", "10000", "--out"])
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{} failed", generator.display());
    let rows = fleet_retire::evidence::registry::load(&dir.path().join("registry.sqlite")).unwrap();
    let leases = fleet_retire::evidence::leases::load(&dir.path().join("leases.sqlite")).unwrap();
    use fleet_retire::evidence::probe::{GivenProbe, ProcessProbe, SystemProbe};
    let system = SystemProbe::new("/proc");
    let mut probe = GivenProbe::default();
    for row in &rows {
        if let fleet_retire::value::Val::Int(pid) = row.get(fleet_retire::row::Col::Pid) {
            probe.processes.insert(pid, system.observe(pid));
        }
    }
    let case = PlanCase {
        name: "realistic".into(),
        now: fleet_retire::time::now(),
        host: fleet_retire::evidence::probe::HostFacts::observe(Path::new("/proc")),
        canonical_repository: Some("prgs/gitea-tools".into()),
        probe,
        rows,
        leases,
        expect: Default::default(),
    };
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    let (on, off) = verdicts_both_ways(&case, &p);
    assert_eq!(on.len(), 10_000);
    let differ = on.iter().zip(&off).filter(|(a, b)| a != b).count();
    assert_eq!(
        differ, 0,
        "{differ} of 10,000 rows judged otherwise without the memo"
    );
    let mut kinds = on;
    kinds.sort();
    kinds.dedup();
    assert!(kinds.len() > 10, "only {} distinct verdicts", kinds.len());
}

/// Cedar has no named expressions, so the heartbeat rule ("fresh") is
/// written out in each policy that needs it; every copy must be the same
/// rule, or a reviewer reading one would be misled about the others.
#[test]
fn every_copy_of_the_fresh_heartbeat_rule_is_the_same() {
    let text = std::fs::read_to_string(root().join("policies/retirement.cedar")).unwrap();
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let fresh = squash(
        "resource.heartbeat_parsed &&
         (resource.heartbeat_age_us < 0 ||
          resource.heartbeat_age_us <=
          (if resource.ttl_number && resource.ttl_sign > 0
           then resource.ttl_us
           else 900000000))",
    );
    for id in [
        "may-hold-identity-evidence",
        "may-occupy-instance-slot",
        "worker-live",
        "heartbeat-not-expired",
        "ownership-not-stale",
    ] {
        let block = text
            .split("\n\n")
            .find(|b| b.contains(&format!("@id(\"{id}\")")))
            .unwrap_or_else(|| panic!("{id} is in retirement.cedar"));
        let body = squash(block).replace("( ", "(").replace(" )", ")");
        assert!(
            body.contains(&fresh.replace("( ", "(").replace(" )", ")")),
            "{id} states the fresh rule differently:\n{block}"
        );
    }
    // And nowhere else does a policy compare the heartbeat age.
    let uses = squash(&text)
        .matches("resource.heartbeat_age_us <=")
        .count();
    assert_eq!(uses, 5, "a sixth comparison of the heartbeat age");
}

/// The plan's fast evidence renderer writes exactly what serde's derived
/// serializer writes: on every fixture's rows, and on rows whose texts
/// need escaping and whose numbers are reals, negative, huge or not finite.
#[test]
fn fast_rendering_equals_serde_on_every_fixture_and_awkward_values() {
    use fleet_retire::row::{Col, COLUMNS};
    use fleet_retire::value::Value as V;
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    let mut all = cases();
    let (_, template) = all[0].clone();
    let awkward = [
        V::Text("quote \" backslash \\ newline \n tab \t bell \u{7} end".into()),
        V::Text("é ü 中文 \u{1f600} \u{2028}".into()),
        V::Text("".into()),
        V::Real(0.25),
        V::Real(-1e300),
        V::Real(f64::NAN),
        V::Real(f64::INFINITY),
        V::Int(i64::MIN),
        V::Bool(true),
        V::Blob(vec![0, 159, 34, 92].into()),
        V::Null,
    ];
    let mut case = template;
    case.rows.clear();
    for (i, v) in awkward.iter().enumerate() {
        for col in COLUMNS {
            let mut r = fleet_retire::row::Row::default();
            for c in COLUMNS {
                r.set(*c, V::Text(format!("x-{i}").into()));
            }
            r.set(*col, v.clone());
            if *col != Col::WorkerIdentity {
                r.set(
                    Col::WorkerIdentity,
                    V::Text(format!("w-{i}-{}", col.name()).into()),
                );
            }
            case.rows.push(r);
        }
        // No process identity given: the evidence derives `pid-<pid>` from
        // each awkward pid (an integer pid takes the writer's fast path).
        let mut r = fleet_retire::row::Row::default();
        r.set(
            Col::WorkerIdentity,
            V::Text(format!("w-{i}-derived").into()),
        );
        r.set(Col::ProcessIdentity, V::Null);
        r.set(Col::Pid, v.clone());
        case.rows.push(r);
        let mut r = fleet_retire::row::Row::default();
        r.set(Col::WorkerIdentity, V::Text(format!("w-{i}-int").into()));
        r.set(Col::Pid, V::Int(4242 + i as i64));
        case.rows.push(r);
    }
    all.push((PathBuf::from("awkward"), case));
    let mut rendered = 0;
    for (file, case) in &all {
        let plan = case.plan(&p).unwrap();
        for entry in &plan.entries {
            let evidence = plan.evidence(entry);
            let mut fast = Vec::new();
            fleet_retire::plan::render::evidence(&mut fast, &evidence);
            let serde = serde_json::to_vec(&evidence).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&fast),
                String::from_utf8_lossy(&serde),
                "{}",
                file.display()
            );
            rendered += 1;
        }
        // The entries, glued from a verdict's pre-rendered members and the
        // fast evidence, are serde's entries line for line.
        let mut doc = Vec::new();
        plan.write_json(&mut doc).unwrap();
        serde_json::from_slice::<serde_json::Value>(&doc).unwrap();
        let text = String::from_utf8(doc).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("{\"worker_identity\""))
            .map(|l| l.trim_end_matches(','))
            .collect();
        let expected: Vec<String> = plan
            .candidates()
            .chain(plan.preserved())
            .map(|e| serde_json::to_string(&plan.entry_json(e)).unwrap())
            .collect();
        assert_eq!(lines, expected, "{}", file.display());
    }
    assert!(rendered > 400, "{rendered}");
}

/// Two rows' Longs get the same key exactly when each Long has the same
/// place among the literals (equal to one, or strictly between the same
/// two) and the same rank among the row's Longs in its gap, with any
/// number of Longs (more than the key keeps on the stack, too).
#[test]
fn longs_share_a_key_exactly_when_their_places_and_ranks_agree() {
    const NAMES: [&str; 20] = [
        "l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7", "l8", "l9", "l10", "l11", "l12", "l13",
        "l14", "l15", "l16", "l17", "l18", "l19",
    ];
    let facts = facts_of_nowhere();
    let run = fleet_retire::policy::entities::run_attrs(&facts);
    let real = Policies::load(&PolicySource::Embedded).unwrap();
    let literals = Abstraction::new(&real, &run).longs().to_vec();
    assert!(literals.len() >= 2, "{literals:?}");
    // Values at, between and beyond the literals, so rows often agree.
    let mut pool: Vec<i64> = vec![i64::MIN, i64::MAX];
    for l in &literals {
        pool.extend([
            l.saturating_sub(2),
            l.saturating_sub(1),
            *l,
            l.saturating_add(1),
        ]);
    }
    let signature = |longs: &[i64]| -> Vec<(Result<usize, usize>, usize)> {
        longs
            .iter()
            .map(|n| {
                let place = literals.binary_search(n);
                let rank = match place {
                    Ok(_) => 0,
                    Err(_) => longs
                        .iter()
                        .filter(|m| *m < n && literals.binary_search(m) == place)
                        .count(),
                };
                (place, rank)
            })
            .collect()
    };
    for width in [3usize, 16, 17, 20] {
        // A fresh abstraction per shape (its key remembers the first shape).
        let abstraction = Abstraction::new(&real, &run);
        let mut seed = 0x9e3779b97f4a7c15u64 ^ width as u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let rows: Vec<Vec<i64>> = (0..400)
            .map(|_| {
                (0..width)
                    .map(|_| pool[(next() % pool.len() as u64) as usize])
                    .collect()
            })
            .collect();
        let keys: Vec<String> = rows
            .iter()
            .map(|longs| {
                let attrs: Vec<(&'static str, Attr<'_>)> = NAMES[..width]
                    .iter()
                    .zip(longs)
                    .map(|(n, v)| (*n, Attr::Long(*v)))
                    .collect();
                let mut key = String::new();
                assert!(abstraction.key(&attrs, &mut key));
                key
            })
            .collect();
        let mut shared = 0;
        for a in 0..rows.len() {
            for b in 0..a {
                let same = signature(&rows[a]) == signature(&rows[b]);
                assert_eq!(keys[a] == keys[b], same, "{:?} / {:?}", rows[a], rows[b]);
                shared += usize::from(same);
            }
        }
        assert!(width > 3 || shared > 0, "some rows share a key");
    }
}

/// Strings the run holds in its sets (lease-protected identities, sessions,
/// pids) are renamed like any other string, but only within their class:
/// the strings in exactly the same run sets. Two rows protected by
/// different leases share a key; a protected and an unprotected row do
/// not, nor do strings in different sets, nor rows whose strings are equal
/// in one and not the other; a protected string that is also a policy
/// literal stays itself.
#[test]
fn run_set_elements_share_a_key_exactly_within_their_class() {
    let mut facts = facts_of_nowhere();
    let p = &mut facts.protections;
    p.session_ids
        .extend(["s-a", "s-b", "s-c", "both", "both-2", "active"].map(String::from));
    p.worker_identities
        .extend(["both", "both-2", "w-protected"].map(String::from));
    p.pids.extend(["10", "11"].map(String::from));
    let run = fleet_retire::policy::entities::run_attrs(&facts);
    let real = Policies::load(&PolicySource::Embedded).unwrap();
    let abstraction = Abstraction::new(&real, &run);
    let key = |identity: &str, session: &str, pid: &str| -> String {
        let attrs: Vec<(&'static str, Attr<'_>)> = vec![
            ("worker_identity", Attr::Str(identity.into())),
            ("status", Attr::Str("active".into())),
            ("session_id", Attr::Str(session.into())),
            ("pid", Attr::Str(pid.into())),
        ];
        let mut key = String::new();
        assert!(abstraction.key(&attrs, &mut key));
        key
    };
    // Renamed within a class: shared.
    assert_eq!(key("w-1", "s-a", "10"), key("w-2", "s-b", "11"));
    assert_eq!(key("w-1", "both", "99"), key("w-2", "both-2", "98"));
    assert_eq!(
        key("w-protected", "s-a", "1"),
        key("w-protected", "s-c", "2")
    );
    // Protected against unprotected, one set against two: apart.
    assert_ne!(key("w-1", "s-a", "10"), key("w-2", "s-unleased", "11"));
    assert_ne!(key("w-1", "s-a", "10"), key("w-2", "s-b", "12"));
    assert_ne!(key("w-1", "s-a", "1"), key("w-2", "both", "2"));
    assert_ne!(key("w-1", "s-a", "1"), key("w-protected", "s-a", "2"));
    // Equality within the row still counts.
    assert_ne!(key("s-a", "s-a", "1"), key("s-b", "s-a", "1"));
    assert_eq!(key("s-a", "s-a", "1"), key("s-b", "s-b", "2"));
    // A protected string that is a policy literal is kept as it is.
    assert_ne!(key("w-1", "active", "1"), key("w-1", "s-a", "1"));
    assert!(key("w-1", "active", "1").contains("active"));
}
