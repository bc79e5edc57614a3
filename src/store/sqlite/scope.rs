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

/// This host's active rows (`?1`: the host).
const OWN: &str = "host_id = ?1 AND status = 'active' ORDER BY rowid";

/// This host's other rows, counted on the index alone.
const COUNT: &str =
    "SELECT count(*) FROM worker_registrations WHERE host_id = ?1 AND status IS NOT 'active'";

/// A statement selecting the rowid and the columns `list` of the rows
/// `filter` names.
fn select(list: &str, filter: &str) -> String {
    format!("SELECT rowid, {list} FROM {TABLE} WHERE {filter}")
}

/// The peer statements for `keys`: per key column the table has (the
/// table in `store/scope.rs`), its keys in every stored form, a few
/// hundred a statement, each served by that column's index.
fn peer_statements(list: &str, keys: &PeerKeys, present: &[Col]) -> Vec<(String, Vec<SqlValue>)> {
    let mut out = Vec::new();
    for (column, any_status_ok, set) in keys.columns() {
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
                if any_status_ok {
                    ""
                } else {
                    " AND status = 'active'"
                }
            );
            out.push((select(list, &filter), chunk.to_vec()));
        }
    }
    out
}

/// SQLite's plan (`EXPLAIN QUERY PLAN`) of every statement the scoped read
/// of `host_id` runs, each as its lines: this host's rows, the count of its
/// others, then the peer statements. For the test that holds the read to
/// its indexes.
pub fn explain(path: &Path, host_id: &str) -> Result<Vec<String>> {
    let conn = open_read_only(path)?;
    let err = Error::sqlite(Store::Registry, path, "cannot explain the scoped read");
    let (present, list) = present_columns(&conn, path)?;
    let own = read(
        &conn,
        path,
        &present,
        &select(&list, OWN),
        &[SqlValue::Text(host_id.into())],
    )?;
    let own: Vec<Row> = own.into_iter().map(|(_, row)| row).collect();
    let host = vec![SqlValue::Text(host_id.into())];
    let mut statements = vec![
        (select(&list, OWN), host.clone()),
        (COUNT.to_string(), host),
    ];
    statements.extend(peer_statements(&list, &PeerKeys::of(&own), &present));
    statements
        .iter()
        .map(|(sql, params)| {
            let mut stmt = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .map_err(err)?;
            let lines = stmt
                .query_map(rusqlite::params_from_iter(params.iter()), |r| {
                    r.get::<_, String>(3)
                })
                .map_err(err)?
                .collect::<rusqlite::Result<Vec<String>>>()
                .map_err(err)?;
            Ok(lines.join("\n"))
        })
        .collect()
}

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
/// with the rows of the identities `also` among the peers; refused
/// (`store::scope::unreadable_scope`) when its indexes cannot be trusted.
pub fn read_on(conn: &Connection, path: &Path, host_id: &str, also: &[String]) -> Result<Scope> {
    read_through_indexes(conn, path, host_id, also)?.map_err(|why| Error::Registry {
        shown: crate::store::location::label(path),
        message: unreadable_scope(&why),
    })
}

/// [`read_on`], with `Err` saying why the scope cannot be read through its
/// indexes (a column missing, an index missing or not ours), before any
/// row is read: a scoped apply then takes the scope from the whole read.
pub fn read_through_indexes(
    conn: &Connection,
    path: &Path,
    host_id: &str,
    also: &[String],
) -> Result<std::result::Result<Scope, String>> {
    let err = Error::sqlite(Store::Registry, path, "cannot read this host's scope");
    let (present, list) = present_columns(conn, path)?;
    for needed in [Col::HostId, Col::Status] {
        if !present.contains(&needed) {
            return Ok(Err(format!("it has no `{}` column", needed.name())));
        }
    }
    if let Some(why) = index_problem(conn).map_err(err)? {
        return Ok(Err(why));
    }
    let own = read(
        conn,
        path,
        &present,
        &select(&list, OWN),
        &[SqlValue::Text(host_id.into())],
    )?;
    let terminal: i64 = conn
        .query_row(COUNT, [host_id], |r| r.get(0))
        .map_err(err)?;
    let own_rowids: BTreeSet<i64> = own.iter().map(|(id, _)| *id).collect();
    let own: Vec<Row> = own.into_iter().map(|(_, row)| row).collect();
    let mut keys = PeerKeys::of(&own);
    keys.identities.extend(also.iter().cloned());
    let mut peers: BTreeMap<i64, Row> = BTreeMap::new();
    for (sql, params) in peer_statements(&list, &keys, &present) {
        for (rowid, row) in read(conn, path, &present, &sql, &params)? {
            // What the statements fetch beyond the scope's definition (a
            // stored form whose canonical text is not a key) is left out.
            if !own_rowids.contains(&rowid) && keys.finds(&row) {
                peers.entry(rowid).or_insert(row);
            }
        }
    }
    Ok(Ok(Scope {
        host_id: host_id.to_string(),
        own,
        peers: peers.into_values().collect(),
        terminal: terminal.max(0) as u64,
    }))
}

/// The registry rows of `rowids` (a few hundred a statement), with their
/// rowids, on `conn` inside the caller's transaction: the rows a change
/// record names (`fleet-retire controller`).
pub fn rows_by_rowid(conn: &Connection, path: &Path, rowids: &[i64]) -> Result<Vec<(i64, Row)>> {
    let (present, list) = present_columns(conn, path)?;
    let mut out = Vec::with_capacity(rowids.len());
    for chunk in rowids.chunks(CHUNK) {
        let marks = vec!["?"; chunk.len()].join(", ");
        let params: Vec<SqlValue> = chunk.iter().map(|i| SqlValue::Integer(*i)).collect();
        out.extend(read(
            conn,
            path,
            &present,
            &select(&list, &format!("rowid IN ({marks})")),
            &params,
        )?);
    }
    Ok(out)
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
