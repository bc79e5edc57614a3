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
use crate::store::pg;
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

/// A store location for messages and audit rows: a path, or a URL with its
/// password masked.
pub(super) fn label_of(location: &Path) -> String {
    if pg::is_postgres(location) {
        pg::masked(&location.to_string_lossy())
    } else {
        location.display().to_string()
    }
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

    /// A mark for [`RegistryTx::verify_writes`]: SQLite's count of every
    /// row changed so far on this connection, triggers included.
    pub(super) fn changes_mark(&self) -> u64 {
        match &self.engine {
            Engine::Sqlite(tx) => tx.total_changes(),
            Engine::Postgres(..) => 0,
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

    /// Before COMMIT: exactly one UPDATE and one audit row per retirement,
    /// every row this transaction changed counted (a trigger's too): by
    /// SQLite's change counter, or by PostgreSQL's row versions.
    pub(super) fn verify_writes(
        &self,
        mark: u64,
        apply_id: &str,
        retired: usize,
    ) -> Result<Option<String>> {
        let n = retired as u64;
        match &self.engine {
            Engine::Sqlite(tx) => {
                let written = tx.total_changes() - mark;
                if written != 2 * n {
                    return Ok(Some(format!(
                        "the transaction changed {written} rows where {} were meant \
                         (one retirement and one audit row per worker); nothing was retired",
                        2 * n
                    )));
                }
                let audited = crate::store::audit::count_for(tx, apply_id)
                    .map_err(self.sqlite_err("cannot count the audit rows"))?;
                Ok((audited != retired).then(|| {
                    format!("{audited} audit rows were found for {retired} retirements; nothing was retired")
                }))
            }
            Engine::Postgres(tx, _) => {
                let (registry, audit, audited) =
                    pg::written_here(&mut *tx.borrow_mut(), apply_id, &self.label)?;
                Ok(([registry, audit, audited] != [n as i64; 3]).then(|| {
                    format!(
                        "the transaction wrote {registry} registry rows and {audit} audit rows \
                         ({audited} with this apply's id) where {retired} of each were meant; \
                         nothing was retired"
                    )
                }))
            }
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
