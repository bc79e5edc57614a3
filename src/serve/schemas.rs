//! The tools as `tools/list` shows them: names, descriptions, closed input
//! schemas (unknown fields refused), the output schema every result's
//! structured content validates against, and the behaviour annotations.

use super::pages::MAX_LIMIT;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{json, Value as Json};
use std::sync::Arc;

/// The tools this server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ToolKind {
    /// `snapshot_instance_fleet`.
    Snapshot,
    /// `plan_stale_worker_retirement`.
    Plan,
    /// `explain_worker_retirement`.
    Explain,
    /// `apply_stale_worker_retirement`.
    Apply,
}

impl ToolKind {
    /// Every tool, in the order listed.
    const ALL: [ToolKind; 4] = [
        ToolKind::Snapshot,
        ToolKind::Plan,
        ToolKind::Explain,
        ToolKind::Apply,
    ];

    /// Its name (it is also listed with a `gitea_` prefix).
    pub(super) fn name(self) -> &'static str {
        match self {
            ToolKind::Snapshot => "snapshot_instance_fleet",
            ToolKind::Plan => "plan_stale_worker_retirement",
            ToolKind::Explain => "explain_worker_retirement",
            ToolKind::Apply => "apply_stale_worker_retirement",
        }
    }

    /// The tool a name or its `gitea_` alias names.
    pub(super) fn named(name: &str) -> Option<ToolKind> {
        let base = name.strip_prefix("gitea_").unwrap_or(name);
        ToolKind::ALL.into_iter().find(|t| t.name() == base)
    }

    fn description(self) -> &'static str {
        match self {
            ToolKind::Snapshot => "Read-only: the live fleet's counts, its instances, its findings grouped by class (a few of each) and its blockers; page a class's findings or a list of workers with `page`. Controller and reconciler only.",
            ToolKind::Plan => "Read-only dry run: the tokens an apply must present, the counts of rows per reason code, and the candidates one apply can take. Preserved rows come a page at a time with `preserved`; the whole document with include \"all\" (when it fits) or as the linked resource. Controller and reconciler only.",
            ToolKind::Explain => "Read-only: why one worker would be retired or is kept: its evidence, Cedar's first-stage answers and every eligibility policy's verdict. Controller and reconciler only.",
            ToolKind::Apply => "Mutating: retire exactly the approved workers of a plan in one guarded transaction; a replay of a finished apply is already_retired. Needs gitea.worker_registry.retire on a controller or reconciler profile.",
        }
    }

    /// The arguments its input schema allows, in the schema's order.
    pub(super) fn argument_names(self) -> Vec<String> {
        self.input()
            .get("properties")
            .and_then(Json::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// What its `gitea_` alias says: which tool it stands for, so a model
    /// is not offered two equal choices.
    fn alias_description(self) -> String {
        format!(
            "Alias of {name}, kept for the seed's callers; prefer {name}, which takes the same \
             arguments and answers the same.",
            name = self.name()
        )
    }

    fn annotations(self) -> ToolAnnotations {
        let read_only = self != ToolKind::Apply;
        ToolAnnotations::new()
            .read_only(read_only)
            .destructive(!read_only)
            // MCP: idempotent means a repeated call has no further effect.
            // Read-only tools have none; a repeated apply with `first` takes
            // the next batch of the plan, so apply is not.
            .idempotent(read_only)
            .open_world(false)
    }

    fn input(self) -> Arc<JsonObject> {
        let canonical = json!({"type": "string", "minLength": 1,
            "description": "The server's own repository binding (OWNER/REPO), fixed at launch; \
                            may be restated, and any other value is refused (repository_not_bound)."});
        match self {
            ToolKind::Snapshot => object(
                json!({
                    "canonical_repository": canonical,
                    "expected_revision": {"type": "string", "description": "Workers on another live revision are findings."},
                    "expected_manifest": {"type": "array", "description": "The approved fleet manifest.",
                        "items": {"type": "object", "required": ["client_instance_id"],
                                  "properties": {"client_instance_id": {"type": "string"}}}},
                    "page": page_input(json!({"enum": ["findings", "workers", "live_workers", "stale_workers", "historical_workers"]}),
                        "classification", "Only findings of this class (findings only)."),
                }),
                &[],
                true,
            ),
            ToolKind::Plan => object(
                json!({
                    "canonical_repository": canonical,
                    "preserved": offset_page(page_input(json!({"const": "preserved"}), "reason_code",
                        "Only rows kept for this primary reason code (see preserved_reason_counts).")),
                    "include": {"enum": ["summary", "candidates", "all"],
                        "description": "summary (the default: tokens, counts, the candidates' identities), candidates (the summary with each candidate whole: evidence and reason codes), or all: the whole document, refused above 1 MiB."},
                    "scope": {"enum": ["host", "registry"],
                        "description": "host (the default): this host's rows and the peers their verdicts depend on, tokens host-scope:; registry: every row of the registry."},
                }),
                &[],
                true,
            ),
            ToolKind::Explain => object(
                json!({
                    "worker_identity": {"type": "string", "description": "The worker to explain."},
                    "canonical_repository": canonical,
                }),
                &["worker_identity"],
                true,
            ),
            ToolKind::Apply => object(
                json!({
                    "registry_fingerprint": {"type": "string", "description": "The plan's registry_fingerprint."},
                    "candidate_fingerprint": {"type": "string", "description": "The plan's candidate_fingerprint."},
                    "policy_fingerprint": {"type": "string", "description": "The plan's policy_fingerprint."},
                    "worker_identities": {
                        "description": "The workers to retire: a list, or a JSON list / comma-separated text. Give this or first.",
                        "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]},
                    "first": {
                        "type": "integer", "minimum": 1,
                        "description": "Instead of worker_identities: retire the first N candidates, in the plan's order, of the plan this server issued under these tokens, passing over those an earlier batch retired. Call again with the same tokens for the next batch."},
                    "canonical_repository": canonical,
                }),
                &[
                    "registry_fingerprint",
                    "candidate_fingerprint",
                    "policy_fingerprint",
                ],
                true,
            ),
        }
    }

    /// What a success's structured content holds. Every result may
    /// instead be a refusal ([`refusal`]).
    fn success(self) -> Json {
        let text = json!({"type": "string"});
        let count = json!({"type": "integer", "minimum": 0});
        let list = json!({"type": "array"});
        let tokens = json!({
            "registry_fingerprint": text, "candidate_fingerprint": text,
            "policy_fingerprint": text, "policy_source": text,
        });
        let required_tokens = [
            "registry_fingerprint",
            "candidate_fingerprint",
            "policy_fingerprint",
            "policy_source",
        ];
        match self {
            ToolKind::Plan => with(
                tokens,
                json!({
                    "outcome": {"const": "planned"},
                    "assessed_count": count, "candidate_count": count, "preserved_count": count,
                    "preserved_reason_counts": {"type": "object", "additionalProperties": count},
                    "preserved_cursors": {"type": "object", "additionalProperties": text},
                    "other_host_rows": count,
                    "candidate_worker_identities": list, "candidates": {"type": "array", "items": entry()},
                    "candidates_not_shown": count,
                    "preserved": {"type": "array", "items": entry()},
                    "preserved_not_shown": count, "next_cursor": text, "next_offset": count,
                    "resource_uri": text, "audit_context": {"type": "object"},
                    "scope": {"type": "object"},
                }),
                &required_tokens,
            ),
            ToolKind::Explain => with(
                tokens,
                json!({
                    "worker_identity": text,
                    "explanations": {"type": "array", "minItems": 1, "items": {"type": "object",
                        "required": ["decision", "reason_code", "policies", "evidence"]}},
                    "peers_not_shown": count,
                }),
                &["worker_identity", "explanations"],
            ),
            ToolKind::Snapshot => with(
                json!({}),
                json!({
                    "snapshot_at": text, "consistency_token": text, "live_fleet_safe": {"type": "boolean"},
                    "live_worker_count": count, "stale_worker_count": count,
                    "historical_worker_count": count, "instance_count": count,
                    "finding_classes": {"type": "object"}, "active_blockers": list,
                    "page": list, "next_cursor": text,
                }),
                &["snapshot_at", "consistency_token"],
            ),
            ToolKind::Apply => with(
                json!({}),
                json!({
                    "outcome": text, "retired_count": count, "retired": list,
                    "registry_fingerprint": text, "detail": text,
                }),
                &["outcome", "retired_count", "detail"],
            ),
        }
    }

    fn output(self) -> Arc<JsonObject> {
        to_object(json!({"type": "object", "anyOf": [self.success(), refusal()]}))
    }
}

/// One plan row as the plan document renders it.
fn entry() -> Json {
    json!({"type": "object", "required": ["worker_identity", "reason_code"],
           "properties": {"reason_code": {"type": "string"},
                          "reason_codes": {"type": "array", "items": {"type": "string"}}}})
}

/// A refusal or failure: the reason code, the words and what to do.
fn refusal() -> Json {
    json!({"type": "object", "required": ["reason_code", "detail", "what_to_do"],
           "properties": {"reason_code": {"type": "string"}, "detail": {"type": "string"},
                          "what_to_do": {"type": "string"}}})
}

/// A success shape: these properties, of which `required` must be there.
fn with(mut a: Json, b: Json, required: &[&str]) -> Json {
    if let (Json::Object(a), Json::Object(b)) = (&mut a, b) {
        a.extend(b);
    }
    json!({"type": "object", "properties": a, "required": required})
}

/// A paging request: which list, a filter, a page size, a cursor.
fn page_input(list: Json, filter: &str, filter_description: &str) -> Json {
    let mut props = json!({
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                  "description": "Rows per page (100 unless given)."},
        "cursor": {"type": "string", "description": "The next_cursor of the page before (or, for preserved rows, a plan summary's preserved_cursors entry: the first page of that plan)."},
    });
    props[filter] = json!({"type": "string", "description": filter_description});
    if list.get("const").is_none() {
        props["list"] = list;
    }
    json!({"type": "object", "properties": props, "additionalProperties": false})
}

/// A page request that may also start at an offset, on the plan made for
/// the call, without a cursor (for clients that start a server per call).
fn offset_page(mut page: Json) -> Json {
    page["properties"]["offset"] = json!({"type": "integer", "minimum": 0,
        "description": "Without a cursor: the first row of the page, counted from 0, in the plan made for this call (each call plans afresh, so rows may shift between calls; a cursor, which only the server that issued it can open, pages one plan)."});
    page
}

fn audit_properties() -> Json {
    json!({
        "remote": {"type": "string", "description": "Audit context: the remote (e.g. prgs)."},
        "host": {"type": "string", "description": "Audit context: host override."},
        "org": {"type": "string", "description": "Audit context: organisation override."},
        "repo": {"type": "string", "description": "Audit context: repository override."},
    })
}

/// A closed object schema with the audit properties added.
fn object(mut props: Json, required: &[&str], audit: bool) -> Arc<JsonObject> {
    if let (true, Json::Object(p), Json::Object(a)) = (audit, &mut props, audit_properties()) {
        p.extend(a);
    }
    to_object(json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    }))
}

fn to_object(schema: Json) -> Arc<JsonObject> {
    match schema {
        Json::Object(o) => Arc::new(o),
        _ => unreachable!("a schema is an object"),
    }
}

/// The tools, each under its name and its `gitea_` alias (whose
/// description names the tool to prefer).
pub fn tools() -> Vec<Tool> {
    let mut out = Vec::new();
    for kind in ToolKind::ALL {
        let tool = Tool::new(kind.name(), kind.description(), kind.input())
            .with_raw_output_schema(kind.output())
            .with_annotations(kind.annotations());
        let mut alias = tool.clone();
        alias.name = format!("gitea_{}", kind.name()).into();
        alias.description = Some(kind.alias_description().into());
        out.push(tool);
        out.push(alias);
    }
    out
}
