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

/// The Cedar CLI release that matches the Cedar engine built into this
/// program (`cedar-policy` in Cargo.toml; a unit test holds them equal).
pub const CEDAR_CLI_VERSION: &str = "4.14.1";

/// `run.sh`: check that the `cedar` CLI is there (and say how to install
/// it when it is not), run `cedar run-tests` on every exported file even
/// when one fails, and end with a summary; exit 1 when any file failed,
/// 127 without the CLI. `names` are made of `[A-Za-z0-9._-]` only
/// ([`script_safe_name`]); they are quoted all the same.
fn run_script(names: &[String]) -> String {
    let list: Vec<String> = names.iter().map(|n| format!("  '{n}'\n")).collect();
    format!(
        r#"#!/usr/bin/env bash
# Check fleet-retire's fixture decisions with Cedar's own CLI, independently
# of fleet-retire: every file below is run, and the run ends with a summary.
cd "$(dirname "$0")" || exit 2
if ! command -v cedar >/dev/null 2>&1; then
  echo "run.sh: the Cedar CLI (cedar) is not on PATH. Install the version fleet-retire uses:" >&2
  echo "  cargo install --locked cedar-policy-cli --version {CEDAR_CLI_VERSION}" >&2
  echo "then run $0 again." >&2
  exit 127
fi
case "$(cedar --version 2>/dev/null)" in
  *"{CEDAR_CLI_VERSION}"*) ;;
  *) echo "run.sh: note: fleet-retire uses Cedar {CEDAR_CLI_VERSION}; this cedar is $(cedar --version 2>&1)" >&2 ;;
esac
files=(
{list})
failed=()
for tests in "${{files[@]}}"; do
  echo "== $tests"
  cedar run-tests --policies policies.cedar --schema {SCHEMA_FILE} --tests "$tests" || failed+=("$tests")
done
echo
echo "run.sh: $(( ${{#files[@]}} - ${{#failed[@]}} )) of ${{#files[@]}} file(s) passed, ${{#failed[@]}} failed"
for f in "${{failed[@]}}"; do echo "  failed: $f"; done
[ "${{#failed[@]}}" -eq 0 ]
"#,
        list = list.concat()
    )
}

/// Write `DIR/<n>-<fixture>.tests.json` for every fixture, plus the policies,
/// schema and an executable `run.sh` that runs them all with `cedar
/// run-tests` ([`run_script`]).
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
    let mut count = 0;
    let mut names = Vec::new();
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
        let name = script_safe_name(names.len(), file);
        write(
            &name,
            &serde_json::to_string_pretty(&tests).expect("tests serialise"),
        )
        .map_err(io)?;
        names.push(name);
    }
    crate::outfile::replace_executable(&dir.join("run.sh"), run_script(&names).as_bytes())
        .map_err(io)?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cedar_cli_named_is_the_engine_we_build_with() {
        let lock = include_str!("../Cargo.lock");
        let version = lock
            .split("[[package]]")
            .find(|p| p.contains("name = \"cedar-policy\"\n"))
            .and_then(|p| p.split("version = \"").nth(1))
            .and_then(|v| v.split('"').next());
        assert_eq!(version, Some(CEDAR_CLI_VERSION));
    }
}
