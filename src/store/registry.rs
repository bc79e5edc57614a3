//! The worker registry's table, `worker_registrations` (semantics §5 of
//! docs/semantics.md): its SQL types, the statement that creates it, and
//! the migration that adds the columns an older registry lacks. The column
//! list itself is `crate::row::Col`, which every reader and writer shares.

use crate::error::{Error, Result, Store};
use crate::row::{Col, COLUMNS};
use rusqlite::Connection;
use std::path::Path;

/// The registry table.
pub const TABLE: &str = "worker_registrations";

fn registry_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Registry {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// SQL type of each known column, for creating and migrating a registry.
pub fn sql_type(col: Col) -> &'static str {
    match col {
        Col::WorkerIdentity => "TEXT PRIMARY KEY",
        Col::Pid | Col::FencingEpoch => "INTEGER",
        Col::HeartbeatTtlSeconds => "REAL",
        _ => "TEXT",
    }
}

/// The statement that creates the registry table with every known column.
pub fn create_sql() -> String {
    let cols: Vec<String> = COLUMNS
        .iter()
        .map(|c| format!("\"{}\" {}", c.name(), sql_type(*c)))
        .collect();
    format!("CREATE TABLE IF NOT EXISTS {TABLE} ({})", cols.join(", "))
}

/// Add every known column the registry table lacks (as NULL), leaving
/// unknown columns alone. For the writers (apply, worker registration);
/// planning never migrates.
pub fn add_missing_columns(conn: &Connection, path: &Path) -> Result<()> {
    let existing = super::table_columns(conn, TABLE)
        .map_err(Error::sqlite(Store::Registry, path, "cannot read"))?
        .ok_or_else(|| {
            registry_error(
                path,
                format!("has no `{TABLE}` table; is this the worker registry?"),
            )
        })?;
    for col in COLUMNS
        .iter()
        .filter(|c| !existing.iter().any(|n| n == c.name()))
    {
        let ty = sql_type(*col).trim_end_matches(" PRIMARY KEY");
        conn.execute_batch(&format!(
            "ALTER TABLE {TABLE} ADD COLUMN \"{}\" {ty}",
            col.name()
        ))
        .map_err(|source| Error::Sqlite {
            store: Store::Registry,
            path: path.to_path_buf(),
            doing: format!("cannot add the missing column `{}`", col.name()),
            source,
        })?;
    }
    Ok(())
}

/// Create the registry table, or add the columns it lacks, inside one
/// `BEGIN IMMEDIATE` transaction that looks again once it holds the lock.
pub fn create_or_migrate_locked(conn: &Connection, path: &Path) -> Result<()> {
    let err = |doing| Error::sqlite(Store::Registry, path, doing);
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(err("cannot take the write lock to create or migrate"))?;
    let done = (|| -> Result<()> {
        match super::table_columns(conn, TABLE).map_err(err("cannot read"))? {
            None => conn
                .execute_batch(&create_sql())
                .map_err(err("cannot create the registry table")),
            Some(_) => add_missing_columns(conn, path),
        }
    })();
    match done {
        Ok(()) => conn
            .execute_batch("COMMIT")
            .map_err(err("cannot commit the migration")),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
