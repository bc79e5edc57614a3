//! The page's table of policies: each with its proofs (a failing one only
//! on the policy that breaks it, [`super::blame`]), the fixture cases in
//! which it fired and decided, and its mutants.

use super::view::{PolicyRow, ProofMark};
use super::{visible, Evidence, Judged};
use std::collections::BTreeMap;

/// Whether two policies can apply to a common action.
fn share_an_action(a: &cedar_policy::Policy, b: &cedar_policy::Policy) -> bool {
    use cedar_policy::ActionConstraint::{Any, Eq, In};
    let list = |p: &cedar_policy::Policy| match p.action_constraint() {
        Any => None,
        Eq(uid) => Some(vec![uid]),
        In(uids) => Some(uids),
    };
    match (list(a), list(b)) {
        (Some(x), Some(y)) => x.iter().any(|u| y.contains(u)),
        _ => true,
    }
}

/// The proofs about one policy: the properties over its file that share
/// an action with it, and its never-errors proof. A failing one is shown
/// only on the policies that break it, so one failure is charged once.
fn proofs_of(e: &Evidence, id: &str, file: &str) -> Vec<ProofMark> {
    let Some(policy) = e.policies.set.policy(&cedar_policy::PolicyId::new(id)) else {
        return Vec::new();
    };
    let about: Vec<&str> = e
        .properties
        .iter()
        .filter(|p| p.subject == file && share_an_action(&p.policy, policy))
        .map(|p| p.id.as_str())
        .collect();
    let never_errors = format!("never-errors:{id}");
    let mut marks: BTreeMap<&str, bool> = BTreeMap::new();
    for p in &e.verification.proofs {
        if about.contains(&p.id.as_str()) || p.id == never_errors {
            *marks.entry(p.id.as_str()).or_insert(true) &= p.holds;
        }
    }
    let breaks = |property: &str| {
        e.blame
            .get(property)
            .is_some_and(|b| b.policies.iter().any(|p| p == id))
    };
    marks
        .into_iter()
        .filter(|(property, holds)| *holds || breaks(property))
        .map(|(id, holds)| ProofMark {
            id: visible(id),
            holds,
        })
        .collect()
}

/// The policies in the order the table lists them: by file, then line.
pub fn ordered<'a>(e: &'a Evidence) -> Vec<&'a crate::policy::Rule> {
    let mut rules: Vec<&crate::policy::Rule> = e.policies.rules.values().collect();
    rules.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    rules
}

/// `added` or `changed` against the base, or empty.
pub fn status(e: &Evidence, id: &str) -> String {
    let Some((_, compared)) = e.compared() else {
        return String::new();
    };
    compared
        .diff
        .policies
        .iter()
        .find(|p| p.id == id && p.status != "removed")
        .map(|p| p.status)
        .filter(|s| *s != "unchanged")
        .unwrap_or("")
        .to_string()
}

/// One row per policy.
pub fn policy_rows(e: &Evidence, mutants: &[Judged]) -> Vec<PolicyRow> {
    ordered(e)
        .into_iter()
        .enumerate()
        .map(|(n, r)| {
            let proofs = proofs_of(e, &r.id, &r.file);
            let covered = e
                .coverage
                .and_then(|c| c.policies.iter().find(|p| p.id == r.id));
            let own: Vec<&Judged> = mutants.iter().filter(|m| m.policy == r.id).collect();
            let count = |s: &str| own.iter().filter(|m| m.status == s).count();
            PolicyRow {
                row: format!("policy-{n}"),
                anchor: super::lines::anchor(e, &r.file, r.line),
                file: visible(&r.file),
                line: r.line,
                effect: match (r.effect, r.reason) {
                    (cedar_policy::Effect::Permit, _) => "permit".into(),
                    (_, Some(reason)) => format!("forbid ({})", reason.code()),
                    (_, None) => "forbid".into(),
                },
                description: visible(&r.description),
                change: status(e, &r.id),
                proved: proofs.iter().filter(|p| p.holds).count(),
                failed: proofs.iter().filter(|p| !p.holds).count(),
                proofs,
                fired: covered.map(|c| c.fired.len()),
                decided: covered.map(|c| c.decided.len()),
                mutated: e.mutants.is_ok() && !own.is_empty(),
                killed: count("killed"),
                equivalent: count("equivalent"),
                survived: count("survived"),
                killers: killers(&own),
                id: visible(&r.id),
            }
        })
        .collect()
}

/// What killed a policy's mutants, each with how many, most first.
fn killers(own: &[&Judged]) -> Vec<String> {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for m in own.iter().filter(|m| m.status == "killed") {
        let killer = m
            .killed_by_property
            .as_deref()
            .or(m.killed_by_fixture.as_deref())
            .unwrap_or("?");
        *by.entry(killer).or_default() += 1;
    }
    let mut listed: Vec<(&str, usize)> = by.into_iter().collect();
    listed.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    listed
        .into_iter()
        .map(|(k, n)| visible(&format!("{k} ({n})")))
        .collect()
}
