//! A worker's writes to its own row of a PostgreSQL registry: each one
//! short autocommit statement touching only that row, over a connection
//! kept for the next heartbeat.

use super::PgUrl;
use crate::error::{Error, Result, Store};
use crate::row::COLUMNS;
use crate::store::registry::TABLE;
use crate::store::seam::{ActiveOwner, WorkerRows};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;

/// A PostgreSQL connection borrowed from this process's cache, one per URL:
/// a worker heartbeating every few seconds does not reconnect each time. It
/// goes back to the cache when dropped, unless it failed.
pub struct PgLease {
    url: String,
    label: String,
    client: Option<postgres::Client>,
    /// Set while the connection waits in the cache ([`super::stall`]).
    idle: super::stall::Idle,
}

type PgCache = std::sync::Mutex<HashMap<String, Vec<(postgres::Client, super::stall::Idle)>>>;

fn pg_cache() -> &'static PgCache {
    static CACHE: std::sync::OnceLock<PgCache> = std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

impl PgLease {
    /// Borrow a connection to `url` from the cache, or connect (creating or
    /// migrating the registry table when it is incomplete).
    pub fn take(url: &PgUrl, location: &Path) -> Result<PgLease> {
        let label = url.to_string();
        // The cache is keyed by the location as given (one URL, one pool).
        let url_key = location.to_string_lossy().into_owned();
        let cached = pg_cache()
            .lock()
            .ok()
            .and_then(|mut c| c.get_mut(&url_key).and_then(Vec::pop))
            .filter(|(c, _)| !c.is_closed());
        let (client, idle) = match cached {
            Some(kept) => kept,
            None => {
                let (mut c, idle) = super::connect_watched(url, Store::Registry)?;
                let complete = super::table_columns(&mut c, TABLE, Store::Registry, &label)?
                    .is_some_and(|cols| {
                        COLUMNS
                            .iter()
                            .all(|col| cols.iter().any(|(n, _)| n == col.name()))
                    });
                if !complete {
                    super::create_or_migrate_registry(&mut c, &label)?;
                }
                (c, idle)
            }
        };
        idle.store(false, std::sync::atomic::Ordering::SeqCst);
        Ok(PgLease {
            url: url_key,
            label,
            client: Some(client),
            idle,
        })
    }

    fn client(&mut self) -> &mut postgres::Client {
        self.client.as_mut().expect("the client is here until drop")
    }

    /// Run one statement; a failed connection is not returned to the cache.
    fn run<T>(
        &mut self,
        doing: &'static str,
        f: impl FnOnce(&mut postgres::Client) -> std::result::Result<T, postgres::Error>,
    ) -> Result<T> {
        let result = f(self.client());
        result.map_err(|e| {
            if e.is_closed() || e.as_db_error().is_none() {
                self.client = None;
            }
            Error::postgres(Store::Registry, &self.label, doing)(e)
        })
    }
}

impl Drop for PgLease {
    fn drop(&mut self) {
        if let (Some(client), Ok(mut cache)) = (self.client.take(), pg_cache().lock()) {
            self.idle.store(true, std::sync::atomic::Ordering::SeqCst);
            cache
                .entry(std::mem::take(&mut self.url))
                .or_default()
                .push((client, self.idle.clone()));
        }
    }
}

impl WorkerRows for PgLease {
    fn status_of(&mut self, identity: &str) -> Result<Option<String>> {
        self.run("cannot read", |c| {
            c.query_opt(
                &format!("SELECT status FROM {TABLE} WHERE worker_identity = $1"),
                &[&identity],
            )
            .map(|r| r.map(|r| r.get::<_, Option<String>>(0).unwrap_or_default()))
        })
    }

    fn insert(&mut self, row: &serde_json::Map<String, serde_json::Value>) -> Result<()> {
        let label = self.label.clone();
        let (names, values) = super::registration_params(row, &label)?;
        self.run("cannot register", |c| {
            let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                values.iter().map(|b| b.as_ref()).collect();
            c.execute(
                &format!(
                    "INSERT INTO {TABLE} ({}) VALUES ({})",
                    names.join(", "),
                    (1..=names.len())
                        .map(|i| format!("${i}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                &refs,
            )
            .map(|_| ())
        })
    }

    fn owner_of(&mut self, worker: &str) -> Result<Option<ActiveOwner>> {
        self.run("cannot read the registration", |c| {
            let row = c.query_opt(
                &format!(
                    "SELECT pid, process_start_time, host_id, boot_id, pid_namespace \
                     FROM {TABLE} WHERE worker_identity = $1 AND status = 'active'"
                ),
                &[&worker],
            )?;
            Ok(row.and_then(|r| {
                let pid: Option<i64> = r.get(0);
                let text = |i: usize| r.get::<_, Option<String>>(i);
                let fencing =
                    json!({"host_id": text(2), "boot_id": text(3), "pid_namespace": text(4)});
                pid.map(|pid| ActiveOwner {
                    pid,
                    start: text(1),
                    fencing,
                })
            }))
        })
    }

    fn set(
        &mut self,
        column: &'static str,
        value: &str,
        worker: &str,
        pid: i64,
        doing: &'static str,
    ) -> Result<u64> {
        let column = super::quote_ident(column);
        self.run(doing, |c| {
            c.execute(
                &format!(
                    "UPDATE {TABLE} SET {column} = $1 WHERE worker_identity = $2 \
                     AND status = 'active' AND pid = $3"
                ),
                &[&value, &worker, &pid],
            )
        })
    }
}
