//! The control-plane lease store (semantics §6).
//!
//! Only rows whose `status` is exactly `active` count, whatever their
//! `expires_at` says. A store that is named but missing, unreadable, or
//! without the table is an error: it is never read as "no leases".

use crate::error::{Error, Result};
use crate::evidence::registry::value_from_sql;
use crate::value::Value;
use rusqlite::{Connection, OpenFlags};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The lease table.
pub const TABLE: &str = "workflow_leases";

/// One lease row: every column as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lease {
    fields: BTreeMap<String, Value>,
}

const NULL: Value = Value::Null;

impl Lease {
    /// A column's value (NULL when absent).
    pub fn get(&self, name: &str) -> &Value {
        self.fields.get(name).unwrap_or(&NULL)
    }

    /// Build from a JSON object (fixtures).
    pub fn from_json(obj: &serde_json::Map<String, serde_json::Value>) -> Result<Lease, String> {
        let mut fields = BTreeMap::new();
        for (k, v) in obj {
            fields.insert(
                k.clone(),
                Value::from_json(v).map_err(|e| format!("field `{k}`: {e}"))?,
            );
        }
        Ok(Lease { fields })
    }

    /// `status` is exactly the text `active`.
    pub fn is_active(&self) -> bool {
        self.get("status").as_text() == Some("active")
    }
}

/// What the active leases protect.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Protections {
    /// `owner_worker_identity` values (non-empty).
    pub worker_identities: BTreeSet<String>,
    /// `session_id` and `owner_session_id` values (non-empty).
    pub session_ids: BTreeSet<String>,
    /// `owner_pid` and `session_pid` values, canonical text (non-NULL).
    pub pids: BTreeSet<String>,
}

impl Protections {
    /// Collect the protections of the active leases among `leases`.
    pub fn from_leases<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> Protections {
        let mut p = Protections::default();
        for lease in leases.into_iter().filter(|l| l.is_active()) {
            let owner = lease.get("owner_worker_identity");
            if owner.truthy() {
                p.worker_identities.insert(owner.py_str());
            }
            for name in ["session_id", "owner_session_id"] {
                let v = lease.get(name);
                if v.truthy() {
                    p.session_ids.insert(v.py_str());
                }
            }
            for name in ["owner_pid", "session_pid"] {
                let v = lease.get(name);
                if *v != Value::Null {
                    p.pids.insert(v.canon());
                }
            }
        }
        p
    }
}

fn lease_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Leases {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Read every lease row from an existing lease store (read-only).
pub fn load(path: &Path) -> Result<Vec<Lease>> {
    let conn = open_read_only(path)?;
    read(&conn, path)
}

/// Open an existing lease store read-only.
pub fn open_read_only(path: &Path) -> Result<Connection> {
    if !path.is_file() {
        return Err(lease_error(
            path,
            "no such file; a named lease store must exist (it is never read as \"no leases\"); \
             fix the --leases path",
        ));
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| lease_error(path, format!("cannot open as SQLite: {e}")))?;
    conn.busy_timeout(crate::evidence::registry::READ_BUSY_TIMEOUT)
        .map_err(|e| lease_error(path, format!("cannot set the busy timeout: {e}")))?;
    Ok(conn)
}

/// Read every lease row through an open connection. Apply calls this
/// before every write, so the statement is cached.
pub fn read(conn: &Connection, path: &Path) -> Result<Vec<Lease>> {
    let sql_err = |e: rusqlite::Error| lease_error(path, format!("cannot read: {e}"));
    let mut stmt = match conn.prepare_cached(&format!("SELECT * FROM {TABLE}")) {
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
    let mut interner = crate::evidence::registry::Interner::default();
    while let Some(r) = cursor.next().map_err(sql_err)? {
        let mut fields = BTreeMap::new();
        for (i, name) in columns.iter().enumerate() {
            let v = value_from_sql(r.get_ref(i).map_err(sql_err)?, &mut interner)
                .map_err(|e| lease_error(path, format!("column `{name}`: {e}")))?;
            fields.insert(name.clone(), v);
        }
        out.push(Lease { fields });
    }
    Ok(out)
}
