//! Connecting while a cluster elects a leader: a URL that names several
//! members, or asks for `target_session_attrs=read-write`, is a cluster
//! that fails over (Patroni and the like), and for some seconds none of its
//! members takes writes. A connection there is retried, with a growing
//! pause, until a writable member answers or the wait runs out, instead of
//! failing at once. Nothing is retried once connected: a transaction that
//! lost its connection is never replayed here.

use postgres::error::SqlState;
use postgres_openssl::MakeTlsConnector;
use std::time::{Duration, Instant};

/// How long to wait for a writable member: `FLEET_RETIRE_PG_FAILOVER_WAIT`
/// seconds, else 30 s for a URL that names several members or asks for a
/// writable one, and no wait for one server (a wrong port fails at once).
pub fn election_wait(config: &postgres::Config) -> Duration {
    if let Some(secs) = std::env::var("FLEET_RETIRE_PG_FAILOVER_WAIT")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        return Duration::from_secs(secs);
    }
    let cluster = config.get_hosts().len() > 1
        || config.get_target_session_attrs() == postgres::config::TargetSessionAttrs::ReadWrite;
    if cluster {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    }
}

/// Whether a failed connection attempt may succeed once a leader is
/// elected: nothing answered, the answer was "not writable", or the server
/// is starting or stopping. A refused password or certificate is not.
fn may_pass(e: &postgres::Error) -> bool {
    match e.code() {
        Some(code) => [
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::READ_ONLY_SQL_TRANSACTION,
        ]
        .contains(code),
        None => {
            let said = format!("{e} {:?}", std::error::Error::source(e));
            !said.contains("TLS") && !said.contains("certificate")
        }
    }
}

/// One connection attempt, bounded as a whole: the driver's
/// `connect_timeout` covers the TCP connect only, and a server that accepts
/// and then says nothing (frozen, or its backlog taken by the kernel) would
/// hold the TLS request, the handshake and the startup for ever. The
/// attempt runs on a thread of its own; past `limit` it is abandoned (its
/// thread ends when the socket fails or the process does) and `None` says
/// so.
fn attempt(
    config: &postgres::Config,
    connector: &MakeTlsConnector,
    limit: Duration,
) -> Option<Result<postgres::Client, postgres::Error>> {
    let (config, connector) = (config.clone(), connector.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("pg-connect".into())
        .spawn(move || {
            let _ = tx.send(config.connect(connector));
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

/// Why connecting failed.
pub enum Failed {
    /// The driver's error.
    Postgres(postgres::Error),
    /// An attempt did not finish within this bound.
    Unfinished(Duration),
}

/// Connect, retrying for at most `wait` while no writable member answers;
/// each attempt is given up after `limit`.
pub fn connect(
    config: &postgres::Config,
    connector: &MakeTlsConnector,
    wait: Duration,
    limit: Duration,
) -> Result<postgres::Client, Failed> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(250);
    loop {
        let Some(result) = attempt(config, connector, limit) else {
            return Err(Failed::Unfinished(limit));
        };
        match result {
            Ok(client) => return Ok(client),
            Err(e) if may_pass(&e) && Instant::now() + pause < deadline => {
                tracing::info!(error = %e, "no writable PostgreSQL member yet; waiting");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(Failed::Postgres(e)),
        }
    }
}
