//! Keeping the folder of kept plans bounded.
//!
//! Found by a security review (finding 50.8): the folder was listed through
//! its path while files were written through the descriptor held open, so
//! once the folder was renamed away a long-running server wrote into it and
//! never pruned it (40 plans left 40 files); and a server killed while
//! writing left its temporary file, up to a whole plan's size, which
//! neither the count nor the age limit removed. Both bounds now hold: the
//! folder is listed through the descriptor it is written through, and a
//! temporary file is removed once it is older than [`TEMPORARY_STALE`] and
//! no live writer holds it. A writer holds an exclusive `flock` on its
//! temporary file from the moment it creates it until it has renamed it
//! into place; the kernel drops that lock when the writer dies, however it
//! dies, so a file that can be locked has no live writer. The age is a
//! second guard: a file created a moment ago and not yet locked is never
//! taken for an abandoned one.
//!
//! Issue 52: 32 plans of 100,000 rows took a gigabyte, a bound no user
//! saw. The folder is also bounded in bytes (256 MiB unless
//! `--plan-dir-max-mib` says otherwise): the oldest plans go first.

use super::{PlanDir, KEEP_FILES, KEEP_FOR};
use nix::dir::Dir;
use nix::fcntl::{openat, AtFlags, Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::os::fd::AsFd;

/// How long a temporary file may stand unlocked before it is taken for one
/// a writer left when it died.
pub const TEMPORARY_STALE: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// The temporary name a file is written under before it is renamed to
/// `name`: never a name another writer uses (the process id and random
/// digits), and one [`is_temporary`] knows.
pub(super) fn temporary_name(name: &str) -> String {
    let random = crate::evidence::random_hex(8).unwrap_or_default();
    format!(".{name}.{}.{random}.tmp", std::process::id())
}

/// Whether `name` is a temporary file of ours (from any version: older
/// ones were `.NAME.PID.tmp`).
fn is_temporary(name: &str) -> bool {
    let ours = |n: &str| n.starts_with("registryfp-") || n.starts_with(super::SCOPED_NAME);
    name.strip_prefix('.').is_some_and(ours) && name.ends_with(".tmp")
}

/// Whether `name` is a kept plan's file.
pub(super) fn is_kept_plan(name: &str) -> bool {
    (name.starts_with("registryfp-") || name.starts_with(super::SCOPED_NAME))
        && name.ends_with(".json")
}

impl PlanDir {
    /// Every name in the folder held open: listed through that descriptor,
    /// never through the path, which may name another folder by now or
    /// none.
    pub(super) fn names(&self) -> Vec<String> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let Ok(mut listing) = Dir::openat(self.dir.as_fd(), ".", flags, Mode::empty()) else {
            return Vec::new();
        };
        listing
            .iter()
            .filter_map(|e| e.ok()?.file_name().to_str().ok().map(str::to_string))
            .collect()
    }

    /// Remove the kept plans beyond the newest [`KEEP_FILES`], those older
    /// than [`KEEP_FOR`], the oldest while all of them take more than the
    /// folder's bound in bytes ([`PlanDir::max_bytes`]), and the temporary
    /// files their writers abandoned. `just_written`, the plan a server has
    /// just saved for the next server's apply, is always kept, even when it
    /// alone is over the bound.
    pub(super) fn prune(&self, just_written: Option<&str>) {
        let now = chrono::Utc::now().timestamp();
        let mut kept: Vec<(i64, i64, u64, String)> = Vec::new();
        for name in self.names() {
            if is_temporary(&name) {
                self.remove_if_abandoned(&name, now);
                continue;
            }
            if !is_kept_plan(&name) {
                continue;
            }
            let at = nix::sys::stat::fstatat(
                self.dir.as_fd(),
                name.as_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            );
            if let Ok(meta) = at {
                let size = u64::try_from(meta.st_size).unwrap_or(0);
                kept.push((meta.st_mtime, meta.st_mtime_nsec, size, name));
            }
        }
        // Newest first, the plan just written before every other.
        kept.sort_by_key(|k| {
            let newest = just_written == Some(k.3.as_str());
            std::cmp::Reverse((newest, k.0, k.1))
        });
        let oldest = now - KEEP_FOR.as_secs() as i64;
        let mut bytes = 0u64;
        for (i, (modified, _, size, name)) in kept.into_iter().enumerate() {
            bytes = bytes.saturating_add(size);
            let over = i >= KEEP_FILES || modified < oldest || bytes > self.max_bytes;
            if over && just_written != Some(name.as_str()) {
                let _ = unlinkat(self.dir.as_fd(), name.as_str(), UnlinkatFlags::NoRemoveDir);
            }
        }
    }

    /// Remove the temporary file `name` when it is a regular file of this
    /// user's, unchanged for [`TEMPORARY_STALE`], and no writer holds its
    /// lock; it is removed while this holds the lock, so no writer can
    /// take it meanwhile.
    fn remove_if_abandoned(&self, name: &str, now: i64) {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let Ok(fd) = openat(self.dir.as_fd(), name, flags, Mode::empty()) else {
            return;
        };
        let Ok(meta) = nix::sys::stat::fstat(&fd) else {
            return;
        };
        let regular = meta.st_mode & super::libc_mode::S_IFMT == super::libc_mode::S_IFREG;
        let mine = meta.st_uid == nix::unistd::geteuid().as_raw();
        let stale = meta.st_mtime < now - TEMPORARY_STALE.as_secs() as i64;
        if !(regular && mine && stale) {
            return;
        }
        let Ok(held) = Flock::lock(std::fs::File::from(fd), FlockArg::LockExclusiveNonblock) else {
            // A live writer holds it.
            return;
        };
        if unlinkat(self.dir.as_fd(), name, UnlinkatFlags::NoRemoveDir).is_ok() {
            tracing::info!(
                "removed {name:?} from the kept-plans folder: a temporary file no live writer \
                 holds, unchanged for {} minutes (its writer died while writing)",
                TEMPORARY_STALE.as_secs() / 60
            );
        }
        drop(held);
    }
}
