//! Apply's registry transaction on either engine: SQLite's `BEGIN
//! IMMEDIATE` (one writer at a time, readers undisturbed) or PostgreSQL's
//! `SERIALIZABLE` (writers of other rows undisturbed; a transaction that
//! lost a race with another is aborted by the server and becomes a
//! refusal). The steps of `super` are the same on both; only how each is
//! said differs, and it is said here.

use crate::error::{Error, Result, Store};
use crate::evidence::leases::{Fence, Lease};
use crate::row::Row;
use crate::store::audit::AuditRow;
use crate::store::postgres as pg;
use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

/// An open registry, before its transaction.
pub(super) enum Connected {
    Sqlite(rusqlite::Connection),
    Postgres(postgres::Client),
}

impl Connected {
    /// Open the registry at `location` for writing.
    pub(super) fn open(location: &Path, busy_timeout: Duration) -> Result<Connected> {
        if pg::is_postgres(location) {
            let url = location.to_string_lossy();
            return pg::connect(&url, Store::Registry).map(Connected::Postgres);
        }
        super::open_for_writing(location, busy_timeout).map(Connected::Sqlite)
    }

    /// Begin apply's transaction.
    pub(super) fn begin<'c>(
        &'c mut self,
        location: &'c Path,
    ) -> std::result::Result<RegistryTx<'c>, String> {
        let label = label_of(location);
        let engine = match self {
            Connected::Sqlite(conn) => conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map(Engine::Sqlite)
                .map_err(|e| format!("could not take the registry's write lock: {e}"))?,
            Connected::Postgres(client) => client
                .build_transaction()
                .isolation_level(postgres::IsolationLevel::Serializable)
                .start()
                .map(|tx| Engine::Postgres(RefCell::new(tx), RefCell::default()))
                .map_err(|e| {
                    Error::postgres(Store::Registry, &label, "could not begin the transaction")(e)
                        .to_string()
                })?,
        };
        Ok(RegistryTx {
            engine,
            path: location,
            label,
        })
    }
}

/// A store location for messages and audit rows: a path, or a URL as
/// [`crate::store::location::PgUrl`] shows it (never its password).
pub(super) fn label_of(location: &Path) -> String {
    crate::store::location::label(location)
}

/// What was seen before the first write ([`RegistryTx::before_writes`]).
pub(super) enum Mark {
    /// SQLite's `total_changes`.
    Changes(u64),
    /// PostgreSQL's image of the registry and audit table.
    Image(pg::image::PreImage),
}

enum Engine<'c> {
    Sqlite(rusqlite::Transaction<'c>),
    Postgres(RefCell<postgres::Transaction<'c>>, RefCell<pg::Prepared>),
}

/// Apply's transaction on the registry.
pub(super) struct RegistryTx<'c> {
    engine: Engine<'c>,
    path: &'c Path,
    label: String,
}

impl RegistryTx<'_> {
    fn sqlite_err(&self, doing: &'static str) -> impl Fn(rusqlite::Error) -> Error + '_ {
        Error::sqlite(Store::Registry, self.path, doing)
    }

    /// Why the registry could make apply's writes differ from its report.
    pub(super) fn untrusted_objects(&self) -> Result<Option<String>> {
        match &self.engine {
            Engine::Sqlite(tx) => {
                crate::store::untrusted_objects(tx, crate::store::registry::TABLE)
                    .map_err(self.sqlite_err("cannot inspect the schema"))
            }
            Engine::Postgres(tx, _) => pg::untrusted_objects(&mut *tx.borrow_mut(), &self.label),
        }
    }

    /// Add the registry columns the table lacks.
    pub(super) fn migrate_registry(&self) -> Result<()> {
        match &self.engine {
            Engine::Sqlite(tx) => crate::store::registry::add_missing_columns(tx, self.path),
            Engine::Postgres(tx, _) => pg::migrate_registry_in(&mut *tx.borrow_mut(), &self.label),
        }
    }

    /// Create the audit table, or add the columns it lacks.
    pub(super) fn migrate_audit(&self) -> Result<()> {
        match &self.engine {
            Engine::Sqlite(tx) => crate::store::audit::create_or_migrate(tx)
                .map_err(self.sqlite_err("cannot create or migrate the audit table")),
            Engine::Postgres(tx, _) => pg::migrate_audit_in(&mut *tx.borrow_mut(), &self.label),
        }
    }

    /// The authoritative read of every registration.
    pub(super) fn read_rows(&self) -> Result<Vec<Row>> {
        match &self.engine {
            Engine::Sqlite(tx) => crate::evidence::registry::read_rows(tx, self.path),
            Engine::Postgres(tx, _) => pg::read_registry(&mut *tx.borrow_mut(), &self.label),
        }
    }

    /// When the leases live in this same PostgreSQL database, read the
    /// fence inside this transaction: the leases and the registry rows are
    /// then one snapshot, and a lease written concurrently conflicts with
    /// this transaction instead of passing unseen.
    pub(super) fn read_fence_here(&self, leases: &Path) -> Option<Result<(Fence, Vec<Lease>)>> {
        let Engine::Postgres(tx, _) = &self.engine else {
            return None;
        };
        if leases != self.path {
            return None;
        }
        let mut tx = tx.borrow_mut();
        Some((|| {
            let version = pg::active_lease_version(&mut *tx, &self.label)?;
            let mut active = pg::read_leases(&mut *tx, &self.label, true)?;
            active.retain(Lease::is_active);
            Ok((Fence::of(&active, version.clone()), active))
        })())
    }

    /// What [`RegistryTx::verify_writes`] compares with, taken before the
    /// first write: SQLite's count of every row changed so far on this
    /// connection (triggers included, and triggers are the only code SQLite
    /// runs inside a write, refused before this); PostgreSQL's image of the
    /// registry and audit table ([`pg::image`]).
    pub(super) fn before_writes(&self, targets: &[String], apply_id: &str) -> Result<Mark> {
        match &self.engine {
            Engine::Sqlite(tx) => Ok(Mark::Changes(tx.total_changes())),
            Engine::Postgres(tx, _) => {
                pg::image::pre_image(&mut *tx.borrow_mut(), targets, apply_id, &self.label)
                    .map(Mark::Image)
            }
        }
    }

    /// The guarded UPDATE of one row and, when it changed exactly one row,
    /// its audit row; the number of rows the UPDATE changed. On PostgreSQL
    /// both are one statement (one round trip).
    pub(super) fn retire_with_audit(&self, row: &Row, audit: &AuditRow) -> Result<u64> {
        let (at, by, reason) = (audit.retired_at, audit.retired_by, audit.retirement_reason);
        match &self.engine {
            Engine::Sqlite(tx) => {
                let changed = crate::store::registry::retire_guarded(tx, row, at, by, reason)
                    .map(|n| n as u64)
                    .map_err(self.sqlite_err("the guarded UPDATE failed"))?;
                if changed == 1 {
                    crate::store::audit::insert(tx, audit)
                        .map_err(self.sqlite_err("cannot write the audit row"))?;
                }
                Ok(changed)
            }
            Engine::Postgres(tx, prepared) => pg::retire_with_audit(
                &mut *tx.borrow_mut(),
                &mut prepared.borrow_mut(),
                row,
                audit,
                &self.label,
            ),
        }
    }

    /// Before COMMIT: the transaction changed exactly what it reports. On
    /// SQLite, one UPDATE and one audit row per retirement and nothing else
    /// (`total_changes` counts every row written, triggers' included); on
    /// PostgreSQL, where code can run in places no counter sees, the
    /// effect itself ([`pg::image::differences`]). `None` when it holds.
    pub(super) fn verify_writes(
        &self,
        mark: &Mark,
        apply_id: &str,
        written: &[pg::image::Written<'_>],
    ) -> Result<Option<String>> {
        let n = written.len() as u64;
        match (&self.engine, mark) {
            (Engine::Sqlite(tx), Mark::Changes(before)) => {
                let changed = tx.total_changes() - before;
                if changed != 2 * n {
                    return Ok(Some(format!(
                        "the transaction changed {changed} rows where {} were meant \
                         (one retirement and one audit row per worker)",
                        2 * n
                    )));
                }
                let audited = crate::store::audit::count_for(tx, apply_id)
                    .map_err(self.sqlite_err("cannot count the audit rows"))?;
                Ok((audited as u64 != n)
                    .then(|| format!("{audited} audit rows were found for {n} retirements")))
            }
            (Engine::Postgres(tx, _), Mark::Image(pre)) => {
                let found = pg::image::differences(
                    &mut *tx.borrow_mut(),
                    pre,
                    apply_id,
                    written,
                    &self.label,
                )?;
                Ok((!found.is_empty()).then(|| found.join("; ")))
            }
            _ => Ok(Some("the write mark is of another engine".into())),
        }
    }

    /// COMMIT.
    pub(super) fn commit(self) -> Result<()> {
        match self.engine {
            Engine::Sqlite(tx) => {
                tx.commit()
                    .map_err(Error::sqlite(Store::Registry, self.path, "commit failed"))
            }
            Engine::Postgres(tx, _) => tx.into_inner().commit().map_err(Error::postgres(
                Store::Registry,
                &self.label,
                "commit failed",
            )),
        }
    }

    /// ROLLBACK; the failure, if it failed, for the report.
    pub(super) fn rollback(self) -> Option<String> {
        match self.engine {
            Engine::Sqlite(tx) => tx.rollback().err().map(|e| {
                format!("{e}; SQLite discards the transaction when the connection closes")
            }),
            Engine::Postgres(tx, _) => tx.into_inner().rollback().err().map(|e| {
                format!("{e}; PostgreSQL discards the transaction when the connection closes")
            }),
        }
    }
}
