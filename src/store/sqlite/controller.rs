//! The controller's lease, budget and apply records in a SQLite registry
//! (`store::controller` has the tables). SQLite has no clock of its own:
//! expiries are on the host's clock, the only one every controller of a
//! SQLite registry shares (they all run on the host that holds the file).
//! Every acquire and renew is a compare-and-set under the write lock
//! (`BEGIN IMMEDIATE`), waiting at most the retry period for it.

use crate::error::{Error, Result, Store};
use crate::store::controller::{
    create_sql, foreign_columns, host_now_ms, not_held, Acquired, Bucket, Changed, ChangesSince,
    Stamp, Table, APPLIES, BUDGETS, LEASES, TABLES,
};
use crate::store::seam::{ControllerRows, Refused};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The registry opened for the controller's own rows.
pub struct Rows {
    conn: Connection,
    /// A second, read-only connection kept open for the change signal.
    watch: Connection,
    path: PathBuf,
}

/// Why each of our tables under our names is not ours; empty when each is
/// absent or exactly ours.
pub fn foreign_shapes(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut problems = Vec::new();
    for (table, cols) in TABLES {
        problems.extend(crate::store::not_a_table(conn, table));
        if let Some(found) = crate::store::table_columns(conn, table)? {
            problems.extend(foreign_columns(table, cols, &found));
        }
    }
    Ok(problems)
}

impl Rows {
    /// Open the existing registry at `path`, creating the controller's
    /// tables when they are missing: only a user who may write the file
    /// can, and any other is told so.
    pub fn open(path: &Path, busy: Duration) -> Result<Rows> {
        let conn = super::worker::open_existing(path)?;
        let err = |doing| Error::sqlite(Store::Registry, path, doing);
        conn.busy_timeout(busy)
            .map_err(err("cannot set the busy timeout"))?;
        let problems = foreign_shapes(&conn).map_err(err("cannot read the schema"))?;
        if !problems.is_empty() {
            return Err(Error::Registry {
                shown: path.display().to_string(),
                message: problems.join("; "),
            });
        }
        ensure_tables(&conn, path)?;
        let watch = super::read::open_read_only(path)?;
        Ok(Rows {
            conn,
            watch,
            path: path.to_path_buf(),
        })
    }

    fn err(&self, doing: &'static str) -> impl Fn(rusqlite::Error) -> Error + '_ {
        Error::sqlite(Store::Registry, &self.path, doing)
    }
}

/// Create whichever of our tables is missing, in one short transaction.
fn ensure_tables(conn: &Connection, path: &Path) -> Result<()> {
    let err = |doing| Error::sqlite(Store::Registry, path, doing);
    let missing = |c: &Connection| -> rusqlite::Result<Vec<Table>> {
        let mut out = Vec::new();
        for (t, cols) in TABLES {
            if crate::store::table_columns(c, t)?.is_none() {
                out.push((t, cols));
            }
        }
        Ok(out)
    };
    if missing(conn)
        .map_err(err("cannot read the schema"))?
        .is_empty()
    {
        return Ok(());
    }
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(true) {
        return Err(Error::Registry {
            shown: path.display().to_string(),
            message: format!(
                "lacks the controller's tables ({LEASES}, {BUDGETS}, {APPLIES}) and this user (uid {}) may \
                 not create them: start the controller once as the registry's owner, or grant \
                 this user write access to the file and its folder",
                nix::unistd::getuid()
            ),
        });
    }
    let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(
        err("cannot take the write lock to create the controller's tables"),
    )?;
    for (table, cols) in missing(&tx).map_err(err("cannot read the schema"))? {
        tx.execute_batch(&create_sql(table, cols))
            .map_err(err("cannot create the controller's tables"))?;
    }
    tx.commit()
        .map_err(err("cannot create the controller's tables"))
}

/// The lease row of `scope`: holder, term, expiry.
fn lease_of(conn: &Connection, scope: &str) -> rusqlite::Result<Option<(String, i64, i64)>> {
    conn.query_row(
        &format!("SELECT holder, term, expires_at_ms FROM {LEASES} WHERE scope = ?1"),
        [scope],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .optional()
}

/// Triggers on our tables: a write of the lease (every retry period, even
/// in a dry run) would run their code outside apply's guard and audit.
/// Read under the write lock, so none is added before the write.
fn triggers_on_ours(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let names: Vec<&str> = TABLES.iter().map(|(t, _)| *t).collect();
    let mut stmt = conn.prepare(
        "SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger' \
         AND tbl_name IN (?1, ?2, ?3) ORDER BY name",
    )?;
    let found = stmt
        .query_map(rusqlite::params_from_iter(names), |r| {
            Ok(format!(
                "trigger {:?} on {:?}",
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?
            ))
        })?
        .collect();
    found
}

/// The write lock for a lease write (`doing` names it in an error), taken
/// only while no trigger stands on the controller's tables: a trigger's
/// code would run as this process at every renewal and release.
fn lease_write<'c>(
    conn: &'c mut Connection,
    path: &Path,
    doing: &str,
) -> Result<rusqlite::Transaction<'c>> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::sqlite(Store::Registry, path, doing))?;
    let triggers = triggers_on_ours(&tx).map_err(Error::sqlite(
        Store::Registry,
        path,
        "cannot read the schema",
    ))?;
    if triggers.is_empty() {
        return Ok(tx);
    }
    Err(Error::Registry {
        shown: path.display().to_string(),
        message: format!(
            "the controller's tables carry {}, whose code would run at every lease write; \
             nothing was written. Read what each does (sqlite3 REGISTRY '.schema'), drop it \
             (sqlite3 REGISTRY 'DROP TRIGGER NAME') and start the controller again",
            triggers.join(", ")
        ),
    })
}

/// The compare-and-set, inside the write lock: take a lease that is free
/// or expired (a new term), renew our own while it has not expired.
fn acquire_in(
    conn: &Connection,
    scope: &str,
    holder: &str,
    ttl_ms: i64,
    bucket: Bucket,
) -> rusqlite::Result<Acquired> {
    let now = host_now_ms();
    let expires = now + ttl_ms;
    let term = match lease_of(conn, scope)? {
        None => {
            conn.execute(
                &format!(
                    "INSERT INTO {LEASES} (scope, holder, term, acquired_at_ms, renewed_at_ms, \
                     expires_at_ms) VALUES (?1, ?2, 1, ?3, ?3, ?4)"
                ),
                params![scope, holder, now, expires],
            )?;
            1
        }
        Some((h, term, until)) if h == holder && until > now => {
            conn.execute(
                &format!(
                    "UPDATE {LEASES} SET renewed_at_ms = ?1, expires_at_ms = ?2 \
                     WHERE scope = ?3 AND holder = ?4 AND term = ?5"
                ),
                params![now, expires, scope, holder, term],
            )?;
            term
        }
        Some((_, term, until)) if until <= now => {
            conn.execute(
                &format!(
                    "UPDATE {LEASES} SET holder = ?1, term = ?2, acquired_at_ms = ?3, \
                     renewed_at_ms = ?3, expires_at_ms = ?4 WHERE scope = ?5 AND term = ?6"
                ),
                params![holder, term + 1, now, expires, scope, term],
            )?;
            term + 1
        }
        Some((h, term, _)) => return Ok(Acquired::Following { holder: h, term }),
    };
    // The budget passes to the new term (made full the first time); a
    // renewal writes nothing here.
    conn.execute(
        &format!(
            "INSERT INTO {BUDGETS} (scope, term, budget_tokens, budget_at_ms) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (scope) DO UPDATE SET term = excluded.term \
             WHERE term <> excluded.term"
        ),
        params![scope, term, bucket.capacity, now],
    )?;
    Ok(Acquired::Leading {
        term,
        expires_at_ms: expires,
    })
}

impl ControllerRows for Rows {
    fn acquire(
        &mut self,
        scope: &str,
        holder: &str,
        ttl: Duration,
        bucket: Bucket,
    ) -> Result<Acquired> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 2);
        let tx = lease_write(
            &mut self.conn,
            &self.path,
            "cannot take the write lock for the controller's lease",
        )?;
        let got = acquire_in(&tx, scope, holder, ttl_ms, bucket).map_err(Error::sqlite(
            Store::Registry,
            &self.path,
            "cannot write the controller's lease",
        ))?;
        tx.commit().map_err(Error::sqlite(
            Store::Registry,
            &self.path,
            "cannot commit the controller's lease",
        ))?;
        Ok(got)
    }

    /// Under the write lock, after the same check of triggers as a renewal.
    fn release(&mut self, scope: &str, holder: &str, term: i64) -> Result<bool> {
        let tx = lease_write(
            &mut self.conn,
            &self.path,
            "cannot take the write lock to release the controller's lease",
        )?;
        let n = tx
            .execute(
                &format!(
                    "UPDATE {LEASES} SET holder = '', expires_at_ms = 0 \
                     WHERE scope = ?1 AND holder = ?2 AND term = ?3"
                ),
                params![scope, holder, term],
            )
            .map_err(Error::sqlite(
                Store::Registry,
                &self.path,
                "cannot release the controller's lease",
            ))?;
        tx.commit().map_err(Error::sqlite(
            Store::Registry,
            &self.path,
            "cannot release the controller's lease",
        ))?;
        Ok(n == 1)
    }

    fn budget(&mut self, scope: &str, bucket: Bucket) -> Result<f64> {
        let row: Option<(f64, i64)> = self
            .conn
            .query_row(
                &format!("SELECT budget_tokens, budget_at_ms FROM {BUDGETS} WHERE scope = ?1"),
                [scope],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(self.err("cannot read the controller's budget"))?;
        Ok(row.map_or(0.0, |(t, at)| bucket.refill(t, at, host_now_ms())))
    }

    /// The registry's row-version clock and schema version (the mark):
    /// every write to the registry table moves the first (our triggers),
    /// any DDL the second; the controller's own lease writes move neither.
    /// The rows changed since are those stamped with a later clock, read
    /// by their row ids. `None` when the registry keeps no row versions.
    fn changes(
        &mut self,
        since: Option<&str>,
        limit: usize,
    ) -> Result<Option<(String, ChangesSince)>> {
        let err = Error::sqlite(Store::Registry, &self.path, "cannot read the change signal");
        let c = &self.watch;
        // One read transaction: the mark and the rows are of one snapshot.
        c.execute_batch("BEGIN").map_err(&err)?;
        let read = changes_on(c, &self.path, since, limit);
        let _ = c.execute_batch("COMMIT");
        read
    }
}

/// [`ControllerRows::changes`] on `c`, inside a read transaction.
fn changes_on(
    c: &Connection,
    path: &Path,
    since: Option<&str>,
    limit: usize,
) -> Result<Option<(String, ChangesSince)>> {
    let err = Error::sqlite(Store::Registry, path, "cannot read the change signal");
    if !super::versions::installed(c).map_err(&err)? {
        return Ok(None);
    }
    let clock: i64 = c
        .query_row(
            &format!(
                "SELECT version FROM {} WHERE id = 1",
                super::versions::CLOCK
            ),
            [],
            |r| r.get(0),
        )
        .map_err(&err)?;
    let schema = super::versions::schema_version(c).map_err(&err)?;
    let mark = format!("{clock}/{schema}");
    let then = since.and_then(|s| {
        let (clock, schema) = s.split_once('/')?;
        Some((clock.parse::<i64>().ok()?, schema.parse::<i64>().ok()?))
    });
    let unknown = |why: &str| Ok(Some((mark.clone(), ChangesSince::Unknown(why.into()))));
    let Some((then_clock, then_schema)) = then else {
        return unknown("no earlier mark");
    };
    if then_schema != schema {
        return unknown("the registry's schema changed");
    }
    if clock == then_clock {
        return Ok(Some((mark, ChangesSince::Rows(Vec::new()))));
    }
    if clock < then_clock {
        return unknown("the registry's row-version clock went back");
    }
    let mut stmt = c
        .prepare_cached(&format!(
            "SELECT row_id FROM {} WHERE version > ?1 ORDER BY row_id LIMIT ?2",
            super::versions::CHANGES
        ))
        .map_err(&err)?;
    let stamped: Vec<i64> = stmt
        .query_map(params![then_clock, limit as i64 + 1], |r| r.get(0))
        .map_err(&err)?
        .collect::<rusqlite::Result<_>>()
        .map_err(&err)?;
    if stamped.len() > limit {
        return unknown("more rows changed than a check reads");
    }
    let found = super::scope::rows_by_rowid(c, path, &stamped)?;
    let mut rows: Vec<Changed> = Vec::with_capacity(stamped.len());
    for id in &stamped {
        rows.push(match found.iter().find(|(at, _)| at == id) {
            Some((_, row)) => Changed::Row(row.clone()),
            None => Changed::Gone(None),
        });
    }
    Ok(Some((mark, ChangesSince::Rows(rows))))
}

/// Inside apply's transaction: why `stamp` may not act, if it may not.
pub fn holds(conn: &Connection, stamp: &Stamp) -> rusqlite::Result<Option<String>> {
    if crate::store::table_columns(conn, LEASES)?.is_none() {
        return Ok(Some(format!("the registry holds no {LEASES} table")));
    }
    Ok(not_held(
        stamp,
        lease_of(conn, &stamp.scope)?,
        host_now_ms(),
    ))
}

/// Inside apply's transaction, once the targets are known: spend `targets`
/// tokens of the host's budget and record the apply's term and tick. Why
/// not, when the budget is another term's or does not hold them.
pub fn record(
    conn: &Connection,
    stamp: &Stamp,
    apply_id: &str,
    targets: usize,
) -> rusqlite::Result<Option<Refused>> {
    let now = host_now_ms();
    let (tokens, at, term): (f64, i64, i64) = conn.query_row(
        &format!("SELECT budget_tokens, budget_at_ms, term FROM {BUDGETS} WHERE scope = ?1"),
        [&stamp.scope],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    if term != stamp.term {
        return Ok(Some(Refused::Lease(format!(
            "the host's budget belongs to term {term}; this controller acted under term {}",
            stamp.term
        ))));
    }
    let left = stamp.bucket.refill(tokens, at, now);
    let wanted = targets as f64;
    if left + 1e-9 < wanted {
        return Ok(Some(Refused::Budget(format!(
            "the host's retirement budget holds {left:.1} token(s) and this apply has \
             {targets} target(s)"
        ))));
    }
    conn.execute(
        &format!("UPDATE {BUDGETS} SET budget_tokens = ?1, budget_at_ms = ?2 WHERE scope = ?3"),
        params![left - wanted, now, stamp.scope],
    )?;
    conn.execute(
        &format!(
            "INSERT INTO {APPLIES} (apply_id, scope, holder, controller_term, controller_tick, \
             targets, recorded_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
        ),
        params![
            apply_id,
            stamp.scope,
            stamp.holder,
            stamp.term,
            stamp.tick,
            targets as i64,
            now
        ],
    )?;
    Ok(None)
}
