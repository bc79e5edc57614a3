//! Which file a SQLite connection of this process really has open, as
//! opposed to what its path names now.
//!
//! Apply opens the registry for writing, then reads it again for the
//! judgement outside the lock (docs/apply.md). A path is only a name: a
//! file renamed over it between the two opens (and back) would have the
//! judgement made on one file and the writes on another, with clocks and
//! row ids made to match (docs/security.md, row 41.8). So the judgement
//! records the device and inode its own connection opened, read from the
//! descriptor the connection added (never from the path), and under the
//! lock apply trusts it only if this process holds that very file open for
//! reading and writing: the write connection's, since nothing else here
//! opens a registry for writing.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A file's device and inode.
pub type FileId = (u64, u64);

/// Every regular file this process has open, by descriptor: its device
/// and inode, and whether it is open for writing.
fn open_files() -> BTreeMap<u32, (FileId, bool)> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // The link's target is the open file itself, whatever its path
        // names now.
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        out.insert(fd, ((meta.dev(), meta.ino()), writable(fd)));
    }
    out
}

/// Whether descriptor `fd` was opened for reading and writing
/// (`/proc/self/fdinfo`'s `flags`, octal; `O_ACCMODE` is its low bits).
fn writable(fd: u32) -> bool {
    let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")) else {
        return false;
    };
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|flags| flags & 0o3 == 0o2)
}

/// Open `path` with `open` and say which file it opened: the one among
/// the descriptors it added that is also the file `path` names once it is
/// open. `None` beside it when no such descriptor was added (the path was
/// replaced around the open, or SQLite reused a descriptor it kept): the
/// caller then trusts nothing it reads there to be the file written later.
/// Descriptors other threads add meanwhile are told apart by that match.
pub fn opened<T, E>(
    path: &Path,
    open: impl FnOnce() -> Result<T, E>,
) -> Result<(T, Option<FileId>), E> {
    let before = open_files();
    let made = open()?;
    let named = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    let id = open_files()
        .into_iter()
        .filter(|(fd, _)| !before.contains_key(fd))
        .map(|(_, (id, _))| id)
        .find(|id| Some(*id) == named);
    Ok((made, id))
}

/// Whether this process holds `file` open for reading and writing.
pub fn held_for_writing(file: FileId) -> bool {
    open_files()
        .values()
        .any(|(id, writing)| *writing && *id == file)
}

/// Why apply must not write the registry at `path` through the connection
/// it opened, if it must not: the path names another file than one this
/// process holds open for writing (it was replaced since apply opened it),
/// or the file has more than one name. SQLite names its journal, its WAL
/// and its shared-memory file after the path, so a writer reaching the same
/// file through a hard link keeps its own and commits while apply holds
/// what it believes is the write lock (docs/security.md, row 41.8).
pub fn write_file_problem(path: &Path) -> Option<String> {
    let shown = crate::text::esc(&path.display().to_string()).into_owned();
    let Ok(meta) = std::fs::metadata(path) else {
        return Some(format!("{shown} can no longer be read by its path"));
    };
    if !held_for_writing((meta.dev(), meta.ino())) {
        return Some(format!(
            "{shown} names another file than the one apply opened for writing: it was replaced \
             while apply ran"
        ));
    }
    (meta.nlink() > 1).then(|| {
        format!(
            "{shown} has {} hard links; SQLite keeps its lock files and journal per name, so a \
             writer through another name can commit while apply holds the write lock. Keep \
             one name for the registry (remove the other links), then apply again",
            meta.nlink()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_a_connection_opened_is_told_from_its_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sqlite");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        let (conn, id) = opened(&path, || {
            rusqlite::Connection::open_with_flags(
                &path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE,
            )
        })
        .unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(id, Some((meta.dev(), meta.ino())));
        assert!(held_for_writing(id.unwrap()));
        // Renamed away and replaced by another file: the connection's file
        // is still the first, and no longer what the path names.
        std::fs::rename(&path, dir.path().join("moved")).unwrap();
        std::fs::write(&path, b"").unwrap();
        let now = std::fs::metadata(&path).unwrap();
        assert!(!held_for_writing((now.dev(), now.ino())));
        assert!(held_for_writing(id.unwrap()));
        drop(conn);
        assert!(!held_for_writing(id.unwrap()));
    }
}
