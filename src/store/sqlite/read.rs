//! Reading a SQLite worker registry (docs/semantics.md §5).
//!
//! Planning opens the file read-only and never alters it: a registry from
//! before the fencing or `retired_*` columns simply reads those columns as
//! NULL. Columns the program does not know are ignored.

use crate::error::{Error, Result, Store};
use crate::row::{Col, Row, COLUMNS};
use crate::store::batch::{BatchError, Cell, RowBatch};
use crate::store::seam::RowVersions;
use crate::value::Value;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

pub use crate::store::registry::TABLE;

fn registry_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Registry {
        shown: crate::store::location::label(path),
        message: message.into(),
    }
}

/// Open an existing registry without any possibility of writing to it.
pub fn open_read_only(path: &Path) -> Result<Connection> {
    if path.is_dir() {
        return Err(registry_error(
            path,
            "is a folder, not a SQLite file; name the worker registry's file itself",
        ));
    }
    if !path.is_file() {
        return Err(registry_error(
            path,
            "no such file; pass the worker registry's SQLite file with --registry \
             (or FLEET_RETIRE_REGISTRY)",
        ));
    }
    let conn = super::held::opening(|| {
        Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    })
    .map_err(Error::sqlite(
        Store::Registry,
        path,
        "cannot open as SQLite",
    ))?;
    // Workers heartbeat into a live registry; wait out their short write
    // locks rather than failing at once.
    conn.busy_timeout(READ_BUSY_TIMEOUT).map_err(Error::sqlite(
        Store::Registry,
        path,
        "cannot set the busy timeout",
    ))?;
    recover_hot_journal(path, "registry").map_err(|m| registry_error(path, m))?;
    Ok(conn)
}

/// A writer killed mid-transaction (rollback-journal mode) leaves a "hot"
/// journal beside the database. SQLite rolls it back on the next open that
/// can write, restoring the state before that transaction; a read-only
/// connection cannot, and every read fails with "attempt to write a readonly
/// database". Readers here recover it when they can write the file (nothing
/// committed is lost: only the interrupted transaction is undone), and
/// otherwise say who must run what.
pub fn recover_hot_journal(path: &Path, what: &str) -> std::result::Result<(), String> {
    let mut journal = path.as_os_str().to_owned();
    journal.push("-journal");
    let journal = std::path::PathBuf::from(journal);
    if !std::fs::metadata(&journal).is_ok_and(|m| m.len() > 0) {
        return Ok(());
    }
    let readable = |flags: OpenFlags| -> rusqlite::Result<Connection> {
        let c = super::held::opening(|| Connection::open_with_flags(path, flags))?;
        c.busy_timeout(READ_BUSY_TIMEOUT)?;
        c.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })?;
        Ok(c)
    };
    let read_only_fails = match readable(OpenFlags::SQLITE_OPEN_READ_ONLY) {
        Ok(_) => false,
        Err(e) => matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::ReadOnly)),
    };
    if !read_only_fails {
        return Ok(());
    }
    match super::held::opening(|| {
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
    }) {
        Ok(c) if !c.is_readonly(rusqlite::MAIN_DB).unwrap_or(true) => {
            c.busy_timeout(READ_BUSY_TIMEOUT).ok();
            c.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(|e| format!("rolling back the interrupted transaction failed: {e}"))?;
            tracing::warn!(
                "the {what} {} had a hot journal left by a writer that stopped mid-transaction; \
                 SQLite rolled that transaction back (the file is as it was before it)",
                path.display()
            );
            Ok(())
        }
        _ => Err(format!(
            "holds a hot journal ({}) left by a writer that stopped mid-transaction. SQLite must \
             roll it back, which needs write access to the file and its folder. Run this same \
             command as a user who can write them (the registry's owner): it rolls the journal \
             back, returning the file to its state before that transaction",
            journal.display()
        )),
    }
}

/// How long a reader waits for a writer's lock.
pub const READ_BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Convert one SQLite value, keeping its storage class.
pub fn value_from_sql(v: ValueRef<'_>) -> std::result::Result<Value, String> {
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(
            std::str::from_utf8(t)
                .map_err(|_| "text is not valid UTF-8".to_string())?
                .into(),
        ),
        ValueRef::Blob(b) => Value::Blob(b.into()),
    })
}

/// Read every registration, in registry (rowid) order, on this connection
/// (inside whatever transaction the caller holds).
pub fn read_rows(conn: &Connection, path: &Path) -> Result<Vec<Row>> {
    let select = Select::of(conn, path)?;
    let mut stmt = select.prepare(conn, Part::All, path)?;
    read_part(&mut stmt, &select.present).map_err(|e| e.at(0, path))
}

/// The rows with these rowids as they stand now, on this connection
/// (inside apply's transaction); `None` for a rowid no row has.
pub fn read_by_rowid(conn: &Connection, path: &Path, rowids: &[i64]) -> Result<Vec<Option<Row>>> {
    let select = Select::of(conn, path)?;
    rowids
        .iter()
        .map(|&rowid| {
            let mut stmt = select.prepare(conn, Part::One(rowid), path)?;
            let mut rows = read_part(&mut stmt, &select.present).map_err(|e| e.at(0, path))?;
            Ok(rows.pop())
        })
        .collect()
}

/// The known registry columns the table has, in our order, and their list
/// quoted for a SELECT (for `scope.rs`, which binds parameters).
pub(super) fn present_columns(conn: &Connection, path: &Path) -> Result<(Vec<Col>, String)> {
    let select = Select::of(conn, path)?;
    Ok((select.present, select.list))
}

/// What a read selects: the known columns the table has, in our order.
struct Select {
    present: Vec<Col>,
    list: String,
    /// The text is UTF-8 as stored (so it is read without conversion).
    utf8: bool,
}

/// Which rows a statement reads.
#[derive(Clone, Copy)]
enum Part {
    All,
    One(i64),
    UpTo(i64),
    After(i64),
}

impl Select {
    fn of(conn: &Connection, path: &Path) -> Result<Select> {
        let sql_err = Error::sqlite(Store::Registry, path, "cannot read");
        let existing = crate::store::table_columns(conn, TABLE)
            .map_err(sql_err)?
            .ok_or_else(|| {
                registry_error(
                    path,
                    format!(
                        "has no `{TABLE}` table; is this the worker registry? \
                     (`fleet-retire register` creates one)"
                    ),
                )
            })?;
        let present: Vec<Col> = COLUMNS
            .iter()
            .copied()
            .filter(|c| existing.iter().any(|n| n == c.name()))
            .collect();
        if !present.contains(&Col::WorkerIdentity) {
            return Err(registry_error(
                path,
                format!(
                    "table `{TABLE}` has no `worker_identity` column; it is not a worker registry"
                ),
            ));
        }
        let list = present
            .iter()
            .map(|c| crate::store::quote_ident(c.name()))
            .collect::<Vec<_>>()
            .join(", ");
        let encoding: String = conn
            .query_row("PRAGMA encoding", [], |r| r.get(0))
            .map_err(sql_err)?;
        Ok(Select {
            present,
            list,
            utf8: encoding.eq_ignore_ascii_case("UTF-8"),
        })
    }

    /// The statement for `part`. A WITHOUT ROWID table has no rowid: its
    /// natural order is the key's, and it is only ever read whole.
    fn prepare<'c>(&self, conn: &'c Connection, part: Part, path: &Path) -> Result<RawStmt<'c>> {
        let sql_err = Error::sqlite(Store::Registry, path, "cannot read");
        match (RawStmt::prepare(conn, &self.sql(part), self.utf8), part) {
            (Ok(s), _) => Ok(s),
            (Err(_), Part::All) => RawStmt::prepare(
                conn,
                &format!("SELECT {} FROM {TABLE}", self.list),
                self.utf8,
            )
            .map_err(sql_err),
            (Err(e), _) => Err(sql_err(e)),
        }
    }

    fn sql(&self, part: Part) -> String {
        let list = &self.list;
        match part {
            Part::All => format!("SELECT {list} FROM {TABLE} ORDER BY rowid"),
            Part::One(n) => format!("SELECT {list} FROM {TABLE} WHERE rowid = {n}"),
            Part::UpTo(n) => {
                format!("SELECT {list} FROM {TABLE} WHERE rowid <= {n} ORDER BY rowid")
            }
            Part::After(n) => {
                format!("SELECT {list} FROM {TABLE} WHERE rowid > {n} ORDER BY rowid")
            }
        }
    }
}

/// A statement stepped through SQLite's C interface directly, so that a
/// row's columns are read without copies: rusqlite's text accessor asks
/// SQLite for a NUL-terminated string, which copies each text into a fresh
/// allocation first (about a third of a large registry's reading time).
struct RawStmt<'c> {
    stmt: std::ptr::NonNull<rusqlite::ffi::sqlite3_stmt>,
    db: *mut rusqlite::ffi::sqlite3,
    /// Texts are stored as UTF-8, so their bytes are read as they are.
    utf8: bool,
    /// How many columns the statement's rows have.
    width: std::ffi::c_int,
    _conn: std::marker::PhantomData<&'c Connection>,
}

impl<'c> RawStmt<'c> {
    fn prepare(conn: &'c Connection, sql: &str, utf8: bool) -> rusqlite::Result<RawStmt<'c>> {
        use rusqlite::ffi;
        let sql = std::ffi::CString::new(sql).map_err(|_| rusqlite::Error::InvalidQuery)?;
        // SAFETY: the handle is the connection's own, which outlives the
        // statement (`'c`); SQLite writes the statement pointer or NULL.
        unsafe {
            let db = conn.handle();
            let mut stmt = std::ptr::null_mut();
            let rc = ffi::sqlite3_prepare_v2(db, sql.as_ptr(), -1, &mut stmt, std::ptr::null_mut());
            if rc != ffi::SQLITE_OK {
                ffi::sqlite3_finalize(stmt);
                return Err(Self::error(db, rc));
            }
            let stmt = std::ptr::NonNull::new(stmt).ok_or(rusqlite::Error::InvalidQuery)?;
            let width = ffi::sqlite3_column_count(stmt.as_ptr());
            Ok(RawStmt {
                stmt,
                db,
                utf8,
                width,
                _conn: std::marker::PhantomData,
            })
        }
    }

    fn error(db: *mut rusqlite::ffi::sqlite3, rc: std::ffi::c_int) -> rusqlite::Error {
        // SAFETY: `db` is a live connection; its message is copied at once.
        let message = unsafe {
            let m = rusqlite::ffi::sqlite3_errmsg(db);
            (!m.is_null()).then(|| std::ffi::CStr::from_ptr(m).to_string_lossy().into_owned())
        };
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rc), message)
    }

    /// The next row: `true` when there is one.
    fn step(&mut self) -> rusqlite::Result<bool> {
        use rusqlite::ffi;
        // SAFETY: the statement is live until drop.
        match unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) } {
            ffi::SQLITE_ROW => Ok(true),
            ffi::SQLITE_DONE => Ok(false),
            rc => Err(Self::error(self.db, rc)),
        }
    }

    /// Column `i` of the current row. Panics unless `i` is below the
    /// statement's width: SQLite would answer a wrong index with a NULL,
    /// which would read as a blank column rather than as the bug it is.
    fn cell(&self, i: usize) -> Cell<'_> {
        use rusqlite::ffi;
        let i = std::ffi::c_int::try_from(i)
            .ok()
            .filter(|&i| i < self.width)
            .unwrap_or_else(|| panic!("column {i} of a statement of {} columns", self.width));
        let bytes = |p: *const std::ffi::c_void, n: std::ffi::c_int| -> &[u8] {
            match usize::try_from(n) {
                // SAFETY: SQLite gives `n` bytes at `p`, valid until the
                // statement steps again or is finalized, which needs
                // `&mut self` and so ends this borrow first.
                Ok(n) if n > 0 && !p.is_null() => unsafe {
                    std::slice::from_raw_parts(p.cast::<u8>(), n)
                },
                _ => &[],
            }
        };
        // SAFETY: the statement is live and on a row. The value is SQLite's
        // own (unprotected: it does not take the connection's mutex), which
        // is sound because one thread uses this connection throughout.
        // Asking for the blob of a text gives its stored bytes without the
        // NUL-terminated copy that asking for its text makes; that is the
        // text itself when the database stores UTF-8, and otherwise SQLite
        // converts it to UTF-8.
        unsafe {
            let v = ffi::sqlite3_column_value(self.stmt.as_ptr(), i);
            match ffi::sqlite3_value_type(v) {
                ffi::SQLITE_INTEGER => Cell::Int(ffi::sqlite3_value_int64(v)),
                ffi::SQLITE_FLOAT => Cell::Real(ffi::sqlite3_value_double(v)),
                ffi::SQLITE_TEXT if self.utf8 => {
                    let p = ffi::sqlite3_value_blob(v);
                    Cell::Text(bytes(p, ffi::sqlite3_value_bytes(v)))
                }
                ffi::SQLITE_TEXT => {
                    let p = ffi::sqlite3_value_text(v);
                    Cell::Text(bytes(p.cast(), ffi::sqlite3_value_bytes(v)))
                }
                ffi::SQLITE_BLOB => {
                    let p = ffi::sqlite3_value_blob(v);
                    Cell::Blob(bytes(p, ffi::sqlite3_value_bytes(v)))
                }
                _ => Cell::Null,
            }
        }
    }
}

impl Drop for RawStmt<'_> {
    fn drop(&mut self) {
        // SAFETY: finalized once, here.
        unsafe {
            rusqlite::ffi::sqlite3_finalize(self.stmt.as_ptr());
        }
    }
}

/// Why reading a part of the registry stopped; `row` counts from the
/// part's first row.
enum PartError {
    Sql(rusqlite::Error),
    NotUtf8 { row: usize, col: Col },
    TooLong { row: usize, col: Col },
}

impl From<BatchError> for PartError {
    fn from(e: BatchError) -> PartError {
        match e {
            BatchError::NotUtf8 { row, col } => PartError::NotUtf8 { row, col },
            BatchError::TooLong { row, col } => PartError::TooLong { row, col },
        }
    }
}

impl PartError {
    /// The error, with rows counted from the registry's first when the
    /// part starts at row `first_row`.
    fn at(self, first_row: usize, path: &Path) -> Error {
        match self {
            PartError::Sql(e) => Error::sqlite(Store::Registry, path, "cannot read")(e),
            PartError::NotUtf8 { row, col } => registry_error(
                path,
                format!(
                    "row {}: column `{}`: text is not valid UTF-8",
                    first_row + row + 1,
                    col.name()
                ),
            ),
            PartError::TooLong { row, col } => registry_error(
                path,
                format!(
                    "row {}: column `{}`: a text past 4 GiB into its batch of rows; \
                     no registry text is that long, so the file is likely damaged \
                     (`PRAGMA integrity_check` tells)",
                    first_row + row + 1,
                    col.name()
                ),
            ),
        }
    }
}

/// Step through one statement, building rows as SQLite gives them into
/// the shared row-batch builder ([`crate::store::batch`]).
fn read_part(stmt: &mut RawStmt<'_>, present: &[Col]) -> std::result::Result<Vec<Row>, PartError> {
    let mut rows = Vec::new();
    let mut batch = RowBatch::new(present.len());
    while stmt.step().map_err(PartError::Sql)? {
        batch.push_row(present, rows.len(), |i| stmt.cell(i))?;
        if batch.full() {
            batch.finish_into(&mut rows)?;
        }
    }
    batch.finish_into(&mut rows)?;
    Ok(rows)
}

/// Open read-only and read every registration from the SQLite file, in
/// one read transaction.
pub fn load(path: &Path) -> Result<Vec<Row>> {
    load_marked(path, false).map(|read| read.map(|(rows, _)| rows).unwrap_or_default())
}

/// [`load`], with the row-version marker of the same read: what apply
/// judges outside its lock. `None`, without reading the rows, when the
/// registry keeps no versions.
pub fn load_versioned(path: &Path) -> Result<Option<(Vec<Row>, RowVersions)>> {
    load_marked(path, true).map(|read| read.and_then(|(rows, m)| Some((rows, m?))))
}

#[allow(clippy::type_complexity)]
fn load_marked(path: &Path, with_marker: bool) -> Result<Option<(Vec<Row>, Option<RowVersions>)>> {
    // The file the path names now; a second connection must find the same.
    let file = file_identity(path);
    let (conn, opened) = super::held::opened(path, false, || open_read_only(path))?;
    let sql_err = Error::sqlite(Store::Registry, path, "cannot read");
    map_for_reading(&conn).map_err(sql_err)?;
    // One read transaction: the shared lock its first read takes is held
    // until COMMIT, so no writer can commit while the rows are read (in WAL
    // mode: one snapshot, read on this connection alone).
    conn.execute_batch("BEGIN").map_err(sql_err)?;
    let marker = match with_marker {
        true => match super::versions::marker(&conn).map_err(sql_err)? {
            None => return Ok(None),
            found => found,
        },
        false => None,
    };
    let rows = read_in_parts(&conn, path, &|| second_reader(path, file, opened))?;
    conn.execute_batch("COMMIT").map_err(sql_err)?;
    // The reading connection stays open with the marker: closing it could
    // free the file (if renamed over meanwhile) and let another file, a
    // journal say, take its inode before apply compares the two. SQLite
    // closes it safely later, while apply's own locks are held too.
    let marker = marker
        .filter(|m| m.rowids.len() == rows.len())
        .map(|m| RowVersions {
            file: opened,
            pin: Some(crate::store::seam::Pin(std::sync::Arc::new(
                std::sync::Mutex::new(conn),
            ))),
            ..m
        });
    if with_marker && marker.is_none() {
        return Ok(None);
    }
    Ok(Some((rows, marker)))
}

/// How much of the registry file a reading connection maps into memory.
/// SQLite then reads those pages where they lie in the kernel's page
/// cache, instead of copying each into its own cache with a `pread`: a
/// 100,000-row plan spent about a tenth of its CPU in those calls and
/// copies (docs/performance.md, "Design choices behind the figures"). The
/// bound keeps the mapped pages, which count as the process's memory while
/// mapped, small beside the rows read from them; a larger registry reads
/// the rest as before.
///
/// A mapped page that cannot be read (a disk error, or the file cut short
/// by a process that ignores SQLite's locks) raises SIGBUS instead of
/// returning an error; `main` turns that signal into a plain message and
/// exit 1 (`error::on_bus_error`). Only read-only paths map: apply's
/// reads inside its write transaction never do.
const READ_MMAP_BYTES: i64 = 64 << 20;

fn map_for_reading(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(&format!("PRAGMA mmap_size = {READ_MMAP_BYTES}"))
}

/// Registries whose rowids span at least this many are read in two parts
/// at once, one per core; smaller ones are not worth a second connection.
const SPLIT_ROWS: i64 = 20_000;

/// The device and inode a path names, if it can be read.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Read every row through `conn`, which is inside a read transaction. A
/// large registry in rollback-journal mode is read in two halves of its
/// rowids at once, the second through a connection from `second` that
/// joins the same state; when there is none, `conn` reads it all.
///
/// Why the halves are one state: `conn` holds its shared lock from before
/// the second connection takes its own until it has read its half, and
/// while any shared lock is held no writer can commit (a commit needs the
/// exclusive lock). So no commit lands between the two locks or during
/// either read. In WAL mode each connection reads its own snapshot and a
/// commit may land between the two, so a WAL registry is read whole.
fn read_in_parts(
    conn: &Connection,
    path: &Path,
    second: &(dyn Fn() -> std::result::Result<Connection, String> + Sync),
) -> Result<Vec<Row>> {
    let select = Select::of(conn, path)?;
    let whole = || -> Result<Vec<Row>> {
        let mut stmt = select.prepare(conn, Part::All, path)?;
        read_part(&mut stmt, &select.present).map_err(|e| e.at(0, path))
    };
    let Some(mid) = split_point(conn) else {
        return whole();
    };
    std::thread::scope(|scope| {
        let (ready, joined) = std::sync::mpsc::channel::<bool>();
        let select = &select;
        let other = scope.spawn(
            move || -> Option<std::result::Result<Vec<Row>, PartError>> {
                let conn = match second() {
                    Ok(c) => c,
                    Err(why) => {
                        tracing::debug!("registry read on one connection: {why}");
                        let _ = ready.send(false);
                        return None;
                    }
                };
                let _ = ready.send(true);
                let mut stmt =
                    match RawStmt::prepare(&conn, &select.sql(Part::After(mid)), select.utf8) {
                        Ok(s) => s,
                        Err(e) => return Some(Err(PartError::Sql(e))),
                    };
                let rows = read_part(&mut stmt, &select.present);
                drop(stmt);
                let _ = conn.execute_batch("COMMIT");
                Some(rows)
            },
        );
        if !joined.recv().unwrap_or(false) {
            let _ = other.join();
            return whole();
        }
        let first = select
            .prepare(conn, Part::UpTo(mid), path)
            .and_then(|mut s| read_part(&mut s, &select.present).map_err(|e| e.at(0, path)));
        let second = other.join().map_err(|_| {
            registry_error(
                path,
                "the thread reading the second half of the rows stopped unexpectedly; \
                     nothing was changed. Run the command again, and report it if it repeats",
            )
        })?;
        let mut rows = first?;
        match second {
            Some(Ok(more)) => rows.extend(more),
            Some(Err(e)) => return Err(e.at(rows.len(), path)),
            None => {
                return Err(registry_error(
                    path,
                    "the thread reading the second half of the rows ended without them; \
                     nothing was changed. Run the command again, and report it if it repeats",
                ))
            }
        }
        Ok(rows)
    })
}

/// The rowid that splits the registry in two halves, when it is worth
/// reading them at once and sound to (see `read_in_parts`).
fn split_point(conn: &Connection) -> Option<i64> {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return None;
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .ok()?;
    if mode.eq_ignore_ascii_case("wal") {
        return None;
    }
    // A column named `rowid` (or `oid`, `_rowid_`) takes the name over: the
    // halves would split on its values and miss the rows where it is NULL.
    if !matches!(super::versions::rowid_shadowed(conn), Ok(None)) {
        return None;
    }
    // Fails for a WITHOUT ROWID table, which is read whole. Two queries:
    // SQLite answers a lone min() or max() of the rowid from the b-tree's
    // edge, but scans the whole table for the two in one SELECT.
    let edge = |f: &str| -> Option<i64> {
        conn.query_row(&format!("SELECT {f}(rowid) FROM {TABLE}"), [], |r| {
            r.get::<_, Option<i64>>(0)
        })
        .ok()
        .flatten()
    };
    let (lo, hi) = (i128::from(edge("min")?), i128::from(edge("max")?));
    if hi - lo < i128::from(SPLIT_ROWS) {
        return None;
    }
    i64::try_from(lo + (hi - lo) / 2).ok()
}

/// A second read-only connection to the registry, inside a read
/// transaction that already holds its shared lock, on the same file as the
/// first (`file`, as the path named it before the first was opened).
///
/// When the file the first connection opened is known (`first`, from its
/// own descriptor), the second must have opened that very file.
fn second_reader(
    path: &Path,
    file: Option<(u64, u64)>,
    first: Option<super::held::FileId>,
) -> std::result::Result<Connection, String> {
    let (conn, second) = super::held::opened(path, false, || {
        Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    })
    .map_err(|e| e.to_string())?;
    if first.is_some() && second != first {
        return Err("the second connection opened another file than the first".into());
    }
    // Never wait: a writer waiting to commit holds a lock that keeps new
    // readers out until the first connection, which holds its shared lock
    // until its half is read, lets it through. Waiting would stall both.
    conn.busy_timeout(std::time::Duration::ZERO)
        .map_err(|e| e.to_string())?;
    map_for_reading(&conn).map_err(|e| e.to_string())?;
    conn.execute_batch("BEGIN").map_err(|e| e.to_string())?;
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(|e| e.to_string())?;
    if file.is_none() || file_identity(path) != file {
        return Err("the path names another file than the one the first connection opened".into());
    }
    Ok(conn)
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
