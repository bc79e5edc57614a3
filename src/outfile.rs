//! Writing the files a command is asked to write (`plan --out`, `policy
//! mutate --save-survivors`, `policy diff --save-counterexamples`, `test
//! --export-cedar`, `fixture capture --out --force`, `policy validate
//! --fix`): the path itself is replaced, never what it points to.
//!
//! The text goes to a new temporary file in the same folder (created with
//! `O_CREAT | O_EXCL`, so never through a link or into a file that exists)
//! and is renamed over the path. A rename replaces a symbolic link, not its
//! target; a FIFO or device at the path is replaced, never opened (so never
//! waited on); a folder at the path is an error. A file name made from
//! something a policy or fixture chose goes through [`safe_name`] first, so
//! it cannot climb out of the folder it is written in (docs/security.md,
//! row 41.7).

use std::io::Write;
use std::path::{Path, PathBuf};

/// Replace `path` with a file holding what `fill` writes. On an error
/// the temporary file is removed and `path` is as it was.
pub fn replace_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    replace_with_mode(path, 0o666, fill)
}

/// [`replace_with`], the new file created with `mode` (less the umask's
/// bits, as for any new file).
fn replace_with_mode(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let (temporary, file) = temporary_beside(path, mode)?;
    let written = (|| {
        let mut w = std::io::BufWriter::new(file);
        fill(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// [`replace_with`] for text already in hand.
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_with(path, |w| w.write_all(bytes))
}

/// [`replace`] for a script its reader runs by its path (`out/run.sh`):
/// created executable (`rwxr-xr-x`, less the umask's bits).
pub fn replace_executable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_with_mode(path, 0o755, |w| w.write_all(bytes))
}

/// A new file in `path`'s folder, named after it, that did not exist,
/// created with `mode` (less the umask's bits).
fn temporary_beside(path: &Path, mode: u32) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path names no file; give a file name",
        )
    })?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for attempt in 0u32..100 {
        let temporary = folder.join(format!(
            ".{}.{}-{nanos:x}-{attempt}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temporary)
        {
            Ok(file) => return Ok((temporary, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "no free name for a temporary file beside it",
    ))
}

/// `text` as one file-name component: every character outside
/// `[A-Za-z0-9._-]` becomes `_`, and leading dots and dashes are dropped
/// (no hidden file, no option, never `.` or `..`); empty becomes `_`.
pub fn safe_name(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    let trimmed = mapped.trim_start_matches(['.', '-']);
    if trimmed.is_empty() {
        "_".into()
    } else {
        trimmed.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_climb_or_hide() {
        assert_eq!(safe_name("x/../../ESCAPED"), "x_.._.._ESCAPED");
        assert_eq!(safe_name(".."), "_");
        assert_eq!(safe_name("-rf"), "rf");
        assert_eq!(safe_name("ok-name_1.json"), "ok-name_1.json");
        assert_eq!(safe_name("é\n"), "__");
    }

    #[test]
    fn an_executable_is_created_executable_and_a_plain_file_is_not() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode();
        let script = dir.path().join("run.sh");
        replace_executable(&script, b"#!/bin/sh\n").unwrap();
        assert_eq!(mode(&script) & 0o111, 0o111, "{:o}", mode(&script));
        assert_eq!(mode(&script) & 0o022, 0, "never writable by others");
        let plain = dir.path().join("plain");
        replace(&plain, b"x").unwrap();
        assert_eq!(mode(&plain) & 0o111, 0);
    }

    #[test]
    fn a_link_is_replaced_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("out.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        replace(&link, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(!std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "new");
        // A dangling link creates nothing where it points.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        replace(&dangling, b"x").unwrap();
        assert!(!dir.path().join("nowhere").exists());
        // A FIFO is replaced, never opened (opening it would wait).
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        replace(&fifo, b"y").unwrap();
        assert_eq!(std::fs::read_to_string(&fifo).unwrap(), "y");
        // A folder is an error, and no temporary file is left behind.
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        assert!(replace(&folder, b"z").is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty());
    }
}
