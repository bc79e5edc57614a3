//! The page's grants matrix: every profile of profiles.json (and, with
//! `--against`, every profile of the earlier file, a removed one included)
//! by every operation, allowed or denied, what the edit changed, and the
//! capability properties about each operation.

use super::view::{GrantCell, GrantRow, Grants};
use super::{visible, GrantsSeen};
use crate::capability::Operation;
use crate::verify::{Property, Verification};
use std::collections::BTreeSet;

/// The capability properties about `op`, each with whether it was proved.
fn proofs_about(op: &str, properties: &[Property], v: &Verification) -> String {
    let about: Vec<String> = properties
        .iter()
        .filter(|p| p.subject == "capabilities.cedar")
        .filter(|p| crate::diff::names_action(&p.policy, op))
        .map(|p| {
            let holds = v.proofs.iter().filter(|x| x.id == p.id).all(|x| x.holds);
            format!("{} {}", p.id, if holds { "proved" } else { "FAILED" })
        })
        .collect();
    visible(&about.join("; "))
}

/// The matrix.
pub fn matrix(g: &GrantsSeen, properties: &[Property], v: &Verification) -> Grants {
    let operations: Vec<String> = Operation::ALL.iter().map(|o| o.code().into()).collect();
    let before = g.against.as_ref().map(|(_, m)| m);
    let names: BTreeSet<&String> = g
        .now
        .keys()
        .chain(before.into_iter().flat_map(|m| m.keys()))
        .collect();
    let allowed = |m: Option<&crate::capability::Grants>, p: &str, op: &str| {
        m.and_then(|m| m.get(p))
            .and_then(|ops| ops.get(op))
            .copied()
            .unwrap_or(false)
    };
    let rows = names
        .into_iter()
        .enumerate()
        .map(|(r, profile)| GrantRow {
            profile: visible(profile),
            cells: operations
                .iter()
                .enumerate()
                .map(|(c, op)| {
                    let now = allowed(Some(&g.now), profile, op);
                    let change = match before.map(|b| allowed(Some(b), profile, op)) {
                        Some(false) if now => "granted",
                        Some(true) if !now => "revoked",
                        _ => "",
                    };
                    GrantCell {
                        anchor: format!("grant-{r}-{c}"),
                        operation: op.clone(),
                        allowed: now,
                        change,
                        proofs: proofs_about(op, properties, v),
                    }
                })
                .collect(),
            removed: before.is_some() && !g.now.contains_key(profile),
        })
        .collect();
    Grants {
        proved_by: operations
            .iter()
            .map(|op| proofs_about(op, properties, v))
            .collect(),
        file: visible(&g.file),
        against: g.against.as_ref().map(|(f, _)| visible(f)),
        operations,
        rows,
        warnings: g
            .warnings
            .iter()
            .enumerate()
            .map(|(n, (_, w))| (visible(w), format!("warning-{n}")))
            .collect(),
    }
}
