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

    /// A lease from its columns, as read.
    pub fn from_fields(fields: BTreeMap<String, Value>) -> Lease {
        Lease { fields }
    }

    /// Every column as read, in column-name order.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.fields.iter().map(|(k, v)| (k.as_str(), v))
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
