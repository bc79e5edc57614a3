//! What made a kept plan: the binding of the server that planned it.
//!
//! A plan's three tokens are a pairing of what it read and what judged it:
//! the registry token of one registry's rows, the candidate token of the
//! verdicts one policy set gave them, for one repository, asked for by one
//! profile allowed to plan. Found by a security review (finding 50.7): kept
//! plans were matched by the registry token, the candidate token and the
//! repository only, so an agent paired a controller's policy token with the
//! tokens of a plan another server made under another policy set, with a
//! profile that may not retire; the controller retired and audited a
//! pairing no plan produced. A kept plan now records all four, and a
//! server takes only the plans its own binding made.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

/// The binding a plan was made under; a kept plan vouches for nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MadeBy {
    /// The policy set's fingerprint (the plan's `policy_fingerprint`).
    pub policy_fingerprint: String,
    /// The registry it read ([`registry_identity`]).
    pub registry: String,
    /// The canonical repository it was bound to.
    pub canonical_repository: String,
    /// The profile that planned (the plan tool writes a plan only after
    /// the capability policies allowed this profile to plan).
    pub profile: String,
}

impl MadeBy {
    /// A digest of the binding (32 hex digits), part of a kept plan's file
    /// name: servers bound otherwise that make plans of the same tokens
    /// (two profiles planning one fleet at once) never write over one
    /// another's plans.
    pub(super) fn tag(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        crate::fingerprint::hex(&Sha256::digest(text.as_bytes()))[..32].to_string()
    }

    /// How `theirs` differs from this binding, in words (empty when it
    /// does not).
    pub(super) fn differences(&self, theirs: &MadeBy) -> Vec<String> {
        let mut out = Vec::new();
        let mut compare = |what: &str, mine: &str, other: &str| {
            if mine != other {
                out.push(format!(
                    "{what} {}, not this server's {}",
                    crate::serve::results::clipped(other),
                    crate::serve::results::clipped(mine)
                ));
            }
        };
        compare(
            "the policy set",
            &self.policy_fingerprint,
            &theirs.policy_fingerprint,
        );
        compare("the registry", &self.registry, &theirs.registry);
        compare(
            "the canonical repository",
            &self.canonical_repository,
            &theirs.canonical_repository,
        );
        compare("the profile", &self.profile, &theirs.profile);
        out
    }
}

/// The identity of a registry location (`store::location::identity`): a
/// PostgreSQL database by its URL as shown, a SQLite file by its resolved
/// path, device and inode.
pub fn registry_identity(location: &Path) -> String {
    crate::store::location::identity(location)
}
