//! Writing a PostgreSQL registry: values bound by their column's kind,
//! a worker's own registration, `registry copy`'s bulk writes, and apply's
//! guarded retirements with their audit rows (one at a time, or a whole
//! batch in one statement).

use super::*;

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
            crate::store::registry::TABLE
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
    leases: &[crate::store::leases::Lease],
    label: &str,
) -> Result<()> {
    let names = crate::store::leases::COLUMNS;
    let sql = format!(
        "INSERT INTO {} ({}) VALUES ({})",
        crate::store::leases::TABLE,
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
        let values = crate::store::leases::LEASE_COLUMNS
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

/// Retire `row` as it was read, exactly as `crate::store::registry::retire_guarded`
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
    audit: &crate::store::audit::AuditRow,
    label: &str,
) -> Result<u64> {
    use crate::store::audit::{COLUMNS as AUDIT, TABLE as AUDIT_TABLE};
    use crate::store::registry::GUARD;
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
                crate::store::registry::TABLE,
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
pub(super) type BorrowedParam<'v> = Box<dyn ToSql + Sync + 'v>;

/// One column of a batch as a PostgreSQL array parameter of its kind (its
/// text borrowed, not copied: the evidence alone is ten megabytes at ten
/// thousand targets).
pub(super) fn array_param<'v>(
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
pub(super) fn retire_all_sql(shared: &[bool]) -> String {
    use crate::store::audit::{COLUMNS as AUDIT, TABLE as AUDIT_TABLE};
    use crate::store::registry::GUARD;
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
        reg = crate::store::registry::TABLE,
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
pub(super) fn audit_params<'v>(
    rows: &[[Val<'v>; crate::store::audit::COLUMNS.len()]],
    values: &mut Vec<BorrowedParam<'v>>,
    label: &str,
) -> Result<Vec<bool>> {
    use crate::store::audit::COLUMNS as AUDIT;
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
    batch: &[(&Row, crate::store::audit::AuditRow<'_>)],
    label: &str,
) -> Result<Vec<u64>> {
    use crate::store::registry::GUARD;
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
}
