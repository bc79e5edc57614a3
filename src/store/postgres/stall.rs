//! A server that stops answering is given up on: no wait for a reply is
//! left to the kernel, and a busy server is told from a frozen one.
//!
//! TCP keepalives and `tcp_user_timeout` catch a server that vanished, but
//! not one that froze (SIGSTOP, a paused virtual machine, a proxy that
//! swallows everything): its kernel still acknowledges every byte, so the
//! connection looks alive while the reply never comes, and the driver's
//! blocking call waits for ever. So every connection's socket is watched,
//! from the kernel's own record of it (`TCP_INFO`: milliseconds since data
//! was last sent and last received), with no hook in the driver.
//!
//! Silence alone does not tell a frozen server from a busy one (a long
//! sort, a lock wait, a read of a million rows before its first row), so
//! once a connection in use has been silent for a third of the bound, the
//! server at its far end is **probed on a connection of its own**: a TCP
//! connect to the same address and one protocol question that needs no
//! password and runs no SQL (a GSSENCRequest, which every PostgreSQL since
//! 7.x answers with one byte, from a backend it forked for it). A server
//! that answers is busy, and the connection waits on, however long its
//! statement takes; the probe is repeated while the silence lasts. A
//! connection whose server has said nothing, on it or to a probe, for the
//! whole bound (15 s by default) is shut down: the blocked call returns an
//! error, the caller treats it as a lost connection (for a COMMIT:
//! `outcome_unknown`), and the address is remembered as suspect for a
//! minute, so the next connect to a cluster tries the other members first
//! (`failover.rs`). A connection kept between uses (a worker's between
//! heartbeats) is marked idle meanwhile ([`Idle`]) and not watched then.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a server may say nothing, on a connection in use or to a
/// probe, before the connection is given up on: 15 s by default
/// (`FLEET_RETIRE_PG_REPLY_TIMEOUT`, in seconds, overrides it).
pub fn reply_bound() -> Duration {
    std::env::var("FLEET_RETIRE_PG_REPLY_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(Duration::from_secs(15), Duration::from_secs)
}

/// How long a probe may take, and how long a connection in use is silent
/// before its server is probed: a third of the bound, 1 to 5 s.
pub fn probe_bound() -> Duration {
    (reply_bound() / 3).clamp(Duration::from_secs(1), Duration::from_secs(5))
}

/// One watched socket: its descriptor and the addresses that make it
/// this socket (a descriptor reused for another is never touched).
struct Watched {
    fd: RawFd,
    ends: (String, String),
    peer: Option<SocketAddr>,
    bound: Duration,
    idle: Idle,
}

/// Whether a watched connection is kept unused for now (set by its
/// holder): an idle connection is silent by right.
pub type Idle = std::sync::Arc<std::sync::atomic::AtomicBool>;

/// Marks a connection in use while it lives, idle again when dropped.
pub struct InUse(Idle);

impl InUse {
    /// Mark `idle` in use until the guard is dropped.
    pub fn mark(idle: &Idle) -> InUse {
        idle.store(false, std::sync::atomic::Ordering::SeqCst);
        InUse(idle.clone())
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

static WATCHED: Mutex<Vec<Watched>> = Mutex::new(Vec::new());
static STARTED: std::sync::Once = std::sync::Once::new();

/// What this process last learnt of a server's address: when it last
/// answered a probe, whether a probe is out, when the last one went, and
/// since when it is suspect (a probe went unanswered, a connection to it
/// was given up on, or a connect to it did not finish).
#[derive(Default)]
struct Peer {
    answered: Option<Instant>,
    probing: bool,
    probed: Option<Instant>,
    suspect: Option<Instant>,
}

static PEERS: Mutex<BTreeMap<SocketAddr, Peer>> = Mutex::new(BTreeMap::new());

/// How long an address stays suspect.
const SUSPECT_FOR: Duration = Duration::from_secs(60);

fn with_peer<T>(addr: SocketAddr, f: impl FnOnce(&mut Peer) -> T) -> T {
    let mut peers = PEERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    f(peers.entry(addr).or_default())
}

/// Remember `addr` as suspect: connects to a cluster try it last.
pub fn suspect(addr: SocketAddr) {
    with_peer(addr, |p| p.suspect = Some(Instant::now()));
}

/// Whether `addr` was found frozen (or did not finish a connect) within
/// the last minute and has not answered a probe since.
pub fn is_suspect(addr: SocketAddr) -> bool {
    with_peer(addr, |p| {
        p.suspect
            .is_some_and(|at| at.elapsed() < SUSPECT_FOR && p.answered.is_none_or(|a| a < at))
    })
}

/// Ask the server at `addr`, on a connection of its own, one question it
/// answers before any password: a GSSENCRequest (8 bytes), to which a
/// PostgreSQL server replies with one byte (`G`, `N`, or an error from
/// one too old to know it). Any byte within `limit` means the server's
/// processes run; the connection is closed before any startup, which the
/// server does not log.
pub fn answers(addr: SocketAddr, limit: Duration) -> bool {
    use std::io::{Read, Write};
    let started = Instant::now();
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, limit) else {
        return false;
    };
    let left = limit
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(1));
    let _ = s.set_read_timeout(Some(left));
    let _ = s.set_write_timeout(Some(left));
    let request = [0u8, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30]; // length 8, code 80877104
    let mut reply = [0u8; 1];
    s.write_all(&request).is_ok() && matches!(s.read(&mut reply), Ok(1))
}

/// Probe `addr` on a thread of its own, the probe bounded by `limit`,
/// unless a probe of it is out or one went less than `limit` ago.
fn probe_soon(addr: SocketAddr, limit: Duration) {
    let go = with_peer(addr, |p| {
        let due = !p.probing && p.probed.is_none_or(|t| t.elapsed() >= limit);
        if due {
            p.probing = true;
            p.probed = Some(Instant::now());
        }
        due
    });
    if !go {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("pg-probe".into())
        .spawn(move || {
            let ok = answers(addr, limit);
            with_peer(addr, |p| {
                p.probing = false;
                if ok {
                    p.answered = Some(Instant::now());
                } else {
                    p.suspect = Some(Instant::now());
                }
            });
            if !ok {
                tracing::warn!(peer = %addr, "the PostgreSQL server did not answer a probe");
            }
        });
    if spawned.is_err() {
        with_peer(addr, |p| p.probing = false);
    }
}

/// The TCP sockets this process holds now: (descriptor, inode).
pub fn sockets() -> Vec<(RawFd, String)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
        let link = std::fs::read_link(e.path()).ok()?;
        let link = link.to_str()?.to_string();
        link.starts_with("socket:").then_some((fd, link))
    })
    .filter(|(fd, _)| tcp_info(*fd).is_some())
    .collect()
}

/// Watch the TCP sockets opened since `before` was taken (the
/// connection just made); the flag its holder sets while it keeps the
/// connection unused.
pub fn watch_new(before: &[(RawFd, String)]) -> Idle {
    watch_new_bounded(before, reply_bound())
}

/// [`watch_new`] with `bound` for the silence of server and probes alike.
pub fn watch_new_bounded(before: &[(RawFd, String)], bound: Duration) -> Idle {
    let idle = Idle::default();
    let fresh: Vec<Watched> = sockets()
        .into_iter()
        .filter(|s| !before.contains(s))
        .filter_map(|(fd, _)| {
            Some(Watched {
                fd,
                ends: ends(fd)?,
                peer: peer_of(fd),
                bound,
                idle: idle.clone(),
            })
        })
        .collect();
    if fresh.is_empty() {
        return idle;
    }
    if let Ok(mut watched) = WATCHED.lock() {
        watched.retain(|w| fresh.iter().all(|f| f.fd != w.fd));
        watched.extend(fresh);
    }
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("pg-stall-watch".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_millis(250));
                sweep();
            });
    });
    idle
}

/// The socket's peer as an address a probe can connect to.
fn peer_of(fd: RawFd) -> Option<SocketAddr> {
    use nix::sys::socket::{getpeername, SockaddrStorage};
    let peer = getpeername::<SockaddrStorage>(fd).ok()?;
    if let Some(v4) = peer.as_sockaddr_in() {
        return Some(SocketAddr::from((v4.ip(), v4.port())));
    }
    // The scope id and flow info kept: a link-local server is reached
    // only through the interface the connection uses.
    let v6 = peer.as_sockaddr_in6()?;
    Some(SocketAddr::V6(std::net::SocketAddrV6::new(
        v6.ip(),
        v6.port(),
        v6.flowinfo(),
        v6.scope_id(),
    )))
}

/// The socket's two addresses, as the kernel states them.
fn ends(fd: RawFd) -> Option<(String, String)> {
    use nix::sys::socket::{getpeername, getsockname, SockaddrStorage};
    let local = getsockname::<SockaddrStorage>(fd).ok()?;
    let peer = getpeername::<SockaddrStorage>(fd).ok()?;
    Some((local.to_string(), peer.to_string()))
}

/// (ms since data was last sent, ms since data was last received).
fn tcp_info(fd: RawFd) -> Option<(u32, u32)> {
    use nix::libc;
    // SAFETY: `info` is a plain C struct the kernel fills, `len` its size;
    // a descriptor that is not a TCP socket makes the call fail, nothing
    // else.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let got = libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        );
        (got == 0).then_some((info.tcpi_last_data_sent, info.tcpi_last_data_recv))
    }
}

/// How long a connection in use may stay silent while its server answers
/// probes: 40 times the bound (10 minutes at the default). A server can
/// answer probes while this connection's backend never will (a COMMIT
/// waiting for a synchronous standby that is gone, a hung disk, a proxy
/// whose probe reaches another member), and no wait may last for ever;
/// the longest honest read (a whole registry of ten million rows) ends
/// well within it.
fn busy_cap(bound: Duration) -> Duration {
    bound.saturating_mul(40)
}

/// Shut down every watched socket in use whose server has said nothing,
/// on it or to a probe, for longer than its bound; probe the servers of
/// those silent for a probe's bound; forget the sockets that are gone.
fn sweep() {
    let Ok(mut watched) = WATCHED.lock() else {
        return;
    };
    watched.retain(|w| {
        if ends(w.fd).as_ref() != Some(&w.ends) {
            return false;
        }
        let Some((since_sent, since_heard)) = tcp_info(w.fd) else {
            return false;
        };
        let in_use = !w.idle.load(std::sync::atomic::Ordering::SeqCst);
        let silent = Duration::from_millis(u64::from(since_sent.min(since_heard)));
        // Probed after a third of the bound (at most 5 s), that often.
        let every = probe_bound().min(w.bound / 3);
        if !in_use || silent <= every {
            return true;
        }
        // Unheard: since the last data on this connection, or the last
        // answer to a probe of its server, whichever came later.
        let unheard = match w.peer {
            Some(peer) => {
                probe_soon(peer, every);
                with_peer(peer, |p| p.answered.map(|t| t.elapsed()))
                    .map_or(silent, |answered| silent.min(answered))
            }
            None => silent,
        };
        let busy_too_long = silent > busy_cap(w.bound);
        if unheard <= w.bound && !busy_too_long {
            return true;
        }
        tracing::warn!(
            peer = %w.ends.1,
            silent_ms = silent.as_millis(),
            "{}",
            if busy_too_long {
                "the PostgreSQL server answers probes but has said nothing on this connection \
                 for 40 times the bound; giving the connection up"
            } else {
                "the PostgreSQL server has not answered, nor a probe; giving the connection up"
            }
        );
        if let Some(peer) = w.peer {
            suspect(peer);
        }
        // The addresses once more, right before: the probe above took time,
        // in which the connection may have been closed and its descriptor
        // given to another file. What is left is the few instructions
        // between this check and the call: a descriptor closed and reused
        // in them, by a socket between the very same two addresses (which
        // the kernel may allow at once when the server closed first), would
        // be cut. Narrowed, not closed: a watch that does not own the
        // descriptor cannot close it.
        if ends(w.fd).as_ref() != Some(&w.ends) {
            return false;
        }
        // SAFETY: the descriptor is the watched socket (its addresses
        // were checked just above); shutdown(2) only ends its traffic.
        unsafe {
            nix::libc::shutdown(w.fd, nix::libc::SHUT_RDWR);
        }
        false
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::mpsc;

    /// Connect to `addr` and watch that connection alone. The watch takes
    /// the sockets new since a list, and these tests' peers live in this
    /// process: the list is taken once the peer has accepted (`accepted`),
    /// with every socket but the client's, so the peer's end (which a
    /// probe of its client's port cannot reach, and would be cut) is not
    /// watched, however the threads are scheduled.
    fn connect_watched(
        addr: SocketAddr,
        accepted: &mpsc::Receiver<()>,
        bound: Duration,
    ) -> (std::net::TcpStream, Idle) {
        use std::os::fd::AsRawFd;
        let client = std::net::TcpStream::connect(addr).unwrap();
        accepted.recv_timeout(Duration::from_secs(10)).unwrap();
        let before: Vec<(RawFd, String)> = sockets()
            .into_iter()
            .filter(|(fd, _)| *fd != client.as_raw_fd())
            .collect();
        let idle = watch_new_bounded(&before, bound);
        (client, idle)
    }

    /// A peer that accepts connections, says so on the channel, and keeps
    /// the first unanswered; every later one (a probe) is answered `N`
    /// after eight bytes, as PostgreSQL answers an SSL request.
    fn busy_peer() -> (SocketAddr, mpsc::Receiver<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut first = None;
            for s in listener.incoming() {
                let Ok(mut s) = s else { continue };
                if first.is_none() {
                    first = Some(s); // the connection in use: never answered
                    let _ = tx.send(());
                    continue;
                }
                let mut request = [0u8; 8];
                if s.read_exact(&mut request).is_ok() {
                    let _ = s.write_all(b"N");
                }
            }
        });
        (addr, rx)
    }

    /// A peer that takes a request and never answers, nor a probe: the
    /// blocked read is ended by the watch soon after the bound, not by
    /// the kernel.
    #[test]
    fn a_silent_peer_is_given_up_on() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, accepted) = mpsc::channel();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let _ = tx.send(());
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            std::thread::sleep(Duration::from_secs(10));
        });
        let (mut client, _in_use) = connect_watched(addr, &accepted, Duration::from_secs(1));
        client.write_all(b"are you there?").unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0u8; 8];
        let got = client.read(&mut buf);
        assert!(matches!(got, Ok(0) | Err(_)), "{got:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(is_suspect(addr));
        drop(peer);
    }

    /// The address a probe connects to is the connection's peer, an IPv6
    /// one whole (its scope id and flow info kept), where this host has
    /// IPv6 loopback.
    #[test]
    fn a_probe_goes_to_the_connections_peer() {
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = std::net::TcpListener::bind(bind) else {
                continue;
            };
            let addr = listener.local_addr().unwrap();
            let client = std::net::TcpStream::connect(addr).unwrap();
            use std::os::fd::AsRawFd;
            assert_eq!(peer_of(client.as_raw_fd()), Some(addr));
        }
    }

    /// A peer silent on the connection in use for four bounds (8 s), which
    /// answers every probe on connections of its own (a server busy with a
    /// long statement): the connection is not cut.
    #[test]
    fn a_busy_peer_that_answers_probes_is_waited_for() {
        let (addr, accepted) = busy_peer();
        let (mut client, _in_use) = connect_watched(addr, &accepted, Duration::from_secs(2));
        client.write_all(b"a long sort, please").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(8)))
            .unwrap();
        let mut buf = [0u8; 8];
        let got = client.read(&mut buf);
        assert!(
            got.as_ref().is_err_and(|e| matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )),
            "the connection was cut: {got:?}"
        );
        assert!(answers(addr, Duration::from_secs(1)));
        assert!(!is_suspect(addr));
    }

    /// A server that answers probes but never this connection is given up
    /// on after [`busy_cap`], not waited for for ever.
    #[test]
    fn a_busy_peer_is_given_up_on_after_the_cap() {
        let (addr, accepted) = busy_peer();
        let bound = Duration::from_millis(600);
        let (mut client, _in_use) = connect_watched(addr, &accepted, bound);
        client.write_all(b"a COMMIT that never returns").unwrap();
        client.set_read_timeout(Some(busy_cap(bound) * 3)).unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0u8; 8];
        let got = client.read(&mut buf);
        assert!(
            !got.as_ref().is_err_and(|e| matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )),
            "still waiting after {:?}: {got:?}",
            started.elapsed()
        );
        assert!(
            started.elapsed() >= busy_cap(bound),
            "{:?}",
            started.elapsed()
        );
    }
}
