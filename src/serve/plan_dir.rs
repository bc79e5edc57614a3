//! The rows of the plans servers issued, kept on disk for the servers that
//! come after (docs/serve.md, "A client that starts a server per call").
//!
//! A client that starts a server per call (the MCP Inspector's command
//! line does) plans with one server and applies with the next, which never
//! saw the plan. Each server therefore writes the rows of every plan it
//! issues ([`PlannedRows`]: digests, verdicts, peer facts) to a folder of
//! the user's own, and a server asked to apply tokens it did not issue looks
//! them up there. What it finds vouches for no more than a saved plan file
//! does: the registry and candidate tokens must match the call's, and apply
//! still re-plans, checks the candidate token against the recorded verdicts,
//! re-probes and fences (docs/semantics.md §13).
//!
//! The folder is created private (0700) and used only while it is owned by
//! this user and writable by no one else; each file is written whole and
//! renamed into place, and only the newest [`KEEP_FILES`] of the last
//! [`KEEP_FOR`] are kept. (A per-call client that pages makes a plan per
//! page; each file holds about 300 bytes per registry row.)

use crate::plan::planned::PlannedRows;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// How many plans' rows the folder keeps (the newest).
pub const KEEP_FILES: usize = 32;

/// How long a plan's rows are kept at most.
pub const KEEP_FOR: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The folder and the binding its files must match.
#[derive(Debug, Clone)]
pub struct PlanDir {
    path: PathBuf,
    canonical_repository: String,
}

/// One file: the plan's tokens, the binding it was judged under, its rows.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    registry_fingerprint: String,
    candidate_fingerprint: String,
    canonical_repository: String,
    planned_rows: PlannedRows,
}

/// The default folder: `$XDG_STATE_HOME/fleet-retire/plans`, else
/// `$HOME/.local/state/fleet-retire/plans`; `None` without either.
pub fn default_path() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })?;
    Some(state.join("fleet-retire").join("plans"))
}

impl PlanDir {
    /// The folder at `path` (created private when missing), for a server
    /// bound to `canonical_repository`. `Err` says why it cannot be used.
    pub fn open(path: &Path, canonical_repository: &str) -> Result<PlanDir, String> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if !meta.is_dir() {
            return Err(format!("{} is not a folder", path.display()));
        }
        if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 {
            return Err(format!(
                "{} is not this user's own, or others may write in it; make it 0700 and \
                 owned by this user, or name another with --plan-dir",
                path.display()
            ));
        }
        Ok(PlanDir {
            path: path.to_path_buf(),
            canonical_repository: canonical_repository.to_string(),
        })
    }

    /// The file of a plan's tokens; `None` for a token that is not a
    /// token's shape (it never names another path).
    fn file(&self, registry: &str, candidate: &str) -> Option<PathBuf> {
        let shaped = |t: &str, prefix: &str| {
            t.strip_prefix(prefix)
                .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        };
        (shaped(registry, "registryfp-") && shaped(candidate, "candidatefp-"))
            .then(|| self.path.join(format!("{registry}.{candidate}.json")))
    }

    /// Write a plan's rows, then drop the oldest files beyond
    /// [`KEEP_FILES`]. A failure is logged, never a failed plan call.
    pub fn save(&self, candidate_fingerprint: &str, rows: &PlannedRows) {
        let Some(path) = self.file(&rows.registry_fingerprint, candidate_fingerprint) else {
            return;
        };
        let saved = Saved {
            registry_fingerprint: rows.registry_fingerprint.clone(),
            candidate_fingerprint: candidate_fingerprint.to_string(),
            canonical_repository: self.canonical_repository.clone(),
            planned_rows: rows.clone(),
        };
        let written = crate::outfile::replace_with(&path, |w| {
            serde_json::to_writer(w, &saved).map_err(std::io::Error::other)
        });
        if let Err(e) = written {
            tracing::warn!("cannot keep the plan's rows in {}: {e}", path.display());
            return;
        }
        self.prune();
    }

    /// The rows of the plan issued under these tokens for this binding, if
    /// a server kept them here.
    pub fn load(&self, registry: &str, candidate: &str) -> Option<PlannedRows> {
        let path = self.file(registry, candidate)?;
        let bytes = std::fs::read(&path).ok()?;
        let saved: Saved = match serde_json::from_slice(&bytes) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("{} is not a kept plan ({e}); ignored", path.display());
                return None;
            }
        };
        (saved.registry_fingerprint == registry
            && saved.candidate_fingerprint == candidate
            && saved.planned_rows.registry_fingerprint == registry
            && saved.canonical_repository == self.canonical_repository)
            .then_some(saved.planned_rows)
    }

    /// Remove the kept plans beyond the newest [`KEEP_FILES`], and those
    /// older than [`KEEP_FOR`].
    fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return;
        };
        let mut kept: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name();
                let name = name.to_str()?;
                if !(name.starts_with("registryfp-") && name.ends_with(".json")) {
                    return None;
                }
                Some((e.metadata().ok()?.modified().ok()?, e.path()))
            })
            .collect();
        kept.sort_by_key(|k| std::cmp::Reverse(k.0));
        let now = std::time::SystemTime::now();
        for (i, (modified, old)) in kept.into_iter().enumerate() {
            let stale = now.duration_since(modified).is_ok_and(|age| age > KEEP_FOR);
            if i >= KEEP_FILES || stale {
                let _ = std::fs::remove_file(old);
            }
        }
    }
}
