//! Every single-point mutant of a policy set, made on the policies' Cedar
//! JSON form (`Policy::to_json`), never on their text.
//!
//! Operators, each applied at one place:
//! * `comparison`: `<` ↔ `<=`, `>` ↔ `>=`, `==` ↔ `!=`;
//! * `drop-conjunct` / `drop-disjunct`: `a && b` becomes `a` or `b`;
//! * `negate-condition` (`when` ↔ `unless`) and `delete-condition`;
//! * `long-literal`: ±1, ×10, ÷10; `string-literal`: another string literal
//!   of the set, or `""`; `like-widened`: one more `*` in a pattern;
//! * `set-element-dropped`: one element of a set literal left out;
//! * `attribute`: `x.a` becomes `x.b`, `b` of the same type on the same
//!   entity type (from the schema);
//! * `delete-forbid`; `widen-scope` (a permit's principal, action or
//!   resource constraint dropped); `narrow-scope` (one action left out of a
//!   policy's `action in [...]`).

use super::render::{cut, render};
use serde_json::{json, Value as Json};
use std::collections::{BTreeMap, BTreeSet};

/// One mutant: which policy, how, and the policy that replaces it.
#[derive(Debug, Clone)]
pub struct Mutant {
    /// The mutated policy's `@id`.
    pub policy: String,
    /// The operator's name (module docs).
    pub operator: &'static str,
    /// The mutated place before, as Cedar text (cut for reports).
    pub before: String,
    /// The same, whole: what [`super::locate`] looks for in the policy's
    /// text (empty for a deleted forbid, which is the whole policy).
    pub place: String,
    /// Which of the policy's sub-expressions that read as `place` it is
    /// (0 for the first in the text): the same text may stand twice.
    pub occurrence: usize,
    /// Where the place stands in its file, once [`super::mutants`] has
    /// found it.
    pub at: Option<super::locate::Span>,
    /// The mutated place after.
    pub after: String,
    /// The mutated policy as Cedar JSON; `None` when the policy is deleted.
    pub replacement: Option<Json>,
}

/// One change of an expression: the whole new expression and what moved.
struct Edit {
    expr: Json,
    operator: &'static str,
    before: String,
    place: String,
    /// The edited node's JSON pointer below the expression edited.
    path: String,
    after: String,
}

/// What the generator knows of the set: its string literals, and the
/// attributes of each entity type with their types.
pub struct Vocabulary {
    strings: Vec<String>,
    /// Entity type (unqualified) → (attribute, type as JSON text).
    attrs: BTreeMap<String, Vec<(String, String)>>,
    /// Action id → (principal type, resource type), unqualified.
    actions: BTreeMap<String, (String, String)>,
}

impl Vocabulary {
    /// Read the literals of `policies` (Cedar JSON) and the attribute types
    /// of `schema` (Cedar's JSON schema form, one namespace or several).
    pub fn new(policies: &[Json], schema: &Json) -> Vocabulary {
        let mut strings = BTreeSet::new();
        for p in policies {
            collect_strings(p, &mut strings);
        }
        let mut attrs = BTreeMap::new();
        let mut actions = BTreeMap::new();
        for ns in schema.as_object().into_iter().flat_map(|o| o.values()) {
            for (name, def) in ns["entityTypes"].as_object().into_iter().flatten() {
                let list = def["shape"]["attributes"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(a, t)| (a.clone(), t.to_string()))
                    .collect();
                attrs.insert(name.clone(), list);
            }
            for (name, def) in ns["actions"].as_object().into_iter().flatten() {
                let first = |k: &str| {
                    def["appliesTo"][k][0]
                        .as_str()
                        .map(|s| s.rsplit("::").next().unwrap_or(s).to_string())
                        .unwrap_or_default()
                };
                actions.insert(
                    name.clone(),
                    (first("principalTypes"), first("resourceTypes")),
                );
            }
        }
        Vocabulary {
            strings: strings.into_iter().collect(),
            attrs,
            actions,
        }
    }
}

fn collect_strings(v: &Json, out: &mut BTreeSet<String>) {
    match v {
        Json::Object(o) => {
            if let Some(Json::String(s)) = o.get("Value") {
                out.insert(s.clone());
            }
            for (k, x) in o {
                if k != "annotations" {
                    collect_strings(x, out);
                }
            }
        }
        Json::Array(a) => a.iter().for_each(|x| collect_strings(x, out)),
        _ => {}
    }
}

/// The entity types `principal` and `resource` have in a policy: those of
/// the first action its scope names (all of ours agree per policy).
fn var_types(policy: &Json, vocab: &Vocabulary) -> (String, String) {
    let action = &policy["action"];
    let id = action["entity"]["id"]
        .as_str()
        .or_else(|| action["entities"][0]["id"].as_str());
    id.and_then(|a| vocab.actions.get(a))
        .cloned()
        .unwrap_or_default()
}

/// Every mutant of one policy (Cedar JSON), in a fixed order.
pub fn mutants_of(id: &str, policy: &Json, vocab: &Vocabulary) -> Vec<Mutant> {
    let mut out = scope_mutants(id, policy);
    let types = var_types(policy, vocab);
    let conditions = policy["conditions"].as_array().cloned().unwrap_or_default();
    // Nodes in the order their text starts (pre-order, operands left to
    // right), each with its place: the k-th node reading as a text is the
    // k-th place that text stands.
    let mut nodes: Vec<(String, String)> = Vec::new();
    for (i, cond) in conditions.iter().enumerate() {
        out.extend(condition_mutants(id, policy, i, cond));
        for edit in expr_edits(&cond["body"], vocab, &types) {
            let node = (edit.place.clone(), format!("{i}{}", edit.path));
            if !nodes.contains(&node) {
                nodes.push(node.clone());
            }
            let occurrence = nodes
                .iter()
                .filter(|(place, _)| *place == node.0)
                .position(|n| *n == node)
                .unwrap_or(0);
            let mut p = policy.clone();
            p["conditions"][i]["body"] = edit.expr;
            out.push(Mutant {
                policy: id.to_string(),
                operator: edit.operator,
                before: edit.before,
                place: edit.place,
                occurrence,
                at: None,
                after: edit.after,
                replacement: Some(p),
            });
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|m| {
        m.replacement.as_ref() != Some(policy)
            && seen.insert(m.replacement.as_ref().map(Json::to_string))
    });
    out
}

/// Deleting a forbid, widening a permit's scope, narrowing an action list.
fn scope_mutants(id: &str, policy: &Json) -> Vec<Mutant> {
    let mut out = Vec::new();
    let mk = |operator, before: String, after: String, replacement| Mutant {
        policy: id.to_string(),
        operator,
        place: if before == "forbid" {
            String::new()
        } else {
            before.clone()
        },
        occurrence: 0,
        at: None,
        before: cut(&before),
        after,
        replacement,
    };
    if policy["effect"] == "forbid" {
        out.push(mk(
            "delete-forbid",
            "forbid".into(),
            "(deleted)".into(),
            None,
        ));
    } else {
        for part in ["principal", "action", "resource"] {
            if policy[part]["op"] != "All" {
                let mut p = policy.clone();
                p[part] = json!({"op": "All"});
                let before = format!("{part} {}", scope_text(&policy[part]));
                out.push(mk("widen-scope", before, part.to_string(), Some(p)));
            }
        }
    }
    let list = policy["action"]["entities"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if policy["action"]["op"] == "in" && list.len() > 1 {
        for i in 0..list.len() {
            let mut p = policy.clone();
            let mut rest = list.clone();
            rest.remove(i);
            p["action"]["entities"] = Json::Array(rest);
            let after = scope_text(&p["action"]);
            out.push(mk(
                "narrow-scope",
                format!("action {}", scope_text(&policy["action"])),
                format!("action {after}"),
                Some(p),
            ));
        }
    }
    out
}

fn scope_text(c: &Json) -> String {
    let uid = |u: &Json| {
        format!(
            "{}::{:?}",
            u["type"].as_str().unwrap_or(""),
            u["id"].as_str().unwrap_or("")
        )
    };
    match c["op"].as_str() {
        Some("==") => format!("== {}", uid(&c["entity"])),
        Some("in") if c["entities"].is_array() => {
            let items: Vec<String> = c["entities"]
                .as_array()
                .into_iter()
                .flatten()
                .map(uid)
                .collect();
            format!("in [{}]", items.join(", "))
        }
        Some("in") => format!("in {}", uid(&c["entity"])),
        _ => c.to_string(),
    }
}

/// Negating and deleting condition `i`.
fn condition_mutants(id: &str, policy: &Json, i: usize, cond: &Json) -> Vec<Mutant> {
    let kind = cond["kind"].as_str().unwrap_or("when");
    let flipped = if kind == "when" { "unless" } else { "when" };
    let place = format!("{kind} {{ {} }}", render(&cond["body"]));
    let before = cut(&place);
    let mut negated = policy.clone();
    negated["conditions"][i]["kind"] = Json::from(flipped);
    let mut deleted = policy.clone();
    if let Some(list) = deleted["conditions"].as_array_mut() {
        list.remove(i);
    }
    vec![
        Mutant {
            policy: id.to_string(),
            operator: "negate-condition",
            before: before.clone(),
            place: place.clone(),
            occurrence: 0,
            at: None,
            after: cut(&format!("{flipped} {{ {} }}", render(&cond["body"]))),
            replacement: Some(negated),
        },
        Mutant {
            policy: id.to_string(),
            operator: "delete-condition",
            before,
            place,
            occurrence: 0,
            at: None,
            after: "(no condition)".into(),
            replacement: Some(deleted),
        },
    ]
}

/// The keys of an operator's operands, in order.
const OPERANDS: &[&str] = &["left", "right", "arg", "if", "then", "else"];

/// Every single-point edit of `e`: at `e` itself, then inside each operand.
fn expr_edits(e: &Json, vocab: &Vocabulary, types: &(String, String)) -> Vec<Edit> {
    let mut out = local_edits(e, vocab, types);
    let Some((op, inner)) = e.as_object().and_then(|o| o.iter().next()) else {
        return out;
    };
    let children: Vec<String> = match inner {
        Json::Object(args) => OPERANDS
            .iter()
            .filter(|k| args.contains_key(**k))
            .map(|k| format!("/{op}/{k}"))
            .collect(),
        Json::Array(items) if op == "Set" => {
            (0..items.len()).map(|i| format!("/Set/{i}")).collect()
        }
        _ => Vec::new(),
    };
    for pointer in children {
        let child = e.pointer(&pointer).cloned().unwrap_or(Json::Null);
        for edit in expr_edits(&child, vocab, types) {
            let mut whole = e.clone();
            if let Some(slot) = whole.pointer_mut(&pointer) {
                *slot = edit.expr;
            }
            out.push(Edit {
                expr: whole,
                path: format!("{pointer}{}", edit.path),
                ..edit
            });
        }
    }
    out
}

/// The edits that replace `e` as a whole.
fn local_edits(e: &Json, vocab: &Vocabulary, types: &(String, String)) -> Vec<Edit> {
    let Some((op, inner)) = e.as_object().and_then(|o| o.iter().next()) else {
        return Vec::new();
    };
    let edit = |operator, expr: Json| Edit {
        before: cut(&render(e)),
        place: render(e),
        path: String::new(),
        after: cut(&render(&expr)),
        expr,
        operator,
    };
    match op.as_str() {
        "<" | "<=" | ">" | ">=" | "==" | "!=" => {
            let swapped = match op.as_str() {
                "<" => "<=",
                "<=" => "<",
                ">" => ">=",
                ">=" => ">",
                "==" => "!=",
                _ => "==",
            };
            vec![edit("comparison", json!({ swapped: inner }))]
        }
        "&&" | "||" => {
            let name = if op == "&&" {
                "drop-conjunct"
            } else {
                "drop-disjunct"
            };
            vec![
                edit(name, inner["left"].clone()),
                edit(name, inner["right"].clone()),
            ]
        }
        "Value" => literal_edits(inner, vocab)
            .into_iter()
            .map(|(n, v)| edit(n, json!({"Value": v})))
            .collect(),
        "." => attribute_edits(inner, vocab, types)
            .into_iter()
            .map(|x| edit("attribute", x))
            .collect(),
        "like" => widened_patterns(inner)
            .into_iter()
            .map(|x| edit("like-widened", x))
            .collect(),
        "Set" => {
            let items = inner.as_array().cloned().unwrap_or_default();
            (0..items.len())
                .map(|i| {
                    let mut rest = items.clone();
                    rest.remove(i);
                    edit("set-element-dropped", json!({"Set": rest}))
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

/// A Long: ±1, ×10, ÷10 (each kept only when it changes the value and does
/// not overflow); a string: every other string literal of the set, and "".
fn literal_edits(v: &Json, vocab: &Vocabulary) -> Vec<(&'static str, Json)> {
    if let Some(n) = v.as_i64() {
        let mut out: Vec<i64> = [
            n.checked_add(1),
            n.checked_sub(1),
            n.checked_mul(10),
            Some(n / 10),
        ]
        .into_iter()
        .flatten()
        .filter(|m| *m != n)
        .collect();
        out.dedup();
        return out
            .into_iter()
            .map(|m| ("long-literal", Json::from(m)))
            .collect();
    }
    let Some(s) = v.as_str() else {
        return Vec::new();
    };
    let mut others: Vec<&str> = vocab
        .strings
        .iter()
        .map(String::as_str)
        .filter(|x| *x != s)
        .collect();
    if !s.is_empty() && !others.contains(&"") {
        others.insert(0, "");
    }
    others
        .into_iter()
        .map(|x| ("string-literal", Json::from(x)))
        .collect()
}

/// `principal.a` / `resource.a` → the same variable's other attributes of
/// a's type.
fn attribute_edits(inner: &Json, vocab: &Vocabulary, types: &(String, String)) -> Vec<Json> {
    let entity = match inner["left"]["Var"].as_str() {
        Some("principal") => &types.0,
        Some("resource") => &types.1,
        _ => return Vec::new(),
    };
    let attrs = vocab.attrs.get(entity).cloned().unwrap_or_default();
    let attr = inner["attr"].as_str().unwrap_or("");
    let Some((_, ty)) = attrs.iter().find(|(a, _)| a == attr) else {
        return Vec::new();
    };
    attrs
        .iter()
        .filter(|(a, t)| t == ty && a != attr)
        .map(|(a, _)| json!({".": {"left": inner["left"], "attr": a}}))
        .collect()
}

/// One more wildcard at each place of the pattern not beside one already.
fn widened_patterns(inner: &Json) -> Vec<Json> {
    let pattern = inner["pattern"].as_array().cloned().unwrap_or_default();
    let wild = |i: usize| pattern.get(i).is_some_and(|p| p == "Wildcard");
    (0..=pattern.len())
        .filter(|&i| !wild(i) && (i == 0 || !wild(i - 1)))
        .map(|i| {
            let mut p = pattern.clone();
            p.insert(i, Json::from("Wildcard"));
            json!({"like": {"left": inner["left"], "pattern": p}})
        })
        .collect()
}
