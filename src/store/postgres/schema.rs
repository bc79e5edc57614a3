//! The PostgreSQL tables' shape as this program makes and migrates it:
//! column types, `CREATE TABLE` statements, the migrations run inside
//! apply's (and a copy's) transaction, and the column types it reads.

use super::*;

/// PostgreSQL's type for a registry column.
pub fn registry_type(col: Col) -> &'static str {
    match crate::store::registry::sql_type(col) {
        "TEXT PRIMARY KEY" => "TEXT PRIMARY KEY",
        "INTEGER" => "BIGINT",
        "REAL" => "DOUBLE PRECISION",
        _ => "TEXT",
    }
}

/// PostgreSQL's type for a SQLite column type of ours.
pub(super) fn from_sqlite_type(ty: &str) -> String {
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
        crate::store::registry::TABLE,
        cols.join(", ")
    )
}

/// The statement that creates the lease table.
pub fn leases_create_sql() -> String {
    from_sqlite_type(&crate::store::leases::create_sql()).replacen(
        "CREATE TABLE",
        "CREATE TABLE IF NOT EXISTS",
        1,
    )
}

/// The statement that creates the audit table.
pub(super) fn audit_create_sql() -> String {
    let cols: Vec<String> = crate::store::audit::COLUMNS
        .iter()
        .map(|(n, t)| format!("{n} {}", from_sqlite_type(t)))
        .collect();
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({} BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, {})",
        crate::store::audit::TABLE,
        crate::store::audit::KEY,
        cols.join(", ")
    )
}

/// One lock key for every schema change, so workers registering at once
/// and an apply do not race each other's `CREATE TABLE`.
pub(super) const SCHEMA_LOCK: i64 = 0x666c_6565_7472_6574; // "fleetret"

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
        crate::store::registry::TABLE,
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
    let existing = table_columns(tx, crate::store::registry::TABLE, Store::Registry, label)?
        .unwrap_or_default();
    for col in COLUMNS
        .iter()
        .filter(|c| !existing.iter().any(|(n, _)| n == c.name()))
    {
        let ty = registry_type(*col).trim_end_matches(" PRIMARY KEY");
        tx.batch_execute(&format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {ty}",
            crate::store::registry::TABLE,
            quote_ident(col.name())
        ))
        .map_err(err("cannot add a missing column"))?;
    }
    no_event_trigger(tx, label, "after")
}

/// Create the audit table, or add the columns an older one lacks.
pub fn migrate_audit_in(tx: &mut impl GenericClient, label: &str) -> Result<()> {
    let err = |doing| Error::postgres(Store::Registry, label, doing);
    let existing = table_columns(tx, crate::store::audit::TABLE, Store::Registry, label)?;
    if existing.as_ref().is_some_and(|cols| {
        crate::store::audit::COLUMNS
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
        table_columns(tx, crate::store::audit::TABLE, Store::Registry, label)?.unwrap_or_default();
    for (name, ty) in crate::store::audit::COLUMNS
        .iter()
        .filter(|(n, _)| !existing.iter().any(|(c, _)| c == n))
    {
        let ty = from_sqlite_type(ty.trim_end_matches(" NOT NULL"));
        tx.batch_execute(&format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {ty}",
            crate::store::audit::TABLE,
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
pub(super) fn readable(data_type: &str) -> bool {
    matches!(
        data_type,
        "text" | "character varying" | "bigint" | "integer" | "smallint" | "double precision"
    )
}

/// Refuse a table with a column we would read unfaithfully.
pub(super) fn check_types(
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

#[cfg(test)]
mod tests {
    use super::*;

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
