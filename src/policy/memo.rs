//! Judging each distinct situation once.
//!
//! Most registry rows differ only in identifiers (worker identity, session,
//! pid, start time) that the policies never inspect except by equality.
//! Cedar can observe a string value in exactly these ways: equality with
//! another value (`==`, `!=`, set membership), equality with a literal
//! written in a policy, and `like` patterns. A row's *situation key* keeps
//! every string that equals a policy literal or a value of the run entity,
//! and replaces every other string by a placeholder numbered by its first
//! occurrence in the row, tagged with the `like` patterns it matches. Two
//! rows with the same key are related by a renaming of strings that
//! preserves all of those observations, so Cedar's verdict for one is its
//! verdict for the other. Longs and booleans are kept exactly.
//!
//! The argument needs the policies to observe strings only in those ways
//! and to read the resource only through its attributes. A policy set that
//! does anything else (an extension function, tags, the resource's own id)
//! turns the memo off, and every row is evaluated on its own.

use crate::policy::entities::Attr;
use crate::policy::Policies;
use cedar_policy_core::ast::{self, BinaryOp, ExprKind, Literal, Pattern, Var};
use smol_str::SmolStr;
use std::collections::HashSet;
use std::fmt::Write;

/// What the policy set can observe about strings.
pub struct Abstraction {
    literals: HashSet<SmolStr>,
    patterns: Vec<Pattern>,
    disabled: Option<String>,
}

impl Abstraction {
    /// Analyse the policy set. `run_strings` are the strings of the run
    /// entity (equal for every row, so kept verbatim).
    pub fn new(policies: &Policies, run_attrs: &[(&'static str, Attr<'_>)]) -> Abstraction {
        let set: &ast::PolicySet = policies.set.as_ref();
        let mut literals: HashSet<SmolStr> = HashSet::new();
        for (_, attr) in run_attrs {
            match attr {
                Attr::Str(t) => {
                    literals.insert(SmolStr::from(t.as_ref()));
                }
                Attr::Set(items) => {
                    literals.extend(items.iter().map(|t| SmolStr::from(t.as_ref())))
                }
                Attr::Bool(_) | Attr::Long(_) => {}
            }
        }
        let mut patterns = Vec::new();
        let mut disabled = None;
        for policy in set.policies() {
            let condition = policy.condition();
            let mut resource_uses = 0usize;
            let mut resource_attribute_uses = 0usize;
            for e in condition.subexpressions() {
                match e.expr_kind() {
                    ExprKind::Lit(Literal::String(s)) => {
                        literals.insert(s.clone());
                    }
                    ExprKind::Lit(Literal::EntityUID(uid))
                        if uid.entity_type().to_string() == "FleetRetire::Worker" =>
                    {
                        disabled = Some(format!("policy {} names a worker entity", policy.id()));
                    }
                    ExprKind::Like { pattern, .. } => patterns.push(pattern.clone()),
                    ExprKind::ExtensionFunctionApp { fn_name, .. } => {
                        disabled = Some(format!("policy {} calls {fn_name}", policy.id()));
                    }
                    ExprKind::BinaryApp {
                        op: BinaryOp::GetTag | BinaryOp::HasTag,
                        ..
                    } => {
                        disabled = Some(format!("policy {} reads tags", policy.id()));
                    }
                    ExprKind::Var(Var::Resource) => resource_uses += 1,
                    ExprKind::GetAttr { expr, .. } | ExprKind::HasAttr { expr, .. }
                        if matches!(expr.expr_kind(), ExprKind::Var(Var::Resource)) =>
                    {
                        resource_attribute_uses += 1
                    }
                    ExprKind::ExtHasAttr { expr, .. }
                        if matches!(expr.expr_kind(), ExprKind::Var(Var::Resource)) =>
                    {
                        resource_attribute_uses += 1
                    }
                    ExprKind::Is { expr, .. }
                        if matches!(expr.expr_kind(), ExprKind::Var(Var::Resource)) =>
                    {
                        resource_attribute_uses += 1
                    }
                    _ => {}
                }
            }
            if resource_uses > resource_attribute_uses {
                disabled = Some(format!(
                    "policy {} uses the resource other than through its attributes",
                    policy.id()
                ));
            }
        }
        Abstraction {
            literals,
            patterns,
            disabled,
        }
    }

    /// Why memoisation is off, if it is.
    pub fn disabled(&self) -> Option<&str> {
        self.disabled.as_deref()
    }

    /// Write the situation key of a worker's attributes into `out`;
    /// `false` (and nothing written) when the memo is off.
    pub fn key(&self, attrs: &[(&'static str, Attr<'_>)], out: &mut String) -> bool {
        out.clear();
        if self.disabled.is_some() {
            return false;
        }
        let mut placeholders: Vec<&str> = Vec::new();
        for (name, value) in attrs {
            out.push_str(name);
            out.push('=');
            match value {
                Attr::Bool(b) => out.push(if *b { 'T' } else { 'F' }),
                Attr::Long(n) => {
                    let _ = write!(out, "L{n}");
                }
                Attr::Str(t) => self.encode(t, &mut placeholders, out),
                Attr::Set(items) => {
                    out.push('[');
                    for t in items {
                        self.encode(t, &mut placeholders, out);
                        out.push(',');
                    }
                    out.push(']');
                }
            }
            out.push(';');
        }
        true
    }

    fn encode<'v>(&self, s: &'v str, placeholders: &mut Vec<&'v str>, out: &mut String) {
        if self.literals.contains(s) {
            let _ = write!(out, "S{}:{s}", s.len());
            return;
        }
        let k = match placeholders.iter().position(|p| *p == s) {
            Some(k) => k,
            None => {
                placeholders.push(s);
                placeholders.len() - 1
            }
        };
        let _ = write!(out, "P{k}/");
        for p in &self.patterns {
            out.push(if p.wildcard_match(s) { '1' } else { '0' });
        }
    }
}
