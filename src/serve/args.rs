//! A tool call's arguments, parsed with unknown fields refused: no
//! argument can name what the server was bound to at launch. Arguments
//! that do not parse are refused as a tool result the model reads
//! (`invalid_arguments`), not as a protocol error.

use super::results::tool_error;
use super::schemas::ToolKind;
use crate::apply::{Tokens, Workers};
use rmcp::model::{CallToolResult, JsonObject};
use serde::Deserialize;
use serde_json::{json, Value as Json};

/// Arguments of the plan tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanArgs {
    pub(super) canonical_repository: Option<String>,
    pub(super) preserved: Option<PreservedAsk>,
    pub(super) include: Option<Include>,
    /// Which rows the plan reads and judges: this host's scope (the
    /// default) or the whole registry.
    pub(super) scope: Option<PlanScope>,
    pub(super) remote: Option<String>,
    pub(super) host: Option<String>,
    pub(super) org: Option<String>,
    pub(super) repo: Option<String>,
}

/// Which preserved rows a plan call asks for.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PreservedAsk {
    /// Only rows kept for this primary reason code.
    pub(super) reason_code: Option<String>,
    /// Rows per page (1 to `MAX_LIMIT`).
    pub(super) limit: Option<usize>,
    /// The `next_cursor` of an earlier page: the next page of that plan.
    pub(super) cursor: Option<String>,
    /// Without a cursor: start this many rows into the list, on the plan
    /// made for this call (a client that starts a server per call cannot
    /// keep a cursor, which only its server can open).
    pub(super) offset: Option<usize>,
}

/// How much of the plan a call asks for.
#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub(super) enum Include {
    /// Tokens, counts and the candidates' identities (the default).
    Summary,
    /// The summary with each candidate shown whole (evidence, reason
    /// codes): the rows an apply would retire, for an agent that reviews
    /// them before applying.
    Candidates,
    /// The whole document, when it fits in one result.
    All,
}

/// Which rows a plan call reads (issue 54): this host's scope, or the
/// whole registry as the seed's plan reads it.
#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum PlanScope {
    /// This host's active rows and the peers their verdicts depend on
    /// (`plan --scope host`); tokens `host-scope:`.
    #[default]
    Host,
    /// Every row of the registry; the seed's tokens.
    Registry,
}

/// Arguments of the explain tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExplainArgs {
    pub(super) worker_identity: String,
    pub(super) canonical_repository: Option<String>,
    pub(super) remote: Option<String>,
    pub(super) host: Option<String>,
    pub(super) org: Option<String>,
    pub(super) repo: Option<String>,
}

/// A page of one of a snapshot's lists.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SnapshotPage {
    /// Which list.
    pub(super) list: super::cursor::List,
    /// Only findings of this class.
    pub(super) classification: Option<String>,
    /// Rows per page.
    pub(super) limit: Option<usize>,
    /// The `next_cursor` of the page before.
    pub(super) cursor: Option<String>,
}

/// Arguments of the snapshot tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SnapshotArgs {
    pub(super) canonical_repository: Option<String>,
    pub(super) expected_revision: Option<String>,
    pub(super) expected_manifest: Option<Vec<Json>>,
    pub(super) page: Option<SnapshotPage>,
    pub(super) remote: Option<String>,
    pub(super) host: Option<String>,
    pub(super) org: Option<String>,
    pub(super) repo: Option<String>,
}

/// Arguments of the apply tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApplyArgs {
    pub(super) registry_fingerprint: String,
    pub(super) candidate_fingerprint: String,
    pub(super) policy_fingerprint: String,
    #[serde(default)]
    pub(super) worker_identities: Option<Workers>,
    /// The first N candidates of the plan this server issued under these
    /// tokens that are still candidates (earlier batches passed over).
    pub(super) first: Option<usize>,
    pub(super) canonical_repository: Option<String>,
    pub(super) remote: Option<String>,
    pub(super) host: Option<String>,
    pub(super) org: Option<String>,
    pub(super) repo: Option<String>,
}

impl ApplyArgs {
    /// The plan's tokens the call presents.
    pub(super) fn tokens(&self) -> Tokens {
        Tokens {
            registry_fingerprint: self.registry_fingerprint.clone(),
            candidate_fingerprint: self.candidate_fingerprint.clone(),
            policy_fingerprint: self.policy_fingerprint.clone(),
        }
    }
}

/// The audit context a call gives, recorded in its result as given.
pub(super) fn audit_context(
    remote: &Option<String>,
    host: &Option<String>,
    org: &Option<String>,
    repo: &Option<String>,
) -> Json {
    json!({"remote": remote, "host": host, "org": org, "repo": repo})
}

/// A call's arguments, or the refusal a model reads and corrects itself
/// by: an input validation error is a tool result (`isError`, reason code
/// `invalid_arguments`), not a JSON-RPC error its SDK would raise before
/// the model saw it (MCP, SEP-1303). Only a request that is not a
/// `tools/call` at all (a key given twice, arguments that are not an
/// object) stays a protocol error.
pub(super) fn parse<T: serde::de::DeserializeOwned>(
    tool: ToolKind,
    args: Option<JsonObject>,
) -> std::result::Result<T, Box<CallToolResult>> {
    let doc = Json::Object(args.unwrap_or_default());
    serde_path_to_error::deserialize(doc).map_err(|e| {
        let place = e.path().to_string();
        let why = e.into_inner().to_string();
        // serde names a missing field in its words only; so does the answer.
        let missing = why
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(name, _)| name);
        let argument = match (place.as_str(), missing) {
            (".", None) => None,
            (".", Some(name)) => Some(name.to_string()),
            (_, Some(name)) => Some(format!("{place}.{name}")),
            (_, None) => Some(place),
        };
        invalid(tool, argument, why)
    })
}

/// A restated repository must name something (`text::nonblank_repository`).
pub(super) fn nonblank(
    tool: ToolKind,
    text: Option<String>,
) -> std::result::Result<Option<String>, Box<CallToolResult>> {
    match text {
        None => Ok(None),
        Some(t) => crate::text::nonblank_repository(&t)
            .map(Some)
            .map_err(|e| invalid(tool, Some("canonical_repository".into()), e.to_string())),
    }
}

/// The refusal of arguments the tool's input schema does not allow.
fn invalid(tool: ToolKind, argument: Option<String>, why: String) -> Box<CallToolResult> {
    let detail = match &argument {
        Some(a) => format!("{}: argument {a}: {why}", tool.name()),
        None => format!("{}: {why}", tool.name()),
    };
    let what_to_do = format!(
        "call {} again with the arguments its input schema allows ({}); this server's \
         profile, files and policies are fixed at launch and no argument names them",
        tool.name(),
        tool.argument_names().join(", ")
    );
    Box::new(tool_error(
        "invalid_arguments",
        detail,
        &what_to_do,
        json!({"tool": tool.name(), "argument": argument}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal's `argument`, as a model reads it.
    fn refused_argument<T: serde::de::DeserializeOwned + std::fmt::Debug>(
        tool: ToolKind,
        args: Json,
    ) -> Json {
        let Json::Object(args) = args else {
            unreachable!()
        };
        let refused = parse::<T>(tool, Some(args)).unwrap_err();
        assert_eq!(refused.is_error, Some(true));
        let body = refused.structured_content.clone().unwrap();
        assert_eq!(body["reason_code"], "invalid_arguments", "{body}");
        assert!(body["what_to_do"]
            .as_str()
            .unwrap()
            .contains("canonical_repository"));
        body["argument"].clone()
    }

    #[test]
    fn an_argument_error_names_the_argument_unknown_mistyped_or_missing() {
        let plan = ToolKind::Plan;
        let unknown = refused_argument::<PlanArgs>(plan, json!({"profile": "x"}));
        assert_eq!(unknown, "profile");
        let nested = refused_argument::<PlanArgs>(plan, json!({"preserved": {"limit": "ten"}}));
        assert_eq!(nested, "preserved.limit");
        let missing = refused_argument::<ApplyArgs>(ToolKind::Apply, json!({"first": 1}));
        assert_eq!(missing, "registry_fingerprint");
        let inner = refused_argument::<SnapshotArgs>(ToolKind::Snapshot, json!({"page": {}}));
        assert_eq!(inner, "page.list");
        let scope = refused_argument::<PlanArgs>(plan, json!({"scope": "everything"}));
        assert_eq!(scope, "scope");
    }
}
