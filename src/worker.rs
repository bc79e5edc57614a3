//! Worker registration, as a worker would write the registry: register,
//! heartbeat, release. The registry is created or migrated as needed, in a
//! SQLite file or (for a `postgres://` location) a PostgreSQL database,
//! where each write is its own short autocommit statement touching only the
//! worker's own row: an apply running meanwhile never makes it wait.
//!
//! Identity comes from the launcher's environment and is recorded as found:
//! a missing or untrusted instance id stays missing or untrusted, and an
//! unknown host, boot or start time is stored as NULL, never guessed.

use crate::error::{Error, Result, Store};
use crate::evidence::probe::{process_start_time, HostFacts};
use crate::evidence::random_hex;
use crate::identity::assess_instance_identity;
use crate::identity::{env, LAUNCHER_PROVENANCE};
use crate::row::COLUMNS;
use crate::store::registry::TABLE;
use crate::store::table_columns;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value as Json};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// A registry opened for a worker's writes.
enum Writable {
    Sqlite(Connection),
    Postgres(Box<PgLease>),
}

/// Open (creating if needed) a registry for a worker's writes.
fn open_any(path: &Path) -> Result<Writable> {
    if crate::store::postgres::is_postgres(path) {
        return PgLease::take(path).map(|p| Writable::Postgres(Box::new(p)));
    }
    open(path).map(Writable::Sqlite)
}

/// A PostgreSQL connection borrowed from this process's cache, one per URL:
/// a worker heartbeating every few seconds does not reconnect each time. It
/// goes back to the cache when dropped, unless it failed.
struct PgLease {
    url: String,
    label: String,
    client: Option<postgres::Client>,
}

type PgCache = std::sync::Mutex<HashMap<String, Vec<postgres::Client>>>;

fn pg_cache() -> &'static PgCache {
    static CACHE: std::sync::OnceLock<PgCache> = std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

impl PgLease {
    fn take(path: &Path) -> Result<PgLease> {
        let url = path.to_string_lossy().into_owned();
        let label = crate::store::location::label(std::path::Path::new(&*url));
        let cached = pg_cache()
            .lock()
            .ok()
            .and_then(|mut c| c.get_mut(&url).and_then(Vec::pop))
            .filter(|c| !c.is_closed());
        let client = match cached {
            Some(c) => c,
            None => {
                let mut c = crate::store::postgres::connect(&url, Store::Registry)?;
                let complete =
                    crate::store::postgres::table_columns(&mut c, TABLE, Store::Registry, &label)?
                        .is_some_and(|cols| {
                            COLUMNS
                                .iter()
                                .all(|col| cols.iter().any(|(n, _)| n == col.name()))
                        });
                if !complete {
                    crate::store::postgres::create_or_migrate_registry(&mut c, &label)?;
                }
                c
            }
        };
        Ok(PgLease {
            url,
            label,
            client: Some(client),
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
            cache
                .entry(std::mem::take(&mut self.url))
                .or_default()
                .push(client);
        }
    }
}

impl Writable {
    fn status_of(&mut self, path: &Path, identity: &str) -> Result<Option<String>> {
        match self {
            Writable::Sqlite(conn) => crate::store::registry::status_of(conn, identity)
                .map_err(Error::sqlite(Store::Registry, path, "cannot read")),
            Writable::Postgres(pg) => pg.run("cannot read", |c| {
                c.query_opt(
                    &format!("SELECT status FROM {TABLE} WHERE worker_identity = $1"),
                    &[&identity],
                )
                .map(|r| r.map(|r| r.get::<_, Option<String>>(0).unwrap_or_default()))
            }),
        }
    }

    fn insert(&mut self, path: &Path, row: &serde_json::Map<String, Json>) -> Result<()> {
        match self {
            Writable::Sqlite(conn) => crate::store::registry::insert(conn, row)
                .map(|_| ())
                .map_err(Error::sqlite(Store::Registry, path, "cannot register")),
            Writable::Postgres(pg) => {
                let label = pg.label.clone();
                let (names, values) = crate::store::postgres::registration_params(row, &label)?;
                pg.run("cannot register", |c| {
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
        }
    }

    /// The active row's pid, start time and fencing facts.
    fn owner_of(&mut self, path: &Path, worker: &str) -> Result<Option<(Owner, Json)>> {
        match self {
            Writable::Sqlite(conn) => owner_of(conn, path, worker),
            Writable::Postgres(pg) => pg.run("cannot read the registration", |c| {
                let row = c.query_opt(
                    &format!(
                        "SELECT pid, process_start_time, host_id, boot_id, pid_namespace                          FROM {TABLE} WHERE worker_identity = $1 AND status = 'active'"
                    ),
                    &[&worker],
                )?;
                Ok(row.and_then(|r| {
                    let pid: Option<i64> = r.get(0);
                    let text = |i: usize| r.get::<_, Option<String>>(i);
                    let fencing =
                        json!({"host_id": text(2), "boot_id": text(3), "pid_namespace": text(4)});
                    pid.map(|pid| {
                        (
                            Owner {
                                pid,
                                start: text(1),
                            },
                            fencing,
                        )
                    })
                }))
            }),
        }
    }

    /// Set one column of the worker's active row, if it is still its pid's.
    fn set(
        &mut self,
        path: &Path,
        column: &'static str,
        value: &str,
        worker: &str,
        pid: i64,
        doing: &'static str,
    ) -> Result<u64> {
        match self {
            Writable::Sqlite(conn) => conn
                .execute(
                    &format!(
                        "UPDATE {TABLE} SET {column} = ?1 WHERE worker_identity = ?2 \
                         AND status = 'active' AND pid = ?3"
                    ),
                    params![value, worker, pid],
                )
                .map(|n| n as u64)
                .map_err(Error::sqlite(Store::Registry, path, doing)),
            Writable::Postgres(pg) => pg.run(doing, |c| {
                c.execute(
                    &format!(
                        "UPDATE {TABLE} SET {column} = $1 WHERE worker_identity = $2 \
                         AND status = 'active' AND pid = $3"
                    ),
                    &[&value, &worker, &pid],
                )
            }),
        }
    }
}

/// Open (creating if needed) a SQLite registry for a worker's writes.
pub fn open(path: &Path) -> Result<Connection> {
    let err = |doing| Error::sqlite(Store::Registry, path, doing);
    let conn = Connection::open(path).map_err(err("cannot open or create"))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(err("cannot set the busy timeout"))?;
    let complete = |conn: &Connection| -> Result<bool> {
        let existing = table_columns(conn, TABLE).map_err(err("cannot read"))?;
        Ok(existing
            .is_some_and(|names| COLUMNS.iter().all(|c| names.iter().any(|n| n == c.name()))))
    };
    if complete(&conn)? {
        return Ok(conn);
    }
    // Creating or migrating: under the write lock, deciding again there, so
    // workers starting together do not each add the same column (the
    // second would fail with "duplicate column name").
    crate::store::registry::create_or_migrate_locked(&conn, path)?;
    Ok(conn)
}

/// What a worker registers.
#[derive(Debug, Clone, Default)]
pub struct Registration {
    /// The worker's identity (minted when absent).
    pub worker_identity: Option<String>,
    /// Its namespace (author, reviewer, …).
    pub namespace: String,
    /// Its declared role (defaults to the namespace).
    pub role: Option<String>,
    /// The worker process.
    pub pid: i64,
    /// Heartbeat TTL in seconds.
    pub ttl_seconds: f64,
    /// Repository binding.
    pub repository_binding: Option<String>,
    /// Remote.
    pub remote: Option<String>,
    /// Transport.
    pub transport: Option<String>,
    /// The environment the launcher gave the worker.
    pub env: HashMap<String, String>,
}

fn nonblank(v: Option<&String>) -> Option<String> {
    v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Register a worker; returns the row written, as JSON.
pub fn register(path: &Path, proc_root: &Path, reg: &Registration) -> Result<Json> {
    let mut store = open_any(path)?;
    let row = registration_row(reg, proc_root)?;
    let identity = row["worker_identity"].as_str().unwrap_or_default();
    if let Some(status) = store.status_of(path, identity)? {
        return Err(Error::Input(format!(
            "worker {identity:?} is already registered (status {status}); a restarted worker registers under a new identity"
        )));
    }
    store.insert(path, row.as_object().expect("row is an object"))?;
    Ok(row)
}

/// The row a registration writes: identity from the launcher's environment
/// as found, this host's facts as observed (NULL when unknown), and the
/// registered process's start time.
fn registration_row(reg: &Registration, proc_root: &Path) -> Result<Json> {
    let now = crate::time::format_ts(crate::time::now());
    let instance = nonblank(reg.env.get(env::CLIENT_INSTANCE));
    let sealed =
        reg.env.get(env::INSTANCE_PROVENANCE).map(|s| s.trim()) == Some(LAUNCHER_PROVENANCE);
    let source = instance
        .as_ref()
        .map(|_| if sealed { "launcher" } else { "env" });
    let provenance = assess_instance_identity(instance.as_deref(), source).provenance;
    let host = HostFacts::observe(proc_root);
    let start = process_start_time(proc_root, reg.pid);
    let identity = match &reg.worker_identity {
        Some(w) => w.clone(),
        None => format!("w-{}-{}", reg.namespace, random_hex(6)?),
    };
    let generation =
        nonblank(reg.env.get(env::GENERATION_ID)).unwrap_or(format!("gen-{}", random_hex(8)?));
    Ok(json!({
        "worker_identity": identity,
        "client_name": nonblank(reg.env.get(env::CLIENT)),
        "client_instance_id": instance,
        "instance_id_source": source,
        "instance_id_provenance": provenance,
        "session_id": nonblank(reg.env.get(env::CLIENT_SESSION)),
        "generation_id": generation,
        "role": reg.role.clone().unwrap_or_else(|| reg.namespace.clone()),
        "profile": nonblank(reg.env.get(env::PROFILE)),
        "namespace": reg.namespace,
        "remote": reg.remote,
        "repository_binding": reg.repository_binding,
        "fleet_run_id": nonblank(reg.env.get(env::FLEET_RUN_ID)),
        "transport": reg.transport.clone().unwrap_or_else(|| "stdio".into()),
        "pid": reg.pid,
        "started_at": now,
        "last_heartbeat_at": now,
        "heartbeat_ttl_seconds": reg.ttl_seconds,
        "fencing_epoch": 1,
        "status": "active",
        "host_id": host.host_id,
        "boot_id": host.boot_id,
        "process_start_time": start,
        "pid_namespace": host.pid_namespace,
    }))
}

/// Who is writing a registration, and how that is known.
#[derive(Debug, Clone, Copy)]
pub enum Writer<'a> {
    /// A command run by the worker: the row's process (pid and start time,
    /// on this host, boot and pid namespace) must be the caller's parent or
    /// one of its ancestors, read from this `/proc` root. This is what the
    /// CLI uses: naming another worker's identity writes nothing.
    Descendant(&'a Path),
    /// Code running inside the worker's own process, or the process that
    /// started it and holds it (`serve`, the demo).
    Owner,
}

/// The registered process, as the row records it.
struct Owner {
    pid: i64,
    start: Option<String>,
}

fn owner_of(conn: &Connection, path: &Path, worker: &str) -> Result<Option<(Owner, Json)>> {
    let sql = format!(
        "SELECT pid, process_start_time, host_id, boot_id, pid_namespace FROM {TABLE} \
         WHERE worker_identity = ?1 AND status = 'active'"
    );
    conn.query_row(&sql, [worker], |r| {
        let pid: Option<i64> = r.get::<_, rusqlite::types::Value>(0).map(|v| match v {
            rusqlite::types::Value::Integer(i) => Some(i),
            _ => None,
        })?;
        let text = |i: usize| -> rusqlite::Result<Option<String>> {
            Ok(match r.get::<_, rusqlite::types::Value>(i)? {
                rusqlite::types::Value::Text(t) => Some(t),
                _ => None,
            })
        };
        let start = text(1)?;
        let fencing = json!({"host_id": text(2)?, "boot_id": text(3)?, "pid_namespace": text(4)?});
        Ok(pid.map(|pid| (Owner { pid, start }, fencing)))
    })
    .optional()
    .map(Option::flatten)
    .map_err(Error::sqlite(
        Store::Registry,
        path,
        "cannot read the registration",
    ))
}

/// The parent pid of `pid`, from `<proc_root>/<pid>/stat` (field 4).
fn parent_of(proc_root: &Path, pid: i64) -> Option<i64> {
    let raw = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let close = raw.rfind(')')?;
    raw[close + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// Refuse unless the writer is entitled to the row of `worker`.
/// Returns the row's pid, which the write then asserts unchanged.
fn prove(store: &mut Writable, path: &Path, worker: &str, writer: Writer) -> Result<i64> {
    let Some((owner, fencing)) = store.owner_of(path, worker)? else {
        return Err(Error::Input(format!(
            "no active registration for worker {worker:?} (with a pid); register it first"
        )));
    };
    let Writer::Descendant(proc_root) = writer else {
        return Ok(owner.pid);
    };
    let refuse = |why: String| {
        Error::Refused(format!(
            "worker {worker:?} is not this command's own registration: {why}. A worker writes \
             only its own row (run this from the worker process, with its identity in \
             GITEA_MCP_WORKER_IDENTITY); retiring another worker's row is what apply is for"
        ))
    };
    let host = HostFacts::observe(proc_root);
    for (name, mine) in [
        ("host_id", &host.host_id),
        ("boot_id", &host.boot_id),
        ("pid_namespace", &host.pid_namespace),
    ] {
        let theirs = fencing[name].as_str().map(str::trim);
        if mine.is_none() || theirs != mine.as_deref() {
            let show =
                |v: Option<&str>, none: &str| v.map_or(none.to_string(), |t| format!("{t:?}"));
            return Err(refuse(format!(
                "its {name} is {}, this command's is {}",
                show(theirs, "not recorded"),
                show(mine.as_deref(), "unknown")
            )));
        }
    }
    let mut pid = i64::from(nix::unistd::getppid().as_raw());
    for _ in 0..64 {
        if pid <= 1 {
            break;
        }
        if pid == owner.pid {
            let start = process_start_time(proc_root, pid);
            if start.is_some() && start == owner.start {
                return Ok(owner.pid);
            }
            return Err(refuse(format!(
                "pid {pid} is an ancestor but started at {start:?}, not {:?}",
                owner.start
            )));
        }
        match parent_of(proc_root, pid) {
            Some(p) => pid = p,
            None => break,
        }
    }
    Err(refuse(format!(
        "its process {} is neither this command's parent nor one of its ancestors",
        owner.pid
    )))
}

/// Move an active worker's heartbeat to now.
pub fn heartbeat(path: &Path, worker: &str, writer: Writer) -> Result<String> {
    let mut store = open_any(path)?;
    let pid = prove(&mut store, path, worker, writer)?;
    let now = crate::time::format_ts(crate::time::now());
    let n = store.set(
        path,
        "last_heartbeat_at",
        &now,
        worker,
        pid,
        "cannot heartbeat",
    )?;
    if n == 0 {
        return Err(Error::Input(format!(
            "no active registration for worker {worker:?}; register it first"
        )));
    }
    Ok(now)
}

/// Give an active registration a historical status (released or superseded).
pub fn release(path: &Path, worker: &str, status: &str, writer: Writer) -> Result<()> {
    if !["released", "superseded"].contains(&status) {
        return Err(Error::Input(format!(
            "release status must be released or superseded, not {status:?} (retired is apply's)"
        )));
    }
    let mut store = open_any(path)?;
    let pid = prove(&mut store, path, worker, writer)?;
    let n = store.set(path, "status", status, worker, pid, "cannot release")?;
    if n == 0 {
        return Err(Error::Input(format!(
            "no active registration for worker {worker:?}"
        )));
    }
    Ok(())
}
