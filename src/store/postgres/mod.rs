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
use postgres::{Client, GenericClient, NoTls};

pub mod apply;
pub mod image;
pub mod leases;
pub mod shape;
pub mod worker;

pub use super::location::{is_postgres, PgUrl};
pub use shape::{enabled_event_triggers, untrusted_objects};
use shape::{lease_shape_problem, no_event_trigger};

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

impl crate::store::seam::Engine for Postgres {
    fn label(&self) -> String {
        self.url.to_string()
    }

    /// In one read-only transaction: one snapshot of the table.
    fn read_registry(&self) -> Result<Vec<Row>> {
        let label = self.url.to_string();
        let mut client = connect_to(&self.url, Store::Registry)?;
        let err = |doing| Error::postgres(Store::Registry, &label, doing);
        let mut tx = client
            .build_transaction()
            .read_only(true)
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .start()
            .map_err(err("cannot begin a read"))?;
        let rows = read_registry(&mut tx, &label)?;
        tx.commit().map_err(err("cannot end the read"))?;
        Ok(rows)
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

/// Connect to a parsed URL, with the session's `search_path` pinned.
pub fn connect_to(url: &PgUrl, store: Store) -> Result<Client> {
    let label = url.to_string();
    let mut config = url.config().clone();
    config
        .application_name("fleet-retire")
        .connect_timeout(CONNECT_TIMEOUT);
    // A password on a command line is visible to every user of the host;
    // libpq's PGPASSWORD keeps it out of the URL.
    if config.get_password().is_none() {
        if let Some(password) = std::env::var_os("PGPASSWORD") {
            config.password(password.as_encoded_bytes());
        }
    }
    let mut client =
        config
            .connect(NoTls)
            .map_err(Error::postgres(store, &label, "cannot connect"))?;
    pin_search_path(&mut client, store, &label)?;
    Ok(client)
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
/// there (the first schema of the path, never `pg_catalog`).
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
    client
        .execute(
            "SELECT pg_catalog.set_config('search_path', \
             pg_catalog.quote_ident($1::pg_catalog.text), false)",
            &[&schema],
        )
        .map_err(err)?;
    Ok(())
}

pub use super::quote_ident;

/// PostgreSQL's type for a registry column.
pub fn registry_type(col: Col) -> &'static str {
    match super::registry::sql_type(col) {
        "TEXT PRIMARY KEY" => "TEXT PRIMARY KEY",
        "INTEGER" => "BIGINT",
        "REAL" => "DOUBLE PRECISION",
        _ => "TEXT",
    }
}

/// PostgreSQL's type for a SQLite column type of ours.
fn from_sqlite_type(ty: &str) -> String {
    ty.replace("INTEGER", "BIGINT")
        .replace("REAL", "DOUBLE PRECISION")
}

/// The statement that creates the registry table.
pub fn registry_create_sql() -> String {
    let cols: Vec<String> = COLUMNS
        .iter()
        .map(|c| format!("{} {}", quote_ident(c.name()), registry_type(*c)))
        .collect();
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({})",
        super::registry::TABLE,
        cols.join(", ")
    )
}

/// The statement that creates the lease table.
pub fn leases_create_sql() -> String {
    from_sqlite_type(&super::leases::create_sql()).replacen(
        "CREATE TABLE",
        "CREATE TABLE IF NOT EXISTS",
        1,
    )
}

/// The statement that creates the audit table.
fn audit_create_sql() -> String {
    let cols: Vec<String> = super::audit::COLUMNS
        .iter()
        .map(|(n, t)| format!("{n} {}", from_sqlite_type(t)))
        .collect();
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({} BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, {})",
        super::audit::TABLE,
        super::audit::KEY,
        cols.join(", ")
    )
}

/// One lock key for every schema change, so workers registering at once
/// and an apply do not race each other's `CREATE TABLE`.
const SCHEMA_LOCK: i64 = 0x666c_6565_7472_6574; // "fleetret"

/// Create the registry table, or add the columns it lacks, in one
/// transaction under the schema lock. Unknown columns are left alone.
pub fn create_or_migrate_registry(client: &mut Client, label: &str) -> Result<()> {
    let err = |doing| Error::postgres(Store::Registry, label, doing);
    let mut tx = client
        .transaction()
        .map_err(err("cannot begin the migration"))?;
    migrate_registry_in(&mut tx, label)?;
    tx.commit().map_err(err("cannot commit the migration"))
}

/// The registry's creation or migration inside a transaction the caller
/// holds (apply's own, so a refused apply leaves no trace).
pub fn migrate_registry_in(tx: &mut impl GenericClient, label: &str) -> Result<()> {
    let err = |doing| Error::postgres(Store::Registry, label, doing);
    let complete = |cols: &Option<Vec<(String, String)>>| {
        cols.as_ref().is_some_and(|cols| {
            COLUMNS
                .iter()
                .all(|c| cols.iter().any(|(n, _)| n == c.name()))
        })
    };
    // Only a change takes the lock: applies and workers on a current
    // schema never wait for each other here.
    if complete(&table_columns(
        tx,
        super::registry::TABLE,
        Store::Registry,
        label,
    )?) {
        return Ok(());
    }
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
        .map_err(err("cannot take the schema lock"))?;
    no_event_trigger(tx, label, "before")?;
    tx.batch_execute(&registry_create_sql())
        .map_err(err("cannot create the registry table"))?;
    let existing =
        table_columns(tx, super::registry::TABLE, Store::Registry, label)?.unwrap_or_default();
    for col in COLUMNS
        .iter()
        .filter(|c| !existing.iter().any(|(n, _)| n == c.name()))
    {
        let ty = registry_type(*col).trim_end_matches(" PRIMARY KEY");
        tx.batch_execute(&format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {ty}",
            super::registry::TABLE,
            quote_ident(col.name())
        ))
        .map_err(err("cannot add a missing column"))?;
    }
    no_event_trigger(tx, label, "after")
}

/// Create the audit table, or add the columns an older one lacks.
pub fn migrate_audit_in(tx: &mut impl GenericClient, label: &str) -> Result<()> {
    let err = |doing| Error::postgres(Store::Registry, label, doing);
    let existing = table_columns(tx, super::audit::TABLE, Store::Registry, label)?;
    if existing.as_ref().is_some_and(|cols| {
        super::audit::COLUMNS
            .iter()
            .all(|(n, _)| cols.iter().any(|(c, _)| c == n))
    }) {
        return Ok(());
    }
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
        .map_err(err("cannot take the schema lock"))?;
    no_event_trigger(tx, label, "before")?;
    tx.batch_execute(&audit_create_sql())
        .map_err(err("cannot create the audit table"))?;
    let existing =
        table_columns(tx, super::audit::TABLE, Store::Registry, label)?.unwrap_or_default();
    for (name, ty) in super::audit::COLUMNS
        .iter()
        .filter(|(n, _)| !existing.iter().any(|(c, _)| c == n))
    {
        let ty = from_sqlite_type(ty.trim_end_matches(" NOT NULL"));
        tx.batch_execute(&format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {ty}",
            super::audit::TABLE,
            quote_ident(name)
        ))
        .map_err(err("cannot add a missing audit column"))?;
    }
    no_event_trigger(tx, label, "after")
}

/// Create the lease table when it does not exist (tests, benchmarks, the
/// demo and `registry copy`; the control plane owns a real one).
pub fn create_leases(client: &mut impl GenericClient, label: &str) -> Result<()> {
    client
        .batch_execute(&leases_create_sql())
        .map_err(Error::postgres(
            Store::Leases,
            label,
            "cannot create the lease table",
        ))
}

/// A table's columns and their types (`information_schema`'s `data_type`),
/// in order, or `None` when the table does not exist in the current schema.
pub fn table_columns(
    client: &mut impl GenericClient,
    table: &str,
    store: Store,
    label: &str,
) -> Result<Option<Vec<(String, String)>>> {
    let rows = client
        .query(
            "SELECT column_name::text, data_type::text FROM information_schema.columns \
             WHERE table_schema = pg_catalog.current_schema() AND table_name = $1 ORDER BY ordinal_position",
            &[&table],
        )
        .map_err(Error::postgres(
            store,
            label,
            "cannot read the table's columns",
        ))?;
    let cols: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    Ok((!cols.is_empty()).then_some(cols))
}

/// The column types this program reads, and the kind each gives.
fn readable(data_type: &str) -> bool {
    matches!(
        data_type,
        "text" | "character varying" | "bigint" | "integer" | "smallint" | "double precision"
    )
}

/// Refuse a table with a column we would read unfaithfully.
fn check_types(
    cols: &[(String, String)],
    wanted: impl Fn(&str) -> bool,
    table: &str,
) -> std::result::Result<(), String> {
    let odd: Vec<String> = cols
        .iter()
        .filter(|(n, t)| wanted(n) && !readable(t))
        .map(|(n, t)| format!("`{n}` is {t}"))
        .collect();
    if odd.is_empty() {
        return Ok(());
    }
    Err(format!(
        "table `{table}` has columns of a type fleet-retire does not read ({}); it reads \
         TEXT, BIGINT and DOUBLE PRECISION, the types it creates. Recreate the table with \
         those types (`fleet-retire registry copy` creates one)",
        odd.join(", ")
    ))
}

/// One value of a result row, as its column's type says.
fn value_at(row: &postgres::Row, i: usize) -> std::result::Result<Value, postgres::Error> {
    let ty = row.columns()[i].type_();
    Ok(if *ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(i)?
            .map_or(Value::Null, Value::Int)
    } else if *ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(i)?
            .map_or(Value::Null, |x| Value::Int(x.into()))
    } else if *ty == Type::INT2 {
        row.try_get::<_, Option<i16>>(i)?
            .map_or(Value::Null, |x| Value::Int(x.into()))
    } else if *ty == Type::FLOAT8 {
        row.try_get::<_, Option<f64>>(i)?
            .map_or(Value::Null, Value::Real)
    } else {
        // TEXT and VARCHAR (the only others `readable` lets through).
        row.try_get::<_, Option<&str>>(i)?
            .map_or(Value::Null, |s| Value::Text(s.into()))
    })
}

fn registry_error(label: &str, message: impl Into<String>) -> Error {
    Error::Registry {
        path: label.into(),
        message: message.into(),
    }
}

fn lease_error(label: &str, message: impl Into<String>) -> Error {
    Error::Leases {
        path: label.into(),
        message: message.into(),
    }
}

/// Read every registration, ordered by identity (bytewise): PostgreSQL has
/// no rowid, and the order only decides the order of the plan's entries,
/// never a verdict or a token. The rows stream in batches, their texts in
/// one buffer per batch.
pub fn read_registry(client: &mut impl GenericClient, label: &str) -> Result<Vec<Row>> {
    let table = super::registry::TABLE;
    let existing = table_columns(client, table, Store::Registry, label)?.ok_or_else(|| {
        registry_error(
            label,
            format!(
                "has no `{table}` table; is this the worker registry's database? \
                 (`fleet-retire registry copy` or a worker's `register` creates it)"
            ),
        )
    })?;
    let present: Vec<Col> = COLUMNS
        .iter()
        .copied()
        .filter(|c| existing.iter().any(|(n, _)| n == c.name()))
        .collect();
    if !present.contains(&Col::WorkerIdentity) {
        return Err(registry_error(
            label,
            format!("table `{table}` has no `worker_identity` column; it is not a worker registry"),
        ));
    }
    check_types(&existing, |n| Col::from_name(n).is_some(), table)
        .map_err(|m| registry_error(label, m))?;
    let list = present
        .iter()
        .map(|c| quote_ident(c.name()))
        .collect::<Vec<_>>()
        .join(", ");
    // Sorted here, bytewise, rather than by the server: whatever the
    // database's collation, and without the server's sort in the way.
    let sql = format!("SELECT {list} FROM {table}");
    let err = Error::postgres(Store::Registry, label, "cannot read the registry");
    let mut stream = client
        .query_raw(&sql, std::iter::empty::<&(dyn ToSql + Sync)>())
        .map_err(err)?;
    let mut rows = Vec::new();
    let mut batch = crate::store::batch::RowBatch::new(present.len());
    while let Some(r) = fallible_iterator::FallibleIterator::next(&mut stream).map_err(err)? {
        let cells = (0..present.len())
            .map(|i| cell_at(&r, i))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(err)?;
        batch
            .push_row(&present, rows.len(), |i| cells[i])
            .map_err(|e| registry_error(label, e.to_string()))?;
        if batch.full() {
            batch
                .finish_into(&mut rows)
                .map_err(|e| registry_error(label, e.to_string()))?;
        }
    }
    batch
        .finish_into(&mut rows)
        .map_err(|e| registry_error(label, e.to_string()))?;
    rows.sort_by(|a, b| {
        let id = |r: &Row| r.get(Col::WorkerIdentity).canon_cow().into_owned();
        match (
            a.get(Col::WorkerIdentity).as_text(),
            b.get(Col::WorkerIdentity).as_text(),
        ) {
            (Some(x), Some(y)) => x.as_bytes().cmp(y.as_bytes()),
            _ => id(a).cmp(&id(b)),
        }
    });
    Ok(rows)
}

/// One value of a result row as a cell for the row-batch builder: text
/// as its bytes, the other readable types by their kind.
fn cell_at(
    row: &postgres::Row,
    i: usize,
) -> std::result::Result<crate::store::batch::Cell<'_>, postgres::Error> {
    use crate::store::batch::Cell;
    let ty = row.columns()[i].type_();
    if *ty == Type::TEXT || *ty == Type::VARCHAR {
        return Ok(match row.try_get::<_, Option<&str>>(i)? {
            None => Cell::Null,
            Some(t) => Cell::Text(t.as_bytes()),
        });
    }
    Ok(match value_at(row, i)? {
        Value::Int(x) => Cell::Int(x),
        Value::Real(x) => Cell::Real(x),
        // `value_at` gives nothing else for the other readable types.
        _ => Cell::Null,
    })
}

/// Read lease rows (all, or the active ones only).
pub fn read_leases(
    client: &mut impl GenericClient,
    label: &str,
    active_only: bool,
) -> Result<Vec<super::leases::Lease>> {
    let table = super::leases::TABLE;
    let existing = table_columns(client, table, Store::Leases, label)?.ok_or_else(|| {
        lease_error(
            label,
            format!("has no `{table}` table; is this the control-plane lease store's database?"),
        )
    })?;
    let missing: Vec<&str> = super::leases::COLUMNS
        .iter()
        .copied()
        .filter(|c| !existing.iter().any(|(n, _)| n == c))
        .collect();
    if !missing.is_empty() {
        return Err(lease_error(
            label,
            format!(
                "table `{table}` lacks the column(s) {}; a lease store with another shape \
                 cannot be read safely (a lease it cannot read would protect nothing)",
                missing.join(", ")
            ),
        ));
    }
    if let Some(why) = super::leases::odd_column_names(existing.iter().map(|(n, _)| n.as_str())) {
        return Err(lease_error(label, why));
    }
    check_types(&existing, |_| true, table).map_err(|m| lease_error(label, m))?;
    if let Some(why) = lease_shape_problem(client, label)? {
        return Err(lease_error(label, why));
    }
    let list = existing
        .iter()
        .map(|(n, _)| quote_ident(n))
        .collect::<Vec<_>>()
        .join(", ");
    let filter = if active_only {
        " WHERE status OPERATOR(pg_catalog.=) 'active'"
    } else {
        ""
    };
    let err = Error::postgres(Store::Leases, label, "cannot read the leases");
    let result = client
        .query(&format!("SELECT {list} FROM {table}{filter}"), &[])
        .map_err(err)?;
    let mut out = Vec::with_capacity(result.len());
    for r in &result {
        let mut fields = std::collections::BTreeMap::new();
        for (i, (name, _)) in existing.iter().enumerate() {
            fields.insert(name.clone(), value_at(r, i).map_err(err)?);
        }
        out.push(super::leases::Lease::from_fields(fields));
    }
    Ok(out)
}

/// A digest of every active lease row, computed by the server in one
/// round trip: it changes whenever the active leases do (the fence's cheap
/// check; a change is confirmed by a full read).
pub fn active_lease_version(client: &mut impl GenericClient, label: &str) -> Result<String> {
    client
        .query_one(
            &format!(
                "SELECT count(*)::text || ':' || md5(coalesce(string_agg(t::text, E'\\x1e' \
                 ORDER BY t::text), '')) FROM {} t WHERE status OPERATOR(pg_catalog.=) 'active'",
                super::leases::TABLE
            ),
            &[],
        )
        .map(|r| r.get(0))
        .map_err(Error::postgres(
            Store::Leases,
            label,
            "cannot read the active leases' version",
        ))
}

/// The kinds a column of ours holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `TEXT`.
    Text,
    /// `BIGINT`.
    Int,
    /// `DOUBLE PRECISION`.
    Real,
}

impl Kind {
    /// The kind of a registry column.
    pub fn of(col: Col) -> Kind {
        match registry_type(col) {
            "BIGINT" => Kind::Int,
            "DOUBLE PRECISION" => Kind::Real,
            _ => Kind::Text,
        }
    }

    /// The kind of an audit column, from its SQLite type of ours.
    pub fn of_audit(sqlite_type: &str) -> Kind {
        if sqlite_type.starts_with("INTEGER") {
            Kind::Int
        } else {
            Kind::Text
        }
    }

    /// The kind of a lease column.
    pub fn of_lease(name: &str) -> Kind {
        match name {
            "owner_pid" | "session_pid" => Kind::Int,
            _ => Kind::Text,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Text => "TEXT",
            Kind::Int => "BIGINT",
            Kind::Real => "DOUBLE PRECISION",
        }
    }
}

/// One statement parameter.
pub type Param = Box<dyn ToSql + Sync>;

/// A value as a parameter for a column of `kind`, exactly: NULL always,
/// otherwise only a value of the column's own kind. Anything else would be
/// a different value once read back (and so a different token).
pub fn to_sql(v: Val<'_>, kind: Kind) -> std::result::Result<Param, String> {
    Ok(match (v, kind) {
        (Val::Null, Kind::Text) => Box::new(None::<String>),
        (Val::Null, Kind::Int) => Box::new(None::<i64>),
        (Val::Null, Kind::Real) => Box::new(None::<f64>),
        (Val::Text(t), Kind::Text) => Box::new(t.to_string()),
        (Val::Int(i), Kind::Int) => Box::new(i),
        (Val::Real(f), Kind::Real) => Box::new(f),
        (other, kind) => {
            return Err(format!(
                "holds {} {}, which a {} column cannot hold as it is",
                other.kind(),
                crate::text::esc(&other.canon()),
                kind.name()
            ))
        }
    })
}

/// Why a row cannot be stored as it is in PostgreSQL's typed columns, if
/// it cannot: the first column whose value its type cannot hold.
pub fn unrepresentable(row: &Row) -> Option<(Col, String)> {
    COLUMNS
        .iter()
        .find_map(|c| to_sql(row.get(*c), Kind::of(*c)).err().map(|e| (*c, e)))
}

/// A worker's registration (column → JSON value) as parameters for its
/// typed columns, converted as SQLite's column affinity would: a number
/// into a `DOUBLE PRECISION` column becomes a real, text stays text.
pub fn registration_params(
    row: &serde_json::Map<String, serde_json::Value>,
    label: &str,
) -> Result<(Vec<String>, Vec<Param>)> {
    use serde_json::Value as Json;
    let mut names = Vec::with_capacity(row.len());
    let mut values: Vec<Param> = Vec::with_capacity(row.len());
    for (name, v) in row {
        let col = Col::from_name(name)
            .ok_or_else(|| registry_error(label, format!("unknown column `{name}`")))?;
        let value = match (v, Kind::of(col)) {
            (Json::Null, kind) => to_sql(Val::Null, kind).map_err(|e| registry_error(label, e))?,
            (Json::String(s), Kind::Text) => Box::new(s.clone()),
            (Json::Number(n), Kind::Int) if n.is_i64() => Box::new(n.as_i64().unwrap_or_default()),
            (Json::Number(n), Kind::Real) => Box::new(n.as_f64().unwrap_or_default()),
            (other, kind) => {
                return Err(registry_error(
                    label,
                    format!(
                        "column `{name}`: {other} does not fit a {} column",
                        kind.name()
                    ),
                ))
            }
        };
        names.push(quote_ident(name));
        values.push(value);
    }
    Ok((names, values))
}

/// Rows into the registry table with `COPY … FROM STDIN BINARY`, inside the
/// caller's transaction. Every value must be representable
/// ([`unrepresentable`]); the first that is not stops the copy.
pub fn copy_rows_in(tx: &mut postgres::Transaction<'_>, rows: &[Row], label: &str) -> Result<u64> {
    use postgres::binary_copy::BinaryCopyInWriter;
    let err = |doing| Error::postgres(Store::Registry, label, doing);
    let list = COLUMNS
        .iter()
        .map(|c| quote_ident(c.name()))
        .collect::<Vec<_>>()
        .join(", ");
    let types: Vec<Type> = COLUMNS
        .iter()
        .map(|c| match Kind::of(*c) {
            Kind::Text => Type::TEXT,
            Kind::Int => Type::INT8,
            Kind::Real => Type::FLOAT8,
        })
        .collect();
    let sink = tx
        .copy_in(&format!(
            "COPY {} ({list}) FROM STDIN BINARY",
            super::registry::TABLE
        ))
        .map_err(err("cannot start the copy"))?;
    let mut writer = BinaryCopyInWriter::new(sink, &types);
    for (n, row) in rows.iter().enumerate() {
        let mut values = Vec::with_capacity(COLUMNS.len());
        for c in COLUMNS {
            values.push(to_sql(row.get(*c), Kind::of(*c)).map_err(|e| {
                registry_error(label, format!("row {} column `{}` {e}", n + 1, c.name()))
            })?);
        }
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|b| b.as_ref()).collect();
        writer.write(&refs).map_err(err("cannot copy a row"))?;
    }
    writer.finish().map_err(err("cannot finish the copy"))
}

/// Lease rows into the lease table, inside the caller's transaction.
pub fn insert_leases_in(
    tx: &mut impl GenericClient,
    leases: &[super::leases::Lease],
    label: &str,
) -> Result<()> {
    let names = super::leases::COLUMNS;
    let sql = format!(
        "INSERT INTO {} ({}) VALUES ({})",
        super::leases::TABLE,
        names.join(", "),
        (1..=names.len())
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let stmt = tx
        .prepare(&sql)
        .map_err(Error::postgres(Store::Leases, label, "cannot prepare"))?;
    for (n, lease) in leases.iter().enumerate() {
        let values = super::leases::LEASE_COLUMNS
            .iter()
            .map(|col| {
                let c = col.name();
                to_sql(lease.get(*col).as_val(), Kind::of_lease(c))
                    .map_err(|e| lease_error(label, format!("lease {} column `{c}` {e}", n + 1)))
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|b| b.as_ref()).collect();
        tx.execute(&stmt, &refs).map_err(Error::postgres(
            Store::Leases,
            label,
            "cannot insert a lease",
        ))?;
    }
    Ok(())
}

/// Apply's statements, prepared once per transaction.
#[derive(Default)]
pub struct Prepared {
    retire: Option<postgres::Statement>,
}

/// Retire `row` as it was read, exactly as `super::registry::retire_guarded`
/// does on SQLite, and write its audit row in the same statement when the
/// UPDATE matched: only where its identity and every guard column still
/// hold the values read (`IS NOT DISTINCT FROM`, PostgreSQL's NULL-safe
/// equality). The identity is matched with `=`, which finds the row by its
/// key (it is `TEXT PRIMARY KEY`, never NULL, here); `IS NOT DISTINCT FROM`
/// would scan the table once per target. Returns the rows changed (the
/// audit rows written are as many).
pub fn retire_with_audit(
    tx: &mut impl GenericClient,
    prepared: &mut Prepared,
    row: &Row,
    audit: &super::audit::AuditRow,
    label: &str,
) -> Result<u64> {
    use super::audit::{COLUMNS as AUDIT, TABLE as AUDIT_TABLE};
    use super::registry::GUARD;
    let stmt = match &prepared.retire {
        Some(s) => s.clone(),
        None => {
            let guard = GUARD
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{} IS NOT DISTINCT FROM ${}", quote_ident(c.name()), i + 5))
                .collect::<Vec<_>>()
                .join(" AND ");
            let first_audit = 5 + GUARD.len();
            let audit_values = AUDIT
                .iter()
                .enumerate()
                .map(|(i, (_, ty))| {
                    let cast = match Kind::of_audit(ty) {
                        Kind::Int => "bigint",
                        _ => "text",
                    };
                    format!("${}::{cast}", first_audit + i)
                })
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "WITH retired AS (UPDATE {} SET status = 'retired', retired_at = $1, \
                 retired_by = $2, retirement_reason = $3 WHERE worker_identity = $4 AND {guard} \
                 RETURNING 1) INSERT INTO {AUDIT_TABLE} ({}) SELECT {audit_values} FROM retired",
                super::registry::TABLE,
                AUDIT.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            );
            let s = tx
                .prepare_typed(&sql, &[Type::TEXT, Type::TEXT, Type::TEXT])
                .map_err(Error::postgres(
                    Store::Registry,
                    label,
                    "cannot prepare the guarded UPDATE",
                ))?;
            prepared.retire.insert(s).clone()
        }
    };
    let mut values: Vec<Param> = vec![
        Box::new(audit.retired_at.to_string()),
        Box::new(audit.retired_by.to_string()),
        Box::new(audit.retirement_reason.to_string()),
    ];
    for col in std::iter::once(&Col::WorkerIdentity).chain(GUARD) {
        values.push(
            to_sql(row.get(*col), Kind::of(*col))
                .map_err(|e| registry_error(label, format!("column `{}` {e}", col.name())))?,
        );
    }
    for (v, (n, ty)) in audit.vals().into_iter().zip(AUDIT) {
        values.push(
            to_sql(v, Kind::of_audit(ty))
                .map_err(|e| registry_error(label, format!("audit column `{n}` {e}")))?,
        );
    }
    let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|b| b.as_ref()).collect();
    tx.execute(&stmt, &refs).map_err(Error::postgres(
        Store::Registry,
        label,
        "the guarded UPDATE failed",
    ))
}

/// A parameter that may borrow what it binds.
type BorrowedParam<'v> = Box<dyn ToSql + Sync + 'v>;

/// One column of a batch as a PostgreSQL array parameter of its kind (its
/// text borrowed, not copied: the evidence alone is ten megabytes at ten
/// thousand targets).
fn array_param<'v>(
    values: impl Iterator<Item = Val<'v>>,
    kind: Kind,
) -> std::result::Result<BorrowedParam<'v>, String> {
    let refuse = |v: Val<'_>| {
        format!(
            "holds {} {}, which a {} column cannot hold as it is",
            v.kind(),
            crate::text::esc(&v.canon()),
            kind.name()
        )
    };
    // Each kind's values, NULL as `None`; any other type refused.
    fn all<'v, T: ToSql + Sync + 'v>(
        values: impl Iterator<Item = Val<'v>>,
        pick: impl Fn(Val<'v>) -> Option<T>,
        refuse: impl Fn(Val<'v>) -> String,
    ) -> std::result::Result<BorrowedParam<'v>, String> {
        let column = values
            .map(|v| match v {
                Val::Null => Ok(None),
                other => pick(other).map(Some).ok_or_else(|| refuse(other)),
            })
            .collect::<std::result::Result<Vec<Option<T>>, String>>()?;
        Ok(Box::new(column))
    }
    match kind {
        Kind::Text => all(values, Val::as_text, refuse),
        Kind::Int => all(
            values,
            |v| if let Val::Int(i) = v { Some(i) } else { None },
            refuse,
        ),
        Kind::Real => all(
            values,
            |v| if let Val::Real(f) = v { Some(f) } else { None },
            refuse,
        ),
    }
}

/// The one statement of [`retire_all`]: the targets and their audit rows
/// as arrays, the guarded UPDATE over all of them joined by identity, the
/// audit rows of exactly the rows it changed, and the identities changed.
/// An audit column whose value is the same for every target (`shared`) is
/// bound once, as a single value; the others as arrays.
fn retire_all_sql(shared: &[bool]) -> String {
    use super::audit::{COLUMNS as AUDIT, TABLE as AUDIT_TABLE};
    use super::registry::GUARD;
    let array = |kind: Kind| format!("{}[]", kind.name());
    let mut n = 3;
    let mut next = || {
        n += 1;
        n
    };
    let target_cols: Vec<(String, String)> = std::iter::once(&Col::WorkerIdentity)
        .chain(GUARD)
        .map(|c| {
            (
                format!("t_{}", c.name()),
                format!("${}::{}", next(), array(Kind::of(*c))),
            )
        })
        .collect();
    // Each audit column: what the INSERT selects, and the array to unnest
    // when it has one value per target.
    let mut per_target: Vec<(String, String)> = Vec::new();
    let selected: Vec<String> = AUDIT
        .iter()
        .zip(shared)
        .map(|((name, ty), &once)| {
            let kind = Kind::of_audit(ty);
            if once {
                return format!("${}::{}", next(), kind.name());
            }
            per_target.push((format!("a_{name}"), format!("${}::{}", next(), array(kind))));
            format!("a.a_{name}")
        })
        .collect();
    let unnest = |cols: &[(String, String)], alias: &str| {
        format!(
            "unnest({}) AS {alias}({})",
            cols.iter()
                .map(|(_, p)| p.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            cols.iter()
                .map(|(c, _)| c.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let guard = GUARD
        .iter()
        .map(|c| {
            let q = quote_ident(c.name());
            format!("r.{q} IS NOT DISTINCT FROM t.t_{}", c.name())
        })
        .collect::<Vec<_>>()
        .join(" AND ");
    format!(
        "WITH retired AS (UPDATE {reg} r SET status = 'retired', retired_at = $1, \
         retired_by = $2, retirement_reason = $3 FROM {targets} \
         WHERE r.worker_identity = t.t_worker_identity AND {guard} RETURNING r.worker_identity), \
         audited AS (INSERT INTO {AUDIT_TABLE} ({names}) SELECT {selected} FROM {audits} \
         WHERE a.a_worker_identity IN (SELECT worker_identity FROM retired) RETURNING 1) \
         SELECT worker_identity FROM retired",
        reg = super::registry::TABLE,
        targets = unnest(&target_cols, "t"),
        names = AUDIT.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
        selected = selected.join(", "),
        audits = unnest(&per_target, "a"),
    )
}

/// Each audit column of a batch bound as one parameter: a single value
/// when every row holds the same one (the tokens, the apply's id, who and
/// from where: most of the bytes sent were these, ten thousand times
/// over), an array otherwise. The worker's identity is always an array:
/// the INSERT joins on it. Returns which columns were bound once.
fn audit_params<'v>(
    rows: &[[Val<'v>; super::audit::COLUMNS.len()]],
    values: &mut Vec<BorrowedParam<'v>>,
    label: &str,
) -> Result<Vec<bool>> {
    use super::audit::COLUMNS as AUDIT;
    let mut shared = Vec::with_capacity(AUDIT.len());
    for (i, (n, ty)) in AUDIT.iter().enumerate() {
        let first = rows.first().map_or(Val::Null, |r| r[i]);
        let once = *n != "worker_identity" && rows.iter().all(|r| r[i] == first);
        let kind = Kind::of_audit(ty);
        let param = if once {
            to_sql(first, kind).map(|p| p as BorrowedParam<'v>)
        } else {
            array_param(rows.iter().map(|r| r[i]), kind)
        };
        values.push(param.map_err(|e| registry_error(label, format!("audit column `{n}` {e}")))?);
        shared.push(once);
    }
    Ok(shared)
}

/// Retire every row of `batch` as it was read and write the audit row of
/// each one retired, in one statement over arrays (the set form of
/// [`retire_with_audit`]; the identity is the table's key here, so a
/// target matches one row or none). Per target, in order, the rows
/// changed.
pub fn retire_all(
    tx: &mut impl GenericClient,
    batch: &[(&Row, super::audit::AuditRow<'_>)],
    label: &str,
) -> Result<Vec<u64>> {
    use super::registry::GUARD;
    let started = std::time::Instant::now();
    let Some((_, first)) = batch.first() else {
        return Ok(Vec::new());
    };
    let mut values: Vec<BorrowedParam> = vec![
        Box::new(first.retired_at),
        Box::new(first.retired_by),
        Box::new(first.retirement_reason),
    ];
    for col in std::iter::once(&Col::WorkerIdentity).chain(GUARD) {
        values.push(
            array_param(batch.iter().map(|(row, _)| row.get(*col)), Kind::of(*col))
                .map_err(|e| registry_error(label, format!("column `{}` {e}", col.name())))?,
        );
    }
    let audit_values: Vec<_> = batch.iter().map(|(_, audit)| audit.vals()).collect();
    let shared = audit_params(&audit_values, &mut values, label)?;
    let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|b| b.as_ref()).collect();
    let retired = tx
        .query(retire_all_sql(&shared).as_str(), &refs)
        .map_err(Error::postgres(
            Store::Registry,
            label,
            "the guarded UPDATE failed",
        ))?;
    tracing::debug!(elapsed = ?started.elapsed(), targets = batch.len(), "retired in one statement");
    let mut count: std::collections::HashMap<String, u64> =
        std::collections::HashMap::with_capacity(retired.len());
    for row in &retired {
        *count.entry(row.get::<_, String>(0)).or_default() += 1;
    }
    Ok(batch
        .iter()
        .map(|(row, _)| {
            let id = row.get(Col::WorkerIdentity);
            id.as_text()
                .and_then(|t| count.get(t).copied())
                .unwrap_or(0)
        })
        .collect())
}

/// Whether a PostgreSQL error is a serialization failure or a deadlock: the
/// transaction lost a race with another and may simply be tried again.
pub fn is_serialization_failure(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_only_into_their_own_kind() {
        assert!(to_sql(Val::Int(4), Kind::Int).is_ok());
        assert!(to_sql(Val::Null, Kind::Real).is_ok());
        assert!(to_sql(Val::Text("4"), Kind::Int).is_err());
        assert!(to_sql(Val::Int(900), Kind::Real).is_err());
        assert!(to_sql(Val::Real(1.5), Kind::Text).is_err());
    }

    #[test]
    fn the_tables_use_postgres_types() {
        let sql = registry_create_sql();
        assert!(sql.contains("\"pid\" BIGINT"));
        assert!(sql.contains("\"heartbeat_ttl_seconds\" DOUBLE PRECISION"));
        assert!(sql.contains("\"worker_identity\" TEXT PRIMARY KEY"));
        assert!(leases_create_sql().contains("owner_pid BIGINT"));
        assert!(audit_create_sql().contains("os_uid BIGINT"));
    }
}
