//! A SQLite lease store: read-only, as a whole (plan) or as apply's fence.

use super::read::value_from_sql;
use crate::error::{Error, Result, Store};
use crate::store::leases::{Lease, COLUMNS, TABLE};
use crate::store::seam::FenceSource;
use rusqlite::{Connection, OpenFlags};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn lease_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Leases {
        shown: crate::store::location::label(path),
        message: message.into(),
    }
}

/// Create a SQLite lease store at `path` holding one active lease, owned
/// by `owner` (the demo's merger holds one while the rest is retired).
pub fn create_with_one_active(path: &Path, owner: &str) -> Result<()> {
    let conn = Connection::open(path).map_err(Error::sqlite(
        Store::Leases,
        path,
        "cannot create the lease store",
    ))?;
    conn.execute_batch(&crate::store::leases::create_sql())
        .and_then(|_| {
            conn.execute(
                "INSERT INTO workflow_leases (lease_id, role, target, status, owner_worker_identity)
                 VALUES ('lease-demo', 'merger', 'pr-7', 'active', ?1)",
                [owner],
            )
        })
        .map(|_| ())
        .map_err(Error::sqlite(Store::Leases, path, "cannot write the lease"))
}

/// Read every lease row of the SQLite store at `path` (read-only).
pub fn load(path: &Path) -> Result<Vec<Lease>> {
    let conn = open_read_only(path)?;
    read(&conn, path)
}

/// Open an existing lease store read-only.
pub fn open_read_only(path: &Path) -> Result<Connection> {
    if path.is_dir() {
        return Err(lease_error(
            path,
            "is a folder, not a SQLite file; name the lease store's file itself",
        ));
    }
    if !path.is_file() {
        return Err(lease_error(
            path,
            "no such file; a named lease store must exist (it is never read as \"no leases\"); \
             fix the --leases path",
        ));
    }
    let conn = super::held::opening(|| {
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
    })
    .map_err(Error::sqlite(Store::Leases, path, "cannot open as SQLite"))?;
    conn.busy_timeout(super::read::READ_BUSY_TIMEOUT)
        .map_err(Error::sqlite(
            Store::Leases,
            path,
            "cannot set the busy timeout",
        ))?;
    super::read::recover_hot_journal(path, "lease store").map_err(|m| lease_error(path, m))?;
    Ok(conn)
}

/// Read every lease row through an open connection.
pub fn read(conn: &Connection, path: &Path) -> Result<Vec<Lease>> {
    query(conn, path, &format!("SELECT * FROM {TABLE}"))
}

/// Read the active leases only (the ones that protect anything).
pub fn read_active(conn: &Connection, path: &Path) -> Result<Vec<Lease>> {
    let mut leases = query(
        conn,
        path,
        &format!("SELECT * FROM {TABLE} WHERE status = 'active'"),
    )?;
    leases.retain(Lease::is_active);
    Ok(leases)
}

/// A SQLite lease store opened for apply's fence.
pub struct Fence {
    /// The connection, read-only.
    conn: Connection,
    /// Its file.
    path: PathBuf,
    /// The same file opened once more, to read its header's change counter
    /// without taking SQLite's lock ([`Fence::header`]).
    header: Option<std::fs::File>,
}

impl Fence {
    /// Open the store at `path` for fencing.
    pub fn open(path: &Path) -> Result<Fence> {
        Ok(Fence {
            conn: open_read_only(path)?,
            path: path.to_path_buf(),
            header: std::fs::File::open(path).ok(),
        })
    }
}

impl FenceSource for Fence {
    fn cheap_to_check(&self) -> bool {
        true
    }

    fn label(&self) -> String {
        self.path.display().to_string()
    }

    /// SQLite's `data_version`: it changes when another connection commits.
    fn version(&mut self) -> Result<String> {
        data_version(&self.conn, &self.path).map(|v| v.to_string())
    }

    /// The store's file format versions and change counter, read straight
    /// from its header (bytes 18 to 27) with one `pread`, when the store is
    /// in rollback-journal mode; `None` otherwise (WAL mode, where the
    /// counter is not kept up to date, or an unreadable file).
    ///
    /// In rollback-journal mode every commit increments the counter before
    /// it releases its lock (SQLite's file format, "File change counter"),
    /// and SQLite itself relies on that to notice other connections'
    /// commits. So an equal counter, read after the fence's own read began,
    /// proves no commit has completed since; `data_version` would say the
    /// same at several times the cost (a lock cycle and a statement). A
    /// counter read mid-commit reads old (that commit orders after the
    /// check, as it would with `data_version`) or different (the full check
    /// runs). Read first, before the version and the leases, so that a
    /// commit racing the read shows as a changed counter later.
    fn header(&self) -> Option<[u8; 10]> {
        use std::os::unix::fs::FileExt;
        let file = self.header.as_ref()?;
        let mut bytes = [0u8; 10];
        file.read_exact_at(&mut bytes, 18).ok()?;
        // Write and read format versions 1: legacy (rollback journal).
        (bytes[0] == 1 && bytes[1] == 1).then_some(bytes)
    }

    fn read_active(&mut self) -> Result<Vec<Lease>> {
        read_active(&self.conn, &self.path)
    }
}

fn data_version(conn: &Connection, path: &Path) -> Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0))
        .map_err(Error::sqlite(
            Store::Leases,
            path,
            "cannot read data_version",
        ))
}

fn query(conn: &Connection, path: &Path, sql: &str) -> Result<Vec<Lease>> {
    let sql_err = Error::sqlite(Store::Leases, path, "cannot read");
    let columns = crate::store::table_columns(conn, TABLE)
        .map_err(sql_err)?
        .unwrap_or_default();
    let missing: Vec<&str> = COLUMNS
        .iter()
        .copied()
        .filter(|c| !columns.iter().any(|n| n == c))
        .collect();
    if !missing.is_empty() {
        return Err(lease_error(
            path,
            format!(
                "table `{TABLE}` lacks the column(s) {}; a lease store with another shape \
                 cannot be read safely (a lease it cannot read would protect nothing). \
                 Point --leases at the control-plane lease store, or add the column(s)",
                missing.join(", ")
            ),
        ));
    }
    if let Some(why) = crate::store::leases::odd_column_names(columns.iter().map(String::as_str)) {
        return Err(lease_error(path, why));
    }
    if let Some(why) = shape_problem(conn).map_err(sql_err)? {
        return Err(lease_error(path, why));
    }

    let mut stmt = match conn.prepare_cached(sql) {
        Ok(s) => s,
        Err(e) if e.to_string().contains("no such table") => {
            return Err(lease_error(
                path,
                format!("has no `{TABLE}` table; is this the control-plane lease store?"),
            ))
        }
        Err(e) => return Err(sql_err(e)),
    };
    let columns: Vec<String> = stmt
        .column_names()
        .into_iter()
        .map(str::to_string)
        .collect();
    let mut cursor = stmt.query([]).map_err(sql_err)?;
    let mut out = Vec::new();
    while let Some(r) = cursor.next().map_err(sql_err)? {
        let mut fields = BTreeMap::new();
        for (i, name) in columns.iter().enumerate() {
            let v = value_from_sql(r.get_ref(i).map_err(sql_err)?)
                .map_err(|e| lease_error(path, format!("column `{name}`: {e}")))?;
            fields.insert(name.clone(), v);
        }
        out.push(Lease::from_fields(fields));
    }
    Ok(out)
}

/// Why the lease table cannot be trusted to show every lease, if it
/// cannot: it must be a plain table, and no trigger may sit on it. A view
/// (with an `INSTEAD OF` trigger so the workers' writes still land) or a
/// virtual table can show the reader fewer leases than the writers hold,
/// and a lease this program does not see protects nothing
/// (docs/security.md, "the lease store's shape").
fn shape_problem(conn: &Connection) -> rusqlite::Result<Option<String>> {
    let fix = "the lease store must hold `workflow_leases` as a plain table with no trigger; \
               point --leases at the control plane's own lease store, or drop what is named";
    if let Some(kind) = crate::store::not_a_table(conn, TABLE) {
        return Ok(Some(format!("{kind}; {fix}")));
    }
    let virtual_table: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE \
         AND sql LIKE 'CREATE VIRTUAL%'",
        [TABLE],
        |r| r.get(0),
    )?;
    if virtual_table {
        return Ok(Some(format!("{TABLE:?} is a virtual table; {fix}")));
    }
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1 COLLATE NOCASE \
         ORDER BY name",
    )?;
    let triggers: Vec<String> = stmt
        .query_map([TABLE], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok((!triggers.is_empty()).then(|| {
        format!(
            "{TABLE:?} has trigger(s) {}, which can change what it shows; {fix}",
            triggers
                .iter()
                .map(|t| format!("{t:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }))
}
