//! A tool call's arguments, parsed with unknown fields refused: no
//! argument can name what the server was bound to at launch.

use crate::apply::{Tokens, Workers};
use rmcp::model::JsonObject;
use rmcp::ErrorData as McpError;
use serde::Deserialize;
use serde_json::{json, Value as Json};

/// Arguments of the plan tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanArgs {
    pub(super) canonical_repository: Option<String>,
    pub(super) preserved: Option<PreservedAsk>,
    pub(super) include: Option<Include>,
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

pub(super) fn parse<T: serde::de::DeserializeOwned>(
    tool: &str,
    args: Option<JsonObject>,
) -> std::result::Result<T, McpError> {
    serde_json::from_value(Json::Object(args.unwrap_or_default())).map_err(|e| {
        McpError::invalid_params(
            format!("{tool}: {e}; see the tool's input schema (tools/list)"),
            None,
        )
    })
}

/// A restated repository must name something (`text::nonblank_repository`).
pub(super) fn nonblank(text: Option<String>) -> std::result::Result<Option<String>, McpError> {
    match text {
        None => Ok(None),
        Some(t) => crate::text::nonblank_repository(&t)
            .map(Some)
            .map_err(|e| McpError::invalid_params(format!("canonical_repository: {e}"), None)),
    }
}
