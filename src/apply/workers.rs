//! The worker list an apply is asked for (`--workers`, or a tool call's
//! `worker_identities`).

use crate::error::{About, Error, Result};
use serde::Deserialize;

/// The workers a caller names: a list, or text [`parse_workers`] reads (a
/// JSON list, or comma- or line-separated identities).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Workers {
    /// Identities, one per element.
    List(Vec<String>),
    /// Identities as text.
    Text(String),
}

impl Workers {
    /// The identities, in the order given.
    pub fn into_list(self) -> Result<Vec<String>> {
        match self {
            Workers::List(list) => Ok(list),
            Workers::Text(text) => parse_workers(&text),
        }
    }
}

/// Parse `--workers`: a JSON list of strings, or comma-separated names.
pub fn parse_workers(text: &str) -> Result<Vec<String>> {
    let trimmed = text.trim();
    if trimmed.starts_with('[') {
        let list: Vec<String> = serde_json::from_str(trimmed).map_err(|e| {
            Error::input(
                About::Option("--workers"),
                format!("the worker list looks like JSON but is not a list of strings: {e}"),
            )
        })?;
        return Ok(list);
    }
    Ok(trimmed
        .split([',', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect())
}
