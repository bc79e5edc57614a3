//! The effect check of apply's transaction on PostgreSQL: what the
//! registry and the audit table held before the first write, and the proof
//! before COMMIT that the transaction changed exactly what the plan
//! approved.
//!
//! Counting the rows a statement reports, or the row versions the
//! transaction stamped (`xmin`), misses writes made in a subtransaction (a
//! plpgsql `EXCEPTION` block called from a CHECK, a default, an index
//! expression, a domain's check, …): there is always one more place a
//! database can run code. So the check is on the effect, not the route:
//! both images are read inside apply's own SERIALIZABLE snapshot, where
//! other transactions' commits are invisible, so every difference between
//! them is this transaction's own doing, whoever issued it.
//!
//! * Every registry row that is not a target: one digest (count, and
//!   SHA-256 over the sorted SHA-256 digests of each row's full text (MD5
//!   would let a schema owner plant a chosen-prefix collision), every
//!   column included,
//!   ours or not) before and after; they must be equal.
//! * Each target row: every column but the four retirement columns (the
//!   row's text with those four set to NULL) must be unchanged; the retirement columns must be exactly
//!   what the guarded UPDATE sets for a retired target, and unchanged for a
//!   target that was kept.
//! * The audit table: the rows of other applies, digested the same way,
//!   unchanged; this apply's rows exactly one per retired worker.

use crate::error::{Error, Result, Store};
use postgres::GenericClient;
use std::collections::BTreeMap;

/// The four columns the guarded UPDATE writes.
const RETIREMENT: [&str; 4] = ["status", "retired_at", "retired_by", "retirement_reason"];

/// A set of rows as a count and a digest.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Digest {
    rows: i64,
    sha256: String,
}

/// A target row: the SHA-256 of its text with the retirement columns set
/// to NULL (the server digests it; comparing digests is comparing the
/// texts), and its retirement columns.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    rest: String,
    retirement: [Option<String>; 4],
}

/// The registry and audit table as apply's transaction saw them before its
/// first write.
#[derive(Debug)]
pub struct PreImage {
    targets_requested: Vec<String>,
    /// The rows not targeted and the other applies' audit rows as digests;
    /// `None` when the change record vouches for them instead.
    others: Option<Digest>,
    targets: BTreeMap<String, Vec<Target>>,
    audit: Option<Digest>,
    /// The catalog's stamp, when the change record vouches.
    catalog: Option<String>,
}

pub use crate::store::seam::Written;

fn digest_sql(table: &str, filter: &str) -> String {
    format!(
        "SELECT count(*), coalesce(encode(sha256(string_agg(h, ''::bytea ORDER BY h)), 'hex'), '') \
         FROM (SELECT sha256(textsend(t::text)) AS h FROM {table} t WHERE {filter}) d"
    )
}

fn digest(
    tx: &mut impl GenericClient,
    sql: &str,
    param: &(dyn postgres::types::ToSql + Sync),
    label: &str,
) -> Result<Digest> {
    let err = Error::postgres(Store::Registry, label, "cannot read the registry's image");
    let r = tx.query_one(sql, &[param]).map_err(err)?;
    Ok(Digest {
        rows: r.get(0),
        sha256: r.get(1),
    })
}

fn others_sql() -> String {
    digest_sql(
        super::super::registry::TABLE,
        // An anti-join on the targets (hashed), not `<> ALL($1)`, which
        // compares every row with every target.
        "NOT EXISTS (SELECT 1 FROM pg_catalog.unnest($1::text[]) u(id) \
         WHERE u.id = t.worker_identity)",
    )
}

fn audit_sql() -> String {
    digest_sql(
        super::super::audit::TABLE,
        "t.apply_id IS DISTINCT FROM $1::text",
    )
}

fn read_targets(
    tx: &mut impl GenericClient,
    ids: &[String],
    label: &str,
) -> Result<BTreeMap<String, Vec<Target>>> {
    let err = Error::postgres(Store::Registry, label, "cannot read the targets' image");
    let cols = RETIREMENT
        .iter()
        .map(|c| format!("t.{}::text", super::quote_ident(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT x.* FROM pg_catalog.unnest($1::text[]) u(id) CROSS JOIN LATERAL \
         (SELECT t.worker_identity::text, \
         encode(sha256(textsend(jsonb_populate_record(t, $2::text::jsonb)::text)), 'hex'), \
         {cols} \
         FROM {} t WHERE t.worker_identity = u.id OFFSET 0) x",
        super::super::registry::TABLE
    );
    // Each identity looked up through the key (a lateral subquery kept
    // apart by `OFFSET 0`): joined plainly, with the identities as a
    // parameter, the planner chose a merge join that sorted the whole
    // table on disk (0.18 s at 100,000 rows for 10,000 targets, growing
    // with the registry, not with the targets).
    // The row's text with its four retirement columns set to NULL (every
    // other column as stored, ours or not), digested on the server: a
    // third of the cost of the same row as JSON less those keys.
    let retirement = serde_json::Value::Object(
        RETIREMENT
            .iter()
            .map(|c| (c.to_string(), serde_json::Value::Null))
            .collect(),
    )
    .to_string();
    let mut out: BTreeMap<String, Vec<Target>> = BTreeMap::new();
    for r in tx.query(&sql, &[&ids, &retirement]).map_err(err)? {
        out.entry(r.get(0)).or_default().push(Target {
            rest: r.get(1),
            retirement: [r.get(2), r.get(3), r.get(4), r.get(5)],
        });
    }
    Ok(out)
}

/// Read the image before the first write: `targets` are the identities
/// apply may write, `apply_id` the id its audit rows will carry. With
/// `stamped` (the change record installed whole, `super::versions`) the
/// rows not targeted need no digest: every write this transaction makes
/// to either table, whoever issues it, is stamped with its own id, and
/// [`differences`] reads those stamps.
pub fn pre_image(
    tx: &mut impl GenericClient,
    targets: &[String],
    apply_id: &str,
    stamped: bool,
    label: &str,
) -> Result<PreImage> {
    let requested = targets.to_vec();
    let started = std::time::Instant::now();
    let catalog = match stamped {
        true => Some(super::versions::catalog_stamp(tx, label)?),
        false => None,
    };
    let others = match stamped {
        true => None,
        false => Some(digest(tx, &others_sql(), &requested, label)?),
    };
    tracing::debug!(elapsed = ?started.elapsed(), "image: rows not targeted");
    let targets = read_targets(tx, &requested, label)?;
    tracing::debug!(elapsed = ?started.elapsed(), "image: targets");
    let audit = match stamped {
        true => None,
        false => Some(digest(tx, &audit_sql(), &apply_id, label)?),
    };
    tracing::debug!(elapsed = ?started.elapsed(), "image: audit rows");
    Ok(PreImage {
        others,
        targets,
        audit,
        catalog,
        targets_requested: requested,
    })
}

impl PreImage {
    /// Whether the change record vouches for the rows not targeted.
    pub fn stamped(&self) -> bool {
        self.catalog.is_some()
    }
}

/// Before COMMIT: every way the transaction's effect differs from the
/// planned one (empty when it is exactly as planned).
pub fn differences(
    tx: &mut impl GenericClient,
    pre: &PreImage,
    apply_id: &str,
    written: &[Written<'_>],
    label: &str,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    if let Some(others) = &pre.others {
        if &digest(tx, &others_sql(), &pre.targets_requested, label)? != others {
            out.push(
                "registry rows that apply did not target changed (or appeared, or vanished)".into(),
            );
        }
    }
    let now = read_targets(tx, &pre.targets_requested, label)?;
    out.extend(target_differences(pre, &now, written));
    if let Some(audit) = &pre.audit {
        if &digest(tx, &audit_sql(), &apply_id, label)? != audit {
            out.push("audit rows of other applies changed (or appeared, or vanished)".into());
        }
    }
    // This apply's audit rows: with the change record, those this
    // transaction stamped (read by their keys, see `own_keys`); every audit
    // row it wrote is stamped, and one it did not write carries another
    // apply's id (ours is 128 random bits, new to this transaction).
    let found = match &pre.catalog {
        Some(catalog) => {
            let (differ, found) = stamp_differences(tx, catalog, apply_id, written, label)?;
            out.extend(differ);
            found
        }
        None => audit_rows(tx, apply_id, label)?,
    };
    out.extend(audit_differences(found, written));
    Ok(out)
}

/// With the change record: no DDL on our tables or functions since the
/// first image, and this transaction's stamps exactly the targets retired
/// and this apply's own audit rows; with them, the workers those audit
/// rows name.
fn stamp_differences(
    tx: &mut impl GenericClient,
    catalog: &str,
    apply_id: &str,
    written: &[Written<'_>],
    label: &str,
) -> Result<(Vec<String>, Vec<Option<String>>)> {
    if super::versions::catalog_stamp(tx, label)? != catalog {
        return Ok((
            vec![
                "the registry's tables, triggers or functions changed inside this transaction \
                 (DDL)"
                    .into(),
            ],
            Vec::new(),
        ));
    }
    let mut expected: std::collections::BTreeSet<String> = written
        .iter()
        .map(|w| format!("i:{}", w.worker_identity))
        .collect();
    let mut out = Vec::new();
    let mut audit_rows = 0;
    let mut found = Vec::new();
    for own in super::versions::own_keys(tx, label)? {
        let key = own.key;
        if key.starts_with("a:") {
            if own.apply_id.as_deref() == Some(apply_id) {
                audit_rows += 1;
                found.push(own.worker_identity);
                continue;
            }
            out.push(format!(
                "an audit row that is not this apply's was written ({})",
                crate::text::esc(&key)
            ));
        } else if !expected.remove(&key) {
            out.push(format!(
                "a registry row apply did not retire was written ({})",
                crate::text::esc(&key)
            ));
        }
    }
    if !expected.is_empty() {
        out.push(format!(
            "{} retired row(s) left no change stamp",
            expected.len()
        ));
    }
    if audit_rows != written.len() {
        out.push(format!(
            "{audit_rows} audit row(s) were stamped where {} worker(s) were retired",
            written.len()
        ));
    }
    Ok((out, found))
}

/// Each target: unchanged but for the retirement columns, which hold what
/// the guarded UPDATE set when it was retired, and are unchanged otherwise.
fn target_differences(
    pre: &PreImage,
    now: &BTreeMap<String, Vec<Target>>,
    written: &[Written<'_>],
) -> Vec<String> {
    let mut out = Vec::new();
    let empty = Vec::new();
    // By identity: a search of the list per target was quadratic (a
    // tenth of a second at 10,000 targets).
    let written: std::collections::HashMap<&str, &Written<'_>> =
        written.iter().map(|w| (w.worker_identity, w)).collect();
    for id in &pre.targets_requested {
        let (was, is) = (
            pre.targets.get(id).unwrap_or(&empty),
            now.get(id).unwrap_or(&empty),
        );
        let show = crate::text::esc(id);
        let ([was], [is]) = (was.as_slice(), is.as_slice()) else {
            if was.len() != is.len() {
                out.push(format!(
                    "target {show:?}: {} row(s) before, {} now",
                    was.len(),
                    is.len()
                ));
            } else if was != is {
                out.push(format!("target {show:?}: its rows changed"));
            }
            continue;
        };
        if was.rest != is.rest {
            out.push(format!(
                "target {show:?}: columns other than the retirement changed"
            ));
        }
        let expected: [Option<String>; 4] = match written.get(id.as_str()) {
            Some(w) => w.retirement.map(|v| Some(v.to_string())),
            None => was.retirement.clone(),
        };
        if is.retirement != expected {
            out.push(format!(
                "target {show:?}: its retirement columns hold {:?} where {:?} was written",
                is.retirement, expected
            ));
        }
    }
    out
}

/// This apply's audit rows' workers, searched for by its id (without the
/// change record: the audit table is digested whole anyway).
fn audit_rows(
    tx: &mut impl GenericClient,
    apply_id: &str,
    label: &str,
) -> Result<Vec<Option<String>>> {
    let err = Error::postgres(
        Store::Registry,
        label,
        "cannot read this apply's audit rows",
    );
    Ok(tx
        .query(
            &format!(
                "SELECT t.worker_identity::text FROM {} t WHERE t.apply_id = $1::text",
                super::super::audit::TABLE
            ),
            &[&apply_id],
        )
        .map_err(err)?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// This apply's audit rows (the workers they name): exactly one per
/// retired worker.
fn audit_differences(mut found: Vec<Option<String>>, written: &[Written<'_>]) -> Vec<String> {
    found.sort();
    let mut expected: Vec<Option<String>> = written
        .iter()
        .map(|w| Some(w.worker_identity.to_string()))
        .collect();
    expected.sort();
    (found != expected)
        .then(|| {
            format!(
                "this apply's audit rows name {} worker(s) where {} were retired",
                found.len(),
                expected.len()
            )
        })
        .into_iter()
        .collect()
}
