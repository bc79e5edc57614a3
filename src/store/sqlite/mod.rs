//! The SQLite engine: a registry and a lease store are files.

pub mod apply;
pub mod controller;
pub mod held;
pub mod leases;
pub mod read;
pub mod scope;
pub mod scope_index;
pub mod versions;
pub mod worker;

use crate::error::Result;
use crate::row::Row;
use crate::store::leases::Lease;
use crate::store::seam::{ApplyConnection, Engine, FenceSource, Recorded, RowVersions, WorkerRows};
use std::path::PathBuf;
use std::time::Duration;

/// A store in the SQLite file at `path`.
pub struct Sqlite {
    path: PathBuf,
}

impl Sqlite {
    /// The store in the file at `path` (opened by each job as it needs).
    pub fn at(path: PathBuf) -> Sqlite {
        Sqlite { path }
    }
}

impl Engine for Sqlite {
    fn label(&self) -> String {
        self.path.display().to_string()
    }

    fn read_registry(&self) -> Result<Vec<Row>> {
        read::load(&self.path)
    }

    fn read_scope(&self, host_id: &str) -> Result<crate::store::scope::Scope> {
        scope::load(&self.path, host_id)
    }

    fn read_leases(&self) -> Result<Vec<Lease>> {
        leases::load(&self.path)
    }

    fn read_registry_versioned(&self) -> Option<Result<(Vec<Row>, RowVersions)>> {
        read::load_versioned(&self.path).transpose()
    }

    fn fence_source(&self) -> Result<Box<dyn FenceSource>> {
        Ok(Box::new(leases::Fence::open(&self.path)?))
    }

    fn apply_connection(&self, busy_timeout: Duration) -> Result<Box<dyn ApplyConnection>> {
        Ok(Box::new(apply::Sqlite::open(&self.path, busy_timeout)?))
    }

    fn worker_rows(&self) -> Result<Box<dyn WorkerRows>> {
        Ok(Box::new(worker::Rows::open(&self.path)?))
    }

    fn controller_rows(
        &self,
        busy: Duration,
    ) -> Result<Box<dyn crate::store::seam::ControllerRows>> {
        Ok(Box::new(controller::Rows::open(&self.path, busy)?))
    }

    /// A SQLite COMMIT is the file's own: a reader sees it whole or not at
    /// all, and a crashed writer's journal is rolled back on the next open.
    fn audit_of(&self, apply_id: &str, wait: Duration) -> Result<Vec<Recorded>> {
        use crate::error::{Error, Store};
        let conn = read::open_read_only(&self.path)?;
        let err = Error::sqlite(Store::Registry, &self.path, "cannot read the audit");
        conn.busy_timeout(wait).map_err(err)?;
        if crate::store::table_columns(&conn, crate::store::audit::TABLE)
            .map_err(err)?
            .is_none()
        {
            return Err(crate::store::audit::absent(
                &self.path.display().to_string(),
            ));
        }
        let mut stmt = conn
            .prepare(&format!(
                "SELECT worker_identity, retired_at, retired_by FROM {} WHERE apply_id = ?1 \
                 ORDER BY worker_identity",
                crate::store::audit::TABLE
            ))
            .map_err(err)?;
        let rows = stmt
            .query_map([apply_id], |r| {
                Ok(Recorded {
                    worker_identity: r.get(0)?,
                    retired_at: r.get(1)?,
                    retired_by: r.get(2)?,
                })
            })
            .map_err(err)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(err)?;
        Ok(rows)
    }
}
