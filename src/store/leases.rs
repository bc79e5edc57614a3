//! The control-plane lease store's table (docs/semantics.md §6):
//! its name, the columns a store must have, and one lease row as read. The
//! store is read only; `create_sql` is for tests, benchmarks and the demo,
//! which build stores of their own.

use crate::value::Value;
use std::collections::BTreeMap;

/// The lease table.
pub const TABLE: &str = "workflow_leases";

/// The columns a lease store must have (docs/semantics.md §6). A store that lacks
/// one is refused: a missing `status` or `owner_pid` would otherwise read as
/// "protects nothing".
pub const COLUMNS: &[&str] = &[
    "lease_id",
    "role",
    "target",
    "status",
    "session_id",
    "owner_session_id",
    "owner_pid",
    "session_pid",
    "generation",
    "owner_worker_identity",
    "acquired_at",
    "expires_at",
];

/// Whether a column name is a plain SQL identifier (`[a-z_][a-z0-9_]*`,
/// the names PostgreSQL folds to and SQLite keeps as written).
pub fn plain_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_lowercase())
        && chars.all(|c| c == '_' || c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// Why a lease table's column names cannot be read, if they cannot: a
/// column whose name is not a plain identifier. The lease store is not
/// ours; a name carrying quotes or SQL (`lease_id", public.ev() "y`) is
/// refused before any statement could hold it.
pub fn odd_column_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let odd: Vec<String> = names
        .into_iter()
        .filter(|n| !plain_identifier(n))
        .map(|n| format!("{:?}", crate::text::esc(n)))
        .collect();
    (!odd.is_empty()).then(|| {
        format!(
            "table `{TABLE}` has column(s) whose names are not plain identifiers ({}); a \
             lease store's columns are named [a-z_][a-z0-9_]*. Rename or drop them",
            odd.join(", ")
        )
    })
}

/// A column of the lease table (docs/semantics.md §6), named once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseCol {
    /// `lease_id`.
    LeaseId,
    /// `role`.
    Role,
    /// `target`.
    Target,
    /// `status`: only exactly `active` counts.
    Status,
    /// `session_id`.
    SessionId,
    /// `owner_session_id`.
    OwnerSessionId,
    /// `owner_pid`.
    OwnerPid,
    /// `session_pid`.
    SessionPid,
    /// `generation`.
    Generation,
    /// `owner_worker_identity`.
    OwnerWorkerIdentity,
    /// `acquired_at`.
    AcquiredAt,
    /// `expires_at` (never consulted: a lease counts by its status).
    ExpiresAt,
}

/// Every lease column, in the table's order (the order of [`COLUMNS`]).
pub const LEASE_COLUMNS: [LeaseCol; 12] = [
    LeaseCol::LeaseId,
    LeaseCol::Role,
    LeaseCol::Target,
    LeaseCol::Status,
    LeaseCol::SessionId,
    LeaseCol::OwnerSessionId,
    LeaseCol::OwnerPid,
    LeaseCol::SessionPid,
    LeaseCol::Generation,
    LeaseCol::OwnerWorkerIdentity,
    LeaseCol::AcquiredAt,
    LeaseCol::ExpiresAt,
];

impl LeaseCol {
    /// The column's name in the table.
    pub fn name(self) -> &'static str {
        COLUMNS[self as usize]
    }

    /// The column of that name, if it is one of ours.
    pub fn from_name(name: &str) -> Option<LeaseCol> {
        LEASE_COLUMNS.iter().copied().find(|c| c.name() == name)
    }
}

/// One lease row: our columns by [`LeaseCol`], and any other column the
/// store has, by name (kept so the fence digests every column). A column
/// absent from the row (a fixture may leave some out) reads as NULL and is
/// not listed by [`Lease::fields`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lease {
    known: [Option<Value>; 12],
    extra: BTreeMap<String, Value>,
}

const NULL: Value = Value::Null;

impl Lease {
    /// A column's value (NULL when absent).
    pub fn get(&self, col: LeaseCol) -> &Value {
        self.known[col as usize].as_ref().unwrap_or(&NULL)
    }

    /// A lease from its columns, as read.
    pub fn from_fields(fields: BTreeMap<String, Value>) -> Lease {
        let mut lease = Lease::default();
        for (name, value) in fields {
            match LeaseCol::from_name(&name) {
                Some(col) => lease.known[col as usize] = Some(value),
                None => {
                    lease.extra.insert(name, value);
                }
            }
        }
        lease
    }

    /// Every column the row has, ours and others, in column-name order.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &Value)> {
        let mut all: Vec<(&str, &Value)> = LEASE_COLUMNS
            .iter()
            .filter_map(|c| self.known[*c as usize].as_ref().map(|v| (c.name(), v)))
            .chain(self.extra.iter().map(|(k, v)| (k.as_str(), v)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        all.into_iter()
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
        Ok(Lease::from_fields(fields))
    }

    /// `status` is exactly the text `active`.
    pub fn is_active(&self) -> bool {
        self.get(LeaseCol::Status).as_text() == Some("active")
    }
}

/// The statement that creates an empty lease table with every column.
pub fn create_sql() -> String {
    let cols: Vec<String> = COLUMNS
        .iter()
        .map(|c| {
            let ty = match *c {
                "lease_id" => "TEXT PRIMARY KEY",
                "owner_pid" | "session_pid" => "INTEGER",
                _ => "TEXT",
            };
            format!("{c} {ty}")
        })
        .collect();
    format!("CREATE TABLE {TABLE} ({})", cols.join(", "))
}
