//! Which policies break a failing property, so the page charges the
//! failure once, to them, and not to every policy the property is about.
//!
//! With a base, each policy that differs from it is put back as the base
//! has it, one at a time, and the property proved again: those that make
//! it hold again are the change that breaks it. Otherwise (or when no one
//! policy does) the counterexample says: for a ceiling, the permits that
//! let it through (no forbid refuses it); for a floor, the forbids that
//! refuse it, each deleted and the property proved again, as
//! `tests/policies.rs` deletes forbids. A policy that can error breaks its
//! own never-errors proof.

use crate::error::Result;
use crate::policy::Policies;
use crate::verify::{Proof, Property, Verification};
use cedar_policy::PolicyId;
use std::collections::BTreeMap;

/// What breaks one failing property.
#[derive(Debug, Clone)]
pub struct Blame {
    /// The policies (`@id`), in file order; a policy the change removed
    /// may be among them.
    pub policies: Vec<String>,
    /// How they were found, in words.
    pub how: String,
}

/// Per failing property id, what breaks it; `base` is the base's name and
/// policies, when it was compared. Needs cvc5 (properties are proved
/// again).
pub fn blame(
    policies: &Policies,
    properties: &[Property],
    verification: &Verification,
    base: Option<(&str, &Policies)>,
) -> Result<BTreeMap<String, Blame>> {
    let mut out = BTreeMap::new();
    for proof in verification.proofs.iter().filter(|p| !p.holds) {
        if out.contains_key(&proof.id) {
            continue;
        }
        if let Some(id) = proof.id.strip_prefix("never-errors:") {
            let how = "it can error, and Cedar skips a policy that errors".to_string();
            out.insert(
                proof.id.clone(),
                Blame {
                    policies: vec![id.to_string()],
                    how,
                },
            );
            continue;
        }
        let Some(property) = properties.iter().find(|p| p.id == proof.id) else {
            continue;
        };
        let reverted = match base {
            Some((name, old)) => by_reverting(policies, old, property, name)?,
            None => None,
        };
        let found = match reverted {
            Some(b) => b,
            None => by_counterexample(policies, property, proof)?,
        };
        out.insert(proof.id.clone(), found);
    }
    Ok(out)
}

/// The policies that differ between the set and the base (changed, added
/// or removed), in file order (the set's, then the base's).
fn changed(policies: &Policies, old: &Policies) -> Vec<String> {
    let text = |set: &Policies, id: &str| set.set.policy(&PolicyId::new(id)).map(|p| p.to_string());
    let mut rules: Vec<&crate::policy::Rule> = policies.ordered_rules();
    rules.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    let mut old_rules: Vec<&crate::policy::Rule> = old.ordered_rules();
    old_rules.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    let mut out: Vec<String> = Vec::new();
    for r in rules.into_iter().chain(old_rules) {
        if text(policies, &r.id) != text(old, &r.id) && !out.contains(&r.id) {
            out.push(r.id.clone());
        }
    }
    out
}

/// Whether every proof of `property` holds of `set`.
fn holds(set: &Policies, property: &Property) -> Result<bool> {
    Ok(crate::verify::prove(set, std::slice::from_ref(property))?
        .iter()
        .all(|p| p.holds))
}

/// The changed policies each of which, put back as the base has it, makes
/// the property hold again.
fn by_reverting(
    policies: &Policies,
    old: &Policies,
    property: &Property,
    name: &str,
) -> Result<Option<Blame>> {
    let mut found = Vec::new();
    for id in changed(policies, old) {
        let before = old.set.policy(&PolicyId::new(&id)).cloned();
        let Ok(reverted) = policies.with_replaced(&id, before) else {
            continue;
        };
        if holds(&reverted, property)? {
            found.push(id);
        }
    }
    Ok((!found.is_empty()).then(|| Blame {
        policies: found,
        how: format!("the property holds again with it as {name} has it"),
    }))
}

/// The policies that decide the counterexample: for a ceiling the permits
/// that let it through; for a floor the forbids that refuse it whose
/// deletion makes the property hold (or, when none alone does, all of
/// them).
fn by_counterexample(policies: &Policies, property: &Property, proof: &Proof) -> Result<Blame> {
    let Some(witness) = &proof.witness else {
        return Ok(Blame {
            policies: Vec::new(),
            how: "no counterexample to attribute it by".into(),
        });
    };
    let ceiling = property.proof == "subject_implies_property";
    let deciding = deciding(policies, &witness.case);
    if ceiling {
        return Ok(Blame {
            policies: deciding,
            how: "it lets the counterexample through, and no forbid refuses it".into(),
        });
    }
    let mut found = Vec::new();
    for id in &deciding {
        if let Ok(without) = policies.with_replaced(id, None) {
            if holds(&without, property)? {
                found.push(id.clone());
            }
        }
    }
    Ok(match found.is_empty() {
        true => Blame {
            policies: deciding,
            how: "it refuses the counterexample".into(),
        },
        false => Blame {
            policies: found,
            how: "the property holds once it is deleted".into(),
        },
    })
}

/// The policies Cedar names as deciding a fixture case's request, in
/// file order.
fn deciding(policies: &Policies, case: &serde_json::Value) -> Vec<String> {
    let uid = |role: &str| -> Option<cedar_policy::EntityUid> {
        let r = &case["request"][role];
        Some(cedar_policy::EntityUid::from_type_name_and_id(
            r["type"].as_str()?.parse().ok()?,
            cedar_policy::EntityId::new(r["id"].as_str()?),
        ))
    };
    let entities =
        cedar_policy::Entities::from_json_value(case["entities"].clone(), Some(&policies.schema));
    let (Some(principal), Some(action), Some(resource), Ok(entities)) =
        (uid("principal"), uid("action"), uid("resource"), entities)
    else {
        return Vec::new();
    };
    let Ok(request) = cedar_policy::Request::new(
        principal,
        action,
        resource,
        cedar_policy::Context::empty(),
        None,
    ) else {
        return Vec::new();
    };
    let answer = cedar_policy::Authorizer::new().is_authorized(&request, &policies.set, &entities);
    let mut ids: Vec<&crate::policy::Rule> = answer
        .diagnostics()
        .reason()
        .filter_map(|id| policies.rules.get(id))
        .collect();
    ids.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    ids.into_iter().map(|r| r.id.clone()).collect()
}
