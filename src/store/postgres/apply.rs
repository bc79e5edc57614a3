//! Apply's transaction on a PostgreSQL registry: `SERIALIZABLE` (writers of
//! other rows undisturbed; a transaction that lost a race with another is
//! aborted by the server and becomes a refusal), with the effect of its
//! writes checked before COMMIT ([`super::image`]).

use super::PgUrl;
use crate::error::{Error, Result, Store};
use crate::row::Col;
use crate::row::Row;
use crate::store::audit::AuditRow;
use crate::store::leases::Lease;
use crate::store::seam::{ApplyConnection, ApplyTx, Changes, RowVersions, ServerMark, Written};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The advisory lock key applies tried again after a serialization
/// failure take turns on ("fr-retry" in ASCII).
const TURN: i64 = 0x6672_2d72_6574_7279;

/// A PostgreSQL registry opened for apply.
pub struct Postgres {
    client: postgres::Client,
    /// The location as given, to tell whether the leases live here.
    location: PathBuf,
    label: String,
    /// Set until the transaction begins: apply judges outside it for
    /// seconds first ([`super::stall`]).
    idle: super::stall::Idle,
    /// The URL, for the check on a connection of its own before COMMIT.
    url: PgUrl,
}

impl Postgres {
    /// Connect to the registry's database. A lock held by another session
    /// is waited for at most `busy_timeout` (PostgreSQL's `lock_timeout`),
    /// as SQLite's busy timeout bounds its wait for the write lock; past it
    /// the statement fails and the apply is `transaction_failed`.
    pub fn open(url: &PgUrl, location: &Path, busy_timeout: Duration) -> Result<Postgres> {
        let label = url.to_string();
        let (mut client, idle) = super::connect_watched(url, Store::Registry)?;
        let millis = busy_timeout.as_millis().clamp(1, i32::MAX as u128);
        client
            .batch_execute(&format!("SET lock_timeout = {millis}"))
            .map_err(Error::postgres(
                Store::Registry,
                &label,
                "cannot set the lock timeout",
            ))?;
        idle.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(Postgres {
            client,
            location: location.to_path_buf(),
            label,
            idle,
            url: url.clone(),
        })
    }
}

impl ApplyConnection for Postgres {
    /// On PostgreSQL 13 or later, when our triggers are not all there.
    fn lacks_versions(&mut self) -> Result<bool> {
        use std::sync::atomic::Ordering::SeqCst;
        let label = self.label.clone();
        self.idle.store(false, SeqCst);
        let lacks = super::versions::supported(&mut self.client, &label)
            .and_then(|ok| Ok(ok && !super::versions::triggers(&mut self.client, &label)?.1));
        self.idle.store(true, SeqCst);
        lacks
    }

    /// A session-level advisory lock, taken outside any transaction (a
    /// lock taken inside would wait after the snapshot was taken, and the
    /// transaction would overlap the one it waited for); given up by
    /// `end_turn` after the last attempt, or when the session ends.
    fn take_turn(&mut self) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        self.idle.store(false, SeqCst);
        let taken = self
            .client
            .batch_execute(&format!("SELECT pg_catalog.pg_advisory_lock({TURN})"))
            .map_err(Error::postgres(
                Store::Registry,
                &self.label,
                "cannot wait for the turn of applies tried again",
            ));
        self.idle.store(true, SeqCst);
        taken
    }

    /// Every attempt after the first took the lock once more (session
    /// locks stack), and this connection is apply's own, holding no other
    /// session lock: all of them are given up. A failure leaves them to
    /// the session's end, which a broken connection's is.
    fn end_turn(&mut self) {
        // In use, as since `begin`: a frozen server is left, as by any
        // call.
        self.idle.store(false, std::sync::atomic::Ordering::SeqCst);
        let given_up = self
            .client
            .batch_execute("SELECT pg_catalog.pg_advisory_unlock_all()");
        if let Err(e) = given_up {
            tracing::debug!("apply: the turn is given up when the connection closes: {e}");
        }
    }

    fn begin(&mut self) -> std::result::Result<Box<dyn ApplyTx + '_>, String> {
        let label = self.label.clone();
        // In use from here until the connection is dropped.
        self.idle.store(false, std::sync::atomic::Ordering::SeqCst);
        let failed = |doing| {
            let label = label.clone();
            move |e| Error::postgres(Store::Registry, &label, doing)(e).to_string()
        };
        // Before the transaction, as committed now: what the check before
        // COMMIT compares the latest committed catalog with.
        let catalog_before =
            super::versions::catalog_stamp(&mut self.client, &label).map_err(|e| e.to_string())?;
        let ours = self
            .client
            .query_one(
                "SELECT coalesce(pg_catalog.string_agg(pg_catalog.quote_ident(relname), ', '), '') \
                 FROM pg_catalog.pg_class WHERE relkind = 'r' AND relname = ANY($1) \
                 AND relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace",
                &[&&super::versions::TABLES[..]],
            )
            .map_err(failed("cannot list the tables to lock"))?
            .get::<_, String>(0);
        let mut tx = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::Serializable)
            .start()
            .map_err(failed("could not begin the transaction"))?;
        // Before the snapshot: no other session may create, alter or
        // switch a trigger on our tables until COMMIT (PostgreSQL runs the
        // latest committed triggers, not the ones this snapshot shows).
        // Writers of rows are not held up.
        if !ours.is_empty() {
            tx.batch_execute(&format!("LOCK TABLE {ours} IN ROW EXCLUSIVE MODE"))
                .map_err(failed("cannot lock the registry's tables against DDL"))?;
        }
        Ok(Box::new(Tx {
            tx,
            prepared: super::Prepared::default(),
            location: &self.location,
            label,
            image: None,
            url: &self.url,
            catalog_before,
        }))
    }
}

/// Each changed identity's row now, at its position in the rows read
/// with `mark` (`None`: deleted since). `Err` when a change cannot be put
/// in place: an identity on several rows, or a row added since.
fn pair_changes(mark: &ServerMark, identities: &[String], rows: Vec<Row>) -> Changes {
    let mut now: HashMap<String, Vec<Row>> = HashMap::with_capacity(rows.len());
    for row in rows {
        let id = row.get(Col::WorkerIdentity).canon_cow().into_owned();
        now.entry(id).or_default().push(row);
    }
    let mut out = Vec::with_capacity(identities.len());
    for id in identities {
        let show = crate::text::esc(id);
        let was = mark
            .positions
            .get(id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut is = now.remove(id).unwrap_or_default();
        match (was, is.len()) {
            ([], 0) => {}
            ([], _) => return Err(format!("{show:?} was added since the registry was read")),
            ([at], 0) => out.push((*at, None)),
            ([at], 1) => out.push((*at, is.pop())),
            _ => {
                return Err(format!(
                    "{show:?} is on several rows, which its change record cannot tell apart"
                ))
            }
        }
    }
    Ok(out)
}

/// Apply's transaction on a PostgreSQL registry.
struct Tx<'c> {
    tx: postgres::Transaction<'c>,
    prepared: super::Prepared,
    location: &'c Path,
    label: String,
    /// The image before the first write.
    image: Option<super::image::PreImage>,
    url: &'c PgUrl,
    /// The catalog's stamp as committed just before BEGIN.
    catalog_before: String,
}

impl Tx<'_> {
    /// The catalog as committed now, read on a connection of its own (this
    /// transaction's snapshot shows the catalog as it began, while
    /// PostgreSQL runs the functions committed since): a stamp that moved
    /// since BEGIN means code other than the one checked may have run in
    /// the writes (a function of ours replaced meanwhile takes no lock).
    fn catalog_moved(&mut self) -> Result<Option<String>> {
        let mut fresh = super::connect_to(self.url, Store::Registry)?;
        let now = super::versions::catalog_stamp(&mut fresh, &self.label)?;
        Ok((now != self.catalog_before).then(|| {
            "the registry's tables, triggers or functions were changed by another session while \
             apply wrote (DDL committed since BEGIN)"
                .to_string()
        }))
    }

    /// Why the change record cannot vouch for the rows read with `mark`,
    /// if it cannot: another server, DDL on our tables or functions since,
    /// or our triggers not all there.
    fn moved_since(&mut self, mark: &ServerMark) -> Result<Option<String>> {
        if super::versions::server(&mut self.tx, &self.label)? != mark.server {
            return Ok(Some(
                "the server is not the one the registry was read from (a failover or a restart)"
                    .into(),
            ));
        }
        if super::versions::catalog_stamp(&mut self.tx, &self.label)? != mark.catalog {
            return Ok(Some(
                "the registry's tables or the change record's triggers changed since the \
                 registry was read (DDL)"
                    .into(),
            ));
        }
        super::versions::vouches(&mut self.tx, &self.label)
    }
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

    /// The change record, its functions and triggers; the audit table
    /// first when there is none yet (the triggers stamp it too).
    fn install_versions(&mut self) -> Result<()> {
        if let Some(why) = super::versions::not_ours(&mut self.tx, false, &self.label)? {
            return Err(super::registry_error(&self.label, why));
        }
        super::migrate_audit_in(&mut self.tx, &self.label)?;
        super::versions::install(&mut self.tx, &self.label)
    }

    fn read_rows(&mut self) -> Result<Vec<Row>> {
        super::read_registry(&mut self.tx, &self.label)
    }

    /// The lease row read in this transaction's snapshot; [`record`]
    /// updates it, so a takeover committed since fails this transaction
    /// and one tried later waits for it to end.
    ///
    /// [`record`]: super::controller::record
    fn controller_holds(
        &mut self,
        stamp: &crate::store::controller::Stamp,
    ) -> Result<Option<String>> {
        super::controller::holds(&mut self.tx, &self.label, stamp)
    }

    fn controller_record(
        &mut self,
        stamp: &crate::store::controller::Stamp,
        apply_id: &str,
        targets: usize,
    ) -> Result<Option<crate::store::seam::Refused>> {
        super::controller::record(&mut self.tx, &self.label, stamp, apply_id, targets)
    }

    fn read_scope(
        &mut self,
        host_id: &str,
        also: &[String],
    ) -> Result<std::result::Result<crate::store::scope::Scope, String>> {
        super::scope::load_through_indexes(&mut self.tx, &self.label, host_id, also)
    }

    fn changed_since(&mut self, since: &RowVersions) -> Result<Changes> {
        let Some(mark) = since.server.as_ref() else {
            return Ok(Err(
                "the rows were not read with a snapshot of this server".into()
            ));
        };
        if let Some(why) = self.moved_since(mark)? {
            return Ok(Err(why));
        }
        let keys = super::versions::changed_keys(&mut self.tx, &mark.snapshot, &self.label)?;
        let mut identities = Vec::with_capacity(keys.len());
        for key in keys {
            if key.starts_with("a:") {
                continue;
            }
            let Some(id) = key.strip_prefix("i:") else {
                return Ok(Err(format!(
                    "the change record holds {:?} (a truncation, or a row without an identity)",
                    crate::text::esc(&key)
                )));
            };
            identities.push(id.to_string());
        }
        let rows = super::read_identities(&mut self.tx, &self.label, &identities)?;
        Ok(pair_changes(mark, &identities, rows))
    }

    fn same_file(&mut self, since: &RowVersions) -> bool {
        match since.server.as_ref() {
            Some(mark) => matches!(self.moved_since(mark), Ok(None)),
            None => false,
        }
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
        let stamped = super::versions::vouches(&mut self.tx, &self.label)?.is_none();
        let label = self.label.as_str();
        let read = |tx: &mut postgres::Transaction<'_>| {
            let started = std::time::Instant::now();
            let image = super::image::pre_image(tx, targets, apply_id, stamped, label);
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
        let mut found =
            super::image::differences(&mut self.tx, pre, apply_id, written, &self.label)?;
        if pre.stamped() {
            found.extend(self.catalog_moved()?);
        }
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
