//! What the capability policies read of a profile: the roles and the
//! operations they compare its `role` and `allowed_operations` with. A
//! profile naming a role no policy reads, or an operation one letter off
//! one they read (`Reconciler`, `gitea.worker_registry.retrie`), is denied
//! without a word from the policies; `grants` warns about it with the
//! nearest name it meant.

use crate::policy::Policies;
use serde_json::Value;
use std::collections::BTreeSet;

/// The roles and operations the loaded policies compare a profile's with,
/// and the fleet's own roles (its namespaces).
#[derive(Debug, Default)]
pub struct Known {
    /// Roles: the fleet's namespaces and every role a policy names.
    pub roles: BTreeSet<String>,
    /// Operations a policy looks for in `allowed_operations`.
    pub operations: BTreeSet<String>,
}

impl Known {
    /// Read them from every policy of `policies` (as Cedar's JSON form),
    /// with `fleet_roles` besides.
    pub fn of(policies: &Policies, fleet_roles: &[&str]) -> Known {
        let mut known = Known::default();
        known
            .roles
            .extend(fleet_roles.iter().map(|r| (*r).to_string()));
        for policy in policies.set.policies() {
            if let Ok(json) = policy.to_json() {
                collect(&json, &mut known);
            }
        }
        known
    }

    /// The known role nearest to `role` when it is not one.
    pub fn role_near(&self, role: &str) -> Option<Option<&str>> {
        (!self.roles.contains(role)).then(|| nearest(role, &self.roles))
    }

    /// The known operation `op` is probably a misspelling of, when it is
    /// not known itself (other tools' operations, far from every known
    /// one, are not ours to warn about).
    pub fn operation_near(&self, op: &str) -> Option<&str> {
        if self.operations.contains(op) {
            return None;
        }
        nearest(op, &self.operations)
    }
}

/// The member of `known` within two edits of `name` (letter case aside),
/// the closest first.
fn nearest<'a>(name: &str, known: &'a BTreeSet<String>) -> Option<&'a str> {
    let folded = name.trim().to_lowercase();
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(&folded, &k.to_lowercase()), k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k.as_str())
}

/// The attribute of `principal` an expression of Cedar's JSON form reads at
/// its top (`principal.role`), if it is one.
fn principal_attr(e: &Value) -> Option<&str> {
    let dot = e.get(".")?;
    if dot.get("left")?.get("Var")?.as_str()? != "principal" {
        return None;
    }
    dot.get("attr")?.as_str()
}

/// Every string literal in an expression.
fn literals(e: &Value, out: &mut BTreeSet<String>) {
    match e {
        Value::Object(map) => {
            if let Some(Value::String(s)) = map.get("Value") {
                out.insert(s.clone());
            }
            map.values().for_each(|v| literals(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| literals(v, out)),
        _ => {}
    }
}

/// The literals every binary operation compares `principal.role` or
/// `principal.allowed_operations` with (`==`, `contains`, `in`, …).
fn collect(e: &Value, known: &mut Known) {
    match e {
        Value::Object(map) => {
            for op in map.values() {
                if let (Some(l), Some(r)) = (op.get("left"), op.get("right")) {
                    for (side, other) in [(l, r), (r, l)] {
                        match principal_attr(side) {
                            Some("role") => literals(other, &mut known.roles),
                            Some("allowed_operations") => literals(other, &mut known.operations),
                            _ => {}
                        }
                    }
                }
            }
            map.values().for_each(|v| collect(v, known));
        }
        Value::Array(items) => items.iter().for_each(|v| collect(v, known)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_policies_name_their_roles_and_operations() {
        let policies = Policies::load(&crate::policy::PolicySource::Embedded).unwrap();
        let known = Known::of(&policies, &["author"]);
        for role in ["controller", "reconciler", "author"] {
            assert!(known.roles.contains(role), "{known:?}");
        }
        for op in ["gitea.read", "gitea.worker_registry.retire"] {
            assert!(known.operations.contains(op), "{known:?}");
        }
        assert_eq!(known.role_near("Reconciler"), Some(Some("reconciler")));
        assert_eq!(known.role_near("controller"), None);
        assert_eq!(known.role_near("janitor"), Some(None));
        assert_eq!(
            known.operation_near("gitea.worker_registry.retrie"),
            Some("gitea.worker_registry.retire")
        );
        assert_eq!(known.operation_near("gitea.pr.create"), None);
        assert_eq!(known.operation_near("gitea.read"), None);
    }
}
