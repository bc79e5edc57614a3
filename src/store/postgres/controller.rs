//! The controller's lease, budget and apply records in a PostgreSQL
//! registry (`store::controller` has the tables). Every time is the
//! server's `clock_timestamp()`, the one clock every host's controller
//! shares, so hosts' clock skew never decides who leads. An acquire or
//! renew is one compare-and-set statement (an upsert whose update holds
//! only for a free or expired lease or the holder's own). Inside apply's
//! transaction the lease row is read and then updated (the budget spent,
//! under the same holder and term): a takeover committed after the
//! transaction's snapshot makes that update fail to serialize, and one
//! tried after it waits for the transaction to end, so terms follow the
//! order of commits.

use super::PgUrl;
use crate::error::{Error, Result, Store};
use crate::store::controller::{
    create_sql, foreign_columns, not_held, Acquired, Bucket, Changed, ChangesSince, Stamp, APPLIES,
    BUDGETS, LEASES, TABLES,
};
use crate::store::seam::{ControllerRows, Refused};
use postgres::GenericClient;
use std::time::Duration;

/// The server's now, in milliseconds since the Unix epoch.
const NOW_MS: &str =
    "(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::pg_catalog.int8";

/// The registry opened for the controller's own rows.
pub struct Rows {
    client: postgres::Client,
    label: String,
    /// Where and how to connect again once the server closed the
    /// connection (a failover, or an idle transaction ended by it).
    url: PgUrl,
    busy: Duration,
    /// Set between calls: a follower's connection is silent by right.
    idle: super::stall::Idle,
}

/// The columns of `table` in the session's schema (none when it is absent),
/// and why it is not a plain table, if it is not.
fn shape_of(
    c: &mut impl GenericClient,
    table: &str,
    label: &str,
) -> Result<(Vec<String>, Option<String>)> {
    let err = Error::postgres(
        Store::Registry,
        label,
        "cannot read the controller's tables' shape",
    );
    let cols: Vec<String> = c
        .query(
            "SELECT a.attname::pg_catalog.text FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class r ON r.oid = a.attrelid \
             WHERE r.relname = $1 AND r.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
             AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&table],
        )
        .map_err(err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let kind: Option<String> = c
        .query_opt(
            "SELECT relkind::pg_catalog.text FROM pg_catalog.pg_class \
             WHERE relname = $1 AND relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace",
            &[&table],
        )
        .map_err(err)?
        .map(|r| r.get(0));
    let not_plain = kind
        .filter(|k| k != "r")
        .map(|_| format!("{table:?} is not a plain table"));
    Ok((cols, not_plain))
}

/// The compare-and-set: insert the lease, or update it when it is the
/// holder's own (renewed; a new term if it had expired) or free or
/// expired (a new term); nothing when another holds it unexpired.
fn upsert_sql() -> String {
    format!(
        "INSERT INTO {LEASES} AS l (scope, holder, term, acquired_at_ms, renewed_at_ms, \
         expires_at_ms) SELECT $1, $2, 1, n, n, n + $3 FROM (SELECT {NOW_MS} AS n) AS now \
         ON CONFLICT (scope) DO UPDATE SET holder = EXCLUDED.holder, \
         term = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at_ms > EXCLUDED.renewed_at_ms \
                THEN l.term ELSE l.term + 1 END, \
         acquired_at_ms = CASE WHEN l.holder = EXCLUDED.holder \
                AND l.expires_at_ms > EXCLUDED.renewed_at_ms \
                THEN l.acquired_at_ms ELSE EXCLUDED.renewed_at_ms END, \
         renewed_at_ms = EXCLUDED.renewed_at_ms, expires_at_ms = EXCLUDED.expires_at_ms \
         WHERE l.holder = EXCLUDED.holder OR l.expires_at_ms <= EXCLUDED.renewed_at_ms \
         RETURNING term, expires_at_ms, renewed_at_ms, acquired_at_ms = renewed_at_ms"
    )
}

/// The key of the advisory lock under which controllers create their
/// tables, so two starting at once do not race (the loser of two
/// concurrent `CREATE TABLE IF NOT EXISTS` gets a unique-key error).
const CREATE_LOCK: i64 = 0x6672_5f63_746c_0001;

/// Create the missing tables in one transaction, under [`CREATE_LOCK`].
fn create_missing(
    client: &mut postgres::Client,
    label: &str,
    missing: &[(&str, &[(&str, &str)])],
) -> Result<()> {
    let cannot = |e: postgres::Error| {
        super::registry_error(
            label,
            format!(
                "lacks the controller's tables and this role may not create them ({e}): run \
                 `fleet-retire registry versions` once as the registry's owner (it makes them), \
                 then grant this role SELECT, INSERT and UPDATE on {LEASES}, {BUDGETS} and \
                 {APPLIES} (docs/multi-host.md, \"The roles, and exactly their grants\")"
            ),
        )
    };
    let mut tx = client.transaction().map_err(cannot)?;
    tx.execute(
        "SELECT pg_catalog.pg_advisory_xact_lock($1)",
        &[&CREATE_LOCK],
    )
    .map_err(cannot)?;
    for (table, cols) in missing {
        let create =
            create_sql(table, cols).replacen("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1);
        tx.batch_execute(&create).map_err(cannot)?;
    }
    tx.commit().map_err(cannot)
}

/// `registry versions`: the controller's tables made when missing, as a
/// controller's start makes them (under [`CREATE_LOCK`], tables of our
/// names that are not ours refused), when the connected role owns the
/// registry table (tables another role made would be refused as not the
/// owner's); by any other role, nothing.
pub fn make_tables(url: &PgUrl) -> Result<()> {
    let label = url.to_string();
    let owner = super::connect_to(url, Store::Registry)?
        .query_opt(
            "SELECT pg_catalog.pg_get_userbyid(relowner) = current_user FROM pg_catalog.pg_class \
             WHERE relname = $1 AND relkind = 'r' \
             AND relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace",
            &[&crate::store::registry::TABLE],
        )
        .map_err(Error::postgres(
            Store::Registry,
            &label,
            "cannot read who owns the registry table",
        ))?
        .is_some_and(|r| r.get::<_, bool>(0));
    if owner {
        Rows::open(url, Duration::from_secs(5))?;
    }
    Ok(())
}

impl Rows {
    /// Connect, refuse tables of our names that are not ours, and create
    /// the missing ones: only a role allowed to create tables in the
    /// registry's schema can, and any other is told so.
    pub fn open(url: &PgUrl, busy: Duration) -> Result<Rows> {
        let label = url.to_string();
        let (mut client, idle) = super::connect_watched(url, Store::Registry)?;
        let err = |doing| Error::postgres(Store::Registry, &label, doing);
        client
            .batch_execute(&format!("SET lock_timeout = {}", busy.as_millis().max(1)))
            .map_err(err("cannot bound the lock wait"))?;
        let mut missing = Vec::new();
        let mut problems = Vec::new();
        for (table, cols) in TABLES {
            let (found, not_plain) = shape_of(&mut client, table, &label)?;
            problems.extend(not_plain);
            if found.is_empty() {
                missing.push((table, cols));
            } else {
                problems.extend(foreign_columns(table, cols, &found));
            }
        }
        problems.extend(super::shape::controller_untrusted(&mut client, &label)?);
        if !problems.is_empty() {
            return Err(super::registry_error(&label, problems.join("; ")));
        }
        if !missing.is_empty() {
            create_missing(&mut client, &label, &missing)?;
            // What stands now (ours, or a racing controller's) is checked
            // as any table found at start.
            return Rows::open(url, busy);
        }
        idle.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(Rows {
            client,
            label,
            url: url.clone(),
            busy,
            idle,
        })
    }

    /// The connection, opened again (and the tables checked again) when
    /// the server closed it: without this a controller whose connection
    /// broke once would never lead again.
    fn live(&mut self) -> Result<()> {
        if self.client.is_closed() {
            *self = Rows::open(&self.url, self.busy)?;
        }
        Ok(())
    }

    fn err(&self, doing: &'static str) -> impl Fn(postgres::Error) -> Error + '_ {
        Error::postgres(Store::Registry, &self.label, doing)
    }
}

impl Drop for Rows {
    /// Closing waits for the server's side: watched as a connection in
    /// use, so a frozen server is given up on within the reply bound.
    fn drop(&mut self) {
        self.idle.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl ControllerRows for Rows {
    /// The lease's upsert and, when a term begins, the budget passed to
    /// it, in one transaction.
    fn acquire(
        &mut self,
        scope: &str,
        holder: &str,
        ttl: Duration,
        bucket: Bucket,
    ) -> Result<Acquired> {
        self.live()?;
        let _in_use = super::stall::InUse::mark(&self.idle);
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 2);
        let label = self.label.clone();
        let err = |doing| Error::postgres(Store::Registry, &label, doing);
        let mut tx = self
            .client
            .transaction()
            .map_err(err("cannot begin the controller's lease"))?;
        // The upsert locks the lease row to COMMIT: a process frozen
        // before COMMIT must not keep every other controller from taking
        // it, so the server ends this transaction once idle for the ttl.
        tx.execute(
            "SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', $1, true)",
            &[&ttl_ms.to_string()],
        )
        .map_err(err("cannot bound an idle transaction"))?;
        let row = tx
            .query_opt(&upsert_sql(), &[&scope, &holder, &ttl_ms])
            .map_err(err("cannot write the controller's lease"))?;
        let Some(row) = row else {
            let row = tx
                .query_one(
                    &format!("SELECT holder, term FROM {LEASES} WHERE scope = $1"),
                    &[&scope],
                )
                .map_err(err("cannot read the controller's lease"))?;
            return Ok(Acquired::Following {
                holder: row.get(0),
                term: row.get(1),
            });
        };
        let (term, expires_at_ms, now): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        // Only a new term (acquired now) takes the budget. A renewal must
        // not even try: an upsert locks the conflicting row whatever its
        // WHERE says, so it would wait for the controller's own apply,
        // which holds the budget row to COMMIT, and fail to renew.
        let new_term: bool = row.get(3);
        // A plain read waits for no lock: the budget row is there (the
        // usual case) unless someone removed it since this term began.
        let budgeted = tx
            .query_opt(
                &format!("SELECT 1 FROM {BUDGETS} WHERE scope = $1"),
                &[&scope],
            )
            .map_err(err("cannot read the controller's budget"))?
            .is_some();
        if !new_term && budgeted {
            tx.commit()
                .map_err(err("cannot commit the controller's lease"))?;
            return Ok(Acquired::Leading {
                term,
                expires_at_ms,
            });
        }
        tx.execute(
            &format!(
                "INSERT INTO {BUDGETS} AS b (scope, term, budget_tokens, budget_at_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (scope) DO UPDATE SET term = EXCLUDED.term \
                 WHERE b.term <> EXCLUDED.term"
            ),
            &[&scope, &term, &bucket.capacity, &now],
        )
        .map_err(err("cannot pass the budget to the new term"))?;
        tx.commit()
            .map_err(err("cannot commit the controller's lease"))?;
        Ok(Acquired::Leading {
            term,
            expires_at_ms,
        })
    }

    fn release(&mut self, scope: &str, holder: &str, term: i64) -> Result<bool> {
        self.live()?;
        let _in_use = super::stall::InUse::mark(&self.idle);
        let n = self
            .client
            .execute(
                &format!(
                    "UPDATE {LEASES} SET holder = '', expires_at_ms = 0 \
                     WHERE scope = $1 AND holder = $2 AND term = $3"
                ),
                &[&scope, &holder, &term],
            )
            .map_err(self.err("cannot release the controller's lease"))?;
        Ok(n == 1)
    }

    fn budget(&mut self, scope: &str, bucket: Bucket) -> Result<f64> {
        self.live()?;
        let _in_use = super::stall::InUse::mark(&self.idle);
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT budget_tokens, budget_at_ms, {NOW_MS} FROM {BUDGETS} WHERE scope = $1"
                ),
                &[&scope],
            )
            .map_err(self.err("cannot read the controller's budget"))?;
        Ok(row.map_or(0.0, |r| bucket.refill(r.get(0), r.get(1), r.get(2))))
    }

    /// The server's start time and the database (`versions::server`).
    fn server(&mut self) -> Result<Option<String>> {
        self.live()?;
        let _in_use = super::stall::InUse::mark(&self.idle);
        super::versions::server(&mut self.client, &self.label).map(Some)
    }

    /// The server and a snapshot (the mark): the rows changed since are
    /// those the change record (`versions`) stamped by a transaction that
    /// snapshot did not see, read by their identities, in one read-only
    /// transaction whose snapshot is the new mark. Every write to the
    /// registry or audit table is stamped; the controller's own rows are
    /// not. `None` without a change record.
    fn changes(
        &mut self,
        since: Option<&str>,
        limit: usize,
    ) -> Result<Option<(String, ChangesSince)>> {
        self.live()?;
        let _in_use = super::stall::InUse::mark(&self.idle);
        let (found, _) = shape_of(&mut self.client, super::versions::CHANGES, &self.label)?;
        if found.is_empty() {
            return Ok(None);
        }
        let label = self.label.clone();
        let mut tx = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(Error::postgres(
                Store::Registry,
                &label,
                "cannot read the change signal",
            ))?;
        let snapshot = super::versions::snapshot(&mut tx, &label)?;
        let server = super::versions::server(&mut tx, &label)?;
        let mark = format!("{server}|{snapshot}");
        let unknown = |why: &str| Ok(Some((mark.clone(), ChangesSince::Unknown(why.into()))));
        let Some((then_server, then)) = since.and_then(|s| s.split_once('|')) else {
            return unknown("no earlier mark");
        };
        if then_server != server {
            return unknown("another server, or the database was recreated");
        }
        let keys = super::versions::changed_keys(&mut tx, then, &label)?;
        if keys.len() > limit {
            return unknown("more rows changed than a check reads");
        }
        let mut identities = Vec::new();
        for key in keys {
            if let Some(identity) = key.strip_prefix("i:") {
                identities.push(identity.to_string());
            } else if !key.starts_with("a:") {
                return unknown("a table of the registry was truncated");
            }
        }
        let rows = super::read::read_identities(&mut tx, &label, &identities)?;
        let _ = tx.commit();
        let mut changed: Vec<Changed> = rows.into_iter().map(Changed::Row).collect();
        let present: std::collections::BTreeSet<String> = changed
            .iter()
            .filter_map(|c| match c {
                Changed::Row(r) => Some(r.get(crate::row::Col::WorkerIdentity).canon()),
                Changed::Gone(_) => None,
            })
            .collect();
        changed.extend(
            identities
                .into_iter()
                .filter(|i| !present.contains(i))
                .map(|i| Changed::Gone(Some(i))),
        );
        Ok(Some((mark, ChangesSince::Rows(changed))))
    }
}

/// Inside apply's transaction: why `stamp` may not act, if it may not. A
/// plain read in the transaction's snapshot: a takeover committed after it
/// makes [`record`]'s update of the same row fail to serialize.
pub fn holds(tx: &mut impl GenericClient, label: &str, stamp: &Stamp) -> Result<Option<String>> {
    let (found, _) = shape_of(tx, LEASES, label)?;
    if found.is_empty() {
        return Ok(Some(format!("the registry holds no {LEASES} table")));
    }
    // Checked in every controller's apply, as the registry's own tables
    // are: the budget and apply rows are written inside it.
    let untrusted = super::shape::controller_untrusted(tx, label)?;
    if !untrusted.is_empty() {
        return Err(super::registry_error(
            label,
            format!(
                "the controller's tables could run code of someone else's: {}. Nothing was \
                 written; have the registry's owner drop them (the controller makes them anew)",
                untrusted.join("; ")
            ),
        ));
    }
    let row = tx
        .query_opt(
            &format!("SELECT holder, term, expires_at_ms, {NOW_MS} FROM {LEASES} WHERE scope = $1"),
            &[&stamp.scope],
        )
        .map_err(Error::postgres(
            Store::Registry,
            label,
            "cannot read the controller's lease",
        ))?;
    let now = row.as_ref().map_or(0, |r| r.get(3));
    Ok(not_held(
        stamp,
        row.map(|r| (r.get(0), r.get(1), r.get(2))),
        now,
    ))
}

/// Inside apply's transaction: spend `targets` tokens and record the
/// apply's term and tick; why not, when the lease or the budget is
/// another term's, or the budget lacks them. The budget row is written by
/// a new term and by applies only, so a takeover committed after this
/// transaction's snapshot fails the update here, and one tried later waits
/// for COMMIT; the controller's own renewals never touch it.
pub fn record(
    tx: &mut impl GenericClient,
    label: &str,
    stamp: &Stamp,
    apply_id: &str,
    targets: usize,
) -> Result<Option<Refused>> {
    let err = |doing| Error::postgres(Store::Registry, label, doing);
    let row = tx
        .query_one(
            &format!(
                "SELECT b.budget_tokens, b.budget_at_ms, {NOW_MS}, l.holder, l.term, \
                 l.expires_at_ms, b.term FROM {BUDGETS} b JOIN {LEASES} l USING (scope) \
                 WHERE scope = $1"
            ),
            &[&stamp.scope],
        )
        .map_err(err("cannot read the controller's budget"))?;
    let now: i64 = row.get(2);
    if let Some(why) = not_held(stamp, Some((row.get(3), row.get(4), row.get(5))), now) {
        return Ok(Some(Refused::Lease(why)));
    }
    let left = stamp.bucket.refill(row.get(0), row.get(1), now);
    let wanted = targets as f64;
    if left + 1e-9 < wanted {
        return Ok(Some(Refused::Budget(format!(
            "the host's retirement budget holds {left:.1} token(s) and this apply has {targets} \
             target(s)"
        ))));
    }
    // The row is locked from here to COMMIT, so a takeover waits for this
    // transaction; a frozen process must not hold it for ever: the server
    // ends this transaction once it has been idle for the lease's ttl.
    tx.execute(
        "SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', $1, true)",
        &[&stamp.lease_ttl_ms.to_string()],
    )
    .map_err(err("cannot bound an idle transaction"))?;
    let n = tx
        .execute(
            &format!(
                "UPDATE {BUDGETS} SET budget_tokens = $1, budget_at_ms = $2 \
                 WHERE scope = $3 AND term = $4"
            ),
            &[&(left - wanted), &now, &stamp.scope, &stamp.term],
        )
        .map_err(err("cannot spend the controller's budget"))?;
    if n != 1 {
        return Ok(Some(Refused::Lease(format!(
            "the host's budget belongs to another term than {}",
            stamp.term
        ))));
    }
    tx.execute(
        &format!(
            "INSERT INTO {APPLIES} (apply_id, scope, holder, controller_term, controller_tick, \
             targets, recorded_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)"
        ),
        &[
            &apply_id,
            &stamp.scope,
            &stamp.holder,
            &stamp.term,
            &stamp.tick,
            &(targets as i64),
            &now,
        ],
    )
    .map_err(err("cannot record the controller's apply"))?;
    Ok(None)
}
