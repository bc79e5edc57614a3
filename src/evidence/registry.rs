//! Reading the worker registry (docs/semantics.md §5), whatever engine
//! holds it: the location picks its engine once (`store::open`), and the
//! engine reads every registration in one snapshot, read-only.
//!
//! Planning never alters the registry: a registry from before the fencing
//! or `retired_*` columns simply reads those columns as NULL. Columns the
//! program does not know are ignored.

use crate::error::Result;
use crate::row::Row;
use std::path::Path;

pub use crate::store::registry::TABLE;
pub use crate::store::sqlite::read::{
    open_read_only, read_rows, recover_hot_journal, value_from_sql, READ_BUSY_TIMEOUT,
};

/// Read every registration at `location` (a SQLite file or a PostgreSQL
/// URL), read-only, in one snapshot.
pub fn load(location: &Path) -> Result<Vec<Row>> {
    crate::store::open::engine(location)?.read_registry()
}

/// Read the scope of host `host_id` at `location` (`store::scope`: its
/// active rows, their peers, a count of its other rows), read-only, in one
/// snapshot.
pub fn load_scope(location: &Path, host_id: &str) -> Result<crate::store::scope::Scope> {
    crate::store::open::engine(location)?.read_scope(host_id)
}
