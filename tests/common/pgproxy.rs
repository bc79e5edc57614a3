//! A TCP proxy of our own between fleet-retire and a PostgreSQL server
//! that reads the frontend's messages and, on the connection that wrote
//! audit rows, loses what happens around its COMMIT: the COMMIT itself
//! (the server never commits), or only the server's reply (it commits, and
//! the client never hears). Everything else passes through untouched.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the proxy does to the COMMIT of a transaction that wrote audit
/// rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lose {
    /// Drop the COMMIT and close the client's connection: the server rolls
    /// the transaction back when its connection closes.
    Commit,
    /// Pass the COMMIT on, then close the client's connection before the
    /// server's reply reaches it: the transaction commits.
    Reply,
    /// Pass the COMMIT on, then pass nothing back and close nothing: the
    /// client's connection goes silent, and so does every connection made
    /// afterwards (a frozen server: a probe of it gets no answer either).
    ReplySilently,
}

/// A running proxy; it stops accepting when dropped.
pub struct PgProxy {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// Set once a COMMIT was lost as asked.
    pub fired: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl PgProxy {
    /// Proxy to `upstream` (host:port), losing as `lose` says.
    pub fn start(upstream: String, lose: Lose) -> PgProxy {
        Self::start_on(0, upstream, lose)
    }

    /// The same, listening on `port` (0: any free one).
    pub fn start_on(port: u16, upstream: String, lose: Lose) -> PgProxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let fired = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (fired.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                if lose == Lose::ReplySilently && f.load(Ordering::SeqCst) {
                    held.push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                // Each message on at once: Nagle's algorithm against the
                // peer's delayed acknowledgement cost 40 ms a round trip.
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let fired = f.clone();
                std::thread::spawn(move || relay(client, server, lose, fired));
            }
        });
        PgProxy { port, fired, stop }
    }
}

/// One frontend message, as far as the proxy cares.
enum Seen {
    /// Pass these bytes on.
    Pass(Vec<u8>),
    /// A COMMIT on a connection that wrote audit rows.
    Commit(Vec<u8>),
}

/// Split the frontend's bytes into messages: untyped ones (SSLRequest,
/// GSSENCRequest, then StartupMessage) until the startup, typed ones after.
struct Frontend {
    buffer: Vec<u8>,
    started: bool,
    wrote_audit: bool,
}

impl Frontend {
    fn next(&mut self) -> Option<Seen> {
        let typed = usize::from(self.started);
        if self.buffer.len() < typed + 4 {
            return None;
        }
        let len = u32::from_be_bytes(self.buffer[typed..typed + 4].try_into().unwrap()) as usize;
        if self.buffer.len() < typed + len {
            return None;
        }
        let message: Vec<u8> = self.buffer.drain(..typed + len).collect();
        if !self.started {
            let code = u32::from_be_bytes(message[4..8].try_into().unwrap());
            // 80877103 asks for TLS, 80877104 for GSS encryption; anything
            // else is the startup message itself.
            self.started = code != 80_877_103 && code != 80_877_104;
            return Some(Seen::Pass(message));
        }
        let body = &message[5..];
        if body
            .windows(28)
            .any(|w| w == b"INSERT INTO retirement_audit")
        {
            self.wrote_audit = true;
        }
        if self.wrote_audit && message[0] == b'Q' && body.starts_with(b"COMMIT") {
            return Some(Seen::Commit(message));
        }
        Some(Seen::Pass(message))
    }
}

fn relay(mut client: TcpStream, mut server: TcpStream, lose: Lose, fired: Arc<AtomicBool>) {
    let silenced = Arc::new(AtomicBool::new(false));
    let (mut from_server, mut to_client) =
        (server.try_clone().unwrap(), client.try_clone().unwrap());
    let quiet = silenced.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n) = from_server.read(&mut buf) {
            if n == 0 || quiet.load(Ordering::SeqCst) {
                break;
            }
            if to_client.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        if !quiet.load(Ordering::SeqCst) {
            let _ = to_client.shutdown(Shutdown::Both);
        }
    });
    let mut frontend = Frontend {
        buffer: Vec::new(),
        started: false,
        wrote_audit: false,
    };
    let mut buf = [0u8; 16384];
    while let Ok(n) = client.read(&mut buf) {
        if n == 0 {
            break;
        }
        frontend.buffer.extend_from_slice(&buf[..n]);
        while let Some(seen) = frontend.next() {
            match seen {
                Seen::Pass(bytes) => {
                    if server.write_all(&bytes).is_err() {
                        return;
                    }
                }
                Seen::Commit(bytes) => {
                    silenced.store(true, Ordering::SeqCst);
                    fired.store(true, Ordering::SeqCst);
                    if lose != Lose::Commit {
                        let _ = server.write_all(&bytes);
                    }
                    match lose {
                        Lose::ReplySilently => {
                            // Keep both sockets open, answering nothing,
                            // until the client gives up.
                            let _ = std::io::copy(&mut client, &mut std::io::sink());
                        }
                        _ => {
                            let _ = client.shutdown(Shutdown::Both);
                        }
                    }
                    if lose == Lose::Commit {
                        let _ = server.shutdown(Shutdown::Both);
                    }
                    return;
                }
            }
        }
    }
    let _ = server.shutdown(Shutdown::Both);
}
