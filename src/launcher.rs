//! Launch identity (seed `mcp_application_launcher`): one trusted
//! `inst-<client>-<stamp>-<digest>` id per application launch, carried to
//! all five namespace workers in their `mcpServers` environment.
//!
//! Workers never mint a trusted id; the launcher does, once per launch.

use crate::error::{About, Error, Result};
use crate::evidence::random_hex;
use crate::identity::{assess_instance_identity, env, normalize_client_name, LAUNCHER_PROVENANCE};
use crate::time::Micros;
use serde_json::{json, Map, Value as Json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The five namespaces of a launch, in server order.
pub const NAMESPACES: &[&str] = &["author", "reviewer", "merger", "controller", "reconciler"];

/// The keys a launch sets itself in every server's environment; a caller's
/// extra environment can never set them.
pub const PROTECTED_KEYS: &[&str] = &[
    env::PROFILE,
    env::NAMESPACE,
    env::CLIENT_MANAGED,
    env::CLIENT,
    env::CLIENT_INSTANCE,
    env::INSTANCE_PROVENANCE,
    env::CONFIG,
    env::FLEET_RUN_ID,
    env::CLIENT_SESSION,
];

/// The prefix of the keys a worker reads its identity and configuration
/// from (`GITEA_MCP_WORKER_IDENTITY` among them); a caller's extra
/// environment can set none of them.
pub const RESERVED_PREFIX: &str = "GITEA_MCP_";

/// Whether the launch alone may set `key` (compared without case, as some
/// platforms compare environment keys).
pub fn is_reserved_key(key: &str) -> bool {
    let upper = key.to_ascii_uppercase();
    upper.starts_with(RESERVED_PREFIX) || PROTECTED_KEYS.contains(&upper.as_str())
}

/// Check a caller's extra environment: every key a variable name
/// (`[A-Za-z_][A-Za-z0-9_]*`), none the launch's own, none twice, no value
/// holding NUL. The first bad entry is named, with what to do instead.
pub fn check_extra_env(extra: &[(String, String)]) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    for (key, value) in extra {
        let problem = if !is_variable_name(key) {
            Some(
                "is not a variable name: a key is a letter or `_`, then letters, digits or `_`"
                    .to_string(),
            )
        } else if is_reserved_key(key) {
            Some(format!(
                "is the launch's own to set (so is every {RESERVED_PREFIX}* key and \
                 {}): a worker's profile, identity, session and configuration come from the \
                 launch alone; drop it, and use --profiles, --config, --session, \
                 --fleet-run-id or --instance instead",
                env::CLIENT_MANAGED
            ))
        } else if !seen.insert(key.as_str()) {
            Some("is given twice; give each key once".to_string())
        } else if value.contains('\0') {
            Some("has a value holding a NUL character, which no environment can carry".into())
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::input(
                About::Option("--env"),
                format!("--env {key:?} {problem}"),
            ));
        }
    }
    Ok(())
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
fn is_variable_name(key: &str) -> bool {
    let mut bytes = key.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Mint an instance id: `inst-<client>-<%Y%m%dT%H%M%SZ>-<12 hex of
/// sha256("<client>\x1f<stamp>\x1f<nonce>")>`.
pub fn generate_client_instance_id(client: Option<&str>, now: Micros, nonce: &str) -> String {
    let client = normalize_client_name(client);
    let stamp = chrono::DateTime::<chrono::Utc>::from_timestamp(now.div_euclid(1_000_000), 0)
        .map(|d| d.format("%Y%m%dT%H%M%SZ").to_string())
        .unwrap_or_default();
    let digest = crate::fingerprint::hex(&Sha256::digest(
        format!("{client}\u{1f}{stamp}\u{1f}{nonce}").as_bytes(),
    ));
    format!("inst-{client}-{stamp}-{}", &digest[..12])
}

/// What `launch` is asked.
#[derive(Debug, Clone, Default)]
pub struct LaunchRequest {
    /// The client type (normalised).
    pub client: Option<String>,
    /// A profile for each of the five namespaces.
    pub profiles: BTreeMap<String, String>,
    /// Reuse this trusted id (reconnect of the same launch).
    pub instance: Option<String>,
    /// The launch's session (minted when absent).
    pub session: Option<String>,
    /// Operator-approved enrollment.
    pub fleet_run_id: Option<String>,
    /// profiles.json path for the workers.
    pub config: Option<String>,
    /// The worker command and its arguments.
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Extra environment: a launch carrying a key of its own
    /// ([`is_reserved_key`]) or a malformed one is refused.
    pub extra_env: Vec<(String, String)>,
    /// The clock.
    pub now: Micros,
    /// The nonce (random when absent).
    pub nonce: Option<String>,
}

/// Build the `mcpServers` document for one launch.
pub fn launch(req: &LaunchRequest) -> Result<Json> {
    check_profiles(req)?;
    check_extra_env(&req.extra_env)?;
    let client = normalize_client_name(req.client.as_deref());
    let instance = instance_id(req, client)?;
    let session = match req
        .session
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        Some(s) => s.to_string(),
        None => format!("launch-{}", random_hex(12)?),
    };
    let fleet_run = req
        .fleet_run_id
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let mut servers = Map::new();
    for ns in NAMESPACES {
        let env = server_env(req, ns, client, &instance, &session, fleet_run);
        servers.insert(
            format!("gitea-{ns}"),
            json!({"command": req.command, "args": req.args, "env": env}),
        );
    }
    Ok(json!({
        "mcpServers": servers,
        "launch": {
            "client_type": client,
            "client_instance_id": instance,
            "instance_id_provenance": LAUNCHER_PROVENANCE,
            "instance_identity_trusted": true,
            "fleet_run_id": fleet_run,
            "session_id": session,
            "namespaces": NAMESPACES,
        },
        "client_instance_id": instance,
        "client_type": client,
        "namespaces": NAMESPACES,
        "shared_instance_id_across_namespaces": true,
        "namespace_count": NAMESPACES.len(),
    }))
}

/// Every namespace needs a profile.
fn check_profiles(req: &LaunchRequest) -> Result<()> {
    let missing: Vec<&str> = NAMESPACES
        .iter()
        .copied()
        .filter(|ns| req.profiles.get(*ns).is_none_or(|p| p.trim().is_empty()))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::input(
        About::Option("--profiles"),
        format!(
            "a launch needs a profile for every namespace; missing: {}. Pass --profiles {}",
            missing.join(", "),
            NAMESPACES
                .iter()
                .map(|n| format!("{n}=PROFILE"))
                .collect::<Vec<_>>()
                .join(",")
        ),
    ))
}

/// The launch's instance id: a given one only when it is launcher-minted
/// (never re-blessing a legacy id), otherwise a fresh one.
fn instance_id(req: &LaunchRequest, client: &str) -> Result<String> {
    if let Some(given) = &req.instance {
        let a = assess_instance_identity(Some(given), None);
        if !a.trusted {
            return Err(Error::Refused(format!(
                "refusing to propagate {given:?}: it is not a launcher-minted inst-... id \
                 ({}); omit --instance to mint a fresh one",
                a.provenance
            )));
        }
        return Ok(a.client_instance_id.unwrap_or_default());
    }
    let nonce = match &req.nonce {
        Some(n) => n.clone(),
        None => random_hex(16)?,
    };
    Ok(generate_client_instance_id(Some(client), req.now, &nonce))
}

/// One server's environment: the identity keys the launcher alone sets,
/// then the caller's extra keys ([`check_extra_env`] has refused any of
/// the launcher's own; they are skipped here too, should a caller skip it).
fn server_env(
    req: &LaunchRequest,
    ns: &str,
    client: &str,
    instance: &str,
    session: &str,
    fleet_run: Option<&str>,
) -> Map<String, Json> {
    let mut env = Map::new();
    env.insert(env::PROFILE.into(), json!(req.profiles[ns]));
    env.insert(env::NAMESPACE.into(), json!(ns));
    env.insert(env::CLIENT_MANAGED.into(), json!("1"));
    env.insert(env::CLIENT.into(), json!(client));
    env.insert(env::CLIENT_INSTANCE.into(), json!(instance));
    env.insert(env::INSTANCE_PROVENANCE.into(), json!(LAUNCHER_PROVENANCE));
    if let Some(c) = &req.config {
        env.insert(env::CONFIG.into(), json!(c));
    }
    if let Some(f) = fleet_run {
        env.insert(env::FLEET_RUN_ID.into(), json!(f));
    }
    env.insert(env::CLIENT_SESSION.into(), json!(session));
    for (k, v) in &req.extra_env {
        if !is_reserved_key(k) {
            env.insert(k.clone(), json!(v));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn extra_environment_is_refused_unless_plain_and_foreign() {
        assert!(check_extra_env(&extra(&[("RUST_LOG", "debug"), ("_X1", "")])).is_ok());
        for (key, value, says) in [
            ("GITEA_MCP_PROFILE", "evil", "launch's own"),
            ("GITEA_MCP_WORKER_IDENTITY", "w", "launch's own"),
            ("Gitea_Mcp_Anything", "1", "launch's own"),
            ("GITEA_CLIENT_MANAGED", "0", "launch's own"),
            ("", "x", "not a variable name"),
            ("A\nB", "1", "not a variable name"),
            ("9LIVES", "1", "not a variable name"),
            ("A-B", "1", "not a variable name"),
            ("KEY", "a\0b", "NUL"),
        ] {
            let err = check_extra_env(&extra(&[(key, value)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(says) && err.starts_with("--env "),
                "{key:?}: {err}"
            );
        }
        let err = check_extra_env(&extra(&[("A", "1"), ("A", "2")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("twice"), "{err}");
    }

    #[test]
    fn instance_id_matches_the_seed_algorithm() {
        // client "codex", 2026-07-30T12:00:00Z, nonce "abc":
        //   stamp  = "20260730T120000Z"
        //   digest = sha256("codex\x1f20260730T120000Z\x1fabc")[:12]
        // computed by hand with: printf 'codex\03720260730T120000Z\037abc' | sha256sum
        //   -> 417535979dce9fd6...
        // (the seed's generate_client_instance_id gives the same id).
        let now = crate::time::parse_ts("2026-07-30T12:00:00Z").unwrap();
        let id = generate_client_instance_id(Some("Codex"), now, "abc");
        assert_eq!(id, "inst-codex-20260730T120000Z-417535979dce");
        // An unknown client normalises to "unknown" before hashing:
        // printf 'unknown\03720260102T030405Z\037n-1' | sha256sum -> 8d2d66028a2f...
        let now = crate::time::parse_ts("2026-01-02T03:04:05.9Z").unwrap();
        assert_eq!(
            generate_client_instance_id(Some("vim"), now, "n-1"),
            "inst-unknown-20260102T030405Z-8d2d66028a2f"
        );
    }
}
