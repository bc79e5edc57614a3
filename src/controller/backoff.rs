//! Backoff by reason (docs/controller.md, "Backoff"): never faster than the
//! evidence. A plan that moved under the apply is tried again at once with
//! jitter, then backs off; a failure of the stores or the transaction backs
//! off exponentially (1 s doubling to 5 min, with jitter); a refusal of the
//! capability or the policy set waits until `profiles.json` or the policy
//! set on disk changes (`follow.rs` reloads the set); an
//! apply whose outcome is unknown holds every apply until the registry's
//! audit rows say whether it committed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest wait.
const MAX: Duration = Duration::from_secs(300);

/// What holds the next tick back.
#[derive(Default)]
pub struct Backoff {
    failures: u32,
    not_before: Option<Instant>,
    /// `profiles.json` as it was when the capability refused (the hold
    /// also ends when the policy set changes: [`Backoff::policies_changed`]).
    profiles_were: Option<(PathBuf, Vec<u8>)>,
    /// The apply whose outcome is unknown.
    pub unresolved: Option<String>,
}

impl Backoff {
    /// Whether a tick may run now.
    pub fn ready(&mut self) -> bool {
        if self.unresolved.is_some() {
            return false;
        }
        if let Some((path, was)) = &self.profiles_were {
            if digest(path) == *was {
                return false;
            }
            tracing::info!("profiles.json changed: trying again");
            self.profiles_were = None;
        }
        self.not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// The policy set was loaded again from disk: a refusal of the
    /// capability or the pin may go otherwise now.
    pub fn policies_changed(&mut self) {
        if self.profiles_were.take().is_some() {
            tracing::info!("the policy set changed: trying again");
        }
    }

    /// After a tick that ended with `outcome`.
    pub fn after(&mut self, outcome: &str, apply_id: Option<String>, profiles: &Path) {
        self.not_before = None;
        match outcome {
            "registry_revision_moved" | "candidate_set_moved" => {
                self.failures += 1;
                // Three tries at once (with jitter), then as a failure.
                let wait = if self.failures <= 3 {
                    Duration::from_millis(200)
                } else {
                    exponential(self.failures - 3)
                };
                self.wait(wait);
            }
            "transaction_failed"
            | "registry_unavailable"
            | "lease_store_unavailable"
            | "blind"
            | "registry_untrusted"
            | "leadership_lost" => {
                self.failures += 1;
                self.wait(exponential(self.failures));
            }
            "permission_denied" | "policy_set_not_pinned" | "policy_set_moved" => {
                self.profiles_were = Some((profiles.to_path_buf(), digest(profiles)));
            }
            "outcome_unknown" => self.unresolved = apply_id,
            _ => self.failures = 0,
        }
    }

    fn wait(&mut self, d: Duration) {
        let jittered = d.mul_f64(0.5 + jitter());
        self.not_before = Some(Instant::now() + jittered.min(MAX));
    }
}

/// 1 s doubling per failure, at most [`MAX`].
fn exponential(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(9)).min(MAX)
}

/// A number in [0, 1) that differs between controllers and ticks (so
/// controllers that failed together do not retry together).
fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mixed = (u64::from(nanos) ^ u64::from(std::process::id()).rotate_left(32))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 11) as f64 / (1u64 << 53) as f64
}

/// The file's bytes' digest, or empty when it cannot be read. Read as
/// `profiles.json` is everywhere (a regular file of bounded size, never
/// blocking): a FIFO or a link to a device put in its place is unreadable,
/// never a wait or an endless read.
fn digest(path: &Path) -> Vec<u8> {
    crate::jsonfile::read_regular(path, crate::jsonfile::MAX_INPUT_BYTES)
        .map_or_else(|_| Vec::new(), |b| b.sha256.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_from_one_second_to_five_minutes() {
        assert_eq!(exponential(1), Duration::from_secs(1));
        assert_eq!(exponential(2), Duration::from_secs(2));
        assert_eq!(exponential(30), MAX);
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j));
        }
    }

    /// `profiles.json` replaced by a FIFO while a refusal holds: the poll
    /// finds it unreadable at once, and never waits for a writer.
    #[test]
    fn a_fifo_in_place_of_profiles_json_never_blocks_the_poll() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profiles.json");
        std::fs::write(&path, "{}").unwrap();
        let mut b = Backoff::default();
        b.after("permission_denied", None, &path);
        assert!(!b.ready());
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(digest(&path), Vec::<u8>::new());
        assert!(b.ready(), "a file that changed into a FIFO is a change");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn an_unknown_outcome_holds_every_tick_until_resolved() {
        let mut b = Backoff::default();
        b.after(
            "outcome_unknown",
            Some("a1".into()),
            Path::new("/nonexistent"),
        );
        assert!(!b.ready());
        b.unresolved = None;
        assert!(b.ready());
    }
}
