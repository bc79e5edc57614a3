//! Signing off. `policy mutate`: the reviewer's hand-made weakenings are
//! each caught by a proof, the mutants like them are killed, and a deleted
//! property shows up as a survivor whose witness case, saved, kills it.
//! `policy validate` holds the property files to the canonical layout.

mod common;

use common::{cvc5_available, run, skip_unless, text};
use serde_json::Value;
use std::path::Path;

/// A copy of the built-in policies and properties in `dir`.
fn copy_policies(dir: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    std::fs::create_dir_all(dir.join("properties")).unwrap();
    for name in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
        "properties/retirement.cedar",
        "properties/capabilities.cedar",
    ] {
        std::fs::copy(root.join(name), dir.join(name)).unwrap();
    }
}

/// Replace `from` (which must occur exactly `times` times) in a file.
fn edit(path: &Path, from: &str, to: &str, times: usize) {
    let s = std::fs::read_to_string(path).unwrap();
    assert_eq!(
        s.matches(from).count(),
        times,
        "{from:?} in {}",
        path.display()
    );
    std::fs::write(path, s.replace(from, to)).unwrap();
}

/// Cut the policy whose `@id` is `id` out of a file (up to the next `@id`
/// or the end).
fn delete_policy(path: &Path, id: &str) {
    let s = std::fs::read_to_string(path).unwrap();
    let start = s.find(&format!("@id(\"{id}\")")).unwrap();
    let end = s[start + 4..]
        .find("@id(")
        .map_or(s.len(), |n| start + 4 + n);
    std::fs::write(path, format!("{}{}", &s[..start], &s[end..])).unwrap();
}

fn mutate(args: &[&str]) -> (Option<i32>, Value, String) {
    let mut all = vec!["--format", "json", "policy", "mutate"];
    all.extend_from_slice(args);
    let out = run(&all);
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), v, text(&out))
}

fn mutate_in(policies: &Path, args: &[&str]) -> (Option<i32>, Value, String) {
    let mut all = vec!["--policies", policies.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run(&[
        &all[..2],
        &["--format", "json", "policy", "mutate"],
        &all[2..],
    ]
    .concat());
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), v, text(&out))
}

/// The weakenings of the table, each in a copy of the policies:
/// before the properties were completed two passed every proof and every
/// fixture, three were caught by fixtures only. Each now fails a proof.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn every_hand_made_weakening_fails_a_proof() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    for w in weakenings() {
        let dir = tempfile::tempdir().unwrap();
        copy_policies(dir.path());
        edit_nth(&dir.path().join(w.file), w.from, w.to, w.nth);
        let out = run(&[
            "--policies",
            dir.path().to_str().unwrap(),
            "policy",
            "verify",
        ]);
        assert_eq!(out.status.code(), Some(4), "{}: {}", w.what, text(&out));
        assert!(
            text(&out).contains(&format!("FAILED {}", w.property)),
            "{}: expected {} to fail:\n{}",
            w.what,
            w.property,
            text(&out)
        );
    }
}

/// One hand-made weakening: in `file`, the `nth` occurrence of `from`
/// becomes `to`, and `property` must then fail.
struct Weakening {
    what: &'static str,
    file: &'static str,
    from: &'static str,
    to: &'static str,
    nth: usize,
    property: &'static str,
}

/// The table, written as edits of the built-in files.
fn weakenings() -> Vec<Weakening> {
    let role = "(\"gitea.read\") &&\n  [\"controller\", \"reconciler\"].contains(principal.role)";
    let read_only = "(\"gitea.read\")";
    vec![
        Weakening {
            what: "TTL default of may-occupy-instance-slot 900000000 -> 60000000",
            file: "retirement.cedar",
            from: "      900000000)) &&\n   resource.pid_probe != \"dead\") ||\n  resource.pid_probe == \"unknown\"",
            to: "      60000000)) &&\n   resource.pid_probe != \"dead\") ||\n  resource.pid_probe == \"unknown\"",
            nth: 0,
            property: "live-or-unprobed-rows-occupy-their-slot",
        },
        Weakening {
            what: "unknown-or-malformed-profile limited to apply",
            file: "capabilities.cedar",
            from: "  action in\n    [FleetRetire::Action::\"snapshot\",\n     FleetRetire::Action::\"plan\",\n     FleetRetire::Action::\"apply\"],",
            to: "  action == FleetRetire::Action::\"apply\",",
            nth: 0,
            property: "every-action-needs-a-known-well-formed-profile",
        },
        Weakening {
            what: "the live half of may-occupy-instance-slot disabled",
            file: "retirement.cedar",
            from: "  (resource.status == \"active\" &&\n   resource.heartbeat_parsed &&",
            to: "  (false &&\n   resource.heartbeat_parsed &&",
            nth: 0,
            property: "live-or-unprobed-rows-occupy-their-slot",
        },
        // snapshot-with-read holds the first role check, plan-with-read the
        // second (apply's reads another permission).
        Weakening {
            what: "the role check of snapshot-with-read dropped",
            file: "capabilities.cedar",
            from: role,
            to: read_only,
            nth: 0,
            property: "plan-and-snapshot-only-with-read-and-a-safe-role",
        },
        Weakening {
            what: "the role check of plan-with-read dropped",
            file: "capabilities.cedar",
            from: role,
            to: read_only,
            nth: 1,
            property: "plan-and-snapshot-only-with-read-and-a-safe-role",
        },
    ]
}

/// Replace the `nth` occurrence of `from` in a file (it must have one).
fn edit_nth(path: &Path, from: &str, to: &str, nth: usize) {
    let s = std::fs::read_to_string(path).unwrap();
    let (at, _) = s
        .match_indices(from)
        .nth(nth)
        .unwrap_or_else(|| panic!("no occurrence {nth} of {from:?} in {}", path.display()));
    let edited = format!("{}{to}{}", &s[..at], &s[at + from.len()..]);
    std::fs::write(path, edited).unwrap();
}

/// The mutants of the built-in set closest to those weakenings are among
/// the killed, and the score of these policies is 100 %.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn mutants_like_the_weakenings_are_killed() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let (code, v, out) = mutate(&[
        "--only",
        "may-occupy-instance-slot",
        "unknown-or-malformed-profile",
        "snapshot-with-read",
        "plan-with-read",
        "--min-score",
        "100",
    ]);
    assert_eq!(code, Some(0), "{out}");
    let report = &v["report"];
    assert_eq!(report["survived"], 0, "{out}");
    let outcomes = report["outcomes"].as_array().unwrap();
    let status = |policy: &str, operator: &str, before: &str, after: &str| {
        outcomes
            .iter()
            .find(|o| {
                o["policy"] == policy
                    && o["operator"] == operator
                    && o["before"].as_str().unwrap().contains(before)
                    && o["after"].as_str().unwrap().contains(after)
            })
            .unwrap_or_else(|| panic!("no mutant {policy} {operator} {before} -> {after}"))
            ["status"]
            .clone()
    };
    for (policy, operator, before, after) in [
        (
            "may-occupy-instance-slot",
            "long-literal",
            "900000000",
            "90000000",
        ),
        (
            "unknown-or-malformed-profile",
            "narrow-scope",
            "snapshot",
            "plan",
        ),
        (
            "may-occupy-instance-slot",
            "drop-disjunct",
            "",
            "resource.pid_probe == \"unknown\"",
        ),
        (
            "snapshot-with-read",
            "drop-conjunct",
            "controller",
            "allowed_operations",
        ),
        (
            "plan-with-read",
            "drop-conjunct",
            "controller",
            "allowed_operations",
        ),
    ] {
        assert_eq!(
            status(policy, operator, before, after),
            "killed",
            "{policy} {operator}"
        );
    }
}

/// Deleting a property makes mutants survive; each survivor comes with a
/// case that, saved as a fixture, kills it.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_deleted_property_shows_a_survivor_and_its_case_kills_it() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    copy_policies(&policies);
    delete_policy(
        &policies.join("properties/retirement.cedar"),
        "retire-only-canonical-bindings",
    );
    let cases = dir.path().join("cases");
    let only = ["--only", "repository-binding-not-canonical"];
    let save = [
        "--save-survivors",
        cases.to_str().unwrap(),
        "--min-score",
        "100",
    ];
    let (code, v, out) = mutate_in(&policies, &[&only[..], &save[..]].concat());
    assert_eq!(code, Some(1), "below --min-score exits 1: {out}");
    let report = &v["report"];
    assert!(report["survived"].as_u64().unwrap() > 0, "{out}");
    let survivor = report["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["status"] == "survived" && o["operator"] == "delete-forbid")
        .unwrap_or_else(|| panic!("deleting the forbid survives: {out}"));
    assert_eq!(survivor["witness"]["expect"]["decision"], "deny");
    assert_eq!(
        v["saved"].as_array().unwrap().len() as u64,
        report["survived"].as_u64().unwrap()
    );

    // Saved, the cases kill every survivor.
    let fixtures = ["--fixtures", cases.to_str().unwrap(), "--min-score", "100"];
    let (code, v, out) = mutate_in(&policies, &[&only[..], &fixtures[..]].concat());
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(v["report"]["survived"], 0, "{out}");
    assert!(v["report"]["killed_by_fixture_only"].as_u64().unwrap() > 0);
}

/// A property the policies themselves break stops the run: it would kill
/// every mutant and prove nothing.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn a_property_the_policies_break_stops_the_run() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    copy_policies(dir.path());
    edit(
        &dir.path().join("properties/retirement.cedar"),
        "when { resource.identity_row_count <= 1 };",
        "when { resource.identity_row_count <= 0 };",
        1,
    );
    let (code, _, out) = mutate_in(dir.path(), &["--only", "worker-identity-duplicated"]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("retire-only-unique-identities"), "{out}");
    assert!(out.contains("policy verify"), "{out}");
}

/// `policy validate` holds the property files to Cedar's canonical layout
/// too, and names the file to fix.
#[test]
fn validate_checks_the_layout_of_property_files() {
    let dir = tempfile::tempdir().unwrap();
    copy_policies(dir.path());
    let path = dir.path().join("properties/capabilities.cedar");
    let original = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, original.replace("permit (", "permit   (")).unwrap();
    let p = dir.path().to_str().unwrap();
    let out = run(&["--policies", p, "policy", "validate"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out).contains("properties/capabilities.cedar:"),
        "{}",
        text(&out)
    );
    let out = run(&["--policies", p, "policy", "validate", "--fix-format"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&["--policies", p, "policy", "validate"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Which kinds of identity evidence a row holds is the policies' decision,
/// per kind: with `hold_session_id` left out of the first-stage permit, a
/// dead row sharing only its session with a live worker is no longer kept
/// for it, and the fixture that expects it kept fails.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn the_policies_decide_which_evidence_kinds_a_row_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture = root.join("fixtures/plan/shared-session-with-live-worker.json");
    let fixture = fixture.to_str().unwrap();
    let builtin = run(&["test", fixture]);
    assert_eq!(builtin.status.code(), Some(0), "{}", text(&builtin));

    let dir = tempfile::tempdir().unwrap();
    copy_policies(dir.path());
    edit(
        &dir.path().join("retirement.cedar"),
        "    [FleetRetire::Action::\"hold_session_id\",\n     FleetRetire::Action::\"hold_generation_id\",",
        "    [FleetRetire::Action::\"hold_generation_id\",",
        1,
    );
    let p = dir.path().to_str().unwrap();
    let out = run(&["--policies", p, "test", fixture]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("w-dead"), "{}", text(&out));
    // The proofs say so too: the floor for hold_session_id fails.
    let out = run(&["--policies", p, "policy", "verify"]);
    if cvc5_available() {
        assert!(
            text(&out).contains("FAILED live-rows-hold-their-identity-evidence [FleetRetire::Run FleetRetire::Action::\"hold_session_id\""),
            "{}",
            text(&out)
        );
    }
}

/// Long work shows its progress on a terminal, and only there: under a
/// pseudo-terminal (`script`) the bar is drawn on stderr; captured, as a
/// script or CI job captures it, stderr holds none of it.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn mutate_shows_progress_on_a_terminal_only() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let only = ["policy", "mutate", "--only", "snapshot-with-read"];
    let out = run(&only);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("judging mutants"));
    if skip_unless(
        Path::new("/usr/bin/script").is_file(),
        "script (util-linux)",
    ) {
        return;
    }
    let command = format!("{} {}", env!("CARGO_BIN_EXE_fleet-retire"), only.join(" "));
    let tty = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .unwrap();
    let drawn = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{drawn}");
    assert!(drawn.contains("judging mutants"), "{drawn}");
}

/// Every mutant of the built-in set is placed on the text it mutates: the
/// text at its place reads as the mutated expression (parentheses and
/// white space aside), never on an annotation, and two sub-expressions of
/// one policy that read alike are placed apart, in text order.
#[test]
fn every_mutant_is_placed_on_the_text_it_mutates() {
    use fleet_retire::policy::{Policies, PolicySource};
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let mutants = fleet_retire::mutate::mutants(&policies).unwrap();
    let squeeze = |s: &str| -> String {
        s.chars()
            .filter(|c| !c.is_whitespace() && *c != '(' && *c != ')')
            .collect()
    };
    let mut places: std::collections::BTreeMap<(String, String, usize), (usize, usize)> =
        Default::default();
    for m in &mutants {
        let rule = &policies.rules[&cedar_policy::PolicyId::new(&m.policy)];
        let text = &policies.texts[&rule.file];
        let at = m.at.expect("every mutant is placed");
        if m.place.is_empty() {
            assert_eq!(
                at.start,
                (rule.line, 1),
                "a deleted forbid is its whole policy"
            );
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let mut span = String::new();
        for line in at.start.0..=at.end.0 {
            let chars: Vec<char> = lines[line - 1].chars().collect();
            let from = if line == at.start.0 {
                at.start.1 - 1
            } else {
                0
            };
            let to = if line == at.end.0 {
                at.end.1 - 1
            } else {
                chars.len()
            };
            span.extend(&chars[from..to]);
            span.push('\n');
        }
        assert!(
            !lines[at.start.0 - 1].trim_start().starts_with('@'),
            "{} {} placed on an annotation at {:?}",
            m.policy,
            m.operator,
            at
        );
        assert_eq!(
            squeeze(&span),
            squeeze(&m.place),
            "{} {} at {at:?}",
            m.policy,
            m.operator
        );
        let key = (m.policy.clone(), m.place.clone(), m.occurrence);
        let start = *places.entry(key).or_insert(at.start);
        assert_eq!(
            start, at.start,
            "one node, one place: {} {}",
            m.policy, m.place
        );
    }
    // The k-th occurrence stands after the (k-1)-th.
    for ((policy, place, k), start) in &places {
        if *k > 0 {
            let before = places[&(policy.clone(), place.clone(), k - 1)];
            assert!(
                before < *start,
                "{policy}: {place} #{k} at {start:?}, #{} at {before:?}",
                k - 1
            );
        }
    }
}

/// A survivor's line says where it stands (`file:line:column`) and shows
/// its line before and with the replacement in place, then its witness in
/// one sentence over a realistic row.
#[test]
fn a_survivor_names_its_place_and_shows_its_replacement_in_place() {
    if skip_unless(cvc5_available(), "cvc5") {
        return;
    }
    let folder = common::reports::policy_folder(false);
    let source = std::fs::read_to_string(folder.path().join("retirement.cedar")).unwrap();
    let condition = "when { resource.pid_probe != \"dead\" };";
    let line = source.lines().position(|l| l == condition).unwrap() + 1;
    let out = run(&[
        "--policies",
        folder.path().to_str().unwrap(),
        "policy",
        "mutate",
        "--only",
        "pid-alive",
    ]);
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    let head = format!("SURVIVED retirement.cedar:{line}:8 pid-alive comparison:");
    let at = shown
        .find(&head)
        .unwrap_or_else(|| panic!("no {head:?}: {shown}"));
    let after: Vec<&str> = shown[at..].lines().skip(1).take(3).collect();
    assert_eq!(
        after[0].trim(),
        format!("{line} - {condition}"),
        "{after:?}"
    );
    assert_eq!(
        after[1].trim(),
        format!("{line} + when {{ resource.pid_probe == \"dead\" }};"),
        "{after:?}"
    );
    assert!(
        after[2].contains("is kept by the mutant and retired by the policies"),
        "{after:?}"
    );
    assert!(
        shown.contains("whose pid probe answers “alive” is retired by the mutant"),
        "deleting the forbid lets a live pid through: {shown}"
    );
}
