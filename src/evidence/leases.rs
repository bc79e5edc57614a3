//! The control-plane lease store (docs/semantics.md §6).
//!
//! Only rows whose `status` is exactly `active` count, whatever their
//! `expires_at` says. A store that is named but missing, unreadable, or
//! without the table is an error: it is never read as "no leases".

use crate::error::{Error, Result, Store};
use crate::evidence::registry::value_from_sql;
pub use crate::store::leases::{Lease, COLUMNS, TABLE};
use crate::value::Value;
use rusqlite::{Connection, OpenFlags};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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
    if crate::store::pg::is_postgres(path) {
        let url = path.to_string_lossy();
        let label = crate::store::pg::masked(&url);
        let mut client = crate::store::pg::connect(&url, Store::Leases)?;
        return crate::store::pg::read_leases(&mut client, &label, false);
    }
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
        .map_err(Error::sqlite(Store::Leases, path, "cannot open as SQLite"))?;
    conn.busy_timeout(crate::evidence::registry::READ_BUSY_TIMEOUT)
        .map_err(Error::sqlite(
            Store::Leases,
            path,
            "cannot set the busy timeout",
        ))?;
    crate::evidence::registry::recover_hot_journal(path, "lease store")
        .map_err(|m| lease_error(path, m))?;
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

/// A lease store apply reads its fence from: a SQLite file, or a
/// PostgreSQL database read through a connection of its own (outside
/// apply's registry transaction, so it sees leases committed meanwhile).
pub enum LeaseSource {
    /// A SQLite lease store, opened read-only.
    Sqlite {
        /// The connection.
        conn: Connection,
        /// Its file.
        path: std::path::PathBuf,
    },
    /// A PostgreSQL lease store.
    Postgres {
        /// An autocommit connection: each read sees the latest commit.
        client: std::cell::RefCell<postgres::Client>,
        /// The URL, password masked.
        label: String,
    },
}

impl LeaseSource {
    /// Open the lease store at `location` for fencing.
    pub fn open(location: &Path) -> Result<LeaseSource> {
        if crate::store::pg::is_postgres(location) {
            let url = location.to_string_lossy();
            let label = crate::store::pg::masked(&url);
            let mut client = crate::store::pg::connect(&url, Store::Leases)?;
            // Fail now, not at the first fence, when the table is not there.
            crate::store::pg::read_leases(&mut client, &label, true)?;
            return Ok(LeaseSource::Postgres {
                client: std::cell::RefCell::new(client),
                label,
            });
        }
        Ok(LeaseSource::Sqlite {
            conn: open_read_only(location)?,
            path: location.to_path_buf(),
        })
    }

    /// The store's name for messages and audit rows (password masked).
    pub fn label(&self) -> String {
        match self {
            LeaseSource::Sqlite { path, .. } => path.display().to_string(),
            LeaseSource::Postgres { label, .. } => label.clone(),
        }
    }

    /// Something that changes whenever the active leases may have: SQLite's
    /// `data_version`, or PostgreSQL's digest of the active lease rows.
    fn version(&self) -> Result<String> {
        match self {
            LeaseSource::Sqlite { conn, path } => data_version(conn, path).map(|v| v.to_string()),
            LeaseSource::Postgres { client, label } => {
                crate::store::pg::active_lease_version(&mut *client.borrow_mut(), label)
            }
        }
    }

    fn read_active(&self) -> Result<Vec<Lease>> {
        match self {
            LeaseSource::Sqlite { conn, path } => read_active(conn, path),
            LeaseSource::Postgres { client, label } => {
                let mut leases =
                    crate::store::pg::read_leases(&mut *client.borrow_mut(), label, true)?;
                leases.retain(Lease::is_active);
                Ok(leases)
            }
        }
    }
}

/// What apply holds the lease store to while it writes: the seed's
/// external-state token, a digest over every column of every active lease
/// (the seed's token leaves `owner_worker_identity` out, so re-pointing a
/// lease at a target would not move it), and a version that changes when
/// another connection commits to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// `externalfp-…`, byte-identical to the seed's.
    pub token: String,
    /// `sha256:<hex>` over the full content of the active leases.
    pub digest: String,
    /// The store's version when the leases were read ([`LeaseSource`]).
    pub version: String,
}

impl Fence {
    /// Read the active leases and fence them. The version is read first,
    /// so a commit racing the read shows as a changed version later.
    pub fn read(source: &LeaseSource) -> Result<(Fence, Vec<Lease>)> {
        let version = source.version()?;
        let active = source.read_active()?;
        Ok((Fence::of(&active, version), active))
    }

    /// The fence of active leases read elsewhere (in apply's own
    /// PostgreSQL transaction), with the version read in that same snapshot.
    pub fn of(active: &[Lease], version: String) -> Fence {
        Fence {
            token: crate::fingerprint::external_state_fingerprint(active.iter()),
            digest: full_digest(active),
            version,
        }
    }

    /// Whether the active leases may have changed since this fence: cheap
    /// (the version) when nobody committed, a full re-read and comparison
    /// when someone did. Returns the fence now in force, or the new one
    /// that differs.
    pub fn recheck(&self, source: &LeaseSource) -> Result<std::result::Result<Fence, Fence>> {
        if source.version()? == self.version {
            return Ok(Ok(self.clone()));
        }
        self.recheck_fully(source)
    }

    /// Re-read the active leases whatever the version says and compare.
    pub fn recheck_fully(&self, source: &LeaseSource) -> Result<std::result::Result<Fence, Fence>> {
        let (now, _) = Fence::read(source)?;
        Ok(if now.token == self.token && now.digest == self.digest {
            Ok(now)
        } else {
            Err(now)
        })
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

/// sha256 over every column (name, storage class and canonical text) of
/// every given lease, independent of row order.
pub fn full_digest(leases: &[Lease]) -> String {
    use sha2::{Digest, Sha256};
    let mut units: Vec<String> = leases
        .iter()
        .map(|l| {
            let mut out = String::new();
            for (name, v) in l.fields() {
                out.push_str(name);
                out.push('\u{1f}');
                out.push_str(v.kind());
                out.push('\u{1f}');
                out.push_str(&v.canon());
                out.push('\u{1e}');
            }
            out
        })
        .collect();
    units.sort();
    let mut h = Sha256::new();
    for u in &units {
        h.update(u.len().to_string().as_bytes());
        h.update(b":");
        h.update(u.as_bytes());
    }
    format!("sha256:{}", crate::fingerprint::hex(&h.finalize()))
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
