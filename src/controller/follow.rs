//! The policy set a controller judges by, followed on disk (docs/controller.md,
//! "Backoff by reason"). `profiles.json` is read again by every apply; the
//! policy set is loaded once at start, so a refusal of the capability or
//! the policy pin would otherwise wait on a change the controller never
//! reads. Every poll digests the set's files (`policy::source_digest`, the
//! same reads a load makes: a few small files), and when the digest moves
//! the set is loaded and checked again:
//!
//! * it loads (and, for a tick of this host's scope, keeps the scope exact,
//!   `policy::scope_check`): the next tick judges by it, afresh (nothing
//!   kept from a judgement by the old set), and a tick held by a refusal
//!   runs again;
//! * it does not: no tick runs (failing closed: half an edit is not a set
//!   anyone reviewed), `/readyz` says why, until the files change again.
//!
//! The built-in set never changes while the binary runs.

use crate::policy::{Policies, PolicySource};

/// The policy set's source and the digest of what was last loaded from it.
pub struct Follow {
    source: PolicySource,
    digest: Vec<u8>,
    /// Whether a set must keep a host's scope exact (ticks of the host
    /// scope).
    host_scope: bool,
    /// Why the set on disk cannot be used, while it cannot.
    invalid: Option<String>,
}

impl Follow {
    /// Following `source`, whose files held the texts of `digest`
    /// (`policy::loaded_digest`) when the running set was loaded from it.
    pub fn new(source: PolicySource, digest: Vec<u8>, host_scope: bool) -> Follow {
        Follow {
            source,
            digest,
            host_scope,
            invalid: None,
        }
    }

    /// The set on disk, when it changed since the last poll and can be
    /// used.
    pub fn poll(&mut self) -> Option<Policies> {
        let now = crate::policy::source_digest(&self.source);
        if now == self.digest {
            return None;
        }
        match self.load() {
            Ok(policies) => {
                tracing::info!(
                    fingerprint = %policies.fingerprint,
                    "the policy set changed on disk ({}): loaded; the next tick judges by it",
                    policies.origin
                );
                // The texts the load read: a write under way during it
                // leaves the files unlike them, and the next poll loads
                // again.
                self.digest = crate::policy::loaded_digest(&self.source, &policies);
                self.invalid = None;
                Some(policies)
            }
            Err(why) => {
                // Tried again at every poll (the files may have been caught
                // in the middle of a write that then ended), said once.
                if self.invalid.as_deref() != Some(why.as_str()) {
                    tracing::error!(
                        "the policy set changed on disk and cannot be used: {why}; no tick \
                         runs until it can"
                    );
                }
                self.digest = Vec::new();
                self.invalid = Some(why);
                None
            }
        }
    }

    /// Why no tick may run, while the set on disk cannot be used.
    pub fn invalid(&self) -> Option<&str> {
        self.invalid.as_deref()
    }

    fn load(&self) -> Result<Policies, String> {
        let policies = Policies::load(&self.source).map_err(|e| e.to_string())?;
        if self.host_scope {
            crate::policy::scope_check::scope_assumptions(&policies).map_err(|why| {
                format!(
                    "it does not keep a host's scope exact ({why}); fix the set, or restart \
                     the controller with --scope registry"
                )
            })?;
        }
        Ok(policies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy_of_ours(dir: &std::path::Path) {
        let ours = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        for name in [
            "schema.cedarschema",
            "retirement.cedar",
            "capabilities.cedar",
        ] {
            std::fs::copy(ours.join(name), dir.join(name)).unwrap();
        }
    }

    #[test]
    fn a_changed_set_is_loaded_and_a_broken_one_holds_until_fixed() {
        let dir = tempfile::tempdir().unwrap();
        copy_of_ours(dir.path());
        let source = PolicySource::Dir(dir.path().to_path_buf());
        let mut follow = Follow::new(source.clone(), crate::policy::source_digest(&source), true);
        assert!(follow.poll().is_none(), "nothing changed");
        let caps = dir.path().join("capabilities.cedar");
        let text = std::fs::read_to_string(&caps).unwrap();
        std::fs::write(&caps, format!("{text}\n// reviewed again\n")).unwrap();
        let loaded = follow.poll().expect("the edited set");
        assert!(follow.invalid().is_none());
        std::fs::write(&caps, "permit (principal, action, resource").unwrap();
        assert!(follow.poll().is_none());
        assert!(follow.invalid().is_some());
        assert!(follow.poll().is_none(), "still broken, still held");
        assert!(follow.invalid().is_some());
        std::fs::write(&caps, format!("{text}\n// reviewed again\n")).unwrap();
        let again = follow.poll().expect("fixed");
        assert_eq!(again.fingerprint, loaded.fingerprint);
        assert!(follow.invalid().is_none());
    }

    #[test]
    fn the_built_in_set_never_moves() {
        let mut follow = Follow::new(PolicySource::Embedded, Vec::new(), true);
        assert!(follow.poll().is_none());
    }
}
