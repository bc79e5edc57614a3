//! `registry copy`, the storage work: move a SQLite registry (its rows and
//! its audit table, and optionally a SQLite lease store) into PostgreSQL,
//! and prove the copy is the same registry. The tokens it is proved by are
//! computed above the store (`crate::copy` passes them in, [`Tokens`]).
//!
//! Everything is written in one transaction into tables that must be empty,
//! then read back inside that transaction and compared with the source,
//! value by value (kind and canonical text, which is what every token
//! hashes), before COMMIT. A copy that would not read back identically
//! (a value PostgreSQL's typed column cannot hold as it is, two rows with
//! one identity) is refused before anything is written, naming the rows.

use crate::error::{About, Error, Result, Store};
use crate::row::{Row, COLUMNS};
use crate::store::location::Location;
use crate::store::postgres as pg;
use crate::value::{Val, Value};
use std::path::Path;

/// What a copy did, and the proof.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CopyReport {
    /// The SQLite registry read.
    pub from: String,
    /// The PostgreSQL database written (password masked).
    pub to: String,
    /// Registry rows copied.
    pub rows: usize,
    /// Audit rows copied.
    pub audit_rows: usize,
    /// Lease rows copied (when a lease store was given).
    pub leases: Option<usize>,
    /// The registry token over the source rows.
    pub registry_fingerprint: String,
    /// The registry token over the rows read back from PostgreSQL.
    pub copied_registry_fingerprint: String,
    /// The lease token over the active leases, source and copy.
    pub external_state_fingerprint: Option<(String, String)>,
}

/// How many rows a refusal names before it counts the rest.
const NAMED: usize = 10;

/// Two values as every token sees them: the same kind and canonical text.
fn same(a: Val<'_>, b: Val<'_>) -> bool {
    a.kind() == b.kind() && a.canon_cow() == b.canon_cow()
}

/// Refuse rows PostgreSQL cannot hold as they are, before writing.
fn check_representable(rows: &[Row], from: &Path) -> Result<()> {
    let mut problems = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (n, row) in rows.iter().enumerate() {
        let id = row.get(crate::row::Col::WorkerIdentity);
        match id.as_text() {
            None => problems.push(format!(
                "row {}: worker_identity is {} {}, and PostgreSQL's key is TEXT NOT NULL",
                n + 1,
                id.kind(),
                crate::text::esc(&id.canon())
            )),
            Some(t) => {
                if let Some(first) = seen.insert(t.to_string(), n) {
                    problems.push(format!(
                        "rows {} and {}: both have worker_identity {}",
                        first + 1,
                        n + 1,
                        crate::text::esc(t)
                    ));
                }
            }
        }
        if let Some((col, why)) = pg::unrepresentable(row) {
            problems.push(format!(
                "row {} ({}): `{}` {why}",
                n + 1,
                crate::text::esc(&id.canon()),
                col.name()
            ));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let more = problems.len().saturating_sub(NAMED);
    problems.truncate(NAMED);
    Err(Error::Registry {
        shown: crate::store::location::label(from),
        message: format!(
            "cannot be copied as it is: {}{}. Nothing was written. PostgreSQL's columns are \
             typed, so such a value would read back as another value and move every token. \
             Correct these rows in the SQLite registry (or retire them there first), then copy again",
            problems.join("; "),
            if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            }
        ),
    })
}

/// The audit rows of a SQLite registry (`audit_id` first, then every
/// audit column in order), or none when it has no audit table.
fn sqlite_audit_rows(conn: &rusqlite::Connection, from: &Path) -> Result<Vec<Vec<Value>>> {
    use crate::store::audit::{COLUMNS as AUDIT, KEY, TABLE};
    let err = Error::sqlite(Store::Registry, from, "cannot read the audit table");
    let Some(existing) = crate::store::table_columns(conn, TABLE).map_err(err)? else {
        return Ok(Vec::new());
    };
    let list: Vec<String> = std::iter::once(KEY)
        .chain(AUDIT.iter().map(|(n, _)| *n))
        .map(|n| {
            if existing.iter().any(|c| c == n) {
                n.to_string()
            } else {
                "NULL".to_string()
            }
        })
        .collect();
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {} FROM {TABLE} ORDER BY {KEY}",
            list.join(", ")
        ))
        .map_err(err)?;
    let mut cursor = stmt.query([]).map_err(err)?;
    let mut out = Vec::new();
    while let Some(r) = cursor.next().map_err(err)? {
        let mut values = Vec::with_capacity(list.len());
        for i in 0..list.len() {
            values.push(
                crate::store::sqlite::read::value_from_sql(r.get_ref(i).map_err(err)?).map_err(
                    |e| Error::Registry {
                        shown: crate::store::location::label(from),
                        message: format!("audit table: {e}"),
                    },
                )?,
            );
        }
        out.push(values);
    }
    Ok(out)
}

fn insert_audit_in(
    tx: &mut postgres::Transaction<'_>,
    rows: &[Vec<Value>],
    label: &str,
) -> Result<()> {
    use crate::store::audit::{COLUMNS as AUDIT, KEY, TABLE};
    if rows.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = std::iter::once(KEY)
        .chain(AUDIT.iter().map(|(n, _)| *n))
        .collect();
    let kinds: Vec<pg::Kind> = std::iter::once(pg::Kind::Int)
        .chain(AUDIT.iter().map(|(_, t)| pg::Kind::of_audit(t)))
        .collect();
    let err = |doing| Error::postgres(Store::Registry, label, doing);
    let stmt = tx
        .prepare(&format!(
            "INSERT INTO {TABLE} ({}) OVERRIDING SYSTEM VALUE VALUES ({})",
            names.join(", "),
            (1..=names.len())
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .map_err(err("cannot prepare the audit copy"))?;
    for row in rows {
        let values = row
            .iter()
            .zip(&kinds)
            .zip(&names)
            .map(|((v, k), n)| {
                pg::to_sql(v.as_val(), *k).map_err(|e| Error::Registry {
                    shown: label.into(),
                    message: format!("audit row {}: `{n}` {e}", row[0].canon()),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
            values.iter().map(|b| b.as_ref()).collect();
        tx.execute(&stmt, &refs)
            .map_err(err("cannot copy an audit row"))?;
    }
    // New audit rows continue after the copied ones.
    tx.execute(
        &format!(
            "SELECT setval(pg_get_serial_sequence('{TABLE}', '{KEY}'), (SELECT max({KEY}) FROM {TABLE}))"
        ),
        &[],
    )
    .map_err(err("cannot move the audit id sequence past the copied rows"))?;
    Ok(())
}

fn count(
    tx: &mut postgres::Transaction<'_>,
    table: &str,
    store: Store,
    label: &str,
) -> Result<i64> {
    tx.query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .map(|r| r.get(0))
        .map_err(Error::postgres(
            store,
            label,
            "cannot count the rows already there",
        ))
}

/// Refuse a source registry whose reads could differ from its rows: the
/// shape checks apply makes before it writes (`crate::store::untrusted_objects`).
/// A view named `worker_registrations` would be copied as what it shows
/// (hiding rows, or showing rows no table holds), and then "read back value
/// for value" from the copy; a trigger or foreign audit columns have no
/// place in a registry either. Called inside the source's read transaction,
/// so the rows read are those of the schema checked.
fn refuse_untrusted_source(conn: &rusqlite::Connection, from: &Path) -> Result<()> {
    let problems =
        crate::store::untrusted_object_list(conn, crate::store::registry::TABLE).map_err(
            Error::sqlite(Store::Registry, from, "cannot read the registry's schema"),
        )?;
    if problems.is_empty() {
        return Ok(());
    }
    Err(Error::Registry {
        shown: crate::store::location::label(from),
        message: format!(
            "cannot be copied: it holds {}. Nothing was written. A copy reads plain tables \
             only, so that what it copies is what the file holds; a registry needs none of \
             these. Inspect and drop them (sqlite3 {} '.schema'), then copy again",
            problems.join("; "),
            crate::text::esc(&from.display().to_string())
        ),
    })
}

/// Every lease of the lease store at `path`. A SQLite store's
/// `workflow_leases` must be a plain table (a view would be copied as what
/// it shows, hiding leases), checked in the same read transaction as the
/// leases are read.
fn read_lease_source(path: &Path) -> Result<Vec<crate::store::leases::Lease>> {
    let Location::Sqlite(_) = Location::parse(path)? else {
        return crate::store::open::engine(path)?.read_leases();
    };
    let conn = crate::store::sqlite::leases::open_read_only(path)?;
    let sql = |doing| Error::sqlite(Store::Leases, path, doing);
    conn.execute_batch("BEGIN")
        .map_err(sql("cannot begin a read"))?;
    if let Some(problem) = crate::store::not_a_table(&conn, crate::store::leases::TABLE) {
        return Err(Error::Leases {
            shown: crate::store::location::label(path),
            message: format!(
                "cannot be copied: {problem}. Nothing was written. A copy reads the lease \
                 table itself, so that every lease it holds is copied; point --leases at the \
                 control-plane lease store, whose `{}` is a table",
                crate::store::leases::TABLE
            ),
        });
    }
    let leases = crate::store::sqlite::leases::read(&conn, path)?;
    conn.execute_batch("COMMIT")
        .map_err(sql("cannot end the read"))?;
    Ok(leases)
}

/// The tokens a copy is proved by, computed where they are defined
/// (`crate::fingerprint`, `crate::evidence::leases`), above the store.
pub trait Tokens {
    /// The registry token of `rows`.
    fn registry(&self, rows: &[Row]) -> String;
    /// The external-state token of `active` leases.
    fn external_state(&self, active: &[crate::store::leases::Lease]) -> String;
    /// The digest of every column of `active` leases.
    fn lease_digest(&self, active: &[crate::store::leases::Lease]) -> String;
}

/// Copy the SQLite registry `from` (and the SQLite lease store `leases`,
/// when given) into the PostgreSQL database `to`, and prove it.
pub fn copy(
    from: &Path,
    leases: Option<&Path>,
    to: &str,
    tokens: &dyn Tokens,
) -> Result<CopyReport> {
    // The one command that names its engines: it moves a SQLite registry
    // into PostgreSQL.
    let from_location = Location::parse(from)?;
    let Location::Sqlite(_) = from_location else {
        return Err(Error::input(
            About::Option("registry copy"),
            format!(
                "--from {from_location}: copy reads a SQLite registry; to move between PostgreSQL \
             databases, use pg_dump"
            ),
        ));
    };
    let Location::Postgres(target) = Location::parse(Path::new(to))? else {
        return Err(Error::input(
            About::Option("registry copy"),
            format!("--to {to}: not a PostgreSQL URL; give postgres://USER@HOST:PORT/DATABASE"),
        ));
    };
    let label = target.to_string();
    // Rows and audit from one read transaction: one state of the file,
    // even while workers write it.
    let source = crate::store::sqlite::read::open_read_only(from)?;
    let sql = |doing| Error::sqlite(Store::Registry, from, doing);
    source
        .execute_batch("BEGIN")
        .map_err(sql("cannot begin a read"))?;
    refuse_untrusted_source(&source, from)?;
    let rows = crate::store::sqlite::read::read_rows(&source, from)?;
    let audit = sqlite_audit_rows(&source, from)?;
    source
        .execute_batch("COMMIT")
        .map_err(sql("cannot end the read"))?;
    drop(source);
    check_representable(&rows, from)?;
    let lease_rows = leases.map(read_lease_source).transpose()?;

    let mut client = pg::connect_to(&target, Store::Registry)?;
    let err = |doing| Error::postgres(Store::Registry, &label, doing);
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::Serializable)
        .start()
        .map_err(err("cannot begin the copy"))?;
    if let Some(why) = pg::versions::not_ours(&mut tx, lease_rows.is_some(), &label)? {
        return Err(Error::Registry {
            shown: label,
            message: why,
        });
    }
    pg::migrate_registry_in(&mut tx, &label)?;
    pg::migrate_audit_in(&mut tx, &label)?;
    refuse_filled_registry(&mut tx, &label)?;
    pg::copy_rows_in(&mut tx, &rows, &label)?;
    insert_audit_in(&mut tx, &audit, &label)?;
    if let Some(lease_rows) = &lease_rows {
        copy_leases_in(&mut tx, lease_rows, &label)?;
    }

    // The proof, inside the same transaction: read everything back.
    let copied = pg::read_registry(&mut tx, &label)?;
    prove_rows(&rows, &copied, &label)?;
    let registry_fingerprint = tokens.registry(&rows);
    let copied_registry_fingerprint = tokens.registry(&copied);
    if registry_fingerprint != copied_registry_fingerprint {
        return Err(Error::Registry {
            shown: label,
            message: format!(
                "the copy's registry token {copied_registry_fingerprint} differs from the \
                 source's {registry_fingerprint}; nothing was committed"
            ),
        });
    }
    let external_state_fingerprint = match &lease_rows {
        None => None,
        Some(source) => Some(prove_leases(&mut tx, source, &label, tokens)?),
    };
    // The change record last, so the copied rows are not stamped one by
    // one (docs/apply.md, "A million rows on PostgreSQL").
    if pg::versions::supported(&mut tx, &label)? {
        pg::versions::install(&mut tx, &label)?;
    }
    // The indexes a host's scoped read goes through (`store::scope`): the
    // tables are new, so they are made here, in the copy's transaction.
    pg::scope::create_indexes(&mut tx, &label, false)?;
    tx.commit().map_err(err("cannot commit the copy"))?;
    Ok(CopyReport {
        from: from.display().to_string(),
        to: label,
        rows: rows.len(),
        audit_rows: audit.len(),
        leases: lease_rows.as_ref().map(Vec::len),
        registry_fingerprint,
        copied_registry_fingerprint,
        external_state_fingerprint,
    })
}

/// Refuse a registry or audit table that already holds rows: a copy never
/// merges into, or overwrites, what is there.
fn refuse_filled_registry(tx: &mut postgres::Transaction<'_>, label: &str) -> Result<()> {
    for (table, store) in [
        (crate::store::registry::TABLE, Store::Registry),
        (crate::store::audit::TABLE, Store::Registry),
    ] {
        let there = count(tx, table, store, label)?;
        if there > 0 {
            return Err(Error::Registry {
                shown: label.to_string(),
                message: format!(
                    "table `{table}` already holds {there} rows; copy writes only into empty \
                     tables, so nothing is merged or overwritten. Copy into a new database, \
                     or empty it deliberately first"
                ),
            });
        }
    }
    Ok(())
}

/// Create the lease table when missing and write the leases into it; an
/// error when it already holds rows.
fn copy_leases_in(
    tx: &mut postgres::Transaction<'_>,
    lease_rows: &[crate::store::leases::Lease],
    label: &str,
) -> Result<()> {
    pg::create_leases(tx, label)?;
    let there = count(tx, crate::store::leases::TABLE, Store::Leases, label)?;
    if there > 0 {
        return Err(Error::Leases {
            shown: label.to_string(),
            message: format!(
                "table `{}` already holds {there} rows; copy writes only into an empty one",
                crate::store::leases::TABLE
            ),
        });
    }
    pg::insert_leases_in(tx, lease_rows, label)
}

/// Read the copied leases back and prove they are the source's: the same
/// active leases (by external-state token and by full digest) and as many
/// in all. Returns the source's and the copy's external-state tokens.
fn prove_leases(
    tx: &mut postgres::Transaction<'_>,
    source: &[crate::store::leases::Lease],
    label: &str,
    tokens: &dyn Tokens,
) -> Result<(String, String)> {
    let back = pg::read_leases(tx, label, false)?;
    let active = |l: &[crate::store::leases::Lease]| -> Vec<crate::store::leases::Lease> {
        l.iter().filter(|l| l.is_active()).cloned().collect()
    };
    let (source_active, back_active) = (active(source), active(&back));
    let (was, now) = (
        tokens.external_state(&source_active),
        tokens.external_state(&back_active),
    );
    let same_digest = tokens.lease_digest(&source_active) == tokens.lease_digest(&back_active);
    if was != now || !same_digest || source.len() != back.len() {
        return Err(Error::Leases {
            shown: label.into(),
            message: format!(
                "the copied leases do not read back as the source: {}; nothing was \
                 committed",
                lease_difference(source, &back)
            ),
        });
    }
    Ok((was, now))
}

/// Every source row is in the copy, value for value, and nothing else is.
fn prove_rows(source: &[Row], copied: &[Row], label: &str) -> Result<()> {
    use crate::row::Col;
    let by_id: std::collections::HashMap<String, &Row> = copied
        .iter()
        .map(|r| (r.get(Col::WorkerIdentity).canon(), r))
        .collect();
    let differs = |why: String| Error::Registry {
        shown: label.into(),
        message: format!("the copy does not read back as the source: {why}; nothing was committed"),
    };
    if copied.len() != source.len() {
        return Err(differs(format!(
            "{} rows read back where {} were written",
            copied.len(),
            source.len()
        )));
    }
    for row in source {
        let id = row.get(Col::WorkerIdentity).canon();
        let back = by_id
            .get(&id)
            .ok_or_else(|| differs(format!("row {} is missing", crate::text::esc(&id))))?;
        if let Some(col) = COLUMNS.iter().find(|c| !same(row.get(**c), back.get(**c))) {
            return Err(differs(format!(
                "row {} column `{}` reads back as {} {} (was {} {})",
                crate::text::esc(&id),
                col.name(),
                back.get(*col).kind(),
                crate::text::esc(&back.get(*col).canon()),
                row.get(*col).kind(),
                crate::text::esc(&row.get(*col).canon()),
            )));
        }
    }
    Ok(())
}

/// What differs between the source's leases and the copy's, as the lease
/// check sees them (every column's kind and canonical text of the active
/// leases, and how many leases there are): the first lease and column that
/// differ, so a refusal says what to correct rather than showing two tokens.
fn lease_difference(
    source: &[crate::store::leases::Lease],
    copied: &[crate::store::leases::Lease],
) -> String {
    use crate::store::leases::Lease;
    let name = |l: &Lease| {
        crate::text::esc(&l.get(crate::store::leases::LeaseCol::LeaseId).canon()).into_owned()
    };
    let by_id: std::collections::HashMap<String, &Lease> =
        copied.iter().map(|l| (name(l), l)).collect();
    for lease in source.iter().filter(|l| l.is_active()) {
        let id = name(lease);
        let Some(back) = by_id.get(&id) else {
            return format!("active lease {id} is missing from the copy");
        };
        if let Some(why) = column_difference(lease, back) {
            return format!("active lease {id} {why}");
        }
    }
    let active = |l: &[Lease]| l.iter().filter(|l| l.is_active()).count();
    format!(
        "{} leases ({} active) read back where {} ({} active) were written",
        copied.len(),
        active(copied),
        source.len(),
        active(source)
    )
}

/// The first column (in name order) where a lease and its copy differ in
/// kind or canonical text, or where one has a column the other lacks.
fn column_difference(
    lease: &crate::store::leases::Lease,
    back: &crate::store::leases::Lease,
) -> Option<String> {
    use crate::store::leases::{COLUMNS, TABLE};
    let was: std::collections::BTreeMap<&str, &Value> = lease.fields().collect();
    let now: std::collections::BTreeMap<&str, &Value> = back.fields().collect();
    let shown = |v: Option<&&Value>| match v {
        None => "absent".to_string(),
        Some(v) => format!("{} {}", v.kind(), crate::text::esc(&v.canon())),
    };
    let column = was
        .keys()
        .chain(now.keys())
        .copied()
        .filter(|c| match (was.get(c), now.get(c)) {
            (Some(a), Some(b)) => !same(a.as_val(), b.as_val()),
            _ => true,
        })
        .min()?;
    let hint = if now.contains_key(column) {
        String::new()
    } else {
        format!(
            ". The copy's `{TABLE}` has only the lease schema's columns ({}): drop `{}` \
             from the source's table, or copy without --leases",
            COLUMNS.join(", "),
            crate::text::esc(column)
        )
    };
    Some(format!(
        "column `{}` reads back as {} (was {}){hint}",
        crate::text::esc(column),
        shown(now.get(column)),
        shown(was.get(column)),
    ))
}
