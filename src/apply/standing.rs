//! The operator's standing while an apply runs: the grant and the policy
//! pin, read from `profiles.json` before the lock and re-read before every
//! write.

use super::{Abort, Context, Outcome};
use crate::capability::{check, Profiles};
use crate::error::Result;
use std::path::Path;

/// The operator's standing, read from `profiles.json`: decided before the
/// lock and re-read (without blocking: regular files only) before every
/// write, so revoking the grant or the policy pin stops an apply under way.
pub(super) struct Standing<'a> {
    ctx: &'a Context<'a>,
    /// sha256 of the profiles.json that was last found to allow apply.
    pub(super) allowed_sha256: String,
    /// That file's identity and times when it was read, if they can vouch
    /// that it has not changed since (see `FileStamp`).
    stamp: Option<FileStamp>,
}

/// What `stat` says of a file: device, inode, size, modification and
/// change times. Any write changes the change time, and a replacement
/// changes the inode, so an equal stamp means unchanged content, except
/// for writes within one tick of the kernel's coarse clock. A stamp whose
/// change time is recent therefore vouches for nothing, and the file is
/// read again (as git does for racily clean files).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp([i64; 7]);

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_nanos() as i128;
        let changed = m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128;
        if !m.is_file() || changed >= now - 2_000_000_000 {
            return None;
        }
        Some(FileStamp([
            m.dev() as i64,
            m.ino() as i64,
            m.size() as i64,
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        ]))
    }
}

impl<'a> Standing<'a> {
    /// Why `profiles` does not let this apply run, if it does not.
    fn refusal(ctx: &Context, profiles: &Profiles) -> Result<Option<(Outcome, String)>> {
        if let Some(why) = profiles.pin_refusal(ctx.policies, ctx.profiles) {
            return Ok(Some((Outcome::PolicySetNotPinned, why)));
        }
        let decision = check(
            ctx.policies,
            profiles,
            ctx.profile,
            crate::capability::Operation::Apply,
        )?;
        Ok((!decision.allowed).then_some((Outcome::PermissionDenied, decision.explanation)))
    }

    /// Read and decide at entry.
    pub(super) fn at_entry(
        ctx: &'a Context<'a>,
    ) -> Result<std::result::Result<Self, (Outcome, String)>> {
        // The stamp is taken before the read: a write during the read
        // makes the next stamp differ.
        let stamp = FileStamp::of(ctx.profiles);
        let profiles = Profiles::load(ctx.profiles)?;
        if let Some(refused) = Self::refusal(ctx, &profiles)? {
            return Ok(Err(refused));
        }
        Ok(Ok(Standing {
            ctx,
            allowed_sha256: profiles.sha256,
            stamp,
        }))
    }

    /// Read again; an unchanged file keeps its decision, a changed one is
    /// decided afresh. Any failure to read is a refusal.
    pub(super) fn recheck(&mut self) -> std::result::Result<(), Abort> {
        let refused = |why: String| {
            Abort::Refuse(
                Outcome::PermissionDenied,
                format!("capability re-read before a write: {why}; nothing was retired"),
            )
        };
        let stamp = FileStamp::of(self.ctx.profiles);
        if stamp.is_some() && stamp == self.stamp {
            return Ok(());
        }
        let profiles = Profiles::load(self.ctx.profiles).map_err(|e| refused(e.to_string()))?;
        if profiles.sha256 == self.allowed_sha256 {
            self.stamp = stamp;
            return Ok(());
        }
        match Self::refusal(self.ctx, &profiles) {
            Ok(None) => {
                self.allowed_sha256 = profiles.sha256;
                self.stamp = stamp;
                Ok(())
            }
            Ok(Some((outcome, why))) => Err(Abort::Refuse(
                outcome,
                format!("re-read before a write: {why}; nothing was retired"),
            )),
            Err(e) => Err(refused(e.to_string())),
        }
    }
}
