//! Reading the worker registry (docs/semantics.md §5).
//!
//! Planning opens the file read-only and never alters it: a registry from
//! before the fencing or `retired_*` columns simply reads those columns as
//! NULL. Columns the program does not know are ignored.

use crate::error::{Error, Result, Store};
use crate::row::{Col, Row, COLUMNS};
use crate::value::Value;
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

/// Shares repeated texts of one column (statuses, hosts, repositories,
/// namespaces) so a large registry holds each distinct text once. A column
/// whose texts are mostly distinct (identities, timestamps) stops being
/// looked up once it has shown [`INTERN_LIMIT`] distinct values: from then
/// on each text is simply stored, which costs less than hashing it.
#[derive(Debug, Default)]
pub struct Interner {
    /// The first few distinct texts, scanned in order: most columns never
    /// have more (statuses, namespaces, hosts), and a scan that compares
    /// lengths first beats hashing.
    few: Vec<std::sync::Arc<str>>,
    seen: std::collections::HashSet<std::sync::Arc<str>, FastHash>,
    saturated: bool,
}

const FEW: usize = 12;

const INTERN_LIMIT: usize = 4096;

/// A small, fast, non-cryptographic hash for the interner (the keys are a
/// registry's own texts; a collision costs a comparison, never a wrong
/// answer).
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHash;

impl std::hash::BuildHasher for FastHash {
    type Hasher = FastHasher;
    fn build_hasher(&self) -> FastHasher {
        FastHasher(0)
    }
}

/// The hasher of [`FastHash`] (FxHash's mixing step, eight bytes at a time).
#[derive(Debug)]
pub struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let word = u64::from_le_bytes(c.try_into().expect("eight bytes"));
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
        }
        let mut tail = [0u8; 8];
        let rest = chunks.remainder();
        tail[..rest.len()].copy_from_slice(rest);
        self.0 =
            (self.0.rotate_left(5) ^ u64::from_le_bytes(tail) ^ bytes.len() as u64).wrapping_mul(K);
    }
}

impl Interner {
    /// The shared copy of `text`.
    pub fn intern(&mut self, text: &str) -> std::sync::Arc<str> {
        if self.saturated {
            return text.into();
        }
        if let Some(shared) = self
            .few
            .iter()
            .find(|f| f.len() == text.len() && f.as_bytes() == text.as_bytes())
        {
            return shared.clone();
        }
        if self.few.len() < FEW {
            let shared: std::sync::Arc<str> = text.into();
            self.few.push(shared.clone());
            return shared;
        }
        if let Some(shared) = self.seen.get(text) {
            return shared.clone();
        }
        let shared: std::sync::Arc<str> = text.into();
        self.seen.insert(shared.clone());
        if self.seen.len() >= INTERN_LIMIT {
            self.saturated = true;
            self.seen = Default::default();
            self.few = Vec::new();
        }
        shared
    }
}

/// Convert one SQLite value, keeping its storage class.
pub fn value_from_sql(
    v: ValueRef<'_>,
    interner: &mut Interner,
) -> std::result::Result<Value, String> {
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(
            interner
                .intern(std::str::from_utf8(t).map_err(|_| "text is not valid UTF-8".to_string())?),
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

/// Rows as SQLite gave them, copied out in bulk.
struct RawBatch {
    first_row: usize,
    values: Vec<RawValue>,
    bytes: Vec<u8>,
}

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
        bytes: Vec::new(),
    };
    let mut cursor = stmt.query([]).map_err(sql_err)?;
    let mut batch = fresh(0);
    let mut count = 0usize;
    while let Some(r) = cursor.next().map_err(sql_err)? {
        for i in 0..width {
            let raw = r.get_ref(i).map_err(sql_err)?;
            batch.push(raw);
        }
        count += 1;
        if batch.values.len() == BATCH_ROWS * width {
            let full = std::mem::replace(&mut batch, fresh(count));
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

/// The converter's side: raw batches into rows, text interned per column.
fn convert_batches(
    batches: std::sync::mpsc::Receiver<RawBatch>,
    present: &[Col],
    path: &Path,
) -> Result<Vec<Row>> {
    let width = present.len();
    let mut rows = Vec::new();
    let mut interners: Vec<Interner> = present.iter().map(|_| Interner::default()).collect();
    for batch in batches {
        for (n, raw) in batch.values.chunks_exact(width).enumerate() {
            let mut row = Row::default();
            for (i, (col, v)) in present.iter().zip(raw).enumerate() {
                let value = match v {
                    RawValue::Null => Value::Null,
                    RawValue::Int(x) => Value::Int(*x),
                    RawValue::Real(x) => Value::Real(*x),
                    RawValue::Text(r) => match std::str::from_utf8(&batch.bytes[r.clone()]) {
                        Ok(t) => Value::Text(interners[i].intern(t)),
                        Err(_) => {
                            return Err(registry_error(
                                path,
                                format!(
                                    "row {}: column `{}`: text is not valid UTF-8",
                                    batch.first_row + n + 1,
                                    col.name()
                                ),
                            ))
                        }
                    },
                    RawValue::Blob(r) => Value::Blob(batch.bytes[r.clone()].into()),
                };
                row.set(*col, value);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

impl RawBatch {
    /// Append one value as SQLite gave it, copying text and blobs.
    fn push(&mut self, v: ValueRef<'_>) {
        let raw = match v {
            ValueRef::Null => RawValue::Null,
            ValueRef::Integer(x) => RawValue::Int(x),
            ValueRef::Real(x) => RawValue::Real(x),
            ValueRef::Text(t) => {
                let at = self.bytes.len();
                self.bytes.extend_from_slice(t);
                RawValue::Text(at..self.bytes.len())
            }
            ValueRef::Blob(b) => {
                let at = self.bytes.len();
                self.bytes.extend_from_slice(b);
                RawValue::Blob(at..self.bytes.len())
            }
        };
        self.values.push(raw);
    }
}

/// Open read-only and read every registration.
pub fn load(path: &Path) -> Result<Vec<Row>> {
    let conn = open_read_only(path)?;
    read_rows(&conn, path)
}
