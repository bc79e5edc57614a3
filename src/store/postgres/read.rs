//! Reading a PostgreSQL registry and lease store: rows streamed in
//! batches, values of the types this program reads, the active leases'
//! digest computed by the server.

use super::*;

/// One value of a result row, as its column's type says.
pub(super) fn value_at(
    row: &postgres::Row,
    i: usize,
) -> std::result::Result<Value, postgres::Error> {
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

/// Read every registration, ordered by identity (bytewise): PostgreSQL has
/// no rowid, and the order only decides the order of the plan's entries,
/// never a verdict or a token. The rows stream in batches, their texts in
/// one buffer per batch.
pub fn read_registry(client: &mut impl GenericClient, label: &str) -> Result<Vec<Row>> {
    read_rows(client, label, None)
}

/// The registry's rows that carry one of `identities`, read and sorted as
/// [`read_registry`] reads all of them.
pub fn read_identities(
    client: &mut impl GenericClient,
    label: &str,
    identities: &[String],
) -> Result<Vec<Row>> {
    read_rows(client, label, Some(identities))
}

fn read_rows(
    client: &mut impl GenericClient,
    label: &str,
    identities: Option<&[String]>,
) -> Result<Vec<Row>> {
    match identities {
        None => read_filtered(client, label, "", &[]),
        Some(ids) => read_filtered(
            client,
            label,
            " WHERE worker_identity::text = ANY($1)",
            &[&ids],
        ),
    }
}

/// The registry's rows `filter` (a `WHERE` clause of ours, or nothing)
/// selects with `params`, read and sorted as [`read_registry`] reads all
/// of them.
pub fn read_filtered(
    client: &mut impl GenericClient,
    label: &str,
    filter: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>> {
    let table = crate::store::registry::TABLE;
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
    let err = Error::postgres(Store::Registry, label, "cannot read the registry");
    let mut stream = client
        .query_raw(
            &format!("SELECT {list} FROM {table}{filter}"),
            params.iter().copied(),
        )
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
pub(super) fn cell_at(
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
) -> Result<Vec<crate::store::leases::Lease>> {
    let table = crate::store::leases::TABLE;
    primary_only(client, label)?;
    let existing = table_columns(client, table, Store::Leases, label)?.ok_or_else(|| {
        lease_error(
            label,
            format!("has no `{table}` table; is this the control-plane lease store's database?"),
        )
    })?;
    let missing: Vec<&str> = crate::store::leases::COLUMNS
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
    if let Some(why) =
        crate::store::leases::odd_column_names(existing.iter().map(|(n, _)| n.as_str()))
    {
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
        out.push(crate::store::leases::Lease::from_fields(fields));
    }
    Ok(out)
}

/// A digest of every active lease row, computed by the server in one
/// round trip: it changes whenever the active leases do (the fence's cheap
/// check; a change is confirmed by a full read).
pub fn active_lease_version(client: &mut impl GenericClient, label: &str) -> Result<String> {
    let row = client
        .query_one(
            &format!(
                "SELECT pg_catalog.pg_is_in_recovery(), count(*)::text || ':' || md5(coalesce(string_agg(t::text, E'\\x1e' \
                 ORDER BY t::text), '')) FROM {} t WHERE status OPERATOR(pg_catalog.=) 'active'",
                crate::store::leases::TABLE
            ),
            &[],
        )
        .map_err(Error::postgres(
            Store::Leases,
            label,
            "cannot read the active leases' version",
        ))?;
    if row.get::<_, bool>(0) {
        return Err(standby(label));
    }
    Ok(row.get(1))
}

/// Refuse a lease store on a server in recovery: a standby replays the
/// primary's writes late, so a lease taken on the primary a moment ago is
/// not there yet, and the worker it protects would look unleased.
fn primary_only(client: &mut impl GenericClient, label: &str) -> Result<()> {
    let in_recovery: bool = client
        .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
        .map_err(Error::postgres(
            Store::Leases,
            label,
            "cannot tell whether the server is a standby",
        ))?
        .get(0);
    if in_recovery {
        return Err(standby(label));
    }
    Ok(())
}

fn standby(label: &str) -> Error {
    lease_error(
        label,
        "is a standby in recovery: leases are read where they are written, because a \
         standby's replay lags and a lease taken on the primary may not be there yet. Point \
         the lease store at the writable member (add `target_session_attrs=read-write` to the \
         URL and name every member)",
    )
}
