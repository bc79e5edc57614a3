//! Reading the worker registry (docs/semantics.md §5).
//!
//! Planning opens the file read-only and never alters it: a registry from
//! before the fencing or `retired_*` columns simply reads those columns as
//! NULL. Columns the program does not know are ignored.

use crate::error::{Error, Result, Store};
use crate::row::{Col, Row, COLUMNS};
use crate::value::{TextBuf, Value};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

pub use crate::store::registry::TABLE;

fn registry_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Registry {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Open an existing registry without any possibility of writing to it.
pub fn open_read_only(path: &Path) -> Result<Connection> {
    if !path.is_file() {
        return Err(registry_error(
            path,
            "no such file; pass the worker registry's SQLite file with --registry \
             (or FLEET_RETIRE_REGISTRY)",
        ));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
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
        let c = Connection::open_with_flags(path, flags)?;
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
    match Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE) {
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

/// Read every registration, in registry (rowid) order.
pub fn read_rows(conn: &Connection, path: &Path) -> Result<Vec<Row>> {
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
            format!("table `{TABLE}` has no `worker_identity` column; it is not a worker registry"),
        ));
    }
    let list = present
        .iter()
        .map(|c| format!("\"{}\"", c.name()))
        .collect::<Vec<_>>()
        .join(", ");
    let ordered = format!("SELECT {list} FROM {TABLE} ORDER BY rowid");
    let mut stmt = match conn.prepare(&ordered) {
        Ok(s) => s,
        // A WITHOUT ROWID table has no rowid: its natural order is the key's.
        Err(_) => conn
            .prepare(&format!("SELECT {list} FROM {TABLE}"))
            .map_err(sql_err)?,
    };
    read_pipelined(&mut stmt, &present, path, sql_err)
}

/// One column of a row as SQLite gave it, its bytes in the batch's buffer.
enum RawValue {
    Null,
    Int(i64),
    Real(f64),
    Text(std::ops::Range<usize>),
    Blob(std::ops::Range<usize>),
}

/// Rows as SQLite gave them, copied out in bulk: every text of the batch
/// in one buffer (which becomes the texts' shared buffer), blobs in another.
struct RawBatch {
    first_row: usize,
    values: Vec<RawValue>,
    text: Vec<u8>,
    blobs: Vec<u8>,
}

/// A batch's text buffer stops growing past this (the texts' offsets are
/// 32-bit); the batch is handed on early instead.
const BATCH_TEXT_LIMIT: usize = 1 << 30;

const BATCH_ROWS: usize = 1024;

/// Step through the statement on this thread while a second thread turns
/// the raw columns into rows: SQLite's decoding and the allocation of the
/// values each take about half of a large registry's reading time, and
/// overlap. Rows keep the statement's order.
fn read_pipelined(
    stmt: &mut rusqlite::Statement<'_>,
    present: &[Col],
    path: &Path,
    sql_err: impl Fn(rusqlite::Error) -> Error,
) -> Result<Vec<Row>> {
    let (to_convert, batches) = std::sync::mpsc::sync_channel::<RawBatch>(4);
    std::thread::scope(|scope| {
        let converter = scope.spawn(move || convert_batches(batches, present, path));
        let stepped = step_rows(stmt, present.len(), &sql_err, &to_convert);
        drop(to_convert);
        let converted = converter
            .join()
            .map_err(|_| registry_error(path, "the row converter failed"))?;
        stepped?;
        converted
    })
}

/// SQLite's side: step the statement, copying each row's values into
/// batches of raw bytes, and hand every full batch on.
fn step_rows(
    stmt: &mut rusqlite::Statement<'_>,
    width: usize,
    sql_err: &impl Fn(rusqlite::Error) -> Error,
    to_convert: &std::sync::mpsc::SyncSender<RawBatch>,
) -> Result<()> {
    let fresh = |first_row| RawBatch {
        first_row,
        values: Vec::with_capacity(BATCH_ROWS * width),
        text: Vec::new(),
        blobs: Vec::new(),
    };
    let mut recent: Vec<Recent> = (0..width).map(|_| Recent::default()).collect();
    let mut cursor = stmt.query([]).map_err(sql_err)?;
    let mut batch = fresh(0);
    let mut count = 0usize;
    while let Some(r) = cursor.next().map_err(sql_err)? {
        for (i, recent) in recent.iter_mut().enumerate() {
            let raw = r.get_ref(i).map_err(sql_err)?;
            batch.push(raw, recent);
        }
        count += 1;
        if batch.values.len() == BATCH_ROWS * width || batch.text.len() > BATCH_TEXT_LIMIT {
            let full = std::mem::replace(&mut batch, fresh(count));
            recent.iter_mut().for_each(Recent::forget);
            if to_convert.send(full).is_err() {
                // The converter stopped on an error: it reports it.
                return Ok(());
            }
        }
    }
    if !batch.values.is_empty() {
        let _ = to_convert.send(batch);
    }
    Ok(())
}

/// The converter's side: raw batches into rows. A batch's texts are checked
/// as UTF-8 in one pass and become one shared buffer that every text value
/// of the batch slices.
fn convert_batches(
    batches: std::sync::mpsc::Receiver<RawBatch>,
    present: &[Col],
    path: &Path,
) -> Result<Vec<Row>> {
    let width = present.len();
    let not_utf8 = |row: usize, col: Col| {
        registry_error(
            path,
            format!(
                "row {}: column `{}`: text is not valid UTF-8",
                row + 1,
                col.name()
            ),
        )
    };
    let mut rows = Vec::new();
    for batch in batches {
        let RawBatch {
            first_row,
            values,
            text,
            blobs,
        } = batch;
        let buf = match String::from_utf8(text) {
            Ok(t) => TextBuf::new(t),
            Err(e) => {
                // Name the first value that is not UTF-8.
                let bytes = e.into_bytes();
                let (n, col) = values
                    .chunks_exact(width)
                    .enumerate()
                    .find_map(|(n, raw)| {
                        raw.iter().zip(present).find_map(|(v, col)| match v {
                            RawValue::Text(r)
                                if std::str::from_utf8(&bytes[r.clone()]).is_err() =>
                            {
                                Some((n, *col))
                            }
                            _ => None,
                        })
                    })
                    .unwrap_or((0, Col::WorkerIdentity));
                return Err(not_utf8(first_row + n, col));
            }
        };
        for (n, raw) in values.chunks_exact(width).enumerate() {
            let mut row = Row::in_buffer(buf.clone());
            for (col, v) in present.iter().zip(raw) {
                let value = match v {
                    RawValue::Null => continue,
                    RawValue::Int(x) => Value::Int(*x),
                    RawValue::Real(x) => Value::Real(*x),
                    // Each text was valid on its own, so its bounds are
                    // character boundaries of the whole.
                    RawValue::Text(r) => {
                        if row.set_slice(*col, r.clone()) {
                            continue;
                        }
                        return Err(not_utf8(first_row + n, *col));
                    }
                    RawValue::Blob(r) => Value::Blob(blobs[r.clone()].into()),
                };
                row.set(*col, value);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// A column's last few distinct texts in the current batch, so a repeated
/// text (a role, a status, a revision: half of a real registry's text) is
/// stored once per batch and its values share the bytes. A column whose
/// texts rarely repeat stops looking after a sample.
#[derive(Default)]
struct Recent {
    ranges: [(u32, u32); RECENT],
    known: usize,
    tries: u32,
    hits: u32,
}

const RECENT: usize = 8;

impl Recent {
    /// The range of an equal text already in `buf`, if one is known.
    fn find(&mut self, buf: &[u8], t: &[u8]) -> Option<std::ops::Range<usize>> {
        if self.tries >= 1024 && self.hits < self.tries / 4 {
            return None;
        }
        self.tries = self.tries.saturating_add(1);
        let found = self.ranges[..self.known]
            .iter()
            .map(|&(at, len)| at as usize..(at + len) as usize)
            .find(|r| r.len() == t.len() && &buf[r.clone()] == t)?;
        self.hits = self.hits.saturating_add(1);
        Some(found)
    }

    /// Remember a text just stored at `range`.
    fn remember(&mut self, range: &std::ops::Range<usize>) {
        let (Ok(at), Ok(len)) = (u32::try_from(range.start), u32::try_from(range.len())) else {
            return;
        };
        self.ranges.copy_within(0..RECENT - 1, 1);
        self.ranges[0] = (at, len);
        self.known = (self.known + 1).min(RECENT);
    }

    /// A new batch (a new buffer): nothing in it is known yet.
    fn forget(&mut self) {
        self.known = 0;
    }
}

impl RawBatch {
    /// Append one value as SQLite gave it, copying text (once per batch
    /// for a text its column repeats) and blobs.
    fn push(&mut self, v: ValueRef<'_>, recent: &mut Recent) {
        let raw = match v {
            ValueRef::Null => RawValue::Null,
            ValueRef::Integer(x) => RawValue::Int(x),
            ValueRef::Real(x) => RawValue::Real(x),
            ValueRef::Text(t) => match recent.find(&self.text, t) {
                Some(range) => RawValue::Text(range),
                None => {
                    let at = self.text.len();
                    self.text.extend_from_slice(t);
                    let range = at..self.text.len();
                    recent.remember(&range);
                    RawValue::Text(range)
                }
            },
            ValueRef::Blob(b) => {
                let at = self.blobs.len();
                self.blobs.extend_from_slice(b);
                RawValue::Blob(at..self.blobs.len())
            }
        };
        self.values.push(raw);
    }
}

/// Open read-only and read every registration: from the SQLite file, or
/// (for a `postgres://` location) in one read-only transaction.
pub fn load(path: &Path) -> Result<Vec<Row>> {
    if crate::store::pg::is_postgres(path) {
        return load_postgres(path);
    }
    let conn = open_read_only(path)?;
    read_rows(&conn, path)
}

/// Read every registration from PostgreSQL, in one read-only transaction
/// (one snapshot of the table).
fn load_postgres(location: &Path) -> Result<Vec<Row>> {
    let url = location.to_string_lossy();
    let label = crate::store::pg::masked(&url);
    let mut client = crate::store::pg::connect(&url, Store::Registry)?;
    let err = |doing| Error::postgres(Store::Registry, &label, doing);
    let mut tx = client
        .build_transaction()
        .read_only(true)
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .start()
        .map_err(err("cannot begin a read"))?;
    let rows = crate::store::pg::read_registry(&mut tx, &label)?;
    tx.commit().map_err(err("cannot end the read"))?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Texts a column repeats are stored once per batch; every value still
    /// reads as SQLite holds it, across batch boundaries, beside texts of
    /// equal length that differ, NULLs and integers in the same column, and
    /// columns with more distinct texts than are remembered.
    #[test]
    fn repeated_texts_read_as_stored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE worker_registrations (worker_identity TEXT PRIMARY KEY, role TEXT,
             remote TEXT, status, boot_id TEXT, namespace TEXT)",
        )
        .unwrap();
        let tx = conn.unchecked_transaction().unwrap();
        for i in 0..5000u32 {
            let status: rusqlite::types::Value = match i % 7 {
                0 => rusqlite::types::Value::Null,
                1 => rusqlite::types::Value::Integer(i64::from(i % 3)),
                2 => "aaab".to_string().into(),
                _ => "aaaa".to_string().into(),
            };
            tx.execute(
                "INSERT INTO worker_registrations VALUES (?1, ?2, 'prgs', ?3, ?4, ?5)",
                rusqlite::params![
                    format!("w-{i}"),
                    ["author", "reviewer", "merger", "controller", "reconciler"][(i % 5) as usize],
                    status,
                    format!("boot-{:02}", (i * 7) % 13),
                    if i % 11 == 0 {
                        String::new()
                    } else {
                        format!("ns-{}", i % 2)
                    },
                ],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        let rows = read_rows(&conn, &path).unwrap();
        let mut stmt = conn
            .prepare(
                "SELECT worker_identity, role, remote, status, boot_id, namespace \
                 FROM worker_registrations ORDER BY rowid",
            )
            .unwrap();
        let cols = [
            Col::WorkerIdentity,
            Col::Role,
            Col::Remote,
            Col::Status,
            Col::BootId,
            Col::Namespace,
        ];
        let mut cursor = stmt.query([]).unwrap();
        let mut n = 0;
        while let Some(r) = cursor.next().unwrap() {
            for (i, col) in cols.iter().enumerate() {
                let expected = value_from_sql(r.get_ref(i).unwrap()).unwrap();
                assert_eq!(rows[n].get(*col), expected, "row {n} column {col:?}");
            }
            n += 1;
        }
        assert_eq!(n, rows.len());
        assert_eq!(n, 5000);
    }
}
