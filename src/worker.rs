//! Worker registration, as a worker would write the registry: register,
//! heartbeat, release. The registry is created or migrated as needed, in a
//! SQLite file or (for a `postgres://` location) a PostgreSQL database,
//! where each write is its own short autocommit statement touching only the
//! worker's own row: an apply running meanwhile never makes it wait.
//!
//! Identity comes from the launcher's environment and is recorded as found:
//! a missing or untrusted instance id stays missing or untrusted, and an
//! unknown host, boot or start time is stored as NULL, never guessed.

use crate::error::{About, Error, Result};
use crate::evidence::probe::{process_start_time, HostFacts};
use crate::evidence::random_hex;
use crate::identity::assess_instance_identity;
use crate::identity::{env, LAUNCHER_PROVENANCE};
use crate::store::seam::WorkerRows;
use serde_json::{json, Value as Json};
use std::collections::HashMap;
use std::path::Path;

/// Open (creating if needed) a registry for a worker's writes, on
/// whatever engine its location names.
fn open_any(path: &Path) -> Result<Box<dyn WorkerRows>> {
    crate::store::open::engine(path)?.worker_rows()
}

pub use crate::store::sqlite::worker::open;

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

/// A registration written: who, and the row as written.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The identity the row was written under (given, or minted).
    pub worker_identity: String,
    /// The row, as JSON, column by column.
    pub row: Json,
}

/// The worker identity the launcher gave this process
/// ([`env::WORKER_IDENTITY`]), if set and not blank.
pub fn identity_from_env() -> Option<String> {
    std::env::var(env::WORKER_IDENTITY)
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// Register a worker; returns its identity and the row written.
pub fn register(path: &Path, proc_root: &Path, reg: &Registration) -> Result<Registered> {
    let mut store = open_any(path)?;
    let (identity, row) = registration_row(reg, proc_root)?;
    if let Some(status) = store.status_of(&identity)? {
        return Err(Error::input(About::Worker(identity.clone()), format!(
            "worker {identity:?} is already registered (status {status}); a restarted worker registers under a new identity"
        )));
    }
    let Json::Object(columns) = &row else {
        unreachable!("registration_row builds an object")
    };
    store.insert(columns)?;
    Ok(Registered {
        worker_identity: identity,
        row,
    })
}

/// The row a registration writes: identity from the launcher's environment
/// as found, this host's facts as observed (NULL when unknown), and the
/// registered process's start time. Returns the identity beside the row.
fn registration_row(reg: &Registration, proc_root: &Path) -> Result<(String, Json)> {
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
    let row = json!({
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
    });
    Ok((identity, row))
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

/// The parent pid of `pid`, from `<proc_root>/<pid>/stat` (field 4).
fn parent_of(proc_root: &Path, pid: i64) -> Option<i64> {
    let raw = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let close = raw.rfind(')')?;
    raw[close + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// Refuse unless the writer is entitled to the row of `worker`.
/// Returns the row's pid, which the write then asserts unchanged.
fn prove(store: &mut dyn WorkerRows, worker: &str, writer: Writer) -> Result<i64> {
    let Some(owner) = store.owner_of(worker)? else {
        return Err(Error::input(
            About::Worker(worker.to_string()),
            format!("no active registration for worker {worker:?} (with a pid); register it first"),
        ));
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
        let theirs = owner.fencing[name].as_str().map(str::trim);
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
    let pid = prove(&mut *store, worker, writer)?;
    let now = crate::time::format_ts(crate::time::now());
    let n = store.set("last_heartbeat_at", &now, worker, pid, "cannot heartbeat")?;
    if n == 0 {
        return Err(Error::input(
            About::Worker(worker.to_string()),
            format!("no active registration for worker {worker:?}; register it first"),
        ));
    }
    Ok(now)
}

/// Give an active registration a historical status (released or superseded).
pub fn release(path: &Path, worker: &str, status: &str, writer: Writer) -> Result<()> {
    if !["released", "superseded"].contains(&status) {
        return Err(Error::input(
            About::Option("release --status"),
            format!(
            "release status must be released or superseded, not {status:?} (retired is apply's)"
        ),
        ));
    }
    let mut store = open_any(path)?;
    let pid = prove(&mut *store, worker, writer)?;
    let n = store.set("status", status, worker, pid, "cannot release")?;
    if n == 0 {
        return Err(Error::input(
            About::Worker(worker.to_string()),
            format!("no active registration for worker {worker:?}"),
        ));
    }
    Ok(())
}
