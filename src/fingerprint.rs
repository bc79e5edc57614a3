//! The three compare-and-swap tokens, byte-compatible with the seed
//! (`registry_fingerprint`, `candidate_fingerprint`,
//! `external_state_fingerprint`). They are a contract with the original
//! system: the field lists, separators, version tags and prefixes here must
//! not change.

use crate::evidence::leases::Lease;
use crate::row::{Col, Row};
use sha2::{Digest, Sha256};

/// The registry-token field list, in contract order. `instance_id_source`,
/// `token_fingerprint`, the revisions and the `retired_*` columns are
/// deliberately absent (seed-pitfalls 6).
pub const FINGERPRINT_FIELDS: &[Col] = &[
    Col::WorkerIdentity,
    Col::ClientName,
    Col::ClientInstanceId,
    Col::SessionId,
    Col::GenerationId,
    Col::Role,
    Col::Profile,
    Col::Namespace,
    Col::Remote,
    Col::RepositoryBinding,
    Col::Pid,
    Col::ProcessIdentity,
    Col::Transport,
    Col::StartedAt,
    Col::LastHeartbeatAt,
    Col::HeartbeatTtlSeconds,
    Col::FencingEpoch,
    Col::Status,
    Col::FleetRunId,
    Col::AuthenticatedAccount,
    Col::InstanceIdProvenance,
    Col::HostId,
    Col::BootId,
    Col::ProcessStartTime,
];

/// Lease fields that take part in the external-state token.
pub const LEASE_FENCE_FIELDS: &[&str] = &[
    "lease_id",
    "role",
    "target",
    "status",
    "session_id",
    "owner_session_id",
    "owner_pid",
    "session_pid",
    "generation",
];

const UNIT: char = '\u{1f}';
const RECORD: char = '\u{1e}';

/// The canonical serialization of one row (the unit the tokens sort and hash).
pub fn serialize_row(row: &Row) -> String {
    let mut out = String::with_capacity(640);
    for (i, col) in FINGERPRINT_FIELDS.iter().enumerate() {
        if i > 0 {
            out.push(UNIT);
        }
        out.push_str(col.name());
        out.push('=');
        row.get(*col).write_canon(&mut out);
    }
    out
}

fn digest<S: AsRef<str> + Ord>(version: &str, mut units: Vec<S>, prefix: &str) -> String {
    units.sort_unstable();
    let mut hasher = Sha256::new();
    hasher.update(version.as_bytes());
    hasher.update(RECORD.to_string().as_bytes());
    hasher.update(units.len().to_string().as_bytes());
    for unit in &units {
        hasher.update(RECORD.to_string().as_bytes());
        hasher.update(unit.as_ref().as_bytes());
    }
    let hex = hex(&hasher.finalize());
    format!("{prefix}-{}", &hex[..32])
}

/// Lower-case hexadecimal of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Both tokens of a plan from the rows' serializations, computed once:
/// `(registry_fingerprint, candidate_fingerprint)`.
pub fn plan_tokens(
    serialized: &[String],
    is_candidate: impl Fn(usize) -> bool,
) -> (String, String) {
    let all: Vec<&str> = serialized.iter().map(String::as_str).collect();
    let candidates: Vec<&str> = serialized
        .iter()
        .enumerate()
        .filter(|(i, _)| is_candidate(*i))
        .map(|(_, s)| s.as_str())
        .collect();
    // The two digests are independent; hash them side by side.
    std::thread::scope(|scope| {
        let registry = scope.spawn(|| digest("registryfp-v1", all, "registryfp"));
        let candidate = digest("candidatefp-v1", candidates, "candidatefp");
        (
            registry.join().expect("fingerprint thread panicked"),
            candidate,
        )
    })
}

/// Token over every registry row; order-independent, time-independent.
pub fn registry_fingerprint<'a>(rows: impl IntoIterator<Item = &'a Row>) -> String {
    let units = rows.into_iter().map(serialize_row).collect();
    digest("registryfp-v1", units, "registryfp")
}

/// Token over exactly the approved candidate rows.
pub fn candidate_fingerprint<'a>(rows: impl IntoIterator<Item = &'a Row>) -> String {
    let units = rows.into_iter().map(serialize_row).collect();
    digest("candidatefp-v1", units, "candidatefp")
}

/// Token over the active leases a decision consumed.
pub fn external_state_fingerprint<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> String {
    let units = leases
        .into_iter()
        .map(|lease| {
            let mut out = String::new();
            for (i, name) in LEASE_FENCE_FIELDS.iter().enumerate() {
                if i > 0 {
                    out.push(UNIT);
                }
                out.push_str(name);
                out.push('=');
                out.push_str(&lease.get(name).canon());
            }
            out
        })
        .collect();
    digest("externalfp-v1", units, "externalfp")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    #[test]
    fn empty_registry_token_is_the_hash_of_version_and_count() {
        // sha256("registryfp-v1\x1e0"), computed independently of this code:
        // printf 'registryfp-v1\0360' | sha256sum
        let want = {
            let mut h = Sha256::new();
            h.update(b"registryfp-v1\x1e0");
            format!("registryfp-{}", &hex(&h.finalize())[..32])
        };
        assert_eq!(registry_fingerprint(std::iter::empty()), want);
    }

    #[test]
    fn token_ignores_order_and_numeric_typing() {
        let mut a = Row::default();
        a.set(Col::WorkerIdentity, Value::Text("w-1".into()));
        a.set(Col::HeartbeatTtlSeconds, Value::Real(900.0));
        let mut b = Row::default();
        b.set(Col::WorkerIdentity, Value::Text("w-2".into()));
        let mut a2 = a.clone();
        a2.set(Col::HeartbeatTtlSeconds, Value::Int(900));
        assert_eq!(
            registry_fingerprint([&a, &b]),
            registry_fingerprint([&b, &a2])
        );
        let mut a3 = a.clone();
        a3.set(Col::HeartbeatTtlSeconds, Value::Real(900.5));
        assert_ne!(
            registry_fingerprint([&a, &b]),
            registry_fingerprint([&a3, &b])
        );
        // token_fingerprint never moves the token.
        let mut a4 = a.clone();
        a4.set(Col::TokenFingerprint, Value::Text("secret".into()));
        assert_eq!(registry_fingerprint([&a]), registry_fingerprint([&a4]));
    }

    #[test]
    fn external_token_matches_the_seed() {
        // Expected values: the seed's mcp_fleet_retirement.external_state_fingerprint
        // run on the same two leases (and on none) under Python 3.11.
        let lease = |v: serde_json::Value| Lease::from_json(v.as_object().unwrap()).unwrap();
        let leases = [
            lease(
                serde_json::json!({"lease_id": "l-1", "role": "author", "target": "issue-1",
                "status": "active", "session_id": "s-1", "owner_session_id": null, "owner_pid": 4242,
                "session_pid": null, "generation": "g-1", "owner_worker_identity": "w"}),
            ),
            lease(
                serde_json::json!({"lease_id": "l-2", "role": "merger", "target": "pr-7",
                "status": "active", "session_id": null, "owner_session_id": "s-2", "owner_pid": null,
                "session_pid": 77.0, "generation": null}),
            ),
        ];
        assert_eq!(
            external_state_fingerprint(&leases),
            "externalfp-8d1cccf1b9a50154f9d37835f4d2fd09"
        );
        assert_eq!(
            external_state_fingerprint(std::iter::empty()),
            "externalfp-cc1f702beded00b09eecf2c3524e2b05"
        );
    }
}
