//! The worker list an apply is asked for (`--workers`).

use crate::error::{About, Error, Result};

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
