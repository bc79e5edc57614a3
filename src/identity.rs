//! Client names and launch-instance identity (docs/semantics.md §4, seed
//! `assess_instance_identity`).
//!
//! Used for evidence and the snapshot. The retirement policy judges trust
//! again from the raw instance id, so a reviewer can read the rule in
//! `policies/retirement.cedar`; a fixture pins that both agree.

/// Environment keys the launcher sets.
pub mod env {
    /// Client type.
    pub const CLIENT: &str = "GITEA_MCP_CLIENT";
    /// The launch's instance id.
    pub const CLIENT_INSTANCE: &str = "GITEA_MCP_CLIENT_INSTANCE";
    /// Provenance marker only the launcher writes.
    pub const INSTANCE_PROVENANCE: &str = "GITEA_MCP_INSTANCE_PROVENANCE";
    /// The launch's session.
    pub const CLIENT_SESSION: &str = "GITEA_MCP_CLIENT_SESSION";
    /// Operator-approved enrollment.
    pub const FLEET_RUN_ID: &str = "GITEA_MCP_FLEET_RUN_ID";
    /// Client-managed marker.
    pub const CLIENT_MANAGED: &str = "GITEA_CLIENT_MANAGED";
    /// The worker's profile.
    pub const PROFILE: &str = "GITEA_MCP_PROFILE";
    /// profiles.json.
    pub const CONFIG: &str = "GITEA_MCP_CONFIG";
    /// A worker generation chosen by its parent.
    pub const GENERATION_ID: &str = "GITEA_MCP_GENERATION_ID";
    /// The namespace a server is started for (read by `fleet-retire serve`).
    pub const NAMESPACE: &str = "GITEA_MCP_NAMESPACE";
    /// The worker's own identity: a worker (or `serve`) registers under it,
    /// and `heartbeat` / `release` name the caller's row by it.
    pub const WORKER_IDENTITY: &str = "GITEA_MCP_WORKER_IDENTITY";
}

/// The provenance value the launcher alone writes.
pub const LAUNCHER_PROVENANCE: &str = "trusted_launcher";

/// The client type of anything not recognised.
pub const UNKNOWN_CLIENT: &str = "unknown";

/// Reserved prefix of launcher-minted instance ids.
pub const TRUSTED_INSTANCE_PREFIX: &str = "inst-";

const LEGACY_PREFIXES: &[&str] = &["pid-", "proc-", "legacy-"];

/// Normalise a client name through the alias table; unknown → `unknown`.
pub fn normalize_client_name(raw: Option<&str>) -> &'static str {
    let Some(raw) = raw else {
        return UNKNOWN_CLIENT;
    };
    let key: String = crate::value::py_strip(raw)
        .to_lowercase()
        .chars()
        .map(|c| if c == '-' || c == ' ' { '_' } else { c })
        .collect();
    match key.as_str() {
        "codex" | "openai_codex" | "codex_cli" => "codex",
        "claude" | "claude_code" | "claudecode" => "claude_code",
        "claude_desktop" => "claude_desktop",
        "gemini" | "gemini_cli" => "gemini",
        "grok" | "grok_cli" => "grok",
        "cursor" => "cursor",
        _ => UNKNOWN_CLIENT,
    }
}

/// How an instance id was classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceIdentity {
    /// The stripped id, when one was given.
    pub client_instance_id: Option<String>,
    /// `trusted_launcher`, `legacy_incomplete` or `missing`.
    pub provenance: &'static str,
    /// Launcher-minted `inst-…` and not a pid fallback.
    pub trusted: bool,
}

/// An instance id's classification without the id itself: what a plan
/// keeps per row (the id is the row's own text, stripped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceClass {
    /// `trusted_launcher`, `legacy_incomplete` or `missing`.
    pub provenance: &'static str,
    /// Launcher-minted `inst-…` and not a pid fallback.
    pub trusted: bool,
}

/// Classify an instance id (seed `assess_instance_identity`).
pub fn assess_instance_identity(raw: Option<&str>, source: Option<&str>) -> InstanceIdentity {
    let (text, class) = classify_instance_identity(raw, source);
    InstanceIdentity {
        client_instance_id: (!text.is_empty()).then(|| text.to_string()),
        provenance: class.provenance,
        trusted: class.trusted,
    }
}

/// [`assess_instance_identity`], lending the stripped id out (empty when
/// none was given) instead of copying it.
pub fn classify_instance_identity<'a>(
    raw: Option<&'a str>,
    source: Option<&str>,
) -> (&'a str, InstanceClass) {
    let text = crate::value::py_strip(raw.unwrap_or(""));
    if text.is_empty() {
        return (
            text,
            InstanceClass {
                provenance: "missing",
                trusted: false,
            },
        );
    }
    // `text.to_lowercase().starts_with(p)`, without building the lowered
    // copy (the prefix is compared with the lowered chars as they come).
    let lowered_starts_with = |prefix: &str| {
        let mut lowered = text.chars().flat_map(char::to_lowercase);
        prefix.chars().all(|c| lowered.next() == Some(c))
    };
    let legacy = LEGACY_PREFIXES.iter().any(|p| lowered_starts_with(p))
        || source == Some("pid_fallback")
        || !text.starts_with(TRUSTED_INSTANCE_PREFIX)
        || text.len() <= TRUSTED_INSTANCE_PREFIX.len();
    (
        text,
        InstanceClass {
            provenance: if legacy {
                "legacy_incomplete"
            } else {
                "trusted_launcher"
            },
            trusted: !legacy,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases() {
        assert_eq!(normalize_client_name(Some(" Claude-Code ")), "claude_code");
        assert_eq!(normalize_client_name(Some("openai codex")), "codex");
        assert_eq!(normalize_client_name(Some("")), "unknown");
        assert_eq!(normalize_client_name(Some("vim")), "unknown");
        assert_eq!(normalize_client_name(None), "unknown");
    }

    /// Legacy prefixes are found whatever their case.
    #[test]
    fn legacy_prefixes_are_matched_on_the_lowered_text() {
        assert!(!assess_instance_identity(Some("PID-7"), None).trusted);
        assert!(!assess_instance_identity(Some("Legacy-x"), None).trusted);
        assert_eq!(
            assess_instance_identity(Some("Proc-inst-x"), None).provenance,
            "legacy_incomplete"
        );
    }

    #[test]
    fn trust() {
        assert!(assess_instance_identity(Some(" inst-codex-x "), None).trusted);
        assert!(!assess_instance_identity(Some("inst-"), None).trusted);
        assert!(!assess_instance_identity(Some("inst-x"), Some("pid_fallback")).trusted);
        assert!(!assess_instance_identity(Some("pid-42"), None).trusted);
        assert!(!assess_instance_identity(Some("INST-x"), None).trusted);
        assert_eq!(
            assess_instance_identity(Some("  "), None).provenance,
            "missing"
        );
    }
}
