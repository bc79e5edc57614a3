//! The tools as `tools/list` shows them: names, descriptions and closed
//! input schemas (unknown fields refused).

use crate::capability::Operation as Op;
use rmcp::model::{JsonObject, Tool};
use serde_json::{json, Value as Json};
use std::sync::Arc;

/// Each tool under its base name, with the capability operation it asks for.
const TOOL_NAMES: &[(&str, Op)] = &[
    ("snapshot_instance_fleet", Op::Snapshot),
    ("plan_stale_worker_retirement", Op::Plan),
    ("apply_stale_worker_retirement", Op::Apply),
];

/// The operation of a tool named by its base name or its `gitea_` alias.
pub(super) fn op_of(name: &str) -> Option<Op> {
    let base = name.strip_prefix("gitea_").unwrap_or(name);
    TOOL_NAMES
        .iter()
        .find(|(n, _)| *n == base)
        .map(|(_, op)| *op)
}

fn audit_properties() -> Json {
    json!({
        "remote": {"type": "string", "description": "Audit context: the remote (e.g. prgs)."},
        "host": {"type": "string", "description": "Audit context: host override."},
        "org": {"type": "string", "description": "Audit context: organisation override."},
        "repo": {"type": "string", "description": "Audit context: repository override."},
    })
}

fn schema(mut props: Json, required: &[&str]) -> Arc<JsonObject> {
    if let (Json::Object(p), Json::Object(audit)) = (&mut props, audit_properties()) {
        p.extend(audit);
    }
    let schema = json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    });
    match schema {
        Json::Object(o) => Arc::new(o),
        _ => unreachable!("a schema is an object"),
    }
}

fn canonical_property() -> Json {
    json!({"type": "string", "minLength": 1,
           "description": "The server's own repository binding (OWNER/REPO), fixed at launch; \
                           may be restated, and any other value is refused (repository_not_bound)."})
}

/// The tools, each under its name and its `gitea_` alias.
pub fn tools() -> Vec<Tool> {
    let snapshot = schema(
        json!({
            "canonical_repository": canonical_property(),
            "expected_revision": {"type": "string", "description": "Workers on another live revision are findings."},
            "expected_manifest": {"type": "array", "description": "The approved fleet manifest.",
                "items": {"type": "object", "required": ["client_instance_id"],
                          "properties": {"client_instance_id": {"type": "string"}}}},
        }),
        &[],
    );
    let plan = schema(json!({"canonical_repository": canonical_property()}), &[]);
    let apply = schema(
        json!({
            "registry_fingerprint": {"type": "string", "description": "The plan's registry_fingerprint."},
            "candidate_fingerprint": {"type": "string", "description": "The plan's candidate_fingerprint."},
            "policy_fingerprint": {"type": "string", "description": "The plan's policy_fingerprint."},
            "worker_identities": {
                "description": "The workers to retire: a list, or a JSON list / comma-separated text.",
                "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]},
            "canonical_repository": canonical_property(),
        }),
        &[
            "registry_fingerprint",
            "candidate_fingerprint",
            "policy_fingerprint",
            "worker_identities",
        ],
    );
    let described = [
        (
            "snapshot_instance_fleet",
            "Read-only: the live fleet, its instances, identity collisions, stale rows and blockers. Controller and reconciler only.",
            snapshot,
        ),
        (
            "plan_stale_worker_retirement",
            "Read-only dry run: every registration is a candidate for retirement or preserved with its reason codes, plus the tokens an apply must present. Controller and reconciler only.",
            plan,
        ),
        (
            "apply_stale_worker_retirement",
            "Mutating: retire exactly the approved workers of a plan in one guarded transaction. Needs gitea.worker_registry.retire on a controller or reconciler profile.",
            apply,
        ),
    ];
    let mut out = Vec::new();
    for (name, description, input) in described {
        for full in [name.to_string(), format!("gitea_{name}")] {
            out.push(Tool::new(full, description, input.clone()));
        }
    }
    out
}
