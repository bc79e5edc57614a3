//! Export fixtures as Cedar CLI `run-tests` files, so a reviewer can check
//! our policy decisions with Cedar's own command-line tool, independently of
//! this program's evaluation.
//!
//! The expected decisions come from the fixtures (written by hand), not from
//! our evaluation: a preserved row must be denied with a policy carrying its
//! expected reason code among the reasons; a candidate must be allowed.
//! Our code contributes only the entities (the observed evidence) and the
//! choice among policies that share a reason code.

use crate::capability::operator_entity;
use crate::error::{About, Error, Result};
use crate::fixture::{Case, PlanCase};
use crate::policy::entities::{run_entity, worker_entity};
use crate::policy::{embedded, Policies, POLICY_FILES, SCHEMA_FILE};
use cedar_policy::{Entities, Entity};
use serde_json::{json, Value as Json};
use std::path::Path;

fn entities_json(list: Vec<Entity>) -> Result<Json> {
    let err = |e: cedar_policy::entities_errors::EntitiesError| {
        Error::input(
            About::Option("--export-cedar"),
            format!("exporting entities: {e}"),
        )
    };
    Entities::from_entities(list, None)
        .map_err(err)?
        .to_json_value()
        .map_err(err)
}

fn plan_tests(case: &PlanCase, policies: &Policies) -> Result<Vec<Json>> {
    let plan = case.plan(policies)?;
    let mut tests = Vec::new();
    for entry in &plan.entries {
        let identity = plan.identity(entry);
        let expect_candidate = case
            .expect
            .candidates
            .as_ref()
            .is_some_and(|c| c.contains(&identity));
        let expect_code = case
            .expect
            .preserved
            .as_ref()
            .and_then(|p| p.get(&identity));
        let (decision, reason) = if expect_candidate {
            ("allow", vec!["retire-when-nothing-forbids".to_string()])
        } else if let Some(code) = expect_code {
            let id = entry
                .verdict
                .forbids
                .iter()
                .find(|r| r.reason.map(|x| x.code()) == Some(code.as_str()))
                .map(|r| r.id.clone())
                // No policy of ours fires with the expected code: export the
                // expectation anyway, so Cedar's CLI reports the mismatch.
                .unwrap_or_else(|| format!("<a policy with @reason(\"{code}\")>"));
            ("deny", vec![id])
        } else {
            continue;
        };
        let row = &plan.rows[entry.index];
        tests.push(json!({
            "name": format!("{} / row {} {identity}", case.name, entry.index + 1),
            "request": {
                "principal": "FleetRetire::Run::\"current\"",
                "action": "FleetRetire::Action::\"retire\"",
                "resource": format!("FleetRetire::Worker::\"row-{}\"", entry.index),
                "context": {},
            },
            "entities": entities_json(vec![
                Entity::from(run_entity(&plan.facts)),
                Entity::from(worker_entity(entry.index, row, plan.observation(entry), plan.facts.now)),
            ])?,
            "decision": decision,
            "reason": reason,
            "num_errors": 0,
        }));
    }
    Ok(tests)
}

fn capability_tests(case: &crate::capability::CapabilityCase) -> Result<Vec<Json>> {
    let mut tests = Vec::new();
    for (profile, operation, allow) in &case.requests {
        if crate::capability::Operation::from_code(operation).is_none() {
            continue; // not an action in the schema: nothing for Cedar to ask
        }
        let operator = operator_entity(profile, case.profiles.profiles.get(profile))?;
        let registry = Entity::new_no_attrs(
            r#"FleetRetire::Registry::"registry""#.parse().expect("valid uid"),
            Default::default(),
        );
        tests.push(json!({
            "name": format!("{} / {profile} {operation}", case.name),
            "request": {
                "principal": format!("FleetRetire::Operator::{}", json!(profile)),
                "action": format!("FleetRetire::Action::\"{operation}\""),
                "resource": "FleetRetire::Registry::\"registry\"",
                "context": {},
            },
            "entities": entities_json(vec![operator, registry])?,
            "decision": if *allow { "allow" } else { "deny" },
            "reason": [],
            "num_errors": 0,
        }));
    }
    Ok(tests)
}

/// A file name for the `n`-th exported fixture that no shell can read as
/// anything but a word: its position, then the fixture's stem with every
/// character outside `[A-Za-z0-9._-]` replaced by `_` (a fixture named
/// `x$(touch PWNED).json` must not run anything from `run.sh`).
fn script_safe_name(n: usize, file: &Path) -> String {
    let stem: String = file
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{n:03}-{}.tests.json", stem.trim_start_matches(['-', '.']))
}

/// Write `DIR/<n>-<fixture>.tests.json` for every fixture, plus the policies,
/// schema and a `run.sh` that runs them all with `cedar run-tests`.
pub fn export(files: &[std::path::PathBuf], dir: &Path, policies: &Policies) -> Result<usize> {
    let io = |e: std::io::Error| {
        Error::input(
            About::Option("--export-cedar"),
            format!("{}: {e}", dir.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let policy_text: Vec<&str> = POLICY_FILES.iter().map(|f| embedded(f)).collect();
    // Each file replaces its path, never following a link there.
    let write = |name: &str, text: &str| crate::outfile::replace(&dir.join(name), text.as_bytes());
    write("policies.cedar", &policy_text.join("\n")).map_err(io)?;
    write(SCHEMA_FILE, embedded(SCHEMA_FILE)).map_err(io)?;
    let mut script = String::from(
        "#!/usr/bin/env bash\n# Check fleet-retire's fixture decisions with Cedar's own CLI.\nset -e\ncd \"$(dirname \"$0\")\"\n",
    );
    let mut count = 0;
    let mut files_written = 0;
    for file in files {
        let tests = match crate::fixture::load(file)? {
            Case::Plan(c) => plan_tests(&c, policies)?,
            Case::Capability(c) => capability_tests(&c)?,
            // A snapshot judges no Cedar request: nothing to export.
            Case::Snapshot(_) => Vec::new(),
            // Already a Cedar request over Cedar entities; the runner's own
            // check is Cedar's authorizer. Not exported.
            Case::Entity(_) => Vec::new(),
        };
        if tests.is_empty() {
            continue;
        }
        count += tests.len();
        let name = script_safe_name(files_written, file);
        files_written += 1;
        write(
            &name,
            &serde_json::to_string_pretty(&tests).expect("tests serialise"),
        )
        .map_err(io)?;
        // The name is made of [A-Za-z0-9._-] only; quoted all the same.
        script.push_str(&format!(
            "cedar run-tests --policies policies.cedar --schema {SCHEMA_FILE} --tests '{name}'\n"
        ));
    }
    write("run.sh", &script).map_err(io)?;
    Ok(count)
}
