//! What a host's scoped read (`store/scope.rs`) assumes of the policies,
//! checked on the loaded set before a scoped plan is trusted.
//!
//! The scoped read fetches, beside this host's active rows, only the
//! *active* rows that share a key with them (and every row of the same
//! identity), and it never reads this host's other rows. That is exact only
//! while:
//!
//! 1. a row holds identity evidence (`hold_<kind>`) or claims its slot
//!    (`claim_instance_slot`) only when its status is exactly `active`:
//!    every policy, permit or forbid, that can answer one of those actions
//!    opens its first `when` with `resource.status == "active" && …`, so it
//!    is false on any other row before anything that could fail is
//!    evaluated (an evaluation error counts as a yes in the first stage);
//!    and no first-stage policy reads `identity_row_count`, which the
//!    scoped read makes exact only for this host's rows;
//! 2. a row whose status is not exactly `active` is never a candidate: a
//!    `forbid` on `retire` whose whole condition is
//!    `resource.status != "active"`.
//!
//! A policy set that does not show both, syntactically, is refused for
//! `--scope host` (the whole plan still runs), naming the policy: a policy
//! that starts counting a terminal row as a holder would otherwise meet a
//! query that does not fetch it. (`occupy_instance_slot` is counted only
//! among claimants, so it needs nothing.)

use super::entities::FIRST_STAGE_ACTIONS;
use super::Policies;
use serde_json::Value as Json;

/// The first-stage actions whose permits must require an active row:
/// all but `occupy_instance_slot`.
const NEEDS_ACTIVE: &[&str] = FIRST_STAGE_ACTIONS.split_last().unwrap().1;

/// The actions that judge worker rows: the first stage's, and `retire`.
fn worker_actions() -> impl Iterator<Item = &'static str> {
    FIRST_STAGE_ACTIONS.iter().copied().chain(["retire"])
}

/// Per worker action, the actions (as `type::"id"`) a scope `in` one of
/// them covers it: itself and its groups in the schema.
fn groups(policies: &Policies) -> Result<Vec<(&'static str, Vec<String>)>, String> {
    let entities = policies
        .schema
        .action_entities()
        .map_err(|e| format!("the schema's actions cannot be read: {e}"))?;
    Ok(worker_actions()
        .map(|a| {
            let uid: cedar_policy::EntityUid = format!("FleetRetire::Action::\"{a}\"")
                .parse()
                .expect("a worker action's uid parses");
            let mut names = vec![uid.to_string()];
            names.extend(
                entities
                    .ancestors(&uid)
                    .into_iter()
                    .flatten()
                    .map(|g| g.to_string()),
            );
            (a, names)
        })
        .collect())
}

/// `Ok` when the set shows both assumptions; otherwise what breaks which,
/// for the operator.
pub fn scope_assumptions(policies: &Policies) -> Result<(), String> {
    if policies.set.templates().next().is_some() {
        return Err("the policy set holds templates, which this check cannot read".into());
    }
    let groups = groups(policies)?;
    let mut terminal_forbidden = false;
    for policy in policies.set.policies() {
        let id = policy.id().to_string();
        let json = policy
            .to_json()
            .map_err(|e| format!("policy {id} cannot be read as JSON: {e}"))?;
        let actions = actions_of(&json["action"], &groups);
        first_stage_policy(&id, &json, &actions)?;
        if policy.effect() == cedar_policy::Effect::Forbid {
            let only_when = json["conditions"].as_array().is_some_and(|c| {
                c.len() == 1 && c[0]["kind"] == "when" && is_status_active(&c[0]["body"], "!=")
            });
            terminal_forbidden |= only_when && actions.iter().any(|a| a == "retire");
        }
    }
    if !terminal_forbidden {
        return Err(
            "no policy forbids retire exactly when resource.status != \"active\": \
                    a host's scoped read counts its rows of other statuses without reading \
                    them, so it must know none of them can be a candidate"
                .into(),
        );
    }
    Ok(())
}

/// The worker actions a policy's action scope applies to (all of them for
/// `action` alone).
fn actions_of(scope: &Json, groups: &[(&'static str, Vec<String>)]) -> Vec<String> {
    let name = |e: &Json| -> Option<String> {
        let uid = cedar_policy::EntityUid::from_json(e.clone()).ok()?;
        Some(uid.to_string())
    };
    let named: Vec<String> = match scope["op"].as_str() {
        Some("==") => {
            let Some(one) = name(&scope["entity"]) else {
                return worker_actions().map(String::from).collect();
            };
            return groups
                .iter()
                .filter(|(_, names)| names[0] == one)
                .map(|(a, _)| a.to_string())
                .collect();
        }
        Some("in") => match scope["entities"].as_array() {
            Some(list) => list.iter().filter_map(name).collect(),
            None => name(&scope["entity"]).into_iter().collect(),
        },
        _ => return worker_actions().map(String::from).collect(),
    };
    groups
        .iter()
        .filter(|(_, names)| names.iter().any(|n| named.contains(n)))
        .map(|(a, _)| a.to_string())
        .collect()
}

/// What a policy answering a first-stage action must show:
///
/// * one answering an action of [`NEEDS_ACTIVE`], permit or forbid alike,
///   opens its first condition with `when { resource.status == "active" &&
///   …`, so that on a row of another status it is false before anything
///   else is evaluated. An evaluation error counts as a yes in the first
///   stage (fail closed), so a policy that could *error* on a terminal row
///   would make it a holder the scoped read never fetches;
/// * none reads `identity_row_count`: the scoped read counts a peer row's
///   identity only over the rows it fetched, not over the registry.
fn first_stage_policy(id: &str, json: &Json, actions: &[String]) -> Result<(), String> {
    let first_stage = |a: &&String| FIRST_STAGE_ACTIONS.contains(&a.as_str());
    if let Some(action) = actions.iter().find(first_stage) {
        if reads_attr(json, "identity_row_count") {
            return Err(format!(
                "policy {id} answers {action} and reads resource.identity_row_count: a host's \
                 scoped read counts a peer row's identity over the rows it fetched, not over \
                 the registry"
            ));
        }
    }
    let Some(action) = actions.iter().find(|a| NEEDS_ACTIVE.contains(&a.as_str())) else {
        return Ok(());
    };
    let first = &json["conditions"][0];
    if first["kind"] == "when" && is_status_active(leftmost(&first["body"]), "==") {
        return Ok(());
    }
    Err(format!(
        "policy {id} answers {action} without opening its first `when` with \
         resource.status == \"active\" &&: a row of another status could then hold \
         evidence or claim a slot (an evaluation error counts as a yes), and a host's scoped \
         read does not fetch such rows"
    ))
}

/// The first operand Cedar evaluates of a chain of `&&`.
fn leftmost(e: &Json) -> &Json {
    match e.get("&&") {
        Some(and) => leftmost(&and["left"]),
        None => e,
    }
}

/// Whether any part of `e` reads (or tests for) the attribute `attr`.
fn reads_attr(e: &Json, attr: &str) -> bool {
    match e {
        Json::Object(map) => map
            .iter()
            .any(|(k, v)| ((k == "." || k == "has") && v["attr"] == attr) || reads_attr(v, attr)),
        Json::Array(list) => list.iter().any(|v| reads_attr(v, attr)),
        _ => false,
    }
}

/// `e` is `resource.status <op> "active"` (either side first).
fn is_status_active(e: &Json, op: &str) -> bool {
    let Some(cmp) = e.get(op) else {
        return false;
    };
    let status = |x: &Json| x["."]["left"]["Var"] == "resource" && x["."]["attr"] == "status";
    let active = |x: &Json| x["Value"] == "active";
    (status(&cmp["left"]) && active(&cmp["right"]))
        || (active(&cmp["left"]) && status(&cmp["right"]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{embedded, PolicySource};

    /// The built-in set with `retirement.cedar` edited by `edit`.
    fn edited(edit: impl Fn(&str) -> String) -> Policies {
        let files: Vec<(String, String)> = [
            "schema.cedarschema",
            "retirement.cedar",
            "capabilities.cedar",
        ]
        .iter()
        .map(|n| {
            let text = embedded(n);
            let text = if *n == "retirement.cedar" {
                edit(text)
            } else {
                text.to_string()
            };
            (n.to_string(), text)
        })
        .collect();
        Policies::from_texts(&files, "edited".into()).expect("the edited set loads")
    }

    /// The built-in set shows both assumptions.
    #[test]
    fn the_built_in_policies_keep_a_scope_exact() {
        let policies = Policies::load(&PolicySource::Embedded).unwrap();
        assert_eq!(scope_assumptions(&policies), Ok(()));
        assert_eq!(NEEDS_ACTIVE.len(), 5);
        assert!(!NEEDS_ACTIVE.contains(&"occupy_instance_slot"));
    }

    /// A policy that starts reading a peer fact the scoped query does not
    /// fetch (a row of another status holding evidence, or claiming a
    /// slot), or lets a terminal row through, is named and refused.
    #[test]
    fn a_policy_reading_rows_the_scope_does_not_fetch_is_refused() {
        let holds = "  resource.status == \"active\" &&\n  ((resource.heartbeat_parsed";
        let claims = "when { resource.status == \"active\" };";
        let terminal = "when { resource.status != \"active\" };";
        for (what, from, to, names) in [
            (
                "hold",
                holds,
                "  resource.status != \"\" &&\n  ((resource.heartbeat_parsed",
                "may-hold-identity-evidence",
            ),
            (
                "claim",
                claims,
                "when { resource.status != \"\" };",
                "active-rows-claim-their-slot",
            ),
            (
                "terminal",
                terminal,
                "when { resource.status != \"active\" && resource.status != \"released\" };",
                "forbids retire",
            ),
        ] {
            let base = embedded("retirement.cedar");
            assert!(base.contains(from), "{what}: the built-in text changed");
            let policies = edited(|t| t.replacen(from, to, 1));
            let refused = scope_assumptions(&policies).expect_err(what);
            assert!(refused.contains(names), "{what}: {refused}");
        }
    }

    /// Attacks on the check: a set that passes a weaker reading of it yet
    /// lets a row the scoped read does not fetch change a verdict.
    /// * the status test not first: `heartbeat_age_us + 1` overflows on a
    ///   terminal row whose age is the largest long, the error counts as a
    ///   yes, and that terminal row holds evidence;
    /// * a forbid on `hold_pid` that errors on a terminal row (the same);
    /// * a hold that reads `identity_row_count`, which a peer row has
    ///   counted over the scope alone.
    #[test]
    fn a_first_stage_policy_that_can_count_an_unfetched_row_is_refused() {
        let holds = "  resource.status == \"active\" &&\n  ((resource.heartbeat_parsed";
        let forbid = "\n@id(\"attack-forbid\")\n@reason(\"conflicting_identity_evidence\")\n\
            @order(\"10\")\n@description(\"x\")\nforbid (principal, \
            action == FleetRetire::Action::\"hold_pid\", resource)\n\
            when { resource.heartbeat_age_us + 9223372036854775807 > 0 };\n";
        type Edit = Box<dyn Fn(&str) -> String>;
        let attacks: [(&str, Edit, &str); 3] = [
            (
                "status not first",
                Box::new(move |t: &str| {
                    t.replacen(
                        holds,
                        "  (resource.heartbeat_age_us + 1 > 0 || true) &&\n  \
                         resource.status == \"active\" &&\n  ((resource.heartbeat_parsed",
                        1,
                    )
                }),
                "may-hold-identity-evidence",
            ),
            (
                "erring forbid",
                Box::new(move |t: &str| format!("{t}{forbid}")),
                "attack-forbid",
            ),
            (
                "identity count",
                Box::new(move |t: &str| {
                    t.replacen(
                        holds,
                        "  resource.status == \"active\" &&\n  \
                         resource.identity_row_count < 2 &&\n  ((resource.heartbeat_parsed",
                        1,
                    )
                }),
                "identity_row_count",
            ),
        ];
        for (what, edit, names) in attacks {
            let policies = edited(|t| edit(t));
            let refused = scope_assumptions(&policies).expect_err(what);
            assert!(refused.contains(names), "{what}: {refused}");
        }
    }
}
