//! Apply's transaction on a PostgreSQL registry: `SERIALIZABLE` (writers of
//! other rows undisturbed; a transaction that lost a race with another is
//! aborted by the server and becomes a refusal), with the effect of its
//! writes checked before COMMIT ([`super::image`]).

use super::PgUrl;
use crate::error::{Error, Result, Store};
use crate::row::Row;
use crate::store::audit::AuditRow;
use crate::store::leases::Lease;
use crate::store::seam::{ApplyConnection, ApplyTx, Written};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A PostgreSQL registry opened for apply.
pub struct Postgres {
    client: postgres::Client,
    /// The location as given, to tell whether the leases live here.
    location: PathBuf,
    label: String,
}

impl Postgres {
    /// Connect to the registry's database. A lock held by another session
    /// is waited for at most `busy_timeout` (PostgreSQL's `lock_timeout`),
    /// as SQLite's busy timeout bounds its wait for the write lock; past it
    /// the statement fails and the apply is `transaction_failed`.
    pub fn open(url: &PgUrl, location: &Path, busy_timeout: Duration) -> Result<Postgres> {
        let label = url.to_string();
        super::stall::allow_waits(busy_timeout);
        let mut client = super::connect_bounded(url, Store::Registry, busy_timeout)?;
        let millis = busy_timeout.as_millis().clamp(1, i32::MAX as u128);
        client
            .batch_execute(&format!("SET lock_timeout = {millis}"))
            .map_err(Error::postgres(
                Store::Registry,
                &label,
                "cannot set the lock timeout",
            ))?;
        Ok(Postgres {
            client,
            location: location.to_path_buf(),
            label,
        })
    }
}

impl ApplyConnection for Postgres {
    fn begin(&mut self) -> std::result::Result<Box<dyn ApplyTx + '_>, String> {
        let label = self.label.clone();
        let tx = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::Serializable)
            .start()
            .map_err(|e| {
                Error::postgres(Store::Registry, &label, "could not begin the transaction")(e)
                    .to_string()
            })?;
        Ok(Box::new(Tx {
            tx,
            prepared: super::Prepared::default(),
            location: &self.location,
            label,
            image: None,
        }))
    }
}

/// Apply's transaction on a PostgreSQL registry.
struct Tx<'c> {
    tx: postgres::Transaction<'c>,
    prepared: super::Prepared,
    location: &'c Path,
    label: String,
    /// The image before the first write.
    image: Option<super::image::PreImage>,
}

impl ApplyTx for Tx<'_> {
    fn untrusted_objects(&mut self) -> Result<Option<String>> {
        super::untrusted_objects(&mut self.tx, &self.label)
    }

    fn migrate_registry(&mut self) -> Result<()> {
        super::migrate_registry_in(&mut self.tx, &self.label)
    }

    fn migrate_audit(&mut self) -> Result<()> {
        super::migrate_audit_in(&mut self.tx, &self.label)
    }

    fn read_rows(&mut self) -> Result<Vec<Row>> {
        super::read_registry(&mut self.tx, &self.label)
    }

    /// When the leases live in this same database, read them inside this
    /// transaction: the leases and the registry rows are then one
    /// snapshot, and a lease written concurrently conflicts with this
    /// transaction instead of passing unseen.
    fn read_leases_here(&mut self, leases: &Path) -> Option<Result<(String, Vec<Lease>)>> {
        if leases != self.location {
            return None;
        }
        Some((|| {
            let version = super::active_lease_version(&mut self.tx, &self.label)?;
            let mut active = super::read_leases(&mut self.tx, &self.label, true)?;
            active.retain(Lease::is_active);
            Ok((version, active))
        })())
    }

    /// The image is read on a thread of its own while `meanwhile` runs
    /// here: the server digests the registry while this process judges the
    /// targets. Nothing else uses this transaction's connection until both
    /// are done, and the first write comes after.
    fn before_writes(
        &mut self,
        targets: &[String],
        apply_id: &str,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<()> {
        let label = self.label.as_str();
        let read = |tx: &mut postgres::Transaction<'_>| {
            let started = std::time::Instant::now();
            let image = super::image::pre_image(tx, targets, apply_id, label);
            tracing::debug!(elapsed = ?started.elapsed(), "effect check: image before the first write");
            image
        };
        let tx = &mut self.tx;
        let together = std::thread::scope(|s| {
            let reader = std::thread::Builder::new()
                .name("apply-image".into())
                .spawn_scoped(s, move || read(tx))
                .ok()?;
            meanwhile();
            Some(reader.join().map_err(|_| {
                super::registry_error(
                    label,
                    "the thread reading the image before the first write failed; \
                     nothing was written: run the apply again",
                )
            }))
        });
        // A system that refuses another thread gets the two in turn.
        let image = match together {
            Some(image) => image??,
            None => {
                let image = read(&mut self.tx)?;
                meanwhile();
                image
            }
        };
        self.image = Some(image);
        Ok(())
    }

    /// The guarded UPDATE and its audit row are one statement (one round
    /// trip).
    fn retire_with_audit(&mut self, row: &Row, audit: &AuditRow) -> Result<u64> {
        super::retire_with_audit(&mut self.tx, &mut self.prepared, row, audit, &self.label)
    }

    fn retire_all(&mut self, batch: &[(&Row, AuditRow<'_>)]) -> Result<Vec<u64>> {
        super::retire_all(&mut self.tx, batch, &self.label)
    }

    /// The effect itself: code can run inside a write in places no counter
    /// sees ([`super::image::differences`]).
    fn verify_writes(&mut self, apply_id: &str, written: &[Written<'_>]) -> Result<Option<String>> {
        let Some(pre) = self.image.as_ref() else {
            return Ok(Some("no image was taken before the first write".into()));
        };
        let started = std::time::Instant::now();
        let found = super::image::differences(&mut self.tx, pre, apply_id, written, &self.label)?;
        tracing::debug!(elapsed = ?started.elapsed(), "effect check: image before COMMIT");
        Ok((!found.is_empty()).then(|| found.join("; ")))
    }

    /// A COMMIT the server answered with an error did not commit; one
    /// whose answer never came (the connection closed, reset or went
    /// silent past its bound) may have.
    fn commit(self: Box<Self>) -> Result<()> {
        let label = self.label;
        self.tx.commit().map_err(|e| {
            if e.as_db_error().is_some() {
                Error::postgres(Store::Registry, &label, "commit failed")(e)
            } else {
                let cause =
                    std::error::Error::source(&e).map_or(String::new(), |c| format!(": {c}"));
                Error::OutcomeUnknown {
                    shown: label.clone(),
                    message: format!("{e}{cause}"),
                }
            }
        })
    }

    fn rollback(self: Box<Self>) -> Option<String> {
        self.tx
            .rollback()
            .err()
            .map(|e| format!("{e}; PostgreSQL discards the transaction when the connection closes"))
    }
}
