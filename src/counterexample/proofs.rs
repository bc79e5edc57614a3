//! The counterexamples of `policy verify`, made plain: a policy that
//! errors, a property the policies break, a forbid that decides.

use super::{allows, case_of, described, errors, minimise, say, say_error, Plain, Request};
use crate::error::{Error, Result};
use cedar_policy::{Entities, Policy, PolicySet, Schema};

fn one(policy: &Policy) -> Result<PolicySet> {
    PolicySet::from_policies([policy.clone()]).map_err(|e| Error::Internal {
        doing: "making a one-policy set".into(),
        source: Box::new(e),
    })
}

/// A request on which `policy` errors.
pub fn erring(env: &cedar_policy_symcc::Env, policy: &Policy, schema: &Schema) -> Result<Plain> {
    let alone = one(policy)?;
    let raw = case_of(
        env,
        &format!("policy verify: {} errors", policy.id()),
        "Found by `fleet-retire policy verify`: Cedar skips a policy that errors, and the \
         program keeps the row. The case expects the deny an error gives.",
        false,
    )?;
    let shows = |e: &Entities, r: &Request| errors(&alone, e, r);
    let (mut case, deciding) = minimise(&raw, schema, &shows);
    let sentence = say_error(&case, &deciding, policy.id().as_ref());
    described(&mut case, &sentence);
    Ok(Plain {
        sentence,
        deciding,
        case,
    })
}

/// A request on which the policies (`subject`) and the property decide
/// otherwise than the proof requires: for a ceiling
/// (`subject_implies_property`) the policies allow what the property
/// refuses; for a floor the property allows what the policies refuse. The
/// case expects the property's decision, so it fails until the policies
/// are mended.
pub fn breaking(
    env: &cedar_policy_symcc::Env,
    subject: &PolicySet,
    property: &Policy,
    ceiling: bool,
    schema: &Schema,
) -> Result<Plain> {
    let prop = one(property)?;
    let id = property.id().to_string();
    let raw = case_of(
        env,
        &format!("policy verify: property {id}"),
        &format!(
            "Found by `fleet-retire policy verify`: it breaks property {id}. The case expects \
             the property's decision, so it fails until the policies keep it."
        ),
        !ceiling,
    )?;
    let shows = |e: &Entities, r: &Request| {
        allows(subject, e, r) == ceiling && allows(&prop, e, r) != ceiling
    };
    let (mut case, deciding) = minimise(&raw, schema, &shows);
    let sentence = say(
        &case,
        &deciding,
        ("the policies", ceiling),
        (&format!("property {id}"), !ceiling),
    );
    described(&mut case, &sentence);
    Ok(Plain {
        sentence,
        deciding,
        case,
    })
}

/// A request the set `without` one forbid allows and the `whole` set
/// refuses: what the forbid decides on its own.
pub fn deciding(
    env: &cedar_policy_symcc::Env,
    whole: &PolicySet,
    without: &PolicySet,
    forbid: &str,
    schema: &Schema,
) -> Result<Plain> {
    let raw = case_of(
        env,
        &format!("policy verify: {forbid} decides"),
        "Found by `fleet-retire policy verify`: only this forbid keeps the row.",
        false,
    )?;
    let shows = |e: &Entities, r: &Request| allows(without, e, r) && !allows(whole, e, r);
    let (mut case, deciding) = minimise(&raw, schema, &shows);
    let sentence = say(
        &case,
        &deciding,
        (&format!("the set without {forbid}"), true),
        ("the set", false),
    );
    described(&mut case, &sentence);
    Ok(Plain {
        sentence,
        deciding,
        case,
    })
}
