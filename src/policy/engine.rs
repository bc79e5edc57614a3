//! The evaluation hot path: Cedar's own evaluator over each policy's
//! condition, built once per policy set instead of once per request.
//!
//! Decision rule, as Cedar's authorizer: Allow when some permit is satisfied
//! and no forbid is; a policy that errors is skipped. On top of that, any
//! error at all denies (see `eval`). A test checks, case by case, that this
//! engine and `cedar_policy::Authorizer` agree on decisions and reasons.

use crate::policy::eval::Verdict;
use crate::policy::Policies;
use cedar_policy::PolicyId;
use cedar_policy_core::ast::{self, EntityUID, EntityUIDEntry};
use cedar_policy_core::entities::Entities;
use cedar_policy_core::evaluator::Evaluator;
use cedar_policy_core::extensions::Extensions;

struct Compiled {
    id: PolicyId,
    effect: ast::Effect,
    condition: ast::Expr,
    env: ast::SlotEnv,
}

/// Pre-built conditions of a policy set.
pub struct Engine {
    policies: Vec<Compiled>,
}

impl Engine {
    /// Build the conditions of every policy in the set.
    pub fn new(policies: &Policies) -> Engine {
        let set: &ast::PolicySet = policies.set.as_ref();
        Engine {
            policies: set
                .policies()
                .map(|p| Compiled {
                    id: PolicyId::new(p.id().as_ref()),
                    effect: p.effect(),
                    condition: p.condition(),
                    env: p.env().clone(),
                })
                .collect(),
        }
    }

    /// Evaluate every policy's condition on its own: `(id, Ok(satisfied))`
    /// or `(id, Err(error))`, in policy-set order (also what `explain` shows).
    pub fn each(
        &self,
        entities: &Entities,
        principal: &EntityUID,
        action: &EntityUID,
        resource: &EntityUID,
    ) -> Vec<(PolicyId, Result<bool, String>)> {
        self.outcomes(entities, principal, action, resource)
            .map(|(p, v)| (p.id.clone(), v))
            .collect()
    }

    fn outcomes<'a>(
        &'a self,
        entities: &'a Entities,
        principal: &EntityUID,
        action: &EntityUID,
        resource: &EntityUID,
    ) -> impl Iterator<Item = (&'a Compiled, Result<bool, String>)> + 'a {
        let request = ast::Request::new_unchecked(
            EntityUIDEntry::known(principal.clone(), None),
            EntityUIDEntry::known(action.clone(), None),
            EntityUIDEntry::known(resource.clone(), None),
            Some(ast::Context::empty()),
        );
        let evaluator = Evaluator::new(request, entities, Extensions::all_available());
        self.policies.iter().map(move |p| {
            let v = evaluator
                .interpret(&p.condition, &p.env)
                .map_err(|e| e.to_string())
                .and_then(|v| match v.value_kind() {
                    ast::ValueKind::Lit(ast::Literal::Bool(b)) => Ok(*b),
                    _ => Err(format!("condition evaluated to {v}, not a boolean")),
                });
            (p, v)
        })
    }

    /// Judge one request with an empty context.
    pub fn judge(
        &self,
        policies: &Policies,
        entities: &Entities,
        principal: &EntityUID,
        action: &EntityUID,
        resource: &EntityUID,
    ) -> Verdict {
        let mut permitted = false;
        let mut forbids = Vec::new();
        let mut errors = Vec::new();
        for (p, outcome) in self.outcomes(entities, principal, action, resource) {
            match outcome {
                Ok(true) => match p.effect {
                    ast::Effect::Permit => permitted = true,
                    ast::Effect::Forbid => {
                        if let Some(rule) = policies.rules.get(&p.id) {
                            forbids.push(rule.clone());
                        } else {
                            errors.push(format!("policy {} has no loaded annotations", p.id));
                        }
                    }
                },
                Ok(false) => {}
                Err(e) => errors.push(format!("policy {}: {e}", p.id)),
            }
        }
        forbids.sort_by(|a, b| (a.order, &a.id).cmp(&(b.order, &b.id)));
        Verdict {
            allowed: permitted && forbids.is_empty() && errors.is_empty(),
            forbids,
            errors,
        }
    }
}
