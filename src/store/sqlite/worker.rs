//! A worker's writes to its own row of a SQLite registry: each one short
//! statement, under SQLite's busy timeout.

use crate::error::{Error, Result, Store};
use crate::row::COLUMNS;
use crate::store::registry::TABLE;
use crate::store::seam::{ActiveOwner, WorkerRows};
use crate::store::table_columns;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A SQLite registry opened for a worker's writes.
pub struct Rows {
    conn: Connection,
    path: PathBuf,
}

impl Rows {
    /// Open the existing registry at `path` (migrating its columns if
    /// needed). A worker never creates a registry: one deleted under a
    /// running fleet must stop its workers, not come back empty.
    pub fn open(path: &Path) -> Result<Rows> {
        Ok(Rows {
            conn: open_existing(path)?,
            path: path.to_path_buf(),
        })
    }
}

impl WorkerRows for Rows {
    fn status_of(&mut self, identity: &str) -> Result<Option<String>> {
        crate::store::registry::status_of(&self.conn, identity).map_err(Error::sqlite(
            Store::Registry,
            &self.path,
            "cannot read",
        ))
    }

    fn insert(&mut self, row: &serde_json::Map<String, serde_json::Value>) -> Result<()> {
        crate::store::registry::insert(&self.conn, row)
            .map(|_| ())
            .map_err(Error::sqlite(
                Store::Registry,
                &self.path,
                "cannot register",
            ))
    }

    fn owner_of(&mut self, worker: &str) -> Result<Option<ActiveOwner>> {
        owner_of(&self.conn, &self.path, worker)
    }

    fn set(
        &mut self,
        column: &'static str,
        value: &str,
        worker: &str,
        pid: i64,
        doing: &'static str,
    ) -> Result<u64> {
        let column = crate::store::quote_ident(column);
        self.conn
            .execute(
                &format!(
                    "UPDATE {TABLE} SET {column} = ?1 WHERE worker_identity = ?2 \
                     AND status = 'active' AND pid = ?3"
                ),
                params![value, worker, pid],
            )
            .map(|n| n as u64)
            .map_err(Error::sqlite(Store::Registry, &self.path, doing))
    }
}

/// Open a SQLite registry, creating the file and its tables if needed: the
/// explicit act of `fleet-retire registry create` (and of the demo and the
/// tests), never of a worker's own writes ([`open_existing`]).
pub fn open(path: &Path) -> Result<Connection> {
    let err = |doing| Error::sqlite(Store::Registry, path, doing);
    let conn =
        super::held::opening(|| Connection::open(path)).map_err(err("cannot open or create"))?;
    migrated(conn, path, true)?
        .ok_or_else(|| Error::Refused("the registry could not be created".into()))
}

/// Create a new SQLite registry at `path`, which must not exist: the file
/// is made with `O_CREAT | O_EXCL`, which fails on any existing path, a
/// symbolic link (dangling or not) included, so nothing is created where a
/// link points; SQLite then opens that very file without following links.
/// `Ok(None)` when the path exists already (the caller says so); a failure
/// after the file was made removes it.
pub fn create_new(path: &Path) -> Result<Option<Connection>> {
    let err = |doing| Error::sqlite(Store::Registry, path, doing);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(Error::io(path, "cannot create the registry file")(e)),
    }
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
        | rusqlite::OpenFlags::SQLITE_OPEN_NOFOLLOW
        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let made = super::held::opening(|| Connection::open_with_flags(path, flags))
        .map_err(err("cannot open the new registry"))
        .and_then(|conn| {
            migrated(conn, path, true)?
                .ok_or_else(|| Error::Refused("the registry could not be created".into()))
        });
    if made.is_err() {
        let _ = std::fs::remove_file(path);
    }
    made.map(Some)
}

/// Open an existing SQLite registry for a worker's writes: refused when
/// the file is missing or holds no registry table.
pub fn open_existing(path: &Path) -> Result<Connection> {
    let err = |doing| Error::sqlite(Store::Registry, path, doing);
    let missing = |what: &str| {
        Error::input(
            crate::error::About::File(path.to_path_buf()),
            format!(
                "the registry {} {what}; a worker does not create one. Create it once with \
                 `fleet-retire registry create --registry {}`, or point the worker at the \
                 fleet's registry",
                crate::text::esc(&path.display().to_string()),
                crate::text::esc(&path.display().to_string()),
            ),
        )
    };
    if !path.exists() {
        return Err(missing("does not exist"));
    }
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = super::held::opening(|| Connection::open_with_flags(path, flags))
        .map_err(err("cannot open"))?;
    migrated(conn, path, false)?.ok_or_else(|| missing("holds no worker_registrations table"))
}

/// The registry with every column this version writes: migrated under the
/// write lock when columns are missing, created when the table is missing
/// and `create` says so (`None` when it does not).
fn migrated(conn: Connection, path: &Path, create: bool) -> Result<Option<Connection>> {
    let err = |doing| Error::sqlite(Store::Registry, path, doing);
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(err("cannot set the busy timeout"))?;
    match table_columns(&conn, TABLE).map_err(err("cannot read"))? {
        None if !create => return Ok(None),
        Some(names) if COLUMNS.iter().all(|c| names.iter().any(|n| n == c.name())) => {
            return Ok(Some(conn))
        }
        _ => {}
    }
    // Creating or migrating: under the write lock, deciding again there, so
    // workers starting together do not each add the same column (the
    // second would fail with "duplicate column name").
    // A new registry keeps row versions from its first row.
    crate::store::registry::create_or_migrate_locked(&conn, path, &super::versions::install)?;
    Ok(Some(conn))
}

fn owner_of(conn: &Connection, path: &Path, worker: &str) -> Result<Option<ActiveOwner>> {
    let sql = format!(
        "SELECT pid, process_start_time, host_id, boot_id, pid_namespace FROM {TABLE} \
         WHERE worker_identity = ?1 AND status = 'active'"
    );
    conn.query_row(&sql, [worker], |r| {
        let pid: Option<i64> = r.get::<_, rusqlite::types::Value>(0).map(|v| match v {
            rusqlite::types::Value::Integer(i) => Some(i),
            _ => None,
        })?;
        let text = |i: usize| -> rusqlite::Result<Option<String>> {
            Ok(match r.get::<_, rusqlite::types::Value>(i)? {
                rusqlite::types::Value::Text(t) => Some(t),
                _ => None,
            })
        };
        let start = text(1)?;
        let fencing = json!({"host_id": text(2)?, "boot_id": text(3)?, "pid_namespace": text(4)?});
        Ok(pid.map(|pid| ActiveOwner {
            pid,
            start,
            fencing,
        }))
    })
    .optional()
    .map(Option::flatten)
    .map_err(Error::sqlite(
        Store::Registry,
        path,
        "cannot read the registration",
    ))
}
