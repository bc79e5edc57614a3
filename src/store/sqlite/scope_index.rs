//! The indexes a host's scoped read goes through, on SQLite: made with the
//! registry's bookkeeping (`versions::install`) and by `registry versions`,
//! checked before every scoped read (`scope.rs`). Their definitions are
//! `store::scope::INDEXES`.

use crate::store::scope::{index_sql, index_words, INDEXES};
use rusqlite::Connection;

const TABLE: &str = crate::store::registry::TABLE;

/// What a scoped read's indexes are as SQLite records them: the statement
/// that made each, `IF NOT EXISTS` left out.
fn recorded_sql(name: &str, columns: &str, active_only: bool) -> String {
    index_sql(name, columns, active_only, false).replacen("IF NOT EXISTS ", "", 1)
}

/// Create the scope's indexes the registry lacks, each only when the table
/// has its columns (an older registry gains them with its migration), on
/// `conn` inside the caller's write transaction; how many were made.
pub fn create_indexes(conn: &Connection) -> rusqlite::Result<usize> {
    let columns = crate::store::table_columns(conn, TABLE)?.unwrap_or_default();
    let mut made = 0;
    for (name, cols, active_only) in INDEXES {
        let has = cols.split(", ").all(|c| columns.iter().any(|n| n == c));
        let exists: bool = conn.query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'index' AND name = ?1",
            [name],
            |r| r.get(0),
        )?;
        if has && !exists {
            conn.execute_batch(&index_sql(name, cols, active_only, false))?;
            made += 1;
        }
    }
    Ok(made)
}

/// Why the scope's indexes cannot be trusted: one missing, one whose
/// statement is not ours (other columns, another table, an expression, a
/// collation, another condition), or no unique index on `worker_identity`
/// alone. `None` when all are ours.
pub fn index_problem(conn: &Connection) -> rusqlite::Result<Option<String>> {
    let fix = "make the indexes with `fleet-retire registry versions --registry FILE` as a \
               user who may write the file";
    for (name, cols, active_only) in INDEXES {
        let expected = recorded_sql(name, cols, active_only);
        let found: Option<Option<String>> = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?1",
                [name],
                |r| r.get(0),
            )
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })?;
        match found {
            Some(Some(sql)) if sql == expected => {}
            found => {
                let found = found.map(|sql| sql.unwrap_or_default());
                return Ok(Some(index_words(name, found.as_deref(), &expected, fix)));
            }
        }
    }
    let keyed: bool = conn.query_row(
        &format!(
            "SELECT count(*) > 0 FROM pragma_index_list('{TABLE}') l WHERE l.\"unique\" \
             AND NOT l.partial AND (SELECT count(*) FROM pragma_index_info(l.name)) = 1 \
             AND (SELECT name FROM pragma_index_info(l.name)) = 'worker_identity'"
        ),
        [],
        |r| r.get(0),
    )?;
    Ok((!keyed).then(|| {
        "no unique index on `worker_identity` alone (the table's key in every registry \
         `fleet-retire` makes): rows of one identity could only be found by a scan"
            .to_string()
    }))
}
