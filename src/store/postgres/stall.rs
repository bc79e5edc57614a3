//! A server that stops answering is given up on: no wait for a reply is
//! left to the kernel.
//!
//! TCP keepalives and `tcp_user_timeout` catch a server that vanished, but
//! not one that froze (SIGSTOP, a hung disk, a proxy that swallows its
//! replies): its kernel still acknowledges every byte, so the connection
//! looks alive while the reply never comes, and the driver's blocking call
//! waits for ever. So every connection's socket is watched: while the
//! connection is in use, when no data has gone either way for longer than
//! its bound, the socket is shut down, the blocked call returns an error,
//! and the caller treats it as a lost connection (for a COMMIT:
//! `outcome_unknown`).
//!
//! The watch reads the kernel's own record of the socket (`TCP_INFO`:
//! milliseconds since data was last sent and last received), so it needs
//! no hook in the driver; a connection receiving a long result, or sending
//! a long copy, is never cut. A connection kept between uses (a worker's
//! between heartbeats) is marked idle meanwhile ([`Idle`]) and not
//! watched then.

use std::os::fd::RawFd;
use std::sync::Mutex;
use std::time::Duration;

/// How long a reply may take by default (`FLEET_RETIRE_PG_REPLY_TIMEOUT`,
/// in seconds, overrides it); a connection that may wait for a lock is
/// given that wait on top.
pub fn reply_bound() -> Duration {
    std::env::var("FLEET_RETIRE_PG_REPLY_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(Duration::from_secs(30), Duration::from_secs)
}

/// The longest lock wait this process's commands allow (apply's
/// `--busy-timeout-ms`), in milliseconds: every connection opened after it
/// is set may be silent that long on top of the reply bound, since one
/// connection's lock wait leaves the others of the same command silent too
/// (apply's lease store while its registry waits for the lock).
static ALLOWED_WAIT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Allow connections opened from now on to wait `wait` for a lock.
pub fn allow_waits(wait: Duration) {
    let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    ALLOWED_WAIT_MS.fetch_max(ms, std::sync::atomic::Ordering::SeqCst);
}

/// The bound of a connection opened now that may itself wait `may_wait`.
pub fn bound_for(may_wait: Duration) -> Duration {
    let allowed = Duration::from_millis(ALLOWED_WAIT_MS.load(std::sync::atomic::Ordering::SeqCst));
    reply_bound() + may_wait.max(allowed)
}

/// One watched socket: its descriptor and the addresses that make it
/// this socket (a descriptor reused for another is never touched).
struct Watched {
    fd: RawFd,
    ends: (String, String),
    bound: Duration,
    idle: Idle,
}

/// Whether a watched connection is kept unused for now (set by its
/// holder): an idle connection is silent by right.
pub type Idle = std::sync::Arc<std::sync::atomic::AtomicBool>;

static WATCHED: Mutex<Vec<Watched>> = Mutex::new(Vec::new());
static STARTED: std::sync::Once = std::sync::Once::new();

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
/// connection just made) with `bound`; the flag its holder sets while it
/// keeps the connection unused.
pub fn watch_new(before: &[(RawFd, String)], bound: Duration) -> Idle {
    let idle = Idle::default();
    let fresh: Vec<Watched> = sockets()
        .into_iter()
        .filter(|s| !before.contains(s))
        .filter_map(|(fd, _)| {
            Some(Watched {
                fd,
                ends: ends(fd)?,
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
                std::thread::sleep(Duration::from_millis(500));
                sweep();
            });
    });
    idle
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

/// Shut down every watched socket in use that has carried no data either
/// way for longer than its bound; forget the ones that are gone.
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
        if in_use && u128::from(since_sent.min(since_heard)) > w.bound.as_millis() {
            tracing::warn!(
                peer = %w.ends.1,
                silent_ms = since_sent.min(since_heard),
                "the PostgreSQL server has not answered; giving the connection up"
            );
            // SAFETY: the descriptor is the watched socket (its addresses
            // were checked just above); shutdown(2) only ends its traffic.
            unsafe {
                nix::libc::shutdown(w.fd, nix::libc::SHUT_RDWR);
            }
            return false;
        }
        true
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A peer that takes a request and never answers: the blocked read is
    /// ended by the watch soon after the bound, not by the kernel.
    #[test]
    fn a_silent_peer_is_given_up_on() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            std::thread::sleep(Duration::from_secs(10));
        });
        let before = sockets();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        let _in_use = watch_new(&before, Duration::from_secs(1));
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
        drop(peer);
    }
}
