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
//! A kept plan records what made it ([`MadeBy`]: the policy set, the
//! registry, the repository and the profile) and is taken only by a server
//! bound to the same; the tokens of a plan made otherwise are refused, not
//! ignored (`made_by`, finding 50.7).
//!
//! The folder is created private (0700) and used only while it is owned by
//! this user, a real folder (not a link) and closed to everyone else
//! (mode 0700 exactly). It is opened once and held: every file is reached,
//! and the folder listed, through that descriptor, never through the path
//! again, so a folder renamed away and replaced (by whoever can write its
//! parent) is never followed (found by the independent review) and a
//! folder renamed away is still pruned (`prune`, finding 50.8). Each file
//! is written whole (0600, `O_EXCL`, locked, synced) and renamed into
//! place; a file is read only when it is a regular file of this user's, up
//! to [`MAX_FILE`] bytes. Only the newest [`KEEP_FILES`] of the last
//! [`KEEP_FOR`], up to [`KEEP_BYTES`] in all, are kept (the server says so
//! in its log at start), and temporary files no live writer holds are
//! removed after [`TEMPORARY_STALE`]. (A per-call client that pages makes
//! a plan per page; each file holds about 300 bytes per registry row.)

mod file;
mod made_by;
mod prune;
#[cfg(test)]
mod tests;

pub use made_by::{registry_identity, MadeBy};
pub use prune::TEMPORARY_STALE;

use crate::plan::planned::PlannedRows;
use nix::fcntl::{openat, renameat, Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::{de::DeserializeOwned, Deserialize};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How many plans' rows the folder keeps (the newest).
pub const KEEP_FILES: usize = 32;

/// How long a plan's rows are kept at most.
pub const KEEP_FOR: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// How many bytes of kept plans the folder holds at most unless the
/// server is told otherwise (`--plan-dir-max-mib`); the plan just written
/// is kept even when it alone is larger.
pub const KEEP_BYTES: u64 = 256 << 20;

/// The largest kept plan read back (about three million rows' worth).
pub const MAX_FILE: u64 = 1 << 30;

/// What the names of a host-scoped plan's files start each token with, in
/// place of `host-scope:`. The file itself holds the tokens as issued;
/// the scope's host is not written, a scoped token being bound to it and
/// a server applying only its own host's scope.
const SCOPED_NAME: &str = "host-scope-";

/// The folder, held open, and the binding of the server using it.
#[derive(Debug, Clone)]
pub struct PlanDir {
    path: PathBuf,
    dir: Arc<OwnedFd>,
    made_by: MadeBy,
    /// The folder's bound in bytes ([`KEEP_BYTES`] unless set).
    max_bytes: u64,
}

/// A kept plan's file without its rows: enough to say what made it.
#[derive(Deserialize)]
struct Heading {
    registry_fingerprint: String,
    candidate_fingerprint: String,
    made_by: MadeBy,
}

/// What the folder (or a server's memory) holds under a pair of tokens.
#[derive(Debug, PartialEq)]
pub enum Found {
    /// The rows of a plan this server's binding made.
    Ours(Arc<PlannedRows>),
    /// Only a plan made under another binding: how it differs, in words.
    Elsewhere(String),
    /// No plan of these tokens.
    Nothing,
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
    /// bound as `made_by` says. `Err` says why it cannot be used.
    pub fn open(path: &Path, made_by: MadeBy) -> Result<PlanDir, String> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let dir = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            format!(
                "cannot open {} as a folder (not a link): {e}",
                path.display()
            )
        })?;
        let meta = nix::sys::stat::fstat(&dir)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if meta.st_uid != nix::unistd::geteuid().as_raw() || meta.st_mode & 0o077 != 0 {
            return Err(format!(
                "{} is not this user's own, or is open to others (mode {:o}); make it 0700 \
                 and owned by this user, or name another with --plan-dir",
                path.display(),
                meta.st_mode & 0o7777
            ));
        }
        Ok(PlanDir {
            path: path.to_path_buf(),
            dir: Arc::new(dir),
            made_by,
            max_bytes: KEEP_BYTES,
        })
    }

    /// The same folder, bounded to `max_bytes` of kept plans.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> PlanDir {
        self.max_bytes = max_bytes;
        self
    }

    /// Where the folder is and what it keeps, for the server's log at
    /// start.
    pub fn describe(&self) -> String {
        format!(
            "kept plans (for an apply by the next server, as a client that starts a server \
             per call needs) in {}: the newest {KEEP_FILES} of the last {} hours, at most {:.1} \
             MiB in all (the plan just written is kept even when alone larger); \
             --plan-dir and --plan-dir-max-mib change them",
            self.path.display(),
            KEEP_FOR.as_secs() / 3600,
            self.max_bytes as f64 / f64::from(1 << 20),
        )
    }

    /// The start of the file names of a plan's tokens (a host-scoped
    /// plan's are marked [`SCOPED_NAME`]); `None` for a token
    /// that is not a token's shape (a name never holds anything else).
    fn prefix(registry: &str, candidate: &str) -> Option<String> {
        let shaped = |t: &str, prefix: &str| {
            t.strip_prefix(prefix).is_some_and(|hex| {
                !hex.is_empty() && hex.len() <= 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
            })
        };
        if shaped(registry, "registryfp-") && shaped(candidate, "candidatefp-") {
            return Some(format!("{registry}.{candidate}."));
        }
        // A host-scoped plan's tokens (`host-scope:…`, both or neither):
        // named without the colon, so the name stays a plain word.
        let scope = crate::fingerprint::HOST_SCOPE;
        let registry = registry.strip_prefix(scope)?;
        let candidate = candidate.strip_prefix(scope)?;
        (shaped(registry, "registryfp-") && shaped(candidate, "candidatefp-"))
            .then(|| format!("{SCOPED_NAME}{registry}.{SCOPED_NAME}{candidate}."))
    }

    /// The file name of a plan of these tokens made under this binding.
    fn name(&self, registry: &str, candidate: &str) -> Option<String> {
        Self::prefix(registry, candidate).map(|p| format!("{p}{}.json", self.made_by.tag()))
    }

    /// Write a plan's rows, then prune the folder. A failure is logged,
    /// never a failed plan call.
    pub fn save(&self, candidate_fingerprint: &str, rows: &PlannedRows) {
        let Some(name) = self.name(&rows.registry_fingerprint, candidate_fingerprint) else {
            return;
        };
        let saved = file::Writing::new(candidate_fingerprint, &self.made_by, rows);
        let written = self.write(&name, &saved);
        if let Err(e) = &written {
            tracing::warn!(
                "cannot keep the plan's rows in {}: {e}",
                self.path.join(&name).display()
            );
        }
        self.prune(written.is_ok().then_some(name.as_str()));
    }

    /// Write `saved` under `name`: a new 0600 file beside it, locked while
    /// it is written (`prune` never takes a locked one for abandoned),
    /// renamed over it.
    fn write(&self, name: &str, saved: &file::Writing) -> std::io::Result<()> {
        let temporary = prune::temporary_name(name);
        let fd = openat(
            self.dir.as_fd(),
            temporary.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        let written = (|| {
            let held = Flock::lock(std::fs::File::from(fd), FlockArg::LockExclusiveNonblock)
                .map_err(|(_, e)| std::io::Error::from(e))?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, &*held);
            serde_json::to_writer(&mut w, saved).map_err(std::io::Error::other)?;
            w.flush()?;
            drop(w);
            held.sync_all()?;
            renameat(self.dir.as_fd(), temporary.as_str(), self.dir.as_fd(), name)?;
            Ok(())
        })();
        if written.is_err() {
            let _ = unlinkat(
                self.dir.as_fd(),
                temporary.as_str(),
                UnlinkatFlags::NoRemoveDir,
            );
        }
        written
    }

    /// The plan kept under these tokens: this binding's rows, else what
    /// another binding's plan of the same tokens differs in.
    pub fn load(&self, registry: &str, candidate: &str) -> Found {
        let (Some(prefix), Some(ours)) = (
            Self::prefix(registry, candidate),
            self.name(registry, candidate),
        ) else {
            return Found::Nothing;
        };
        if let Some(saved) = self.read::<file::Saved>(&ours) {
            let tokens =
                saved.registry_fingerprint == registry && saved.candidate_fingerprint == candidate;
            if tokens && saved.made_by == self.made_by {
                if let Some(rows) = saved.into_rows() {
                    return Found::Ours(Arc::new(rows));
                }
            }
        }
        let others = self
            .names()
            .into_iter()
            .filter(|n| n.starts_with(&prefix) && n.ends_with(".json") && *n != ours);
        for other in others {
            let Some(theirs) = self.read::<Heading>(&other) else {
                continue;
            };
            let differs = self.made_by.differences(&theirs.made_by);
            let tokens = theirs.registry_fingerprint == registry
                && theirs.candidate_fingerprint == candidate;
            if tokens && !differs.is_empty() {
                return Found::Elsewhere(differs.join("; "));
            }
        }
        Found::Nothing
    }

    /// The file `name` parsed, when it is a regular file of this user's up
    /// to [`MAX_FILE`] bytes holding what `T` reads.
    fn read<T: DeserializeOwned>(&self, name: &str) -> Option<T> {
        let fd = openat(
            self.dir.as_fd(),
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        )
        .ok()?;
        let meta = nix::sys::stat::fstat(&fd).ok()?;
        let regular = meta.st_mode & libc_mode::S_IFMT == libc_mode::S_IFREG;
        let mine = meta.st_uid == nix::unistd::geteuid().as_raw();
        if !regular || !mine || meta.st_size < 0 || meta.st_size as u64 > MAX_FILE {
            tracing::warn!(
                "{} is not a kept plan of this user's (a regular file up to {MAX_FILE} bytes); \
                 ignored",
                self.path.join(name).display()
            );
            return None;
        }
        let reader = std::io::BufReader::new(std::fs::File::from(fd));
        match serde_json::from_reader(reader) {
            Ok(parsed) => Some(parsed),
            Err(e) => {
                tracing::warn!(
                    "{} is not a kept plan ({e}); ignored",
                    self.path.join(name).display()
                );
                None
            }
        }
    }
}

/// The file-type bits of `st_mode`.
mod libc_mode {
    pub const S_IFMT: u32 = 0o170000;
    pub const S_IFREG: u32 = 0o100000;
}
