//! Row versions of a SQLite registry: which rows changed since a moment,
//! without reading the registry (docs/apply.md, "The write lock held for
//! what changed").
//!
//! SQLite tells no one which rows a commit changed, so the registry keeps
//! it: a clock (`fleet_retire_clock`, one row, only ever moving forward) and
//! for each rowid of `worker_registrations` the clock's value when it was
//! last inserted, updated or deleted (`fleet_retire_changes`, indexed by
//! version). Triggers whose exact SQL text is ours keep both, so every
//! writer that goes through SQLite stamps its rows whatever program it is:
//! our workers, an older binary, the seed's Python, a hand edit in the
//! `sqlite3` shell. Six guard triggers refuse writes that would turn the
//! clock back, jump it, replace it, or stamp a row with anything but the
//! current clock.
//!
//! A schema change moves `PRAGMA schema_version`, which the marker records,
//! so apply then reads the whole registry again; so does a unique index
//! other than the primary key's (a `REPLACE` through it deletes a row
//! without a trigger). What it cannot see are deliberate bypasses by
//! someone who can equally edit the file's bytes: a connection with
//! triggers switched off (`SQLITE_DBCONFIG_ENABLE_TRIGGER`), a TEMP trigger
//! on the writer's own connection that swallows ours (`RAISE(IGNORE)`), or
//! `PRAGMA schema_version` written back by hand (docs/apply.md says what
//! still holds then).

use crate::store::registry::TABLE;
use crate::store::seam::RowVersions as Marker;
use rusqlite::{Connection, OptionalExtension};

/// The clock table.
pub const CLOCK: &str = "fleet_retire_clock";
/// The change table: rowid → the clock when that row last changed.
pub const CHANGES: &str = "fleet_retire_changes";
/// The index of the change table by version.
const CHANGES_INDEX: &str = "fleet_retire_changes_by_version";

/// The statement that stamps `rowid` with the clock (upsert).
fn stamp_sql(rowid: &str) -> String {
    format!(
        "INSERT INTO {CHANGES} (row_id, version) VALUES ({rowid}, \
         (SELECT version FROM {CLOCK} WHERE id = 1)) \
         ON CONFLICT (row_id) DO UPDATE SET version = excluded.version;"
    )
}

const TICK: &str = "UPDATE fleet_retire_clock SET version = version + 1 WHERE id = 1;";

/// Our triggers: name, table, and the exact SQL `sqlite_master` keeps.
pub fn triggers() -> Vec<(&'static str, &'static str, String)> {
    let raise = |why: &str| format!("SELECT RAISE(ABORT, 'fleet-retire: {why}');");
    let current = format!("(SELECT version FROM {CLOCK} WHERE id = 1)");
    vec![
        (
            "fleet_retire_stamp_insert",
            TABLE,
            format!(
                "CREATE TRIGGER fleet_retire_stamp_insert AFTER INSERT ON {TABLE} BEGIN {TICK} {} END",
                stamp_sql("NEW.rowid")
            ),
        ),
        (
            "fleet_retire_stamp_update",
            TABLE,
            format!(
                "CREATE TRIGGER fleet_retire_stamp_update AFTER UPDATE ON {TABLE} BEGIN {TICK} {} {} END",
                stamp_sql("OLD.rowid"),
                stamp_sql("NEW.rowid")
            ),
        ),
        (
            "fleet_retire_stamp_delete",
            TABLE,
            format!(
                "CREATE TRIGGER fleet_retire_stamp_delete AFTER DELETE ON {TABLE} BEGIN {TICK} {} END",
                stamp_sql("OLD.rowid")
            ),
        ),
        (
            "fleet_retire_clock_forward",
            CLOCK,
            format!(
                "CREATE TRIGGER fleet_retire_clock_forward BEFORE UPDATE ON {CLOCK} \
                 WHEN typeof(NEW.version) IS NOT 'integer' OR NEW.version IS NOT OLD.version + 1 \
                 OR NEW.id IS NOT OLD.id BEGIN {} END",
                raise("the registry clock only moves forward, one step at a time")
            ),
        ),
        (
            "fleet_retire_clock_single",
            CLOCK,
            format!(
                "CREATE TRIGGER fleet_retire_clock_single BEFORE INSERT ON {CLOCK} BEGIN {} END",
                raise("the registry clock is never inserted again (nor replaced)")
            ),
        ),
        (
            "fleet_retire_clock_kept",
            CLOCK,
            format!(
                "CREATE TRIGGER fleet_retire_clock_kept BEFORE DELETE ON {CLOCK} BEGIN {} END",
                raise("the registry clock is never deleted")
            ),
        ),
        (
            "fleet_retire_changes_insert",
            CHANGES,
            format!(
                "CREATE TRIGGER fleet_retire_changes_insert BEFORE INSERT ON {CHANGES} \
                 WHEN NEW.version IS NOT {current} BEGIN {} END",
                raise("a row is stamped with the current clock only")
            ),
        ),
        (
            "fleet_retire_changes_update",
            CHANGES,
            format!(
                "CREATE TRIGGER fleet_retire_changes_update BEFORE UPDATE ON {CHANGES} \
                 WHEN NEW.version IS NOT {current} OR NEW.row_id IS NOT OLD.row_id BEGIN {} END",
                raise("a row is stamped with the current clock only")
            ),
        ),
        (
            "fleet_retire_changes_kept",
            CHANGES,
            format!(
                "CREATE TRIGGER fleet_retire_changes_kept BEFORE DELETE ON {CHANGES} BEGIN {} END",
                raise("a row stamp is never deleted")
            ),
        ),
    ]
}

/// Whether a trigger as `sqlite_master` lists it is one of ours, exactly.
pub fn is_ours(name: &str, table: &str, sql: Option<&str>) -> bool {
    triggers()
        .iter()
        .any(|(n, t, s)| *n == name && *t == table && Some(s.as_str()) == sql)
}

/// Our tables and their index, each as `sqlite_master` keeps the text we
/// create it with. They are accepted by that exact text, as the triggers
/// are: a `version` column declared TEXT, say, would store every stamp as
/// text, and `version > ?` would then compare text with an integer
/// (`'10' > 5` is false), hiding changes (docs/security.md, row 41.12).
const SHAPES: [(&str, &str, &str); 3] = [
    (
        "table",
        CLOCK,
        "CREATE TABLE fleet_retire_clock (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)",
    ),
    (
        "table",
        CHANGES,
        "CREATE TABLE fleet_retire_changes (row_id INTEGER PRIMARY KEY, version INTEGER NOT NULL)",
    ),
    (
        "index",
        CHANGES_INDEX,
        "CREATE INDEX fleet_retire_changes_by_version ON fleet_retire_changes (version)",
    ),
];

/// Our tables and index that exist under our names but not exactly as we
/// make them, each named with what was found.
pub fn foreign_shapes(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut found = Vec::new();
    for (kind, name, sql) in SHAPES {
        let have: Option<(String, Option<String>)> = conn
            .query_row(
                "SELECT type, sql FROM sqlite_master WHERE name = ?1 COLLATE NOCASE",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if let Some((have_kind, have_sql)) = have {
            if have_kind != kind || have_sql.as_deref() != Some(sql) {
                found.push(format!(
                    "{have_kind} {name:?} is not fleet-retire's ({})",
                    have_sql.unwrap_or_default()
                ));
            }
        }
    }
    Ok(found)
}

/// Whether all three exist, exactly ours.
fn shapes_all_there(conn: &Connection) -> rusqlite::Result<bool> {
    for (kind, name, sql) in SHAPES {
        let exact: bool = conn.query_row(
            "SELECT count(*) = 1 FROM sqlite_master WHERE type = ?1 AND name = ?2 AND sql IS ?3",
            [kind, name, sql],
            |r| r.get(0),
        )?;
        if !exact {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The tables our triggers write: never a view or anything but a table,
/// and exactly as we make them ([`foreign_shapes`]).
pub fn tables() -> [&'static str; 2] {
    [CLOCK, CHANGES]
}

/// The names SQLite gives a table's row id, each of which a column of
/// that name takes over everywhere it is used.
const ROWID_NAMES: [&str; 3] = ["rowid", "oid", "_rowid_"];

/// A column of the registry table (hidden and generated ones included)
/// that takes one of the row id's names, if there is one. SQLite then
/// resolves `rowid` (or `oid`, `_rowid_`) to that column: in the triggers'
/// `NEW.rowid`, an `ORDER BY rowid`, a read by rowid. Rows sharing its value
/// would share a stamp, and a NULL would fall out of a read split by rowid,
/// so such a registry keeps no row versions and is read whole, in one part
/// (docs/security.md, "a column named rowid").
pub fn rowid_shadowed(conn: &Connection) -> rusqlite::Result<Option<String>> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_xinfo(?1)")?;
    let names: Vec<String> = stmt
        .query_map([TABLE], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(names
        .into_iter()
        .find(|n| ROWID_NAMES.iter().any(|r| n.eq_ignore_ascii_case(r))))
}

/// Whether every one of our objects is in place, exactly as we make them.
pub fn installed(conn: &Connection) -> rusqlite::Result<bool> {
    if rowid_shadowed(conn)?.is_some() {
        return Ok(false);
    }
    let mut stmt = conn.prepare(
        "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'fleet\\_retire\\_%' ESCAPE '\\'",
    )?;
    let found: Vec<(String, String, Option<String>)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let all_ours = triggers().iter().all(|(n, t, s)| {
        found
            .iter()
            .any(|(fn_, ft, fs)| fn_ == n && ft == t && fs.as_deref() == Some(s.as_str()))
    });
    if !all_ours {
        return Ok(false);
    }
    if !shapes_all_there(conn)? {
        return Ok(false);
    }
    let clock: Option<i64> = conn
        .query_row(
            &format!("SELECT version FROM {CLOCK} WHERE id = 1"),
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(clock.is_some())
}

/// Create the clock, the change table, its index and our triggers, unless
/// they are all there. Run inside a write transaction on a connection that
/// may run triggers or not (creating them runs none).
pub fn install(conn: &Connection) -> rusqlite::Result<()> {
    // With the bookkeeping, the indexes a host's scoped read goes through
    // (`store::scope`).
    super::scope_index::create_indexes(conn)?;
    if installed(conn)? {
        return Ok(());
    }
    // A table without rowids cannot be stamped by rowid, nor one with a
    // column that takes the row id's name: it keeps no versions (and apply
    // reads it whole, as before).
    if rowid_shadowed(conn)?.is_some()
        || conn
            .prepare(&format!("SELECT rowid FROM {TABLE} LIMIT 0"))
            .is_err()
    {
        return Ok(());
    }
    // A partial set (a table without its triggers, say) is completed: the
    // pieces that exist are ours by name and refused by the untrusted check
    // when their SQL is not.
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {CLOCK} (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
         INSERT OR IGNORE INTO {CLOCK} (id, version) VALUES (1, 0);
         CREATE TABLE IF NOT EXISTS {CHANGES} (row_id INTEGER PRIMARY KEY, version INTEGER NOT NULL);
         CREATE INDEX IF NOT EXISTS {CHANGES_INDEX} ON {CHANGES} (version);"
    ))?;
    for (name, _, sql) in triggers() {
        let exists: bool = conn.query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'trigger' AND name = ?1",
            [name],
            |r| r.get(0),
        )?;
        if !exists {
            conn.execute_batch(&sql)?;
        }
    }
    Ok(())
}

/// The marker of the state `conn` reads now (inside its read transaction),
/// with the rowids of the rows it reads; `None` when the registry keeps no
/// versions.
pub fn marker(conn: &Connection) -> rusqlite::Result<Option<Marker>> {
    if !installed(conn)? {
        return Ok(None);
    }
    let schema_version = schema_version(conn)?;
    let clock: i64 = conn.query_row(
        &format!("SELECT version FROM {CLOCK} WHERE id = 1"),
        [],
        |r| r.get(0),
    )?;
    let mut stmt = conn.prepare(&format!("SELECT rowid FROM {TABLE} ORDER BY rowid"))?;
    let rowids: Vec<i64> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    // Row ids are unique integers, so in their order each is above the
    // last; anything else is not a row id, and vouches for nothing.
    if !rowids.windows(2).all(|w| w[0] < w[1]) {
        return Ok(None);
    }
    Ok(Some(Marker {
        schema_version,
        clock,
        rowids,
        file: None,
        pin: None,
        server: None,
    }))
}

/// What changed since `marker`, read under apply's lock: the positions (in
/// the rows read with the marker) of the rows stamped since. `Err` with a
/// reason when the versions cannot be trusted to say (the schema moved, our
/// objects are not all there, the clock went back, a row was added or
/// deleted): apply then reads the whole registry again.
///
/// `schema_at_begin` is `PRAGMA schema_version` as apply's transaction
/// found it when it took the write lock, before its own migrations: from
/// then on no one else can change the schema.
pub fn changed_since(
    conn: &Connection,
    marker: &Marker,
    schema_at_begin: i64,
) -> rusqlite::Result<std::result::Result<Vec<(usize, i64)>, String>> {
    if schema_at_begin != marker.schema_version {
        return Ok(Err(
            "the registry's schema changed since it was read (DDL: a column, a trigger, an \
             index), so its row versions cannot vouch for the rows"
                .into(),
        ));
    }
    if let Some(column) = rowid_shadowed(conn)? {
        return Ok(Err(format!(
            "the registry has a column named {column:?}, which takes the row id's name, so \
             its row versions cannot vouch for the rows"
        )));
    }
    if !installed(conn)? {
        return Ok(Err("the registry keeps no row versions".into()));
    }
    if let Some(index) = other_unique_index(conn)? {
        return Ok(Err(format!(
            "the registry has a unique index other than one on worker_identity alone ({index:?}): \
             a REPLACE through it \
             deletes a row without a trigger, so its row versions cannot vouch for the rows"
        )));
    }
    let clock: i64 = conn.query_row(
        &format!("SELECT version FROM {CLOCK} WHERE id = 1"),
        [],
        |r| r.get(0),
    )?;
    if clock < marker.clock {
        return Ok(Err(format!(
            "the registry clock went back from {} to {clock}",
            marker.clock
        )));
    }
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT row_id FROM {CHANGES} WHERE version > ?1 ORDER BY row_id"
    ))?;
    let stamped: Vec<i64> = stmt
        .query_map([marker.clock], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut changed = Vec::with_capacity(stamped.len());
    for rowid in stamped {
        let Ok(at) = marker.rowids.binary_search(&rowid) else {
            return Ok(Err(format!(
                "row {rowid} was added or deleted since the registry was read"
            )));
        };
        changed.push((at, rowid));
    }
    Ok(Ok(changed))
}

/// Move the clock on by one for a writer whose triggers are off (apply);
/// the new value.
pub fn tick(conn: &Connection) -> rusqlite::Result<i64> {
    conn.execute_batch(TICK)?;
    conn.query_row(
        &format!("SELECT version FROM {CLOCK} WHERE id = 1"),
        [],
        |r| r.get(0),
    )
}

/// Stamp one row with `clock`, as the triggers would (for apply, whose
/// triggers are off).
pub fn stamp(conn: &Connection, rowid: i64, clock: i64) -> rusqlite::Result<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO {CHANGES} (row_id, version) VALUES (?1, ?2) \
         ON CONFLICT (row_id) DO UPDATE SET version = excluded.version"
    ))?
    .execute([rowid, clock])?;
    Ok(())
}

/// `PRAGMA schema_version`: moved by every schema change.
pub fn schema_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA schema_version", [], |r| r.get(0))
}

/// A unique index on the registry table other than one on
/// `worker_identity` alone, if there is one. The safety argument lets a
/// `REPLACE` delete only the row it writes again: its conflict must be on
/// the identity (bytewise, whole), since any other key (a primary key on
/// another column, an identity compared without case, a partial index, an
/// expression) lets it delete a row of another identity without a trigger
/// (docs/security.md, row 41.11).
fn other_unique_index(conn: &Connection) -> rusqlite::Result<Option<String>> {
    let mut stmt = conn.prepare("SELECT name, \"unique\", partial FROM pragma_index_list(?1)")?;
    let indexes: Vec<(String, i64, i64)> = stmt
        .query_map([TABLE], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (name, unique, partial) in indexes {
        if unique != 1 {
            continue;
        }
        if partial != 0 || !on_the_identity_alone(conn, &name)? {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// Whether index `name` is on `worker_identity` alone, with the binary
/// collation.
fn on_the_identity_alone(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    let mut stmt =
        conn.prepare("SELECT name, coll FROM pragma_index_xinfo(?1) WHERE key = 1 ORDER BY seqno")?;
    let keys: Vec<(Option<String>, Option<String>)> = stmt
        .query_map([name], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(matches!(keys.as_slice(),
        [(Some(column), Some(coll))] if column == "worker_identity" && coll == "BINARY"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&format!(
            "CREATE TABLE {TABLE} (worker_identity TEXT PRIMARY KEY)"
        ))
        .unwrap();
        conn
    }

    #[test]
    fn our_tables_are_known_by_their_exact_text() {
        let conn = registry();
        install(&conn).unwrap();
        assert!(installed(&conn).unwrap());
        assert!(foreign_shapes(&conn).unwrap().is_empty());
        // A stamp table whose version is TEXT compares stamps as text.
        let conn = registry();
        conn.execute_batch(&format!(
            "CREATE TABLE {CHANGES} (row_id INTEGER PRIMARY KEY, version TEXT NOT NULL)"
        ))
        .unwrap();
        install(&conn).unwrap();
        assert!(!installed(&conn).unwrap());
        let found = foreign_shapes(&conn).unwrap();
        assert!(found[0].contains("version TEXT"), "{found:?}");
    }
}
