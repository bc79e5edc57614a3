//! The PostgreSQL side of the differential tests
//! (`tests/postgres_differential.rs`, `tests/postgres_scoped_differential.rs`):
//! the random writes of `common::interleave` in PostgreSQL's dialect, and
//! one database of a test, loaded afresh from a SQLite fleet for each
//! interleaving and applied on with the writes in the window.

use super::interleave::{apply_with_window, World, Write};
use super::PgDb;
use fleet_retire::apply::{Outcome, Request};
use rusqlite::types::Value as Sql;
use std::path::{Path, PathBuf};

/// A SQLite write in PostgreSQL's dialect, its parameters written in as
/// literals (a value the column's type refuses is a write refused, on both
/// routes alike).
pub fn in_postgres(w: &Write) -> String {
    let literal = |v: &Sql| match v {
        Sql::Null => "NULL".to_string(),
        Sql::Integer(i) => i.to_string(),
        Sql::Real(r) => format!("'{r:?}'::float8"),
        Sql::Text(t) => format!("'{}'", t.replace('\'', "''")),
        Sql::Blob(_) => unreachable!("no write here uses a blob"),
    };
    let mut sql = w
        .sql
        .replace(
            "INSERT OR REPLACE INTO worker_registrations SELECT * FROM worker_registrations \
             WHERE worker_identity = ?1",
            "WITH gone AS (DELETE FROM worker_registrations WHERE worker_identity = ?1 \
             RETURNING *) INSERT INTO worker_registrations SELECT * FROM gone",
        )
        .replace(
            "INSERT OR REPLACE INTO workflow_leases (lease_id, status, owner_worker_identity) \
             VALUES ('l-' || ?1, 'active', ?1)",
            "INSERT INTO workflow_leases (lease_id, status, owner_worker_identity) \
             VALUES ('l-' || ?1, 'active', ?1) ON CONFLICT (lease_id) DO UPDATE \
             SET status = excluded.status, owner_worker_identity = excluded.owner_worker_identity",
        );
    for (i, v) in w.params.iter().enumerate().rev() {
        sql = sql.replace(&format!("?{}", i + 1), &literal(v));
    }
    assert!(!sql.contains("OR REPLACE"), "untranslated: {sql}");
    sql
}

/// One database of a test, emptied for each interleaving.
pub struct Side {
    pub db: PgDb,
    pub profiles: PathBuf,
}

impl Side {
    /// Its URL, as apply and plan take a registry's location.
    pub fn url(&self) -> PathBuf {
        PathBuf::from(&self.db.url)
    }

    /// Copy the fleet at `base` in, add a column the program does not
    /// know, and install the change record (and the scope's indexes).
    pub fn load(&self, base: &Path) {
        self.db
            .client()
            .batch_execute(
                "DROP TABLE IF EXISTS worker_registrations, retirement_audit, workflow_leases, \
                 fleet_retire_changes CASCADE; \
                 DROP FUNCTION IF EXISTS fleet_retire_stamp(), fleet_retire_changes_guard()",
            )
            .unwrap();
        fleet_retire::copy::copy(
            &base.join("registry.sqlite"),
            Some(&base.join("leases.sqlite")),
            &self.db.url,
        )
        .unwrap();
        let mut c = self.db.client();
        c.batch_execute("ALTER TABLE worker_registrations ADD COLUMN note TEXT")
            .unwrap();
        let mut tx = c.transaction().unwrap();
        fleet_retire::store::postgres::versions::install(&mut tx, "test").unwrap();
        tx.commit().unwrap();
    }

    /// Every row's identity and status.
    pub fn statuses(&self) -> Vec<(String, Option<String>)> {
        self.db
            .client()
            .query(
                "SELECT worker_identity, status FROM worker_registrations ORDER BY 1, 2",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// Commit `writes` as an ordinary client would, then `ddl` if any.
    pub fn commit(&self, writes: &[String], ddl: Option<&str>) {
        let mut c = self.db.client();
        for w in writes {
            // A write PostgreSQL refuses did not happen, on both sides.
            let _ = c.batch_execute(w);
        }
        if let Some(ddl) = ddl {
            c.batch_execute(ddl).unwrap();
        }
    }

    /// Apply with `writes` in the window, then `ddl` there too, then
    /// `after` (still in the window); the outcome and how the lock read.
    pub fn route(
        &self,
        world: &World,
        req: &Request,
        (writes, ddl): (&[String], Option<&str>),
        after: &mut dyn FnMut(),
    ) -> (Outcome, String) {
        let mut hook = || {
            self.commit(writes, ddl);
            after();
        };
        let url = self.url();
        apply_with_window((&url, &url, &self.profiles), world, req, &mut hook)
    }
}
