//! The tables: every table this program reads or writes, its columns, its
//! SQL types and its migrations, defined once.
//!
//! * `registry`: `worker_registrations`, written by workers (their own row,
//!   `crate::worker`) and by apply (the guarded retirement, `crate::apply`).
//! * `leases`: `workflow_leases`, the control-plane lease store; read only.
//! * `audit`: `retirement_audit`, written by apply beside each retirement.
//! * `controller`: the controller's lease, budget and apply records, in the
//!   registry's database beside the registry.
//!
//! Readers (`crate::evidence`) and writers ask this module for table names,
//! columns and the statements that create or migrate them, so a column added
//! here reaches every reader, writer and migration at once. A registry file
//! is data an attacker with write access to it can shape: before writing,
//! apply refuses one that could make its writes differ from what it reports
//! (`untrusted_objects`): any trigger (one on `worker_registrations` retired
//! live rows beside the target), any view (a view named `retirement_audit`
//! swallowed the audit rows), a registry or audit object that is not a plain
//! table, or an audit table with columns that are not ours. The one
//! exception is the row-version bookkeeping (`sqlite::versions`): its
//! triggers are accepted when their SQL text is exactly ours. `registry copy`
//! refuses the same objects in the registry it copies from.

pub mod audit;
pub mod batch;
pub mod controller;
pub mod copy;
pub mod leases;
pub mod location;
pub mod open;
pub mod pgurl;
pub mod postgres;
pub mod registry;
pub mod scope;
pub mod seam;
pub mod sqlite;

use rusqlite::Connection;

/// Whether `e` says the engine aborted a transaction because a concurrent
/// one made the two unserializable (PostgreSQL's serialization failure or
/// deadlock): what the transaction read is no longer the store, and it may
/// simply be tried again. SQLite serializes writers with its lock instead.
pub fn lost_a_race(e: &crate::error::Error) -> bool {
    matches!(e, crate::error::Error::Postgres { source, .. }
        if postgres::is_serialization_failure(source))
}

/// An identifier quoted for SQL (SQLite and PostgreSQL alike): in double
/// quotes, an embedded double quote doubled. Every identifier put into SQL
/// text goes through here; most are our own constant names, and a name a
/// store gave us is refused first unless it is a plain identifier
/// (`leases::odd_column_names`).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The columns of a table, or `None` when it does not exist.
pub fn table_columns(conn: &Connection, table: &str) -> rusqlite::Result<Option<Vec<String>>> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info(?1)")?;
    let names: Vec<String> = stmt
        .query_map([table], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(if names.is_empty() { None } else { Some(names) })
}

/// `"NAME" is a view, not a table` when the object named `table` (in any
/// letter case, as SQLite resolves names) exists and is not a plain table.
pub fn not_a_table(conn: &Connection, table: &str) -> Option<String> {
    let kind: Option<String> = conn
        .query_row(
            "SELECT type FROM sqlite_master WHERE name = ?1 COLLATE NOCASE",
            [table],
            |r| r.get(0),
        )
        .ok();
    kind.filter(|k| k != "table")
        .map(|kind| format!("{table:?} is a {kind}, not a table"))
}

/// Why a registry cannot be written safely, if it cannot.
pub fn untrusted_objects(
    conn: &Connection,
    registry_table: &str,
) -> rusqlite::Result<Option<String>> {
    let problems = untrusted_object_list(conn, registry_table)?;
    Ok((!problems.is_empty()).then(|| {
        format!(
            "the registry holds objects that could make apply's writes differ from its report: {}. \
             Nothing was written. A registry needs none of them: inspect and drop them \
             (sqlite3 REGISTRY '.schema'), then apply again",
            problems.join("; ")
        )
    }))
}

/// Each object of a registry that makes it untrustworthy (any trigger or
/// view, a registry or audit object that is not a table, foreign audit
/// columns), one phrase each; empty for a plain registry. Apply and
/// `registry copy` (`crate::copy`) both refuse on these.
pub fn untrusted_object_list(
    conn: &Connection,
    registry_table: &str,
) -> rusqlite::Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE type IN ('trigger', 'view') ORDER BY name",
    )?;
    let objects: Vec<(String, String, String, Option<String>)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (kind, name, table, sql) in objects {
        // The row-version triggers are accepted by their exact text only.
        if kind == "trigger" && sqlite::versions::is_ours(&name, &table, sql.as_deref()) {
            continue;
        }
        problems.push(if kind == "trigger" {
            format!("trigger {name:?} on {table:?}")
        } else {
            format!("view {name:?}")
        });
    }
    for table in [registry_table, audit::TABLE] {
        problems.extend(not_a_table(conn, table));
    }
    for table in sqlite::versions::tables() {
        problems.extend(not_a_table(conn, table));
    }
    // The row-version tables and index, by their exact text (a column of
    // another type would compare stamps as text).
    problems.extend(sqlite::versions::foreign_shapes(conn)?);
    // The controller's tables, absent or exactly ours (`store::controller`).
    problems.extend(sqlite::controller::foreign_shapes(conn)?);
    if let Some(existing) = table_columns(conn, audit::TABLE)? {
        let foreign: Vec<&String> = existing
            .iter()
            .filter(|c| *c != audit::KEY && !audit::COLUMNS.iter().any(|(n, _)| n == c))
            .collect();
        if !foreign.is_empty() || !existing.iter().any(|c| c == audit::KEY) {
            problems.push(format!(
                "table {:?} has columns that are not fleet-retire's ({})",
                audit::TABLE,
                existing.join(", ")
            ));
        }
    }
    Ok(problems)
}
