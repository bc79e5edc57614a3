//! The seam between the program and a storage engine: the four jobs every
//! engine does, as traits. Everything above `store` (observe, judge, plan,
//! apply's story, the worker commands, serve) is written once against these
//! and never asks which engine it runs on; each engine is one folder under
//! `store/` (`sqlite/`, `postgres/`) implementing them, and
//! [`super::open::engine`] is the one place a location picks its engine.
//!
//! 1. Reading the registry: [`Engine::read_registry`], or one host's
//!    scope of it, [`Engine::read_scope`].
//! 2. Reading leases: [`Engine::read_leases`], and [`FenceSource`] for the
//!    fence apply re-reads while it writes.
//! 3. The guarded apply transaction: [`ApplyConnection`] and [`ApplyTx`],
//!    one method per step of docs/semantics.md §10 that an engine says its
//!    own way (shapes refused, migrations, the authoritative read, the
//!    image before the first write, the guarded write with its audit row,
//!    the check of the effect before COMMIT, COMMIT).
//! 4. A worker's own row: [`WorkerRows`] (register, heartbeat, release).
//! 5. The controller's own rows: [`ControllerRows`] (its lease, its budget,
//!    the change signal), and inside apply's transaction
//!    [`ApplyTx::controller_holds`] and [`ApplyTx::controller_record`].

use super::audit::AuditRow;
use super::controller::{Acquired, Bucket, ChangesSince, Stamp};
use super::leases::Lease;
use crate::error::Result;
use crate::row::Row;
use std::path::Path;
use std::time::Duration;

/// One storage engine at one location.
pub trait Engine {
    /// The location for messages, reports and audit rows (a URL's password
    /// never shows).
    fn label(&self) -> String;

    /// Every registration, read-only, in one snapshot of the table.
    fn read_registry(&self) -> Result<Vec<Row>>;

    /// This host's scope (`store::scope`: `plan --scope host`): its active
    /// rows, the peer rows their verdicts depend on, and a count of its
    /// other rows, read-only, in one snapshot.
    fn read_scope(&self, host_id: &str) -> Result<super::scope::Scope>;

    /// Every lease row, read-only (never "no leases" for a store that
    /// cannot be read).
    fn read_leases(&self) -> Result<Vec<Lease>>;

    /// The registry read outside apply's lock, with where it stood
    /// ([`RowVersions`]), when the engine keeps row versions and this
    /// registry has them; `None` otherwise (apply then judges under its
    /// lock alone).
    fn read_registry_versioned(&self) -> Option<Result<(Vec<Row>, RowVersions)>> {
        None
    }

    /// The lease store opened for apply's fence.
    fn fence_source(&self) -> Result<Box<dyn FenceSource>>;

    /// The registry opened for apply's transaction (it must exist).
    fn apply_connection(&self, busy_timeout: Duration) -> Result<Box<dyn ApplyConnection>>;

    /// The registry opened for a worker's writes to its own row (created or
    /// migrated when needed).
    fn worker_rows(&self) -> Result<Box<dyn WorkerRows>>;

    /// The registry opened for the controller's lease and budget, its
    /// tables created when missing (by a role allowed to; any other gets an
    /// error saying so); each write waits at most `busy` for a lock.
    fn controller_rows(&self, busy: Duration) -> Result<Box<dyn ControllerRows>> {
        let _ = busy;
        Err(crate::error::Error::Registry {
            shown: self.label(),
            message: "this engine does not keep a controller's lease yet; run the controller on \
                      a SQLite registry"
                .into(),
        })
    }

    /// The retirements the audit table records under `apply_id`, read once
    /// no transaction is still writing that table (waited for at most
    /// `wait`): empty when that apply did not commit.
    fn audit_of(&self, apply_id: &str, wait: Duration) -> Result<Vec<Recorded>>;
}

/// One retirement an apply's audit row records.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Recorded {
    /// The worker retired.
    pub worker_identity: String,
    /// When.
    pub retired_at: String,
    /// By which profile.
    pub retired_by: String,
}

/// The rows changed since a [`RowVersions`] marker, each with its position
/// in the rows read then (`None` for a row deleted since); `Err` says why
/// the engine cannot vouch for the rows it does not return.
pub type Changes = std::result::Result<Vec<(usize, Option<Row>)>, String>;

/// Where a registry stood when it was read outside apply's lock
/// (`store::sqlite::versions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowVersions {
    /// The schema's version (SQLite's `PRAGMA schema_version`): any DDL
    /// since moves it.
    pub schema_version: i64,
    /// The registry clock.
    pub clock: i64,
    /// The rowid of each row read, in the order read (rowid order).
    pub rowids: Vec<i64>,
    /// The file the rows were read from (device and inode of the reading
    /// connection's own descriptor), when it could be told: under the lock
    /// the versions vouch only if it is the file apply writes.
    pub file: Option<(u64, u64)>,
    /// What keeps that file open while the marker lives (the connection
    /// that read it), so its inode cannot be freed and given to another
    /// file (a journal, say) before apply compares it.
    pub pin: Option<Pin>,
    /// Where a database server's registry stood (PostgreSQL,
    /// `store::postgres::versions`); `None` for a file.
    pub server: Option<ServerMark>,
}

/// Where a PostgreSQL registry stood when it was read outside apply's
/// transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerMark {
    /// The read's snapshot (`pg_current_snapshot()`).
    pub snapshot: String,
    /// Which server and database (its start time: a failover moves it).
    pub server: String,
    /// The catalog rows that shape our tables, with their writers.
    pub catalog: String,
    /// Each worker identity read, with its positions in the rows read.
    pub positions: std::collections::HashMap<String, Vec<usize>>,
}

/// Something an engine keeps alive beside a marker; compared as equal
/// always (it only holds a file open).
#[derive(Clone)]
pub struct Pin(pub std::sync::Arc<dyn std::any::Any + Send + Sync>);

impl std::fmt::Debug for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pin")
    }
}

impl PartialEq for Pin {
    fn eq(&self, _: &Pin) -> bool {
        true
    }
}

impl Eq for Pin {}

/// A lease store as apply's fence reads it, again and again while it
/// writes: each read sees what other connections have committed.
pub trait FenceSource {
    /// The store's name for messages and audit rows.
    fn label(&self) -> String;

    /// Something that changes whenever the active leases may have.
    fn version(&mut self) -> Result<String>;

    /// A cheaper proof than [`FenceSource::version`] that nothing was
    /// committed, where the engine has one (SQLite's file header in
    /// rollback-journal mode); `None` where it has not.
    fn header(&self) -> Option<[u8; 10]> {
        None
    }

    /// The active leases (status exactly `active`).
    fn read_active(&mut self) -> Result<Vec<Lease>>;

    /// Whether [`FenceSource::version`] costs next to nothing (SQLite: a
    /// counter in the file), so apply checks the fence before every write;
    /// otherwise (PostgreSQL: a digest over the active leases on the
    /// server) before the first write and before COMMIT (docs/apply.md).
    fn cheap_to_check(&self) -> bool {
        false
    }
}

/// An open registry, before apply's transaction.
pub trait ApplyConnection {
    /// Begin the transaction (SQLite: the write lock; PostgreSQL:
    /// SERIALIZABLE); the failure as the report says it.
    fn begin(&mut self) -> std::result::Result<Box<dyn ApplyTx + '_>, String>;

    /// Whether the registry lacks the row-version bookkeeping it could keep
    /// (SQLite: a registry the seed made, before its first apply;
    /// PostgreSQL 13 or later: the change record not yet installed). Apply
    /// then installs it in a short transaction of its own before it judges
    /// ([`ApplyTx::install_versions`]), so its judgement can be made outside
    /// the lock. Read without a lock.
    fn lacks_versions(&mut self) -> Result<bool> {
        Ok(false)
    }

    /// Before a transaction tried again after a serialization failure:
    /// wait (at most the busy timeout) until no other apply trying again
    /// runs its transaction, held until [`ApplyConnection::end_turn`] (or
    /// the connection closes), so applies that collided take turns instead
    /// of colliding again (PostgreSQL; a no-op where the transaction holds
    /// the write lock already).
    fn take_turn(&mut self) -> Result<()> {
        Ok(())
    }

    /// The turn taken by [`ApplyConnection::take_turn`] given up, once the
    /// last attempt has ended (committed, refused or failed), so the next
    /// apply waiting need not wait for this one's work after COMMIT.
    /// Without a turn held, nothing.
    fn end_turn(&mut self) {}
}

/// Apply's transaction on the registry: the steps of docs/semantics.md §10
/// that each engine says its own way. Dropping it rolls it back.
pub trait ApplyTx {
    /// Why the registry could make apply's writes differ from its report,
    /// if it could (triggers, views, rules, code run by a write, …).
    fn untrusted_objects(&mut self) -> Result<Option<String>>;

    /// Add the registry columns the table lacks.
    fn migrate_registry(&mut self) -> Result<()>;

    /// Create the audit table, or add the columns it lacks.
    fn migrate_audit(&mut self) -> Result<()>;

    /// Install the row-version bookkeeping alone (nothing else is written),
    /// for [`ApplyConnection::lacks_versions`]: committed on its own, it
    /// stays whatever the apply that installed it ends in.
    fn install_versions(&mut self) -> Result<()> {
        Ok(())
    }

    /// The authoritative read of every registration.
    fn read_rows(&mut self) -> Result<Vec<Row>>;

    /// The authoritative read of a host-scoped apply: host `host_id`'s
    /// scope (`store::scope`) through its indexes, with every row of an
    /// identity in `also` (any status) among its peers, so a requested
    /// worker retired since is seen. `Err` with the reason, before any row
    /// is read and with the transaction intact, when the indexes cannot be
    /// trusted here (one missing, of another shape, or over an expression;
    /// a collation's version moved): apply then reads every row
    /// ([`ApplyTx::read_rows`]) and takes the scope from them
    /// (`store::scope::from_whole_read`).
    fn read_scope(
        &mut self,
        host_id: &str,
        also: &[String],
    ) -> Result<std::result::Result<super::scope::Scope, String>>;

    /// The rows changed since `since` was read, as they stand now: each
    /// with its position in the rows read then (`None` for a row deleted
    /// since). `Err` with the reason when the engine cannot vouch for the
    /// rows it does not return (apply then reads the whole registry).
    fn changed_since(&mut self, since: &RowVersions) -> Result<Changes> {
        let _ = since;
        Ok(Err("this engine keeps no row versions".into()))
    }

    /// Whether the rows read with `since` were read from the very file
    /// this transaction writes (SQLite: each told from its connection's
    /// own descriptor); `false` where the engine cannot tell.
    fn same_file(&mut self, since: &RowVersions) -> bool {
        let _ = since;
        false
    }

    /// When the lease store at `leases` is this same database, its version
    /// and active leases read inside this transaction (one snapshot with
    /// the registry); `None` when it is elsewhere.
    fn read_leases_here(&mut self, leases: &Path) -> Option<Result<(String, Vec<Lease>)>>;

    /// Before the first write: what [`ApplyTx::verify_writes`] compares
    /// with. `targets` are the identities apply may write, `apply_id` the
    /// id its audit rows will carry. `meanwhile` (the targets' own checks,
    /// which need nothing of this transaction) is run exactly once, while
    /// the image is taken where the engine can do both at once (PostgreSQL:
    /// the server digests the rows while this process judges the targets),
    /// else after it; no write is made before both are done.
    fn before_writes(
        &mut self,
        targets: &[String],
        apply_id: &str,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<()>;

    /// The guarded UPDATE of one row and, when it changed exactly one row,
    /// its audit row; the number of rows the UPDATE changed.
    fn retire_with_audit(&mut self, row: &Row, audit: &AuditRow) -> Result<u64>;

    /// The guarded UPDATE and audit row of every retirement, in one step
    /// where the engine can (PostgreSQL: one statement over arrays); per
    /// retirement, in order, the rows its UPDATE changed. By default, one
    /// [`ApplyTx::retire_with_audit`] after another.
    fn retire_all(&mut self, batch: &[(&Row, AuditRow<'_>)]) -> Result<Vec<u64>> {
        batch
            .iter()
            .map(|(row, audit)| self.retire_with_audit(row, audit))
            .collect()
    }

    /// Before COMMIT: whether the transaction changed exactly the
    /// retirements in `written` and their audit rows; what differs when it
    /// did not.
    fn verify_writes(&mut self, apply_id: &str, written: &[Written<'_>]) -> Result<Option<String>>;

    /// For an apply a controller makes: why `stamp`'s lease is no longer
    /// its own with the same term and unexpired, read inside this
    /// transaction (`None` when it is). An engine without a controller's
    /// lease says so, and the apply is refused.
    fn controller_holds(&mut self, stamp: &Stamp) -> Result<Option<String>> {
        let _ = stamp;
        Ok(Some("this engine keeps no controller lease".into()))
    }

    /// For an apply a controller makes, once its targets are known and
    /// before the first write (so the effect check does not count it):
    /// spend `targets` tokens of the host's budget and record the apply's
    /// term and tick under `apply_id`. Why not, when the budget is another
    /// term's (a takeover) or lacks them.
    fn controller_record(
        &mut self,
        stamp: &Stamp,
        apply_id: &str,
        targets: usize,
    ) -> Result<Option<Refused>> {
        let _ = (stamp, apply_id, targets);
        Ok(Some(Refused::Lease(
            "this engine keeps no controller budget".into(),
        )))
    }

    /// COMMIT.
    fn commit(self: Box<Self>) -> Result<()>;

    /// ROLLBACK; the failure, if it failed, for the report.
    fn rollback(self: Box<Self>) -> Option<String>;
}

/// What one retirement wrote: the target and its four retirement columns.
pub struct Written<'a> {
    /// The retired worker.
    pub worker_identity: &'a str,
    /// `status`, `retired_at`, `retired_by`, `retirement_reason` as set.
    pub retirement: [&'a str; 4],
}

/// The registered process of a worker's active row, as the row records it.
#[derive(Debug, Clone)]
pub struct ActiveOwner {
    /// Its pid.
    pub pid: i64,
    /// Its recorded start time.
    pub start: Option<String>,
    /// `host_id`, `boot_id` and `pid_namespace` as recorded (text or null).
    pub fencing: serde_json::Value,
}

/// A worker's writes to its own row. Each is one short statement touching
/// only that row, so an apply running meanwhile never makes it wait long.
pub trait WorkerRows {
    /// The status of the row with this identity, if there is one.
    fn status_of(&mut self, identity: &str) -> Result<Option<String>>;

    /// Insert a new registration, given as column → JSON value.
    fn insert(&mut self, row: &serde_json::Map<String, serde_json::Value>) -> Result<()>;

    /// The active row's registered process, when it has a pid.
    fn owner_of(&mut self, worker: &str) -> Result<Option<ActiveOwner>>;

    /// Set `column` of the worker's active row to `value` if its pid is
    /// still `pid`; the rows changed. `column` is one of ours, never input.
    fn set(
        &mut self,
        column: &'static str,
        value: &str,
        worker: &str,
        pid: i64,
        doing: &'static str,
    ) -> Result<u64>;
}

/// The controller's own rows in the registry's database: its lease (a
/// compare-and-set on the database's clock where it has one), the host's
/// budget, and a cheap signal that the registry changed.
pub trait ControllerRows: Send {
    /// Take the lease of `scope` when it is free or expired (a new term),
    /// or renew it when `holder` holds it unexpired; else who does.
    fn acquire(
        &mut self,
        scope: &str,
        holder: &str,
        ttl: Duration,
        bucket: Bucket,
    ) -> Result<Acquired>;

    /// Give the lease up, if `holder` still holds it under `term`.
    fn release(&mut self, scope: &str, holder: &str, term: i64) -> Result<bool>;

    /// The tokens the host's budget holds now (0 without a lease row).
    fn budget(&mut self, scope: &str, bucket: Bucket) -> Result<f64>;

    /// Where the registry's change record stands now (a mark), and what
    /// changed since `since` (a mark this store gave before; `None`:
    /// nothing to compare with), each changed row read as it is now, at
    /// most `limit` of them. `None` when the registry keeps no change
    /// record (then only time drives ticks). The controller's own rows
    /// never count as a change.
    fn changes(
        &mut self,
        since: Option<&str>,
        limit: usize,
    ) -> Result<Option<(String, ChangesSince)>>;

    /// Which server answers, in words that change when another one does
    /// (a failover) or it restarts; `None` for an engine without one.
    fn server(&mut self) -> Result<Option<String>> {
        Ok(None)
    }
}

/// Why a controller's apply may not spend its host's budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The lease (or the budget's term) is no longer this controller's.
    Lease(String),
    /// The budget lacks the tokens.
    Budget(String),
}
