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
//! this user, a real folder (not a link) and closed to everyone else
//! (mode 0700 exactly). It is opened once and held: every file is reached
//! through that descriptor, never through the path again, so a folder
//! renamed away and replaced (by whoever can write its parent) is never
//! followed (found by the independent review). Each file is written whole
//! (0600, `O_EXCL`, synced) and renamed into place; a file is read only
//! when it is a regular file of this user's, up to [`MAX_FILE`] bytes. Only
//! the newest [`KEEP_FILES`] of the last [`KEEP_FOR`] are kept. (A per-call
//! client that pages makes a plan per page; each file holds about 300
//! bytes per registry row.)

use crate::plan::planned::PlannedRows;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// How many plans' rows the folder keeps (the newest).
pub const KEEP_FILES: usize = 32;

/// How long a plan's rows are kept at most.
pub const KEEP_FOR: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The largest kept plan read back (about three million rows' worth).
pub const MAX_FILE: u64 = 1 << 30;

/// The folder, held open, and the binding its files must match.
#[derive(Debug, Clone)]
pub struct PlanDir {
    path: PathBuf,
    dir: std::sync::Arc<OwnedFd>,
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
            dir: std::sync::Arc::new(dir),
            canonical_repository: canonical_repository.to_string(),
        })
    }

    /// The file name of a plan's tokens; `None` for a token that is not a
    /// token's shape (a name never holds anything else).
    fn name(registry: &str, candidate: &str) -> Option<String> {
        let shaped = |t: &str, prefix: &str| {
            t.strip_prefix(prefix).is_some_and(|hex| {
                !hex.is_empty() && hex.len() <= 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
            })
        };
        (shaped(registry, "registryfp-") && shaped(candidate, "candidatefp-"))
            .then(|| format!("{registry}.{candidate}.json"))
    }

    /// Write a plan's rows, then drop the oldest files beyond
    /// [`KEEP_FILES`]. A failure is logged, never a failed plan call.
    pub fn save(&self, candidate_fingerprint: &str, rows: &PlannedRows) {
        let Some(name) = Self::name(&rows.registry_fingerprint, candidate_fingerprint) else {
            return;
        };
        let saved = Saved {
            registry_fingerprint: rows.registry_fingerprint.clone(),
            candidate_fingerprint: candidate_fingerprint.to_string(),
            canonical_repository: self.canonical_repository.clone(),
            planned_rows: rows.clone(),
        };
        if let Err(e) = self.write(&name, &saved) {
            tracing::warn!(
                "cannot keep the plan's rows in {}: {e}",
                self.path.join(&name).display()
            );
            return;
        }
        self.prune();
    }

    /// Write `saved` under `name`: a new 0600 file beside it, renamed over it.
    fn write(&self, name: &str, saved: &Saved) -> std::io::Result<()> {
        let temporary = format!(".{name}.{}.tmp", std::process::id());
        let fd = openat(
            self.dir.as_fd(),
            temporary.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        let written = (|| {
            let mut w = std::io::BufWriter::new(std::fs::File::from(fd));
            serde_json::to_writer(&mut w, saved).map_err(std::io::Error::other)?;
            w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
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

    /// The rows of the plan issued under these tokens for this binding, if
    /// a server kept them here.
    pub fn load(&self, registry: &str, candidate: &str) -> Option<PlannedRows> {
        let name = Self::name(registry, candidate)?;
        let fd = openat(
            self.dir.as_fd(),
            name.as_str(),
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
                self.path.join(&name).display()
            );
            return None;
        }
        let reader = std::io::BufReader::new(std::fs::File::from(fd));
        let saved: Saved = match serde_json::from_reader(reader) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    "{} is not a kept plan ({e}); ignored",
                    self.path.join(&name).display()
                );
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
    /// older than [`KEEP_FOR`] (named through the path, removed through the
    /// held folder: only ever names of ours in it).
    fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return;
        };
        let mut kept: Vec<(i64, String)> = entries
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                if !(name.starts_with("registryfp-") && name.ends_with(".json")) {
                    return None;
                }
                let meta = nix::sys::stat::fstatat(
                    self.dir.as_fd(),
                    name.as_str(),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .ok()?;
                Some((meta.st_mtime, name))
            })
            .collect();
        kept.sort_by_key(|k| std::cmp::Reverse(k.0));
        let oldest = chrono::Utc::now().timestamp() - KEEP_FOR.as_secs() as i64;
        for (i, (modified, name)) in kept.into_iter().enumerate() {
            if i >= KEEP_FILES || modified < oldest {
                let _ = unlinkat(self.dir.as_fd(), name.as_str(), UnlinkatFlags::NoRemoveDir);
            }
        }
    }
}

/// The file-type bits of `st_mode`.
mod libc_mode {
    pub const S_IFMT: u32 = 0o170000;
    pub const S_IFREG: u32 = 0o100000;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const REG: &str = "registryfp-00112233445566778899aabbccddeeff";
    const CAND: &str = "candidatefp-00112233445566778899aabbccddeeff";

    fn rows() -> PlannedRows {
        PlannedRows {
            registry_fingerprint: REG.into(),
            rows: Vec::new(),
        }
    }

    /// A plan's rows written by one server are read by the next, for the
    /// same tokens and binding only.
    #[test]
    fn a_kept_plan_is_found_by_both_tokens_and_the_binding() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("plans");
        PlanDir::open(&path, "prgs/a").unwrap().save(CAND, &rows());
        let next = PlanDir::open(&path, "prgs/a").unwrap();
        assert_eq!(next.load(REG, CAND), Some(rows()));
        let other_candidates = CAND.replace("00112233", "99999999");
        assert_eq!(next.load(REG, &other_candidates), None);
        assert_eq!(
            PlanDir::open(&path, "prgs/b").unwrap().load(REG, CAND),
            None
        );
        assert_eq!(next.load("../../etc/passwd", CAND), None);
        let file = path.join(format!("{REG}.{CAND}.json"));
        let mode = std::fs::metadata(file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A folder open to others, or a link, is refused.
    #[test]
    fn a_folder_open_to_others_or_a_link_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let open = root.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(PlanDir::open(&open, "prgs/a")
            .unwrap_err()
            .contains("open to others"));
        let private = root.path().join("private");
        PlanDir::open(&private, "prgs/a").unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        assert!(PlanDir::open(&link, "prgs/a").is_err());
    }

    /// Found by the independent review: the folder was reached through its
    /// path at every use, so one renamed away and replaced by a folder of
    /// forged plans was followed. The folder held open is the one used.
    #[test]
    fn a_folder_replaced_after_it_was_opened_is_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("plans");
        let dir = PlanDir::open(&path, "prgs/a").unwrap();
        std::fs::rename(&path, root.path().join("moved")).unwrap();
        std::fs::create_dir(&path).unwrap();
        let forged = Saved {
            registry_fingerprint: REG.into(),
            candidate_fingerprint: CAND.into(),
            canonical_repository: "prgs/a".into(),
            planned_rows: rows(),
        };
        std::fs::write(
            path.join(format!("{REG}.{CAND}.json")),
            serde_json::to_vec(&forged).unwrap(),
        )
        .unwrap();
        assert_eq!(dir.load(REG, CAND), None);
        dir.save(CAND, &rows());
        assert!(root
            .path()
            .join("moved")
            .join(format!("{REG}.{CAND}.json"))
            .is_file());
    }

    /// A link in the folder in place of a kept plan is not followed.
    #[test]
    fn a_link_in_place_of_a_kept_plan_is_ignored() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("plans");
        let dir = PlanDir::open(&path, "prgs/a").unwrap();
        let elsewhere = root.path().join("elsewhere.json");
        dir.save(CAND, &rows());
        std::fs::rename(path.join(format!("{REG}.{CAND}.json")), &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, path.join(format!("{REG}.{CAND}.json"))).unwrap();
        assert_eq!(dir.load(REG, CAND), None);
    }
}
