//! Tool results: a success's summary and structured body, and every
//! refusal or failure with its reason code and what to do; each with the
//! structured body as text too (`as_text`).

use crate::apply::Outcome;
use crate::error::Error;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Value as Json};

/// A refusal or failure as a tool result: the reason code, the words, and
/// what to do.
pub(super) fn tool_error(
    reason_code: &str,
    detail: String,
    what_to_do: &str,
    mut body: Json,
) -> CallToolResult {
    let summary = format!("{reason_code}: {detail} (what to do: {what_to_do})");
    if let Json::Object(o) = &mut body {
        o.insert("reason_code".into(), json!(reason_code));
        o.insert("what_to_do".into(), json!(what_to_do));
        o.entry("detail").or_insert(json!(detail));
    }
    let block = super::as_text::json_block(&summary, &body);
    let mut result = CallToolResult::structured_error(body);
    result.content = vec![ContentBlock::text(summary), ContentBlock::text(block)];
    result
}

/// A success: the one-line summary and the structured result, which the
/// second text block repeats as JSON (`as_text`).
pub(super) fn success(summary: String, body: Json) -> CallToolResult {
    let block = super::as_text::json_block(&summary, &body);
    let mut result = CallToolResult::structured(body);
    result.content = vec![ContentBlock::text(summary), ContentBlock::text(block)];
    result
}

/// An error as a tool result: the server keeps serving.
pub(super) fn error_result(e: &Error) -> CallToolResult {
    let (code, todo) = match e {
        Error::Registry { .. }
        | Error::Sqlite {
            store: crate::error::Store::Registry,
            ..
        }
        | Error::Postgres {
            store: crate::error::Store::Registry,
            ..
        } => (
            "registry_unavailable",
            "check the registry this server was started with (FLEET_RETIRE_REGISTRY)",
        ),
        Error::Leases { .. }
        | Error::Sqlite {
            store: crate::error::Store::Leases,
            ..
        }
        | Error::Postgres {
            store: crate::error::Store::Leases,
            ..
        } => (
            "lease_store_unavailable",
            "check the lease store this server was started with (FLEET_RETIRE_LEASES)",
        ),
        Error::Profiles { .. } => (
            "profiles_unreadable",
            "fix profiles.json (GITEA_MCP_CONFIG); the next call reads it again",
        ),
        Error::Policy { .. } => (
            "policy_error",
            "the server's policy set is invalid; restart it with a valid one",
        ),
        _ => ("error", "read the detail; the server keeps serving"),
    };
    // Stores are named masked where the message is made; the net under
    // that, as for the command line's errors (docs/security.md, row 50.6).
    let message = crate::store::location::mask_given(&e.to_string());
    tool_error(code, message, todo, json!({}))
}

/// What an operator does about an apply outcome that is not a success.
pub(super) fn advice(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::PermissionDenied => "ask the operator to grant gitea.worker_registry.retire to a controller or reconciler profile; an agent cannot change its own profile",
        Outcome::PolicySetNotPinned => "restart the server with the built-in policies, or have the operator pin this set's fingerprint in profiles.json (\"policy_pins\")",
        Outcome::PolicySetMoved | Outcome::RegistryRevisionMoved | Outcome::CandidateSetMoved => "plan again and apply the new plan",
        Outcome::BlastRadiusExceeded => "review the plan and request fewer workers; the limit is the server's --max-retire",
        Outcome::RegistryUntrusted => "the registry holds triggers or views; an operator must inspect and drop them",
        Outcome::RegistryUnavailable | Outcome::LeaseStoreUnavailable => "check the stores this server was started with",
        Outcome::TransactionFailed => "nothing was retired; read the detail, then plan again",
        Outcome::OutcomeUnknown => "do not plan or apply again yet: ask the operator to run `fleet-retire apply-status APPLY_ID` on the registry, which says whether this apply committed",
        Outcome::Applied | Outcome::AlreadyRetired | Outcome::NothingRequested => "nothing",
        // Only a controller's apply carries a lease and a budget.
        Outcome::LeadershipLost | Outcome::BudgetExhausted => "plan again",
    }
}

/// The answer to a call that arrives, or is still queued, when the server
/// has decided to stop.
pub(super) fn stopping_result(why: String) -> CallToolResult {
    tool_error(
        "server_stopping",
        why,
        "this server is stopping; the launcher starts a new one, and a new plan is needed",
        json!({}),
    )
}

/// A caller's text quoted in an error, at most 200 characters of it (a
/// URI can be megabytes long, and every answer stays under 1 MiB).
pub(in crate::serve) fn clipped(text: &str) -> String {
    const SHOWN: usize = 200;
    match text.char_indices().nth(SHOWN) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes in all)", &text[..end], text.len()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_uri_is_clipped_in_errors() {
        let long = format!("fleet://{}", "x".repeat(15_000_000));
        let shown = super::clipped(&long);
        assert!(shown.len() < 300, "{}", shown.len());
        assert!(shown.ends_with("(15000008 bytes in all)"), "{shown}");
        assert_eq!(super::clipped("short"), "\"short\"");
    }
}
