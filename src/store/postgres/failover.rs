//! Connecting while a cluster elects a leader: a URL that names several
//! members, or asks for `target_session_attrs=read-write`, is a cluster
//! that fails over (Patroni and the like), and for some seconds none of its
//! members takes writes. A connection there is retried, with a growing
//! pause, until a writable member answers or the wait runs out, instead of
//! failing at once. Nothing is retried once connected: a transaction that
//! lost its connection is never replayed here.
//!
//! The members are tried one at a time, each attempt bounded as a whole
//! (TCP, TLS, startup, the read-write check): a frozen member accepts the
//! TCP connection in its kernel and then says nothing, and the driver,
//! left to try the members itself, would wait on it for ever. A member
//! this process found frozen within the last minute (`stall.rs`) is tried
//! last.

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
/// each attempt is given up after `limit` (to one of several members,
/// after at most 10 s: another may answer).
pub fn connect(
    config: &postgres::Config,
    connector: &MakeTlsConnector,
    wait: Duration,
    limit: Duration,
) -> Result<postgres::Client, Failed> {
    let members = config.get_hosts().len().max(config.get_hostaddrs().len());
    if members > 1 {
        return connect_members(config, connector, wait, limit.min(Duration::from_secs(10)));
    }
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

/// [`connect`] to a URL naming several members: each round tries every
/// member alone, the suspect ones last, until one takes the connection.
fn connect_members(
    config: &postgres::Config,
    connector: &MakeTlsConnector,
    wait: Duration,
    limit: Duration,
) -> Result<postgres::Client, Failed> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(250);
    let members: Vec<(postgres::Config, Vec<std::net::SocketAddr>)> =
        (0..config.get_hosts().len().max(config.get_hostaddrs().len()))
            .map(|i| {
                let one = one_member(config, i);
                let addrs = addresses(&one);
                (one, addrs)
            })
            .collect();
    loop {
        let mut order: Vec<&(postgres::Config, Vec<std::net::SocketAddr>)> =
            members.iter().collect();
        order.sort_by_key(|(_, addrs)| addrs.iter().any(|a| super::stall::is_suspect(*a)));
        let mut failed = Failed::Unfinished(limit);
        let mut refused = None;
        for (one, addrs) in order {
            match attempt(one, connector, limit) {
                Some(Ok(client)) => return Ok(client),
                Some(Err(e)) if may_pass(&e) => failed = Failed::Postgres(e),
                // As the driver does: another member may take it (a
                // replica behind the leader lacks a database just made).
                Some(Err(e)) => refused = Some(e),
                None => {
                    tracing::warn!(
                        member = ?addrs,
                        "a PostgreSQL member did not complete a connection in {} s; trying the others",
                        limit.as_secs()
                    );
                    addrs.iter().for_each(|a| super::stall::suspect(*a));
                }
            }
        }
        if let Some(e) = refused {
            return Err(Failed::Postgres(e));
        }
        if Instant::now() + pause >= deadline {
            return Err(failed);
        }
        if let Failed::Postgres(e) = &failed {
            tracing::info!(error = %e, "no writable PostgreSQL member yet; waiting");
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Member `i` of a URL naming several, alone, with the URL's every other
/// setting.
fn one_member(config: &postgres::Config, i: usize) -> postgres::Config {
    use postgres::config::Host;
    let mut one = postgres::Config::new();
    match config.get_hosts().get(i) {
        Some(Host::Tcp(h)) => {
            one.host(h);
        }
        Some(Host::Unix(p)) => {
            one.host_path(p);
        }
        None => {}
    }
    if let Some(addr) = config.get_hostaddrs().get(i) {
        one.hostaddr(*addr);
    }
    let ports = config.get_ports();
    if let Some(port) = ports.get(i).or_else(|| ports.first()) {
        one.port(*port);
    }
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(db) = config.get_dbname() {
        one.dbname(db);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    if let Some(t) = config.get_connect_timeout() {
        one.connect_timeout(*t);
    }
    if let Some(t) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*t);
    }
    if let Some(t) = config.get_keepalives_interval() {
        one.keepalives_interval(t);
    }
    if let Some(n) = config.get_keepalives_retries() {
        one.keepalives_retries(n);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding());
    one
}

/// The TCP addresses a member's config reaches (none for a Unix socket,
/// or a name that does not resolve now).
fn addresses(one: &postgres::Config) -> Vec<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let port = one.get_ports().first().copied().unwrap_or(5432);
    if let Some(addr) = one.get_hostaddrs().first() {
        return vec![std::net::SocketAddr::new(*addr, port)];
    }
    match one.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => (h.as_str(), port)
            .to_socket_addrs()
            .map(Iterator::collect)
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting of a URL naming three members is kept for each one.
    #[test]
    fn one_member_keeps_every_other_setting() {
        let config: postgres::Config = "postgres://u:p@127.0.0.1:1,127.0.0.2:2,127.0.0.3:3/db\
            ?target_session_attrs=read-write&application_name=x&connect_timeout=7"
            .parse()
            .unwrap();
        let one = one_member(&config, 1);
        assert_eq!(
            one.get_hosts(),
            &[postgres::config::Host::Tcp("127.0.0.2".into())]
        );
        assert_eq!(one.get_ports(), &[2]);
        assert_eq!(one.get_user(), Some("u"));
        assert_eq!(one.get_password(), Some(&b"p"[..]));
        assert_eq!(one.get_dbname(), Some("db"));
        assert_eq!(one.get_application_name(), Some("x"));
        assert_eq!(one.get_connect_timeout(), Some(&Duration::from_secs(7)));
        assert_eq!(
            one.get_target_session_attrs(),
            postgres::config::TargetSessionAttrs::ReadWrite
        );
        assert_eq!(addresses(&one), vec!["127.0.0.2:2".parse().unwrap()]);
    }
}
