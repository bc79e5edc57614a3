//! The reviewer's page (`policy report --out DIR`) opened from disk in a
//! real browser: Debian's Chromium, headless, driven by puppeteer-core
//! (`tests/validators/review_page.mjs`). Every check reads the rendered
//! DOM, not the HTML text; a screenshot of the first screen is kept in
//! the test's output folder.

mod common;

use common::reports::*;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The browser and its driver, or a skip saying how to get them.
fn browser_ready() -> bool {
    let driver =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/validators/node_modules/puppeteer-core");
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    !skip_unless(
        cvc5_available() && driver.is_dir() && chromium.is_file(),
        "cvc5 and chromium (Debian packages) and puppeteer-core (cd tests/validators && npm ci)",
    )
}

/// Write the page (`global` flags, then `policy report --out DIR` and its
/// `own` flags), open it in Chromium, and return what the DOM shows; the
/// screenshot goes to the output folder under `name`.
fn open_page(name: &str, global: &[&str], own: &[&str]) -> Value {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let mut head: Vec<&str> = global.to_vec();
    head.extend(["policy", "report", "--out", dir]);
    head.extend(own);
    let ran = bin()
        .args(&head)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(ran.status.success(), "{}", text(&ran));
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("signoff-page");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join(format!("{name}.png"));
    let seen = std::process::Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/validators/review_page.mjs"))
        .arg(out.path().join("index.html"))
        .arg(&shot)
        .output()
        .unwrap();
    assert!(seen.status.success(), "{}", text(&seen));
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 1000,
        "a screenshot"
    );
    serde_json::from_slice(&seen.stdout).unwrap()
}

fn policy<'a>(seen: &'a Value, id: &str) -> &'a Value {
    seen["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap_or_else(|| panic!("{id} is not on the page"))
}

/// The built-in set with the repository's fixtures, pid-alive's mutants,
/// two profiles (one named with markup, one granted apply by the edit) and
/// the base HEAD: each policy shown with the coverage `test --coverage`
/// reports, pid-alive's mutants all killed, one matrix cell per profile and
/// operation with the widened one marked, nothing fetched, no script.
#[test]
#[cfg_attr(
    not(all(fr_cvc5, fr_chromium)),
    ignore = "needs the cvc5 solver (apt-get install cvc5); and Debian's chromium and puppeteer-core ((cd tests/validators && npm ci))"
)]
fn the_built_in_set_renders_with_its_marks() {
    if !browser_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (
        dir.path().join("old.json"),
        dir.path().join("profiles.json"),
    );
    std::fs::write(
        &old,
        r#"{"profiles": {"ctl": {"role": "controller", "allowed_operations": ["gitea.read"]}, "gone": {"role": "reconciler", "allowed_operations": ["gitea.read"]}}}"#,
    )
    .unwrap();
    std::fs::write(&new, r#"{"profiles": {"ctl": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}, "<b>rev</b>": {"role": "reviewr", "allowed_operations": ["gitea.read"]}}}"#).unwrap();
    let seen = open_page(
        "built-in",
        &[],
        &[
            "--fixtures",
            "fixtures/plan",
            "fixtures/capabilities",
            "--mutate",
            "--only",
            "pid-alive",
            "--profiles",
            new.to_str().unwrap(),
            "--against",
            old.to_str().unwrap(),
            "--base",
            "HEAD",
        ],
    );
    assert_eq!(seen["requests"], Value::Array(vec![]), "nothing fetched");
    assert_eq!(seen["scripts"], 0);
    assert_eq!(seen["made_from_text"], 0);
    assert!(
        seen["base"].is_string(),
        "the difference from HEAD is shown"
    );

    let listed = run(&["--format", "json", "policy", "list"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let coverage = run(&[
        "--format",
        "json",
        "test",
        "--coverage",
        "fixtures/plan",
        "fixtures/capabilities",
    ]);
    let coverage: Value = serde_json::from_slice(&coverage.stdout).unwrap();
    for p in listed.as_array().unwrap() {
        let id = p["id"].as_str().unwrap();
        let shown = policy(&seen, id);
        assert_eq!(shown["visible"], true, "{id}");
        let counted = coverage["coverage"]["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap();
        let n = |k: &str| counted[k].as_array().unwrap().len();
        assert_eq!(
            (&shown["fired"], &shown["decided"]),
            (&Value::from(n("fired")), &Value::from(n("decided"))),
            "{id}"
        );
        assert!(shown["proved"].as_u64().unwrap() > 0, "{id} has proofs");
        assert_eq!(shown["failed"], 0, "{id}");
    }
    let pid_alive = policy(&seen, "pid-alive");
    assert!(pid_alive["killed"].as_u64().unwrap() > 0, "{pid_alive}");
    assert_eq!(pid_alive["survived"], 0);
    assert!(
        pid_alive["shown"].as_str().unwrap().contains("killed by"),
        "{pid_alive}"
    );
    assert_eq!(
        policy(&seen, "worker-live")["killed"],
        Value::Null,
        "not judged"
    );

    grants_as_edited(&seen);
}

/// A weakened copy: no properties, and pid-alive's description holding
/// `</script>` and markup. Its comparison mutant survives and is marked at
/// the comparison's line of retirement.cedar; the description is shown as
/// the text it is.
#[test]
#[cfg_attr(
    not(all(fr_cvc5, fr_chromium)),
    ignore = "needs the cvc5 solver (apt-get install cvc5); and Debian's chromium and puppeteer-core ((cd tests/validators && npm ci))"
)]
fn a_planted_survivor_is_shown_at_its_line() {
    if !browser_ready() {
        return;
    }
    let folder = policy_folder(false);
    let file = folder.path().join("retirement.cedar");
    let policy_text = std::fs::read_to_string(&file).unwrap();
    let hostile = "A live pid </script><script>alert(1)</script><b>blocks</b> retirement \u{202e}.";
    let before = policy_text
        .lines()
        .find(|l| l.starts_with("@description(\"The recorded pid is still running"))
        .unwrap();
    std::fs::write(
        &file,
        policy_text.replace(before, &format!("@description(\"{hostile}\")")),
    )
    .unwrap();
    let line = policy_text
        .lines()
        .position(|l| l.contains("when { resource.pid_probe != \"dead\" };"))
        .unwrap()
        + 1;
    let seen = open_page(
        "planted-survivor",
        &["--policies", folder.path().to_str().unwrap()],
        &["--mutate", "--only", "pid-alive"],
    );
    assert_eq!(seen["requests"], Value::Array(vec![]));
    assert_eq!(
        seen["scripts"], 0,
        "no script, not even the one in the text"
    );
    assert_eq!(seen["made_from_text"], 0);
    let shown = hostile.replace('\u{202e}', "\\u{202e}");
    assert!(
        seen["text"].as_str().unwrap().contains(&shown),
        "shown as text"
    );
    assert!(
        !seen["text"].as_str().unwrap().contains('\u{202e}'),
        "no override reaches the page"
    );
    let pid_alive = policy(&seen, "pid-alive");
    assert!(pid_alive["survived"].as_u64().unwrap() > 0, "{pid_alive}");
    let survivors = seen["survivors"].as_array().unwrap();
    let at = survivors
        .iter()
        .find(|s| s["line"] == line && s["file"] == "retirement.cedar")
        .unwrap_or_else(|| panic!("no survivor at retirement.cedar:{line}: {survivors:?}"));
    assert!(
        at["text"]
            .as_str()
            .unwrap()
            .contains("resource.pid_probe != \"dead\""),
        "{at}"
    );
    assert!(at["note"].as_str().unwrap().contains("SURVIVING"), "{at}");
    // The first screen lists it, linked to that line.
    let listed = seen["attention"].as_array().unwrap();
    assert!(
        listed
            .iter()
            .any(|a| a["target"] == line && a["text"].as_str().unwrap().contains("survives")),
        "{listed:?}"
    );
}

/// The set with pid-alive deleted, properties kept: the properties about
/// pids fail and are marked at their own lines; mutants are not judged
/// against failing properties, and the page says so.
#[test]
#[cfg_attr(
    not(all(fr_cvc5, fr_chromium)),
    ignore = "needs the cvc5 solver (apt-get install cvc5); and Debian's chromium and puppeteer-core ((cd tests/validators && npm ci))"
)]
fn a_failing_proof_is_shown_at_its_property() {
    if !browser_ready() {
        return;
    }
    let folder = without_pid_alive();
    let properties = folder.path().join("properties/retirement.cedar");
    let line = std::fs::read_to_string(&properties)
        .unwrap()
        .lines()
        .position(|l| l.contains("@id(\"retire-only-dead-pids\")"))
        .unwrap()
        + 1;
    let seen = open_page(
        "failing-proof",
        &["--policies", folder.path().to_str().unwrap()],
        &["--mutate"],
    );
    let failing = seen["failing"].as_array().unwrap();
    assert!(
        failing.iter().any(|f| f["file"]
            .as_str()
            .unwrap()
            .ends_with("properties/retirement.cedar")
            && f["line"] == line),
        "{failing:?}"
    );
    assert!(
        policy(&seen, "pid-probe-unknown")["failed"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(seen["text"]
        .as_str()
        .unwrap()
        .contains("mutants are judged only against properties that hold"));
}

/// `--mutants FILE` takes a `policy mutate --format json` run only of the
/// same policies judged by the same properties and cases: a folder whose
/// properties differ is refused, naming the file, before anything is
/// written.
#[test]
#[cfg_attr(not(fr_cvc5), ignore = "needs the cvc5 solver (apt-get install cvc5)")]
fn mutants_judged_by_other_properties_are_refused() {
    if skip_unless(
        cvc5_available(),
        "cvc5 (Debian package; .ci/run installs it)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run_file = dir.path().join("mutants.json");
    let judged = run(&[
        "--format",
        "json",
        "policy",
        "mutate",
        "--only",
        "pid-alive",
    ]);
    assert!(judged.status.success(), "{}", text(&judged));
    std::fs::write(&run_file, &judged.stdout).unwrap();
    let page = dir.path().join("page");
    let mutants = run_file.to_str().unwrap();
    let out = run(&[
        "policy",
        "report",
        "--out",
        page.to_str().unwrap(),
        "--mutants",
        mutants,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    // The same policy files, with properties of the folder's own (none
    // about pids): the run's kills were made by properties it lacks.
    let weak = policy_folder(false);
    std::fs::write(
        weak.path().join("properties/capabilities.cedar"),
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("policies/properties/capabilities.cedar"),
        )
        .unwrap(),
    )
    .unwrap();
    let other = dir.path().join("other");
    let out = run(&[
        "--policies",
        weak.path().to_str().unwrap(),
        "policy",
        "report",
        "--out",
        other.to_str().unwrap(),
        "--mutants",
        mutants,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("judged by other properties"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(mutants),
        "names the file: {}",
        text(&out)
    );
    assert!(!other.join("index.html").exists());
}

/// The matrix of the built-in test's profiles: ctl gains apply, gone is
/// removed (and loses what it had), `<b>rev</b>` is a name, not markup,
/// and its misspelt role is warned of.
fn grants_as_edited(seen: &Value) {
    let grants = &seen["grants"];
    assert_eq!(
        (&grants["profiles"], &grants["operations"]),
        (&Value::from(3), &Value::from(3))
    );
    let cells = grants["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 9, "the removed profile keeps its row");
    let proved_by = grants["proved_by"].as_array().unwrap();
    assert_eq!(proved_by.len(), 3, "one per operation");
    assert!(
        proved_by
            .iter()
            .all(|p| p.as_str().unwrap().contains("proved")),
        "{proved_by:?}"
    );
    let revoked = cells
        .iter()
        .filter(|c| c["profile"] == "gone" && c["change"].as_str().unwrap().contains("revoked"))
        .count();
    assert_eq!(revoked, 2, "gone loses snapshot and plan: {cells:?}");
    assert!(
        seen["text"]
            .as_str()
            .unwrap()
            .contains("did you mean \"reviewer\""),
        "the typo warning is on the page"
    );
    let widened: Vec<&Value> = cells
        .iter()
        .filter(|c| c["change"].as_str().unwrap().contains("granted"))
        .collect();
    assert_eq!(widened.len(), 1, "{cells:?}");
    assert_eq!(
        (&widened[0]["profile"], &widened[0]["operation"]),
        (&Value::from("ctl"), &Value::from("apply"))
    );
    assert!(
        cells.iter().any(|c| c["profile"] == "<b>rev</b>"),
        "a name with markup is text"
    );
}
