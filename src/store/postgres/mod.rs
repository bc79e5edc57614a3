//! The same tables on PostgreSQL: a fleet spread over several hosts shares
//! one registry (and usually one lease store) in a PostgreSQL database.
//!
//! A store location is a SQLite file path or a `postgres://` (or
//! `postgresql://`) URL; [`is_postgres`] tells which. The tables, their
//! columns and their order are the SQLite ones (`super::registry`,
//! `super::leases`, `super::audit`), with PostgreSQL's types: `TEXT`,
//! `BIGINT` for SQLite's `INTEGER`, `DOUBLE PRECISION` for `REAL`.
//!
//! Values keep their kind. A PostgreSQL column has one type where a SQLite
//! column may hold any storage class, so a value is read as its column's
//! type says (`TEXT` → text, `BIGINT`/`INTEGER`/`SMALLINT` → integer,
//! `DOUBLE PRECISION` → real), and a column of any other type stops the
//! read: a kind we do not read faithfully would change the canonical text
//! every token hashes. Writing is strict the same way ([`to_sql`]): a value
//! whose kind its column cannot hold (SQLite text `"abc"` in `pid`) is
//! refused, never coerced, so a copied registry reads back value for value.

use crate::error::{About, Error, Result, Store};
use crate::row::{Col, Row, COLUMNS};
use crate::value::{Val, Value};
use postgres::types::{ToSql, Type};
use postgres::{Client, GenericClient};

pub mod apply;
pub mod controller;
pub mod failover;
pub mod image;
pub mod leases;
mod read;
mod schema;
pub mod scope;
pub mod shape;
pub mod stall;
pub mod tls;
pub mod versions;
pub mod worker;
mod write;

pub use super::location::{is_postgres, PgUrl};
pub use read::*;
pub use schema::*;
pub use shape::{enabled_event_triggers, untrusted_objects};
use shape::{lease_shape_problem, no_event_trigger};
pub use write::*;

/// A store in the PostgreSQL database a URL names.
pub struct Postgres {
    url: PgUrl,
    /// The location as given: two stores given the same text are one
    /// database (the leases beside the registry).
    location: std::path::PathBuf,
}

impl Postgres {
    /// The store at `url` (connected to by each job as it needs).
    pub fn at(url: PgUrl, location: &std::path::Path) -> Postgres {
        Postgres {
            url,
            location: location.to_path_buf(),
        }
    }
}

impl Postgres {
    /// `read` in one read-only `REPEATABLE READ` transaction: one snapshot.
    fn in_one_snapshot<T>(
        &self,
        read: impl FnOnce(&mut postgres::Transaction<'_>, &str) -> Result<T>,
    ) -> Result<T> {
        let label = self.url.to_string();
        let mut client = connect_to(&self.url, Store::Registry)?;
        let err = |doing| Error::postgres(Store::Registry, &label, doing);
        let mut tx = client
            .build_transaction()
            .read_only(true)
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .start()
            .map_err(err("cannot begin a read"))?;
        let out = read(&mut tx, &label)?;
        tx.commit().map_err(err("cannot end the read"))?;
        Ok(out)
    }
}

impl crate::store::seam::Engine for Postgres {
    fn label(&self) -> String {
        self.url.to_string()
    }

    /// In one read-only transaction: one snapshot of the table.
    fn read_registry(&self) -> Result<Vec<Row>> {
        self.in_one_snapshot(|tx, label| read_registry(tx, label))
    }

    /// In one read-only transaction: one snapshot for every statement.
    fn read_scope(&self, host_id: &str) -> Result<crate::store::scope::Scope> {
        self.in_one_snapshot(|tx, label| scope::load(tx, label, host_id, &[]))
    }

    /// In one read-only snapshot: the rows, the snapshot, the server and
    /// the catalog's stamp, when the change record is installed and whole
    /// (`versions`).
    fn read_registry_versioned(
        &self,
    ) -> Option<Result<(Vec<Row>, crate::store::seam::RowVersions)>> {
        let read = |tx: &mut postgres::Transaction<'_>, label: &str| {
            // The first statement takes the snapshot every later one reads.
            let snapshot = versions::snapshot(tx, label)?;
            if versions::vouches(tx, label)?.is_some() {
                return Ok(None);
            }
            let server = versions::server(tx, label)?;
            let catalog = versions::catalog_stamp(tx, label)?;
            let rows = read_registry(tx, label)?;
            Ok(Some((rows, snapshot, server, catalog)))
        };
        let (rows, snapshot, server, catalog) = match self.in_one_snapshot(read) {
            Ok(Some(read)) => read,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let mut positions: std::collections::HashMap<String, Vec<usize>> =
            std::collections::HashMap::with_capacity(rows.len());
        for (at, row) in rows.iter().enumerate() {
            if let Some(id) = row.get(Col::WorkerIdentity).as_text() {
                positions.entry(id.to_string()).or_default().push(at);
            }
        }
        let mark = crate::store::seam::ServerMark {
            snapshot,
            server,
            catalog,
            positions,
        };
        Some(Ok((
            rows,
            crate::store::seam::RowVersions {
                schema_version: 0,
                clock: 0,
                rowids: Vec::new(),
                file: None,
                pin: None,
                server: Some(mark),
            },
        )))
    }

    fn read_leases(&self) -> Result<Vec<super::leases::Lease>> {
        let mut client = connect_to(&self.url, Store::Leases)?;
        read_leases(&mut client, &self.url.to_string(), false)
    }

    fn fence_source(&self) -> Result<Box<dyn crate::store::seam::FenceSource>> {
        Ok(Box::new(leases::Fence::open(&self.url)?))
    }

    fn apply_connection(
        &self,
        busy_timeout: std::time::Duration,
    ) -> Result<Box<dyn crate::store::seam::ApplyConnection>> {
        Ok(Box::new(apply::Postgres::open(
            &self.url,
            &self.location,
            busy_timeout,
        )?))
    }

    fn worker_rows(&self) -> Result<Box<dyn crate::store::seam::WorkerRows>> {
        Ok(Box::new(worker::PgLease::take(&self.url, &self.location)?))
    }

    fn controller_rows(
        &self,
        busy: std::time::Duration,
    ) -> Result<Box<dyn crate::store::seam::ControllerRows>> {
        Ok(Box::new(controller::Rows::open(&self.url, busy)?))
    }

    /// Read on the server the URL reaches (the writable member, with
    /// `target_session_attrs=read-write`), after taking the audit table in
    /// SHARE mode: a transaction that wrote audit rows holds it in ROW
    /// EXCLUSIVE mode until its COMMIT is done or undone, so a COMMIT still
    /// in flight is waited for, and the answer is final.
    fn audit_of(
        &self,
        apply_id: &str,
        wait: std::time::Duration,
    ) -> Result<Vec<crate::store::seam::Recorded>> {
        let label = self.url.to_string();
        let mut client = connect_to(&self.url, Store::Registry)?;
        let err = |doing| Error::postgres(Store::Registry, &label, doing);
        // READ COMMITTED whatever the database's default: the read after
        // the lock must see what a COMMIT in flight committed, not a
        // snapshot taken before it.
        let mut tx = client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::ReadCommitted)
            .start()
            .map_err(err("cannot begin a read"))?;
        let millis = wait.as_millis().clamp(1, i32::MAX as u128);
        tx.batch_execute(&format!("SET LOCAL lock_timeout = {millis}"))
            .map_err(err("cannot set the lock timeout"))?;
        let table = crate::store::audit::TABLE;
        let exists: bool = tx
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .and_then(|r| r.try_get(0))
            .map_err(err("cannot look for the audit table"))?;
        if !exists {
            return Err(crate::store::audit::absent(&label));
        }
        tx.batch_execute(&format!("LOCK TABLE {table} IN SHARE MODE"))
            .map_err(err("cannot wait for transactions writing the audit"))?;
        let rows = tx
            .query(
                &format!(
                    "SELECT worker_identity, retired_at, retired_by FROM {table} \
                     WHERE apply_id = $1 ORDER BY worker_identity"
                ),
                &[&apply_id],
            )
            .map_err(err("cannot read the audit"))?;
        let recorded = rows
            .iter()
            .map(|r| {
                Ok(crate::store::seam::Recorded {
                    worker_identity: r.try_get(0)?,
                    retired_at: r.try_get(1)?,
                    retired_by: r.try_get(2)?,
                })
            })
            .collect::<std::result::Result<Vec<_>, postgres::Error>>()
            .map_err(err("cannot read the audit"))?;
        tx.commit().map_err(err("cannot end the read"))?;
        Ok(recorded)
    }
}

/// A failure of `store` named `label` that the driver did not report.
fn store_error(store: Store, label: &str, message: String) -> Error {
    let shown = label.to_string();
    match store {
        Store::Registry => Error::Registry { shown, message },
        Store::Leases => Error::Leases { shown, message },
    }
}

/// How long a connection attempt may take before it is an error.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connect to the database a store URL names, with the session's
/// `search_path` pinned ([`pin_search_path`]).
pub fn connect(url: &str, store: Store) -> Result<Client> {
    let url = PgUrl::parse(url).map_err(|e| {
        Error::input(
            About::Option("--registry"),
            format!(
                "{store} postgres://…: not a PostgreSQL URL this program can read ({e}); write \
             it as postgres://USER@HOST:PORT/DATABASE, with the password in PGPASSWORD"
            ),
        )
    })?;
    connect_to(&url, store)
}

/// Connect to a parsed URL, with the session's `search_path` pinned, the
/// connection watched ([`stall`]): given up on once its server has said
/// nothing, on it or to a probe, for the bound.
pub fn connect_to(url: &PgUrl, store: Store) -> Result<Client> {
    connect_watched(url, store).map(|(client, _)| client)
}

/// [`connect_to`], with the flag that marks the connection idle while its
/// holder keeps it unused.
pub fn connect_watched(url: &PgUrl, store: Store) -> Result<(Client, stall::Idle)> {
    let label = url.to_string();
    let mut config = url.config().clone();
    config.application_name("fleet-retire");
    tls::bound_waits(&mut config);
    // A password on a command line is visible to every user of the host;
    // libpq's PGPASSWORD keeps it out of the URL.
    if config.get_password().is_none() {
        if let Some(password) = std::env::var_os("PGPASSWORD") {
            config.password(password.as_encoded_bytes());
        }
    }
    let connector = tls::connector(url.tls())
        .map_err(|message| store_error(store, &label, format!("cannot set up TLS: {message}")))?;
    tls::warn_if_unverified(url);
    // One connect at a time in this process: the watch takes the sockets
    // that appeared during the connect for this connection's, and another
    // thread's connect meanwhile would give its socket this one's idle
    // flag (a pooled worker connection, idle by its own flag, was cut as
    // this one's "in use").
    static CONNECTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = CONNECTING.lock().unwrap_or_else(|p| p.into_inner());
    let before = stall::sockets();
    let wait = failover::election_wait(&config);
    let limit = CONNECT_TIMEOUT + stall::reply_bound();
    let mut client = match failover::connect(&config, &connector, wait, limit) {
        Ok(client) => client,
        Err(failover::Failed::Postgres(e)) => {
            return Err(Error::postgres(store, &label, "cannot connect")(e))
        }
        Err(failover::Failed::Unfinished(limit)) => {
            let message = format!(
                "cannot connect: the server accepted the connection and did not complete it \
                 within {} s (TLS, startup or authentication); is it frozen or overloaded?",
                limit.as_secs()
            );
            return Err(store_error(store, &label, message));
        }
    };
    let idle = stall::watch_new(&before);
    pin_search_path(&mut client, store, &label)?;
    Ok((client, idle))
}

/// Name resolution that the database cannot steer. The schema our tables
/// live in is the one the session starts in (`current_schema()`, asked by
/// its qualified name before anything else runs); the session's
/// `search_path` then becomes that schema alone. PostgreSQL searches
/// `pg_catalog` before every schema of a path that does not name it, so
/// every function, operator, type and collation we name resolves to
/// PostgreSQL's own first (an `=` for `text` planted in `public` under
/// `ALTER DATABASE … SET search_path = public, pg_catalog` is never
/// chosen), our tables resolve in our schema, and tables we create go
/// there (the first schema of the path, never `pg_catalog`). `pg_temp` is
/// named last: unnamed, PostgreSQL searches it first for tables and views,
/// and a temporary view a function made mid-transaction would stand in for
/// our table (docs/security.md, row 41.12).
pub fn pin_search_path(client: &mut Client, store: Store, label: &str) -> Result<()> {
    let err = Error::postgres(store, label, "cannot pin the session's search_path");
    let row = client
        .query_one("SELECT pg_catalog.current_schema()::pg_catalog.text", &[])
        .map_err(err)?;
    let schema: Option<String> = row.get(0);
    let schema = schema.ok_or_else(|| {
        Error::input(
            About::Option("--registry"),
            format!(
                "{store} {label}: the session has no schema (its search_path names none that \
             exists); set the role's or database's search_path to the schema holding the \
             registry tables"
            ),
        )
    })?;
    if let Some(why) = tables_in_two_schemas(client, &schema).map_err(err)? {
        return Err(Error::input(
            About::Option(match store {
                Store::Leases => "--leases",
                _ => "--registry",
            }),
            format!("{store} {label}: {why}"),
        ));
    }
    client
        .execute(
            "SELECT pg_catalog.set_config('search_path', \
             pg_catalog.quote_ident($1::pg_catalog.text) || ', pg_temp', false)",
            &[&schema],
        )
        .map_err(err)?;
    Ok(())
}

/// Why the session's `search_path` is ambiguous about our tables, if it
/// is: one of them exists in more than one of its schemas. This program
/// reads the first (`current_schema()`, often a schema named after the
/// role, `"$user"`), while workers whose path differs write another: an
/// empty `workflow_leases` in the controller's own schema would hide every
/// lease the workers hold in `public` (docs/security.md, row 41.11).
fn tables_in_two_schemas(
    client: &mut Client,
    first: &str,
) -> std::result::Result<Option<String>, postgres::Error> {
    let ours = [
        crate::store::registry::TABLE,
        crate::store::audit::TABLE,
        crate::store::leases::TABLE,
    ];
    let rows = client.query(
        "SELECT c.relname::pg_catalog.text, \
           pg_catalog.string_agg(n.nspname::pg_catalog.text, ', ' ORDER BY n.nspname) \
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relname::pg_catalog.text = ANY($1) \
           AND n.nspname = ANY(pg_catalog.current_schemas(false)) \
         GROUP BY c.relname HAVING pg_catalog.count(*) > 1 ORDER BY 1",
        &[&&ours[..]],
    )?;
    if rows.is_empty() {
        return Ok(None);
    }
    let found: Vec<String> = rows
        .iter()
        .map(|r| format!("{} (in {})", r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect();
    Ok(Some(format!(
        "{} exist in more than one schema of the session's search_path; this program would \
         read the one in {first:?} while others may write another. Keep one table of each \
         name on the path: set the role's search_path to the schema that holds them \
         (ALTER ROLE … SET search_path = …), or drop the other",
        found.join(", ")
    )))
}

pub use super::quote_ident;

fn registry_error(label: &str, message: impl Into<String>) -> Error {
    Error::Registry {
        shown: label.into(),
        message: message.into(),
    }
}

fn lease_error(label: &str, message: impl Into<String>) -> Error {
    Error::Leases {
        shown: label.into(),
        message: message.into(),
    }
}

/// Whether a PostgreSQL error is a serialization failure or a deadlock: the
/// transaction lost a race with another and may simply be tried again.
pub fn is_serialization_failure(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    })
}
