//! A host's scope read from a SQLite registry: what to fetch, and why, is
//! `store/scope.rs`; here, how. One read transaction holds one snapshot for
//! every statement: this host's active rows through the index on
//! (`host_id`, `status`), its other rows counted on that index alone, and
//! the peer rows key by key, through the identity's key and the indexes on
//! active rows (`store::registry::SCOPE_INDEXES`).

use super::read::{open_read_only, present_columns, value_from_sql};
use super::scope_index::{create_indexes, index_problem};
use crate::error::{Error, Result, Store};
use crate::row::{Col, Row};
use crate::store::scope::{stored_forms, unreadable_scope, PeerKeys, Scope};
use crate::value::Value;
use rusqlite::types::Value as SqlValue;
use rusqlite::Connection;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const TABLE: &str = crate::store::registry::TABLE;

/// Values bound per statement (well below SQLite's limit on parameters).
const CHUNK: usize = 500;

/// This host's scope, read-only, in one read transaction.
pub fn load(path: &Path, host_id: &str) -> Result<Scope> {
    let conn = open_read_only(path)?;
    let err = Error::sqlite(Store::Registry, path, "cannot read this host's scope");
    // One read transaction: the shared lock (or, in WAL mode, the
    // snapshot) its first read takes holds until COMMIT.
    conn.execute_batch("BEGIN").map_err(err)?;
    let scope = read_on(&conn, path, host_id, &[])?;
    conn.execute_batch("COMMIT").map_err(err)?;
    Ok(scope)
}

/// This host's scope on `conn`, inside the transaction the caller holds,
/// with the rows of the identities `also` among the peers.
pub fn read_on(conn: &Connection, path: &Path, host_id: &str, also: &[String]) -> Result<Scope> {
    let err = Error::sqlite(Store::Registry, path, "cannot read this host's scope");
    let (present, list) = present_columns(conn, path)?;
    let refused = |why: String| Error::Registry {
        shown: crate::store::location::label(path),
        message: unreadable_scope(&why),
    };
    for needed in [Col::HostId, Col::Status] {
        if !present.contains(&needed) {
            return Err(refused(format!("it has no `{}` column", needed.name())));
        }
    }
    if let Some(why) = index_problem(conn).map_err(err)? {
        return Err(refused(why));
    }
    let select = |filter: &str| format!("SELECT rowid, {list} FROM {TABLE} WHERE {filter}");
    let own = read(
        conn,
        path,
        &present,
        &select("host_id = ?1 AND status = 'active' ORDER BY rowid"),
        &[SqlValue::Text(host_id.into())],
    )?;
    let terminal: i64 = conn
        .query_row(
            &format!("SELECT count(*) FROM {TABLE} WHERE host_id = ?1 AND status IS NOT 'active'"),
            [host_id],
            |r| r.get(0),
        )
        .map_err(err)?;
    let own_rowids: BTreeSet<i64> = own.iter().map(|(id, _)| *id).collect();
    let own: Vec<Row> = own.into_iter().map(|(_, row)| row).collect();
    let mut keys = PeerKeys::of(&own);
    keys.identities.extend(also.iter().cloned());
    let mut peers: BTreeMap<i64, Row> = BTreeMap::new();
    for (column, any_status_ok, set) in keys.columns() {
        let active_only = !any_status_ok;
        if set.is_empty() || !present.contains(&column) {
            continue;
        }
        let forms: Vec<SqlValue> = set
            .iter()
            .flat_map(|k| stored_forms(k))
            .map(sql_value)
            .collect();
        for chunk in forms.chunks(CHUNK) {
            let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("?{i}")).collect();
            let filter = format!(
                "{} IN ({}){}",
                crate::store::quote_ident(column.name()),
                marks.join(", "),
                if active_only {
                    " AND status = 'active'"
                } else {
                    ""
                }
            );
            for (rowid, row) in read(conn, path, &present, &select(&filter), chunk)? {
                if !own_rowids.contains(&rowid) {
                    peers.entry(rowid).or_insert(row);
                }
            }
        }
    }
    Ok(Scope {
        host_id: host_id.to_string(),
        own,
        peers: peers.into_values().collect(),
        terminal: terminal.max(0) as u64,
    })
}

/// Our value as SQLite binds it (a boolean is SQLite's integer).
fn sql_value(v: Value) -> SqlValue {
    match v {
        Value::Null => SqlValue::Null,
        Value::Int(i) => SqlValue::Integer(i),
        Value::Real(f) => SqlValue::Real(f),
        Value::Bool(b) => SqlValue::Integer(i64::from(b)),
        Value::Text(t) => SqlValue::Text(t.to_string()),
        Value::Blob(b) => SqlValue::Blob(b.into_vec()),
    }
}

/// The rows `sql` selects (rowid first, then `present`), with their rowids.
fn read(
    conn: &Connection,
    path: &Path,
    present: &[Col],
    sql: &str,
    params: &[SqlValue],
) -> Result<Vec<(i64, Row)>> {
    let err = Error::sqlite(Store::Registry, path, "cannot read this host's scope");
    let mut stmt = conn.prepare(sql).map_err(err)?;
    let mut rows = stmt
        .query(rusqlite::params_from_iter(params.iter()))
        .map_err(err)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(err)? {
        let rowid: i64 = r.get(0).map_err(err)?;
        let mut row = Row::default();
        for (i, col) in present.iter().enumerate() {
            let value =
                value_from_sql(r.get_ref(i + 1).map_err(err)?).map_err(|m| Error::Registry {
                    shown: crate::store::location::label(path),
                    message: format!("row {rowid}, column `{}`: {m}", col.name()),
                })?;
            row.set(*col, value);
        }
        out.push((rowid, row));
    }
    Ok(out)
}

/// `registry versions` on a SQLite registry: the scope's indexes it lacks,
/// made in one write transaction; whether any was made.
pub fn install_indexes(path: &Path) -> Result<bool> {
    let conn = super::worker::open_existing(path)?;
    let err = Error::sqlite(
        Store::Registry,
        path,
        "cannot make the host scope's indexes",
    );
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(err)?;
    conn.execute_batch("BEGIN IMMEDIATE").map_err(err)?;
    let made = create_indexes(&conn).map_err(err)?;
    conn.execute_batch("COMMIT").map_err(err)?;
    Ok(made > 0)
}
