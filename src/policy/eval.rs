//! Asking Cedar about one row, and reading the answer fail-closed.
//!
//! The determining forbids of a Deny become the reason codes, lowest
//! `@order` first. Any evaluation error, or a Deny that no forbid explains,
//! is `policy_evaluation_error`: Cedar skips a policy that errors, so an
//! error must never let a row through.

use crate::policy::{Policies, Rule};
use crate::reasons::Reason;
use cedar_policy::{Authorizer, Context, Decision, Entities, EntityUid, Request};

/// Cedar's verdict on one request.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Allowed, with no error anywhere.
    pub allowed: bool,
    /// Determining forbids, lowest `@order` first.
    pub forbids: Vec<Rule>,
    /// Evaluation errors (any error denies).
    pub errors: Vec<String>,
}

impl Verdict {
    /// The reason codes, in order, without repeats; a Deny with nothing to
    /// say for itself, or any error, leads with `policy_evaluation_error`.
    pub fn reason_codes(&self) -> Vec<Reason> {
        let mut out = Vec::new();
        if self.allowed {
            return out;
        }
        if !self.errors.is_empty() || self.forbids.is_empty() {
            out.push(Reason::PolicyEvaluationError);
        }
        for rule in &self.forbids {
            if let Some(r) = rule.reason {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
        out
    }
}

/// Evaluate `principal action resource` against the loaded policies.
pub fn judge(
    policies: &Policies,
    authorizer: &Authorizer,
    entities: &Entities,
    principal: &EntityUid,
    action: &EntityUid,
    resource: &EntityUid,
) -> Verdict {
    let request = match Request::new(
        principal.clone(),
        action.clone(),
        resource.clone(),
        Context::empty(),
        None,
    ) {
        Ok(r) => r,
        Err(e) => {
            return Verdict {
                allowed: false,
                forbids: Vec::new(),
                errors: vec![format!("request: {e}")],
            }
        }
    };
    let response = authorizer.is_authorized(&request, &policies.set, entities);
    let errors: Vec<String> = response
        .diagnostics()
        .errors()
        .map(|e| e.to_string())
        .collect();
    let mut forbids: Vec<Rule> = response
        .diagnostics()
        .reason()
        .filter_map(|id| policies.rules.get(id))
        .filter(|r| r.effect == cedar_policy::Effect::Forbid)
        .cloned()
        .collect();
    forbids.sort_by(|a, b| (a.order, &a.id).cmp(&(b.order, &b.id)));
    Verdict {
        allowed: response.decision() == Decision::Allow && errors.is_empty(),
        forbids,
        errors,
    }
}
