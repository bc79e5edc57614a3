//! The policies are the decision: deleting one must be visible, the fast
//! evaluation path must agree with Cedar's own authorizer, and every reason
//! code must be exercised by a fixture of ours.

use fleet_retire::evidence::leases::Protections;
use fleet_retire::fixture::{collect, load, Case, PlanCase};
use fleet_retire::observe::{observe_all, RunFacts};
use fleet_retire::policy::entities::{
    retire_action, run_entity, run_uid, worker_entity, worker_uid,
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
            Case::Capability(_) | Case::Snapshot(_) => None,
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
    };
    let mut obs = observe_all(&case.rows, &facts, &case.probe);
    edit(&mut obs[0]);
    let entities = cedar_policy::Entities::from_entities(
        [run_entity(&facts), worker_entity(0, &case.rows[0], &obs[0])]
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
fn ambiguous_ownership_is_refused_by_its_own_policy() {
    // Unreachable through plan (docs/semantics.md, pitfall 5), so the entity is edited:
    // an otherwise eligible row whose ownership is not exactly "stale".
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    assert!(
        judge_edited(&p, |_| {}).allowed,
        "the unedited row is eligible"
    );
    let v = judge_edited(&p, |o| o.ownership_state = "live_untrusted_identity");
    assert!(!v.allowed);
    assert_eq!(v.reason_codes(), vec![Reason::AmbiguousOwnership]);
    let v = judge_edited(&without(&["ownership-not-stale"]), |o| {
        o.ownership_state = "live_untrusted_identity"
    });
    assert!(
        v.allowed,
        "without its policy the same row would be retired"
    );
}

#[test]
fn the_fast_path_agrees_with_cedars_authorizer_on_every_row() {
    let p = Policies::load(&PolicySource::Embedded).unwrap();
    let authorizer = cedar_policy::Authorizer::new();
    let mut rows = 0;
    for (file, case) in cases() {
        let planned = case.plan(&p).unwrap();
        let facts = &planned.facts;
        let obs = observe_all(&case.rows, facts, &case.probe);
        for (i, entry) in planned.entries.iter().enumerate() {
            let entities = cedar_policy::Entities::from_entities(
                [run_entity(facts), worker_entity(i, &case.rows[i], &obs[i])]
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

#[test]
fn the_memo_switches_off_when_a_policy_singles_out_a_row() {
    let p = with_extra_policy(
        "@id(\"only-row-1\")\n@reason(\"worker_live\")\n@order(\"5\")\nforbid (principal, action, resource)\nwhen { resource == FleetRetire::Worker::\"row-1\" };",
    );
    let facts = RunFacts {
        now: 0,
        host: Default::default(),
        canonical_repository: None,
        protections: Default::default(),
    };
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
fn verify_proves_our_policies_and_catches_a_deleted_forbid() {
    if !cvc5_available() {
        // CI installs cvc5: there a missing solver must not pass as a skip.
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "cvc5 is required under CI=true; .ci/run installs it"
        );
        eprintln!("skipped: cvc5 is not installed (Debian package cvc5; .ci/run installs it)");
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
    let dir = tempfile::tempdir().unwrap();
    copy_policies(dir.path());
    let path = dir.path().join("retirement.cedar");
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = text
        .split("\n\n")
        .filter(|b| !b.contains("@id(\"pid-alive\")"))
        .collect();
    std::fs::write(&path, kept.join("\n\n")).unwrap();
    let out = fleet_retire(&[
        "--policies",
        dir.path().to_str().unwrap(),
        "policy",
        "verify",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains("FAILED retire-only-dead-pids"), "{text}");
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
    let re_line = err.lines().any(|l| {
        l.starts_with("capabilities.cedar:")
            && l.split(':')
                .nth(2)
                .is_some_and(|c| c.parse::<u32>().is_ok())
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
