//! `test --coverage`: which policies the fixtures exercise.
//!
//! For every policy: the cases in which it fired (its condition held for
//! some request of the case) and the cases in which it decided (it was the
//! deciding policy of some request: for a deny, the forbid that gives the
//! primary reason, lowest `@order` first; for an allow, the permit). Each
//! policy is asked on its own, by Cedar's evaluator, for every request a
//! case makes: a plan case asks retire and the two first-stage actions of
//! each row, a capability case asks each profile and operation, a Cedar-level
//! case asks its one request.

use crate::error::{About, Error, Result};
use crate::fixture::Case;
use crate::policy::engine::Engine;
use crate::policy::entities::{
    first_stage_actions, retire_action, run_entity, run_uid, worker_entity, worker_uid,
};
use crate::policy::Policies;
use cedar_policy::{Authorizer, Context, Decision, Effect, PolicyId, PolicySet, Request};
use cedar_policy_core::entities::{Entities, NoEntitiesSchema, TCComputation};
use cedar_policy_core::extensions::Extensions;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What the fixtures did with one policy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyCoverage {
    /// `@id`.
    pub id: String,
    /// The policy file.
    pub file: String,
    /// The lines it spans in its file, first and last (for LCOV).
    #[serde(skip)]
    pub lines: (usize, usize),
    /// `permit` or `forbid`.
    pub effect: &'static str,
    /// Its reason code, for an eligibility forbid.
    pub reason: Option<String>,
    /// Cases in which it fired.
    pub fired: Vec<String>,
    /// Cases in which it decided some request.
    pub decided: Vec<String>,
    /// Proved by `policy verify`'s solver: the set without it decides every
    /// retire request alike (it only ever names a reason code). `None` when
    /// not checked (no cvc5, or not an eligibility forbid).
    pub shadowed: Option<bool>,
    /// Proved: whenever it matches, a forbid of lower `@order` matches too,
    /// so no case can ever show it deciding; it counts as covered by that
    /// proof. `None` when not checked (no cvc5, or a permit).
    pub never_primary: Option<bool>,
}

/// The coverage of a fixture run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Coverage {
    /// The cases run.
    pub cases: usize,
    /// Per policy; those that never fire first, then those that never
    /// decide, then the rest, each in policy order.
    pub policies: Vec<PolicyCoverage>,
    /// Percent of forbids covered: each decided some case, or is proved
    /// never to be the deciding one.
    pub forbids_deciding_percent: f64,
    /// Forbids covered so, and all forbids.
    pub forbids_deciding: (usize, usize),
}

/// What the solver proved about the forbids, for the coverage report.
#[derive(Debug, Clone, Default)]
pub struct Proved {
    /// Per eligibility forbid: shadowed (the set without it decides alike).
    pub shadowed: BTreeMap<String, bool>,
    /// Per forbid: never the deciding one.
    pub never_primary: BTreeMap<String, bool>,
}

impl Proved {
    /// Ask the solver which eligibility forbids are shadowed and which can
    /// never be the deciding one.
    pub fn prove(policies: &Policies) -> Result<Proved> {
        Ok(Proved {
            shadowed: crate::verify::shadowed_forbids(policies)?,
            never_primary: crate::verify::never_primary_forbids(policies)?,
        })
    }
}

#[derive(Default)]
struct Tally {
    fired: BTreeSet<String>,
    decided: BTreeSet<String>,
}

/// Run every fixture file and tally, per policy, where it fired and decided.
pub fn coverage(
    policies: &Policies,
    files: &[PathBuf],
    proved: Option<&Proved>,
) -> Result<Coverage> {
    let mut tally: BTreeMap<String, Tally> = BTreeMap::new();
    let engine = Engine::new(policies);
    let mut cases = 0;
    for file in files {
        let case = crate::fixture::load(file)?;
        let Some((fired, decided)) = case_policies(policies, &engine, file, &case)? else {
            continue;
        };
        cases += 1;
        let label = format!("{} ({})", case.name(), file.display());
        for id in fired {
            tally.entry(id).or_default().fired.insert(label.clone());
        }
        for id in decided {
            tally.entry(id).or_default().decided.insert(label.clone());
        }
    }
    let policies = per_policy(policies, tally, proved);
    Ok(summary(cases, policies))
}

/// Which policies fired and which decided in one case; `None` for a
/// snapshot case, which asks the policies nothing.
fn case_policies(
    policies: &Policies,
    engine: &Engine,
    file: &Path,
    case: &Case,
) -> Result<Option<(BTreeSet<String>, BTreeSet<String>)>> {
    Ok(Some(match case {
        Case::Plan(c) => plan_case(policies, engine, &c.plan(policies)?),
        Case::Capability(c) => capability_case(policies, c)?,
        Case::Entity(c) => {
            let entities =
                cedar_policy::Entities::from_json_value(c.entities.clone(), Some(&policies.schema))
                    .map_err(|e| Error::Fixture {
                        path: file.to_path_buf(),
                        message: format!("field `entities`: {e}"),
                    })?;
            let (f, d) = one_request(policies, &entities, &c.principal, &c.action, &c.resource)?;
            (f.into_iter().collect(), d.into_iter().collect())
        }
        Case::Snapshot(_) => return Ok(None),
    }))
}

/// Every request of a capability case (profiles asking for operations the
/// policies know): which policies fired and which decided.
fn capability_case(
    policies: &Policies,
    case: &crate::capability::CapabilityCase,
) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let mut fired = BTreeSet::new();
    let mut decided = BTreeSet::new();
    for (profile, operation, _) in &case.requests {
        let Some(operation) = crate::capability::Operation::from_code(operation) else {
            continue;
        };
        let (entities, principal, action, resource) =
            crate::capability::request_parts(policies, &case.profiles, profile, operation)?;
        let (f, d) = one_request(policies, &entities, &principal, &action, &resource)?;
        fired.extend(f);
        decided.extend(d);
    }
    Ok((fired, decided))
}

/// Every policy with the cases it fired and decided in: those that never
/// fire first, then those that never decide, then the rest, each in
/// policy order.
fn per_policy(
    policies: &Policies,
    mut tally: BTreeMap<String, Tally>,
    proved: Option<&Proved>,
) -> Vec<PolicyCoverage> {
    let mut out: Vec<(u8, PolicyCoverage)> = policies
        .ordered_rules()
        .into_iter()
        .map(|rule| {
            let t = tally.remove(&rule.id).unwrap_or_default();
            let forbid = rule.effect == Effect::Forbid;
            let c = PolicyCoverage {
                id: rule.id.clone(),
                file: rule.file.clone(),
                lines: (rule.line, rule.end_line),
                effect: if forbid { "forbid" } else { "permit" },
                reason: rule.reason.map(|r| r.code().to_string()),
                fired: t.fired.into_iter().collect(),
                decided: t.decided.into_iter().collect(),
                shadowed: proved.and_then(|s| s.shadowed.get(&rule.id).copied()),
                never_primary: proved.and_then(|s| s.never_primary.get(&rule.id).copied()),
            };
            let rank = if c.fired.is_empty() {
                0
            } else if c.decided.is_empty() {
                1
            } else {
                2
            };
            (rank, c)
        })
        .collect();
    out.sort_by_key(|(rank, _)| *rank);
    out.into_iter().map(|(_, c)| c).collect()
}

/// The report: the policies, and the share of forbids that decided some
/// case or are proved never to be the deciding one.
fn summary(cases: usize, policies: Vec<PolicyCoverage>) -> Coverage {
    let forbids: Vec<&PolicyCoverage> = policies.iter().filter(|p| p.effect == "forbid").collect();
    let deciding = forbids
        .iter()
        .filter(|p| !p.decided.is_empty() || p.never_primary == Some(true))
        .count();
    Coverage {
        cases,
        forbids_deciding_percent: if forbids.is_empty() {
            100.0
        } else {
            100.0 * deciding as f64 / forbids.len() as f64
        },
        forbids_deciding: (deciding, forbids.len()),
        policies,
    }
}

/// Every row of a plan case: which policies fired and which decided, for
/// retire and both first-stage actions.
fn plan_case(
    policies: &Policies,
    engine: &Engine,
    plan: &crate::plan::Plan,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut fired = BTreeSet::new();
    let mut decided = BTreeSet::new();
    let run = run_entity(&plan.facts);
    for entry in &plan.entries {
        let worker = worker_entity(
            entry.index,
            &plan.rows[entry.index],
            plan.observation(entry),
            plan.facts.now,
        );
        let Ok(entities) = Entities::from_entities(
            [run.clone(), worker],
            None::<&NoEntitiesSchema>,
            TCComputation::AssumeAlreadyComputed,
            Extensions::all_available(),
        ) else {
            continue;
        };
        for action in std::iter::once(retire_action()).chain(first_stage_actions()) {
            let each = engine.each(&entities, &run_uid(), &action, &worker_uid(entry.index));
            let satisfied: Vec<&PolicyId> = each
                .iter()
                .filter(|(_, r)| matches!(r, Ok(true)))
                .map(|(id, _)| id)
                .collect();
            let errored = each.iter().any(|(_, r)| r.is_err());
            let rule = |id: &PolicyId| policies.rules.get(id);
            let forbids: Vec<&crate::policy::Rule> = satisfied
                .iter()
                .filter_map(|id| rule(id))
                .filter(|r| r.effect == Effect::Forbid)
                .collect();
            for id in &satisfied {
                fired.insert(id.to_string());
            }
            if errored {
                continue; // the row is kept as policy_evaluation_error
            }
            match forbids
                .iter()
                .min_by(|a, b| (a.order, &a.id).cmp(&(b.order, &b.id)))
            {
                Some(primary) => {
                    decided.insert(primary.id.clone());
                }
                None => {
                    for id in &satisfied {
                        decided.insert(id.to_string());
                    }
                }
            }
        }
    }
    (fired, decided)
}

/// One request, each policy asked on its own: (fired, decided).
fn one_request(
    policies: &Policies,
    entities: &cedar_policy::Entities,
    principal: &cedar_policy::EntityUid,
    action: &cedar_policy::EntityUid,
    resource: &cedar_policy::EntityUid,
) -> Result<(Vec<String>, Vec<String>)> {
    let request = Request::new(
        principal.clone(),
        action.clone(),
        resource.clone(),
        Context::empty(),
        None,
    )
    .map_err(|e| Error::input(About::PolicySet, format!("request: {e}")))?;
    let authorizer = Authorizer::new();
    let mut fired = Vec::new();
    let mut forbids = Vec::new();
    let mut errored = false;
    for rule in policies.ordered_rules() {
        let id = PolicyId::new(&rule.id);
        let Some(p) = policies.set.policy(&id) else {
            continue;
        };
        let mut alone = PolicySet::new();
        alone
            .add(p.clone())
            .map_err(|e| Error::policy(About::PolicySet, e.to_string()))?;
        let response = authorizer.is_authorized(&request, &alone, entities);
        errored |= response.diagnostics().errors().next().is_some();
        let satisfied = match rule.effect {
            Effect::Permit => response.decision() == Decision::Allow,
            Effect::Forbid => response.diagnostics().reason().any(|r| r == &id),
        };
        if satisfied {
            fired.push(rule.id.clone());
            if rule.effect == Effect::Forbid {
                forbids.push(rule);
            }
        }
    }
    let decided = if errored {
        Vec::new()
    } else if let Some(primary) = forbids.first() {
        vec![primary.id.clone()]
    } else {
        fired.clone()
    };
    Ok((fired, decided))
}

/// The coverage as an LCOV tracefile (`genhtml`, coverage services): a
/// record per policy file (`SF:` its path as given from the working
/// directory: `folder` joined with its name, as every LCOV producer names
/// sources, so `genhtml` and coverage services find it); per policy
/// a function (`FN:` its first line and `@id`, `FNDA:` the cases in which
/// it fired); per line of each policy a `DA:` count: its first line, the
/// cases in which it decided; its other lines, the cases in which its
/// condition held (it fired).
pub fn lcov(report: &Coverage, folder: &std::path::Path) -> String {
    use std::fmt::Write;
    let mut by_file: BTreeMap<&str, Vec<&PolicyCoverage>> = BTreeMap::new();
    for p in &report.policies {
        by_file.entry(p.file.as_str()).or_default().push(p);
    }
    // An LCOV name ends at a comma or a line's end.
    let name = |id: &str| -> String {
        id.chars()
            .map(|c| if c == ',' || c.is_control() { '_' } else { c })
            .collect()
    };
    let mut out = String::from("TN:fleet_retire\n");
    for (file, mut policies) in by_file {
        policies.sort_by_key(|p| p.lines);
        let _ = writeln!(out, "SF:{}", name(&folder.join(file).to_string_lossy()));
        for p in &policies {
            let _ = writeln!(out, "FN:{},{}", p.lines.0, name(&p.id));
        }
        for p in &policies {
            let _ = writeln!(out, "FNDA:{},{}", p.fired.len(), name(&p.id));
        }
        let hit = policies.iter().filter(|p| !p.fired.is_empty()).count();
        let _ = writeln!(out, "FNF:{}\nFNH:{hit}", policies.len());
        let mut lines: BTreeMap<usize, usize> = BTreeMap::new();
        for p in &policies {
            let (first, last) = p.lines;
            *lines.entry(first).or_default() += p.decided.len();
            for line in first + 1..=last {
                *lines.entry(line).or_default() += p.fired.len();
            }
        }
        for (line, count) in &lines {
            let _ = writeln!(out, "DA:{line},{count}");
        }
        let covered = lines.values().filter(|c| **c > 0).count();
        let _ = writeln!(out, "LF:{}\nLH:{covered}\nend_of_record", lines.len());
    }
    out
}
