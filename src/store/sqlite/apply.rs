//! Apply's transaction on a SQLite registry: `BEGIN IMMEDIATE` (one writer
//! at a time, readers undisturbed). A trigger is the only code SQLite runs
//! inside a write: apply's connection runs none (`ENABLE_TRIGGER` off), and
//! every trigger but the row-version bookkeeping's is refused before the
//! first write anyway, so `total_changes` (which counts every row written)
//! accounts for every write; the check before COMMIT needs nothing more
//! and keeps the write lock short. Apply stamps its retirements in the
//! row-version bookkeeping itself (`versions`), as our triggers would.

use crate::error::{Error, Result, Store};
use crate::row::Row;
use crate::store::audit::AuditRow;
use crate::store::leases::Lease;
use crate::store::seam::{ApplyConnection, ApplyTx, Changes, RowVersions, Written};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Open the registry for writing (it must exist). Columns are added, and
/// the audit table created, inside apply's transaction, so a refused or
/// failed apply leaves the file exactly as it was.
pub fn open_for_writing(path: &Path, busy_timeout: Duration) -> Result<Connection> {
    let err = |message: String| Error::Registry {
        shown: crate::store::location::label(path),
        message,
    };
    if !path.is_file() {
        return Err(err(
            "no such file; pass the worker registry with --registry".into(),
        ));
    }
    let sql = |doing| Error::sqlite(crate::error::Store::Registry, path, doing);
    // One thread uses the connection at a time (rusqlite's `Connection` is
    // not `Sync`), so SQLite's per-call connection mutex only costs time.
    let conn = super::held::opening(|| {
        Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
    })
    .map_err(sql("cannot open for writing"))?;
    conn.busy_timeout(busy_timeout)
        .map_err(sql("cannot set the busy timeout"))?;
    // No code of the file's runs inside apply's writes, not even ours: the
    // row-version stamps are written explicitly (`Tx::stamp`).
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER,
        false,
    )
    .map_err(sql("cannot switch triggers off"))?;
    // Apply re-reads the whole registry and writes every target inside one
    // transaction: a page cache of SQLite's default 2 MiB spills dirty pages
    // to the file (and syncs the journal) mid-transaction. This is a bound,
    // not an allocation: only the pages touched are held.
    conn.execute_batch("PRAGMA cache_size = -262144")
        .map_err(sql("cannot size the page cache"))?;
    // SQLite quietly opens a file it may not write read-only; say so now
    // rather than fail at the first write. The journal is created beside the
    // file, so its folder must be writable too.
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let uid = nix::unistd::getuid();
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(true) {
        return Err(err(format!(
            "is not writable by this user (uid {uid}); apply needs write permission on the \
             file and on its folder {} (for SQLite's journal): run apply as the registry's \
             owner, or grant that user write access",
            folder.display()
        )));
    }
    if nix::unistd::access(folder, nix::unistd::AccessFlags::W_OK).is_err() {
        return Err(err(format!(
            "its folder {} is not writable by this user (uid {uid}), and SQLite writes its \
             journal there; run apply as the registry's owner, or grant write access to the folder",
            folder.display()
        )));
    }
    Ok(conn)
}

/// A SQLite registry opened for apply.
pub struct Sqlite {
    conn: Connection,
    path: PathBuf,
    /// The file the connection opened, from its own descriptor (`held`).
    file: Option<super::held::FileId>,
}

impl Sqlite {
    /// Open the registry at `path` for apply's transaction.
    pub fn open(path: &Path, busy_timeout: Duration) -> Result<Sqlite> {
        let (conn, file) =
            super::held::opened(path, true, || open_for_writing(path, busy_timeout))?;
        Ok(Sqlite {
            conn,
            path: path.to_path_buf(),
            file,
        })
    }
}

impl ApplyConnection for Sqlite {
    fn begin(&mut self) -> std::result::Result<Box<dyn ApplyTx + '_>, String> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| format!("could not take the registry's write lock: {e}"))?;
        // The schema as the lock found it, before apply's own migrations.
        let schema_at_begin = super::versions::schema_version(&tx)
            .map_err(|e| format!("could not read the registry's schema version: {e}"))?;
        Ok(Box::new(Tx {
            tx,
            schema_at_begin,
            path: &self.path,
            file: self.file,
            changes_before: 0,
            stamps: None,
            stamped: 0,
        }))
    }

    /// Not installed, and the registry table could keep versions (it has
    /// row ids no column shadows).
    fn lacks_versions(&mut self) -> Result<bool> {
        let read = || -> rusqlite::Result<bool> {
            Ok(!super::versions::installed(&self.conn)?
                && super::versions::rowid_shadowed(&self.conn)?.is_none()
                && self
                    .conn
                    .prepare(&format!(
                        "SELECT rowid FROM {} LIMIT 0",
                        crate::store::registry::TABLE
                    ))
                    .is_ok())
        };
        read().map_err(Error::sqlite(
            Store::Registry,
            &self.path,
            "cannot read whether the registry keeps row versions",
        ))
    }
}

/// Apply's transaction on a SQLite registry.
struct Tx<'c> {
    tx: rusqlite::Transaction<'c>,
    /// `PRAGMA schema_version` when the write lock was taken.
    schema_at_begin: i64,
    path: &'c Path,
    /// The file the write connection opened (`held`).
    file: Option<super::held::FileId>,
    /// `total_changes` before the first write.
    changes_before: u64,
    /// The clock this apply stamps its retirements with, when the registry
    /// keeps row versions.
    stamps: Option<i64>,
    /// Rows the stamps wrote (the clock's and each retired row's).
    stamped: u64,
}

impl Tx<'_> {
    fn err(&self, doing: &'static str) -> impl Fn(rusqlite::Error) -> Error + '_ {
        Error::sqlite(Store::Registry, self.path, doing)
    }
}

impl ApplyTx for Tx<'_> {
    fn untrusted_objects(&mut self) -> Result<Option<String>> {
        if let Some(problem) =
            super::held::write_file_problem(self.path, self.file, self.tx.path().map(Path::new))
        {
            return Ok(Some(problem));
        }
        crate::store::untrusted_objects(&self.tx, crate::store::registry::TABLE)
            .map_err(self.err("cannot inspect the schema"))
    }

    fn migrate_registry(&mut self) -> Result<()> {
        crate::store::registry::add_missing_columns(&self.tx, self.path)?;
        super::versions::install(&self.tx)
            .map_err(self.err("cannot install the row-version bookkeeping"))
    }

    fn migrate_audit(&mut self) -> Result<()> {
        crate::store::audit::create_or_migrate(&self.tx)
            .map_err(self.err("cannot create or migrate the audit table"))
    }

    fn install_versions(&mut self) -> Result<()> {
        super::versions::install(&self.tx)
            .map_err(self.err("cannot install the row-version bookkeeping"))
    }

    fn read_rows(&mut self) -> Result<Vec<Row>> {
        super::read::read_rows(&self.tx, self.path)
    }

    fn read_scope(
        &mut self,
        host_id: &str,
        also: &[String],
    ) -> Result<std::result::Result<crate::store::scope::Scope, String>> {
        super::scope::read_through_indexes(&self.tx, self.path, host_id, also)
    }

    /// A SQLite registry file never holds the lease store's table.
    fn changed_since(&mut self, since: &RowVersions) -> Result<Changes> {
        // The rows judged must come from the file this transaction writes
        // (each told from its connection's own descriptor, `held`).
        if since.file.is_none() || since.file != self.file {
            return Ok(Err(
                "the file read outside the lock is not the one apply holds open for writing \
                 (the registry's path was replaced meanwhile, or the file read could not be told)"
                    .into(),
            ));
        }
        let changed = match super::versions::changed_since(&self.tx, since, self.schema_at_begin)
            .map_err(self.err("cannot read the row versions"))?
        {
            Ok(changed) => changed,
            Err(why) => return Ok(Err(why)),
        };
        let rowids: Vec<i64> = changed.iter().map(|(_, r)| *r).collect();
        let rows = super::read::read_by_rowid(&self.tx, self.path, &rowids)?;
        Ok(Ok(changed
            .into_iter()
            .map(|(at, _)| at)
            .zip(rows)
            .collect()))
    }

    fn same_file(&mut self, since: &RowVersions) -> bool {
        since.file.is_some() && since.file == self.file
    }

    fn read_leases_here(&mut self, _leases: &Path) -> Option<Result<(String, Vec<Lease>)>> {
        None
    }

    /// The changes counted so far and the clock moved once for this
    /// apply's stamps (both next to nothing), then the targets' checks.
    fn before_writes(
        &mut self,
        _targets: &[String],
        _apply_id: &str,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<()> {
        self.changes_before = self.tx.total_changes();
        if super::versions::installed(&self.tx).map_err(self.err("cannot read the row versions"))? {
            self.stamps = Some(
                super::versions::tick(&self.tx)
                    .map_err(self.err("cannot move the registry clock"))?,
            );
            self.stamped = 1;
        }
        meanwhile();
        Ok(())
    }

    fn retire_with_audit(&mut self, row: &Row, audit: &AuditRow) -> Result<u64> {
        let (at, by, reason) = (audit.retired_at, audit.retired_by, audit.retirement_reason);
        let rowids = crate::store::registry::retire_guarded(&self.tx, row, at, by, reason)
            .map_err(self.err("the guarded UPDATE failed"))?;
        if let [rowid] = rowids[..] {
            crate::store::audit::insert(&self.tx, audit)
                .map_err(self.err("cannot write the audit row"))?;
            if let Some(clock) = self.stamps {
                super::versions::stamp(&self.tx, rowid, clock)
                    .map_err(self.err("cannot stamp the retired row's version"))?;
                self.stamped += 1;
            }
        }
        Ok(rowids.len() as u64)
    }

    /// One UPDATE and one audit row per retirement and nothing else, and
    /// this apply's audit rows there.
    fn verify_writes(&mut self, apply_id: &str, written: &[Written<'_>]) -> Result<Option<String>> {
        // A second name made while apply held the lock.
        if let Some(problem) =
            super::held::write_file_problem(self.path, self.file, self.tx.path().map(Path::new))
        {
            return Ok(Some(problem));
        }
        let n = written.len() as u64;
        let changed = self.tx.total_changes() - self.changes_before;
        if changed != 2 * n + self.stamped {
            return Ok(Some(format!(
                "the transaction changed {changed} rows where {} were meant \
                 (one retirement and one audit row per worker, and {} row-version stamps)",
                2 * n + self.stamped,
                self.stamped
            )));
        }
        let audited = crate::store::audit::count_for(&self.tx, apply_id)
            .map_err(self.err("cannot count the audit rows"))?;
        Ok((audited as u64 != n)
            .then(|| format!("{audited} audit rows were found for {n} retirements")))
    }

    /// Read under the write lock: no one can take the lease over before
    /// this transaction ends.
    fn controller_holds(
        &mut self,
        stamp: &crate::store::controller::Stamp,
    ) -> Result<Option<String>> {
        super::controller::holds(&self.tx, stamp)
            .map_err(self.err("cannot read the controller's lease"))
    }

    fn controller_record(
        &mut self,
        stamp: &crate::store::controller::Stamp,
        apply_id: &str,
        targets: usize,
    ) -> Result<Option<crate::store::seam::Refused>> {
        super::controller::record(&self.tx, stamp, apply_id, targets)
            .map_err(self.err("cannot record the controller's apply"))
    }

    fn commit(self: Box<Self>) -> Result<()> {
        let path = self.path;
        self.tx
            .commit()
            .map_err(Error::sqlite(Store::Registry, path, "commit failed"))
    }

    fn rollback(self: Box<Self>) -> Option<String> {
        self.tx
            .rollback()
            .err()
            .map(|e| format!("{e}; SQLite discards the transaction when the connection closes"))
    }
}
