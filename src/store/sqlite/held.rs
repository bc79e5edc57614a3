//! Which file a SQLite connection of this process really has open, as
//! opposed to what its path names now.
//!
//! Apply opens the registry for writing, then reads it again for the
//! judgement outside the lock (docs/apply.md). A path is only a name: a
//! file renamed over it between the two opens (and back) would have the
//! judgement made on one file and the writes on another, with clocks and
//! row ids made to match (docs/security.md, row 41.8). So the judgement
//! records the device and inode its own connection opened, read from the
//! descriptor the connection added (never from the path), apply records
//! the same of its write connection, and under the lock the judgement
//! stands only if the two are one file. Every connection to a store path
//! is opened under one lock ([`opening`]), so no other thread's descriptor
//! (a `serve` heartbeat's) is taken for the one an open added.
//!
//! An open does not always add a descriptor: POSIX locks belong to the
//! process, so while another connection of this process holds a lock on
//! the file (in WAL mode any reader does), SQLite keeps the descriptor of
//! a connection that closes and gives it to the next open of that file.
//! The file is then read from the connection's own file object
//! ([`descriptor_of`]).

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

/// How many descriptors this process has open on each regular file, for
/// writing or not as `writing` says.
fn counted(writing: bool) -> BTreeMap<FileId, usize> {
    let mut counts = BTreeMap::new();
    for (id, rw) in open_files().into_values() {
        if rw == writing {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
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

/// Every SQLite connection this program opens on a registry or lease
/// store path is opened under this lock ([`opening`]), so that the
/// descriptors a call of [`opened`] sees appear are its own: another thread
/// (a `serve` heartbeat, a plan call) cannot open the same path meanwhile
/// and be taken for it.
static OPENING: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    /// Whether this thread holds [`OPENING`] (an open inside an open, as
    /// the hot-journal recovery is inside a read-only open).
    static HOLDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `open` under [`OPENING`] (at once when this thread holds it).
pub fn opening<T>(open: impl FnOnce() -> T) -> T {
    if HOLDING.with(std::cell::Cell::get) {
        return open();
    }
    let _held = OPENING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            HOLDING.with(|h| h.set(false));
        }
    }
    HOLDING.with(|h| h.set(true));
    let _release = Release;
    open()
}

/// Open `path` with `open` (under [`opening`]) and say which file it
/// opened: the file `path` names once it is open, if the open added a
/// descriptor on it (open for writing as `writing` says); else the file of
/// the descriptor the connection's own file object holds (SQLite gave it
/// one it kept). `None` beside it when neither tells (the path was replaced
/// around the open, or the two disagree): the caller then trusts nothing
/// it reads there to be the file written later.
pub fn opened<E>(
    path: &Path,
    writing: bool,
    open: impl FnOnce() -> Result<rusqlite::Connection, E>,
) -> Result<(rusqlite::Connection, Option<FileId>), E> {
    opening(|| {
        let before = counted(writing);
        let made = open()?;
        let named = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        // Counted by file, not by descriptor number: another thread may
        // close a descriptor meanwhile and the open be given its number.
        // Only an open raises a file's count, and every open of a store
        // path is under this lock, so the file whose count rose is this
        // open's; a close elsewhere can only hide it.
        let after = counted(writing);
        let added = named.filter(|id| after.get(id) > before.get(id));
        let own = descriptor_of(&made)
            .and_then(|fd| open_files().get(&fd).copied())
            .filter(|(_, rw)| *rw == writing)
            .map(|(id, _)| id);
        let id = match (added, own) {
            (Some(a), Some(o)) if a != o => None,
            (Some(a), _) => Some(a),
            (None, own) => own,
        };
        Ok((made, id))
    })
}

/// The descriptor the file object of `conn`'s main database holds, read
/// from that object (`SQLITE_FCNTL_FILE_POINTER`). SQLite has no call that
/// returns it, so it is read where the unix VFS keeps it: its file object
/// (`unixFile` in os_unix.c of the bundled SQLite, unchanged since 2011)
/// begins with its methods, the VFS that made it, its inode record and the
/// descriptor. The object is read so only when the VFS that made it is
/// SQLite's own `unix` VFS, which every connection here uses; anything else
/// is `None` (and the caller trusts nothing read there).
fn descriptor_of(conn: &rusqlite::Connection) -> Option<u32> {
    use rusqlite::ffi;
    use std::os::raw::{c_int, c_void};
    #[repr(C)]
    struct UnixFileHead {
        methods: *const c_void,
        vfs: *mut ffi::sqlite3_vfs,
        inode: *mut c_void,
        fd: c_int,
    }
    // One pointer out of the connection's main database by a file control.
    let pointer = |op: c_int| -> *mut c_void {
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: the handle is `conn`'s, alive for this call; the file
        // controls asked for here write one pointer into `out`.
        let rc = unsafe {
            ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                op,
                (&raw mut out).cast::<c_void>(),
            )
        };
        if rc == ffi::SQLITE_OK {
            out
        } else {
            std::ptr::null_mut()
        }
    };
    // SAFETY: `sqlite3_vfs_find` reads SQLite's list of registered VFSes.
    let unix = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
    let vfs = pointer(ffi::SQLITE_FCNTL_VFS_POINTER).cast::<ffi::sqlite3_vfs>();
    let file = pointer(ffi::SQLITE_FCNTL_FILE_POINTER);
    // The connection's VFS must be the unix VFS before its file object is
    // read as that VFS's.
    if unix.is_null() || vfs != unix || file.is_null() {
        return None;
    }
    // SAFETY: `file` is the open file object of `conn`'s main database,
    // alive as long as the connection, made by the unix VFS (checked
    // above), whose objects begin with the four members of
    // `UnixFileHead`; the object's own `vfs` member is checked again.
    let head = unsafe { &*file.cast::<UnixFileHead>() };
    if head.vfs != unix || head.fd < 0 {
        return None;
    }
    u32::try_from(head.fd).ok()
}

/// Why apply must not write the registry at `path` through its write
/// connection, whose own file is `written` (from its descriptor, when it
/// was opened) and whose name as SQLite resolved it is `db_name`, if it
/// must not: the file is not known; the path names another file now (it
/// was replaced since apply opened it); SQLite's name for it is no longer
/// that very file, a regular file and not a link (it was renamed and a link
/// left in its place); or the file has more than one name. SQLite names its
/// journal, WAL and shared-memory files after the name it resolved, so a
/// writer reaching the same file by another name keeps its own and commits
/// while apply holds what it believes is the write lock (docs/security.md,
/// rows 41.8 and 41.12).
pub fn write_file_problem(
    path: &Path,
    written: Option<FileId>,
    db_name: Option<&Path>,
) -> Option<String> {
    let shown = crate::text::esc(&path.display().to_string()).into_owned();
    let Ok(meta) = std::fs::metadata(path) else {
        return Some(format!(
            "{shown} can no longer be read by its path (it was moved or deleted while apply \
             ran); nothing was written: put the registry back at its path and apply again"
        ));
    };
    if written != Some((meta.dev(), meta.ino())) {
        return Some(format!(
            "{shown} names another file than the one apply opened for writing (it was \
             replaced while apply ran, or the file apply opened could not be told); nothing \
             was written: make sure nothing replaces the registry file, and apply again"
        ));
    }
    let named = db_name.and_then(|n| std::fs::symlink_metadata(n).ok());
    if !named.is_some_and(|m| m.is_file() && (m.dev(), m.ino()) == (meta.dev(), meta.ino())) {
        return Some(format!(
            "{shown}: the name SQLite opened it by ({}) no longer is that file itself (it was \
             renamed or a link put in its place while apply ran), so other writers would use \
             other lock and journal files; apply again",
            db_name.map_or_else(
                || "unknown".into(),
                |n| crate::text::esc(&n.display().to_string()).into_owned()
            )
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

    /// Whether this process holds `file` open for reading and writing.
    fn held_for_writing(file: FileId) -> bool {
        counted(true).contains_key(&file)
    }

    #[test]
    fn the_descriptor_is_read_from_the_connections_own_file_object() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sqlite");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (x)").unwrap();
        let fd = descriptor_of(&conn).expect("the unix VFS's descriptor");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            open_files().get(&fd).map(|(id, _)| *id),
            Some((meta.dev(), meta.ino()))
        );
        // An in-memory database has no file: nothing is read.
        let memory = rusqlite::Connection::open_in_memory().unwrap();
        assert_eq!(descriptor_of(&memory), None);
    }

    #[test]
    fn the_file_a_connection_opened_is_told_from_its_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sqlite");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        let (conn, id) = opened(&path, true, || {
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
        let problem = write_file_problem(&path, id, conn.path().map(Path::new)).unwrap();
        assert!(problem.contains("names another file"), "{problem}");
        drop(conn);
        assert!(!held_for_writing(id.unwrap()));
    }
}
