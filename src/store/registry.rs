//! The worker registry's table, `worker_registrations` (docs/semantics.md
//! §5): its SQL types, the statement that creates it, the migration that
//! adds the columns an older registry lacks, and the statements that write
//! it. The column
//! list itself is `crate::row::Col`, which every reader and writer shares.

use crate::error::{Error, Result, Store};
use crate::row::{Col, COLUMNS};
use rusqlite::Connection;
use std::path::Path;

/// The registry table.
pub const TABLE: &str = "worker_registrations";

fn registry_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Registry {
        shown: crate::store::location::label(path),
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
        .map(|c| format!("{} {}", super::quote_ident(c.name()), sql_type(*c)))
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
            "ALTER TABLE {TABLE} ADD COLUMN {} {ty}",
            super::quote_ident(col.name())
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
/// `BEGIN IMMEDIATE` transaction that looks again once it holds the lock;
/// `on_create` runs in the same transaction after a creation (the engine's
/// row-version bookkeeping).
pub fn create_or_migrate_locked(
    conn: &Connection,
    path: &Path,
    on_create: &dyn Fn(&Connection) -> rusqlite::Result<()>,
) -> Result<()> {
    let err = |doing| Error::sqlite(Store::Registry, path, doing);
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(err("cannot take the write lock to create or migrate"))?;
    let done = (|| -> Result<()> {
        match super::table_columns(conn, TABLE).map_err(err("cannot read"))? {
            None => {
                conn.execute_batch(&create_sql())
                    .map_err(err("cannot create the registry table"))?;
                on_create(conn).map_err(err("cannot install the row-version bookkeeping"))
            }
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

/// Columns the guarded UPDATE asserts unchanged (NULL-safe `IS`): every
/// column the program reads, besides the identity it matches on. A
/// retirement was decided on the whole row as read, so any change to it
/// since (a heartbeat, a restart, a new generation, a move to another host
/// or pid namespace, an identity's provenance, a revision) makes the UPDATE
/// match nothing (docs/security.md, "a changed row compared on the token's
/// fields only").
pub const GUARD: &[Col] = &guard_columns();

/// [`crate::row::COLUMNS`] without `worker_identity`, in their order.
const fn guard_columns() -> [Col; crate::row::WIDTH - 1] {
    let mut out = [Col::Status; crate::row::WIDTH - 1];
    let (mut i, mut j) = (0, 0);
    while i < crate::row::WIDTH {
        if !matches!(crate::row::COLUMNS[i], Col::WorkerIdentity) {
            out[j] = crate::row::COLUMNS[i];
            j += 1;
        }
        i += 1;
    }
    out
}

/// A value as SQLite stores it.
pub fn sql_value(v: crate::value::Val<'_>) -> rusqlite::types::Value {
    use crate::value::Val;
    use rusqlite::types::Value as S;
    match v {
        Val::Null => S::Null,
        Val::Int(i) => S::Integer(i),
        Val::Real(f) => S::Real(f),
        Val::Text(t) => S::Text(t.to_string()),
        Val::Bool(b) => S::Integer(b as i64),
        Val::Blob(b) => S::Blob(b.to_vec()),
    }
}

/// Retire `row` as it was read: set it `retired`, but only where its
/// identity and every [`GUARD`] column still hold the values read. Returns
/// the rows changed: 1, or 0 when the registration changed meanwhile (more
/// than 1 is the caller's to refuse).
pub fn retire_guarded(
    conn: &Connection,
    row: &crate::row::Row,
    retired_at: &str,
    retired_by: &str,
    reason: &str,
) -> rusqlite::Result<Vec<i64>> {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        let guard = GUARD
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{} IS ?{}", super::quote_ident(c.name()), i + 5))
            .collect::<Vec<_>>()
            .join(" AND ");
        format!(
            "UPDATE {TABLE} SET status = 'retired', retired_at = ?1, retired_by = ?2, \
             retirement_reason = ?3 WHERE worker_identity IS ?4 AND {guard} RETURNING rowid"
        )
    });
    use rusqlite::types::Value as S;
    let mut params = vec![
        S::Text(retired_at.to_string()),
        S::Text(retired_by.to_string()),
        S::Text(reason.to_string()),
        sql_value(row.get(Col::WorkerIdentity)),
    ];
    params.extend(GUARD.iter().map(|c| sql_value(row.get(*c))));
    let mut stmt = conn.prepare_cached(sql)?;
    let rowids = stmt
        .query_map(rusqlite::params_from_iter(params), |r| r.get(0))?
        .collect();
    rowids
}

/// The status of the row with this identity, if there is one.
pub fn status_of(conn: &Connection, identity: &str) -> rusqlite::Result<Option<String>> {
    use rusqlite::OptionalExtension;
    conn.query_row(
        &format!("SELECT status FROM {TABLE} WHERE worker_identity = ?1"),
        [identity],
        |r| r.get(0),
    )
    .optional()
}

/// Insert a new registration, given as column → JSON value (JSON types
/// standing for SQLite storage classes: an integer, a real, text, NULL).
pub fn insert(
    conn: &Connection,
    row: &serde_json::Map<String, serde_json::Value>,
) -> rusqlite::Result<usize> {
    use rusqlite::types::Value as S;
    use serde_json::Value as Json;
    let names: Vec<String> = row.keys().map(|n| super::quote_ident(n)).collect();
    let values: Vec<S> = row
        .values()
        .map(|v| match v {
            Json::Null => S::Null,
            Json::String(s) => S::Text(s.clone()),
            Json::Number(n) if n.is_i64() => S::Integer(n.as_i64().unwrap_or(0)),
            Json::Number(n) => S::Real(n.as_f64().unwrap_or(0.0)),
            other => S::Text(other.to_string()),
        })
        .collect();
    let marks: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    conn.execute(
        &format!(
            "INSERT INTO {TABLE} ({}) VALUES ({})",
            names.join(", "),
            marks.join(", ")
        ),
        rusqlite::params_from_iter(values),
    )
}
