//! A host's scope read from a PostgreSQL registry: what to fetch, and why,
//! is `store/scope.rs`; here, how. Three statements in the caller's one
//! read-only snapshot: this host's active rows (the index on `host_id`,
//! `status`), its other rows counted (the same index, an index-only
//! scan), and every peer row in one statement whose arms are each served
//! by an index (the identity's, and the partial indexes on active rows,
//! `store::registry::SCOPE_INDEXES`), which the server ORs together.

use super::read::read_filtered;
use super::schema::table_columns;
use crate::error::{Error, Result, Store};
use crate::row::Col;
use crate::store::scope::{
    index_sql, index_words, integer_form, unreadable_scope, PeerKeys, Scope, INDEXES,
};
use postgres::types::ToSql;
use postgres::GenericClient;
use std::collections::BTreeSet;

const TABLE: &str = crate::store::registry::TABLE;

/// Parameters of a statement, each of the type its column compares with.
type Params = Vec<Box<dyn ToSql + Sync>>;

/// This host's active rows (`$1`: the host).
const OWN: &str = " WHERE host_id = $1 AND status = 'active'";

/// This host's other rows, counted (an index-only scan).
fn count_sql() -> String {
    format!("SELECT count(*) FROM {TABLE} WHERE host_id = $1 AND status IS DISTINCT FROM 'active'")
}

/// This host's scope, on `client` (inside the caller's snapshot), with the
/// rows of the identities `also` among the peers.
pub fn load(
    client: &mut impl GenericClient,
    label: &str,
    host_id: &str,
    also: &[String],
) -> Result<Scope> {
    load_through_indexes(client, label, host_id, also)?.map_err(|why| Error::Registry {
        shown: label.to_string(),
        message: unreadable_scope(&why),
    })
}

/// [`load`], with `Err` saying why the scope cannot be read through its
/// indexes (a column missing or not text, an index missing or not ours, a
/// collation's version moved), found before any row is read and by no
/// failing statement (the caller's transaction goes on): a scoped apply
/// then takes the scope from the whole read.
pub fn load_through_indexes(
    client: &mut impl GenericClient,
    label: &str,
    host_id: &str,
    also: &[String],
) -> Result<std::result::Result<Scope, String>> {
    let types = match trusted(client, label)? {
        Ok(types) => types,
        Err(why) => return Ok(Err(why)),
    };
    let own = read_filtered(client, label, OWN, &[&host_id])?;
    let terminal: i64 = client
        .query_one(&count_sql(), &[&host_id])
        .map_err(Error::postgres(
            Store::Registry,
            label,
            "cannot count this host's other rows",
        ))?
        .get(0);
    let mut keys = PeerKeys::of(&own);
    keys.identities.extend(also.iter().cloned());
    let peers = match peer_filter(host_id, &keys, &types) {
        None => Vec::new(),
        Some((filter, params)) => {
            let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref()).collect();
            read_filtered(client, label, &filter, &refs)?
        }
    };
    // What the statement fetches beyond the scope's definition (a value
    // whose canonical text is not a key) is left out.
    let peers = peers.into_iter().filter(|row| keys.finds(row)).collect();
    Ok(Ok(Scope {
        host_id: host_id.to_string(),
        own,
        peers,
        terminal: terminal.max(0) as u64,
    }))
}

/// The server's plan of each of the scoped read's three statements, run
/// (`EXPLAIN (ANALYZE, BUFFERS)`), as [`load`] runs them but selecting
/// `*`: this host's rows, the count of its others, the peers (absent when
/// there is no key to match). For the tests and the benchmark that hold
/// the read to its bound.
pub fn explain(client: &mut impl GenericClient, label: &str, host_id: &str) -> Result<Vec<String>> {
    let types = checked(client, label)?;
    let own = read_filtered(client, label, OWN, &[&host_id])?;
    let keys = PeerKeys::of(&own);
    let mut statements: Vec<(String, Params)> = vec![
        (
            format!("SELECT * FROM {TABLE}{OWN}"),
            vec![Box::new(host_id.to_string())],
        ),
        (count_sql(), vec![Box::new(host_id.to_string())]),
    ];
    if let Some((filter, params)) = peer_filter(host_id, &keys, &types) {
        statements.push((format!("SELECT * FROM {TABLE}{filter}"), params));
    }
    let mut plans = Vec::new();
    for (sql, params) in statements {
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref()).collect();
        let rows = client
            .query(&format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"), &refs)
            .map_err(Error::postgres(
                Store::Registry,
                label,
                "cannot explain the scoped read",
            ))?;
        let lines: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        plans.push(lines.join("\n"));
    }
    Ok(plans)
}

/// The registry's columns and types, once its scope can be read: `host_id`
/// and `status` text, and the indexes ours.
fn checked(client: &mut impl GenericClient, label: &str) -> Result<Vec<(String, String)>> {
    trusted(client, label)?.map_err(|why| Error::Registry {
        shown: label.to_string(),
        message: unreadable_scope(&why),
    })
}

/// [`checked`], with `Err` saying why the scope cannot be read.
fn trusted(
    client: &mut impl GenericClient,
    label: &str,
) -> Result<std::result::Result<Vec<(String, String)>, String>> {
    let types = table_columns(client, TABLE, Store::Registry, label)?.unwrap_or_default();
    for needed in [Col::HostId, Col::Status] {
        if !types
            .iter()
            .any(|(n, t)| n == needed.name() && matches!(t.as_str(), "text" | "character varying"))
        {
            return Ok(Err(format!(
                "its `{}` column is missing or not text",
                needed.name()
            )));
        }
    }
    if let Some(why) = index_problem(client, label)? {
        return Ok(Err(why));
    }
    Ok(Ok(types))
}

/// The peers' `WHERE` clause and its parameters (`$1`: the host), one arm
/// per key column (`PeerKeys::columns`) that has keys, each served by an
/// index; `None` when there is nothing to match.
fn peer_filter(
    host_id: &str,
    keys: &PeerKeys,
    types: &[(String, String)],
) -> Option<(String, Params)> {
    let mut params: Params = vec![Box::new(host_id.to_string())];
    let mut arms = Vec::new();
    for (column, any_status_ok, set) in keys.columns() {
        let Some((_, data_type)) = types
            .iter()
            .find(|(n, _)| n == column.name())
            .filter(|_| !set.is_empty())
        else {
            continue;
        };
        let (param, cast) = bound(data_type, set);
        params.push(param);
        // Each arm whole, `status` beside its key: the server then serves
        // each from its own partial index and ORs the bitmaps (an arm
        // nesting the keys under one `status = 'active'` was served by
        // reading every active row).
        let arm = format!(
            "{}{} = ANY(${}::{cast}[])",
            if any_status_ok {
                ""
            } else {
                "status = 'active' AND "
            },
            crate::store::quote_ident(column.name()),
            params.len()
        );
        arms.push(format!("({arm})"));
    }
    (!arms.is_empty()).then(|| {
        let filter = format!(
            " WHERE (host_id = $1 AND status = 'active') IS NOT TRUE AND ({})",
            arms.join(" OR ")
        );
        (filter, params)
    })
}

/// The keys as an array of the column's own type (every form whose
/// canonical text a key could be), and that type's name for the cast.
fn bound(data_type: &str, keys: &BTreeSet<String>) -> (Box<dyn ToSql + Sync>, &'static str) {
    match data_type {
        "bigint" | "integer" | "smallint" => (
            Box::new(
                keys.iter()
                    .filter_map(|k| integer_form(k))
                    .collect::<Vec<i64>>(),
            ),
            "int8",
        ),
        "double precision" => (
            Box::new(
                keys.iter()
                    .filter_map(|k| k.parse::<f64>().ok())
                    .collect::<Vec<f64>>(),
            ),
            "float8",
        ),
        // text and character varying (`readable` lets nothing else through
        // a read of the registry).
        _ => (
            Box::new(keys.iter().cloned().collect::<Vec<String>>()),
            "text",
        ),
    }
}

/// Create the scope's indexes the registry lacks, each only when the table
/// has its columns: inside the caller's transaction (`registry copy`, whose
/// tables are new), or `concurrently`, each in a transaction of its own,
/// writers never held up (`registry versions`); how many were made.
pub fn create_indexes(
    client: &mut impl GenericClient,
    label: &str,
    concurrently: bool,
) -> Result<usize> {
    let columns = table_columns(client, TABLE, Store::Registry, label)?.unwrap_or_default();
    let existing = ours(client, label)?;
    let mut made = 0;
    for (name, cols, active_only) in INDEXES {
        let has = cols
            .split(", ")
            .all(|c| columns.iter().any(|(n, _)| n == c));
        if has && !existing.iter().any(|(n, _, _)| n == name) {
            client
                .batch_execute(&index_sql(name, cols, active_only, concurrently))
                .map_err(Error::postgres(
                    Store::Registry,
                    label,
                    "cannot make the host scope's indexes (as the tables' owner)",
                ))?;
            made += 1;
        }
    }
    Ok(made)
}

/// The indexes on the registry whose names are ours: name, definition as
/// the server prints it, and whether it is valid (a `CONCURRENTLY` build
/// that failed leaves an invalid one).
fn ours(client: &mut impl GenericClient, label: &str) -> Result<Vec<(String, String, bool)>> {
    let rows = client
        .query(
            &format!(
                "SELECT c.relname::text, pg_catalog.pg_get_indexdef(i.indexrelid), i.indisvalid \
                 FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid \
                 WHERE i.indrelid = '{TABLE}'::regclass AND c.relname LIKE 'fleet\\_retire\\_scope\\_%'"
            ),
            &[],
        )
        .map_err(Error::postgres(
            Store::Registry,
            label,
            "cannot read the registry's indexes",
        ))?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// Why the scope's indexes cannot be trusted: one missing, invalid, or
/// not of our shape (other columns, an expression, an operator class or
/// collation, another condition, another method), or no valid unique
/// index on `worker_identity` alone. `None` when all are ours.
pub fn index_problem(client: &mut impl GenericClient, label: &str) -> Result<Option<String>> {
    let fix = "make them as the tables' owner with `fleet-retire registry versions --registry URL`";
    let schema: String = client
        .query_one(
            "SELECT pg_catalog.quote_ident(pg_catalog.current_schema())",
            &[],
        )
        .map_err(Error::postgres(
            Store::Registry,
            label,
            "cannot read the schema",
        ))?
        .get(0);
    let found = ours(client, label)?;
    for (name, cols, active_only) in INDEXES {
        let expected = format!(
            "CREATE INDEX {name} ON {schema}.{TABLE} USING btree ({cols}){}",
            if active_only {
                " WHERE (status = 'active'::text)"
            } else {
                ""
            }
        );
        match found.iter().find(|(n, _, _)| n == name) {
            Some((_, def, true)) if *def == expected => {}
            Some((_, def, valid)) => {
                let def = if *valid {
                    def.clone()
                } else {
                    format!("{def} (invalid: a build that did not finish)")
                };
                return Ok(Some(index_words(name, Some(&def), &expected, fix)));
            }
            None => return Ok(Some(index_words(name, None, &expected, fix))),
        }
    }
    if let Some(why) = collation_problem(client, label)? {
        return Ok(Some(why));
    }
    let keyed: bool = client
        .query_one(
            &format!(
                "SELECT count(*) > 0 FROM pg_catalog.pg_index i WHERE i.indrelid = '{TABLE}'::regclass \
                 AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL \
                 AND i.indnatts = 1 AND i.indkey[0] = (SELECT attnum FROM pg_catalog.pg_attribute \
                 WHERE attrelid = '{TABLE}'::regclass AND attname = 'worker_identity')"
            ),
            &[],
        )
        .map_err(Error::postgres(
            Store::Registry,
            label,
            "cannot read the registry's indexes",
        ))?
        .get(0);
    Ok((!keyed).then(|| {
        "no valid unique index on `worker_identity` alone (the table's key in every registry \
         `fleet-retire registry copy` makes): rows of one identity could only be found by a scan"
            .to_string()
    }))
}

/// A text index is ordered by its collation: built under one version of
/// the operating system's collation and searched under another (an
/// upgrade of the C library or ICU), it can miss equal keys, and the
/// scoped read would miss the peers they name while the whole plan,
/// reading the table, sees them. So the versions the database and the
/// registry's index collations were recorded under must be the ones in
/// use (PostgreSQL 15 and later record the database's; older servers
/// record only explicit collations'). `None` when they are.
fn collation_problem(client: &mut impl GenericClient, label: &str) -> Result<Option<String>> {
    let err = Error::postgres(
        Store::Registry,
        label,
        "cannot read the collations' versions",
    );
    let version: i32 = client
        .query_one(
            "SELECT pg_catalog.current_setting('server_version_num')::int",
            &[],
        )
        .map_err(err)?
        .get(0);
    let database: Option<String> = if version < 150000 {
        None
    } else {
        client
            .query_opt(
                "SELECT pg_catalog.format('the database''s collation is recorded as version %s \
                 and the server now has %s', coalesce(d.datcollversion, 'none'), \
                 coalesce(pg_catalog.pg_database_collation_actual_version(d.oid), 'none')) \
                 FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database() \
                 AND d.datcollversion IS DISTINCT FROM \
                 pg_catalog.pg_database_collation_actual_version(d.oid)",
                &[],
            )
            .map_err(err)?
            .map(|r| r.get(0))
    };
    let explicit: Option<String> = client
        .query_opt(
            &format!(
                "SELECT pg_catalog.format('the collation %s is recorded as version %s and the \
                 server now has %s', c.collname, coalesce(c.collversion, 'none'), \
                 coalesce(pg_catalog.pg_collation_actual_version(c.oid), 'none')) \
                 FROM pg_catalog.pg_collation c WHERE c.oid IN (SELECT pg_catalog.unnest(\
                 i.indcollation::pg_catalog.oid[]) FROM pg_catalog.pg_index i \
                 WHERE i.indrelid = '{TABLE}'::regclass) AND c.oid <> 100 \
                 AND c.collversion IS DISTINCT FROM pg_catalog.pg_collation_actual_version(c.oid) \
                 LIMIT 1"
            ),
            &[],
        )
        .map_err(err)?
        .map(|r| r.get(0));
    Ok(database.or(explicit).map(|why| {
        format!(
            "{why}: an index built under another ordering can miss rows, and the scoped read \
             would miss the peers they are. Rebuild the registry's indexes as the tables' \
             owner (`REINDEX TABLE worker_registrations`), then `ALTER DATABASE … REFRESH \
             COLLATION VERSION` (or `ALTER COLLATION … REFRESH VERSION`)"
        )
    }))
}
