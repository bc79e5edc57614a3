//! Helpers for the controller's tests (tests/controller.rs,
//! tests/controller_watch.rs): stores made by `registry create`, workers
//! registered by `fleet-retire register`, controllers as child processes
//! with their JSON logs in files, the lease row as the registry holds it.

use super::{bin, text, KillOnDrop, Stores};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub const TTL: Duration = Duration::from_secs(3);
pub const RETRY: Duration = Duration::from_millis(500);
pub const LEASE_TIMES: [&str; 6] = [
    "--lease-ttl",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
];

/// Stores whose registry `registry create` made (with its row versions).
pub fn stores() -> Stores {
    let stores = Stores::new(&[]);
    std::fs::remove_file(&stores.registry).unwrap();
    let out = bin()
        .args(["registry", "create", "--registry"])
        .arg(&stores.registry)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    stores
}

/// A worker registered by `fleet-retire register` as a launcher's server
/// would be (its own client instance), whose registered process is the
/// `sleep` its shell becomes; killing it makes the worker dead. Its
/// heartbeat TTL is one second.
pub fn worker(stores: &Stores, n: usize) -> KillOnDrop {
    worker_with_ttl(stores, n, 1)
}

/// [`worker`] with a heartbeat TTL of `ttl` seconds.
pub fn worker_with_ttl(stores: &Stores, n: usize, ttl: u32) -> KillOnDrop {
    worker_then(stores, n, ttl, "exec sleep 300")
}

/// A worker `w-n` registered by `fleet-retire register` (heartbeat TTL
/// `ttl` s) from a shell that then runs `then` (`$1` is the registry, `$BIN`
/// fleet-retire), as a launcher's server would be (its own client
/// instance and session), killed on drop; back once its row is active.
pub fn worker_then(stores: &Stores, n: usize, ttl: u32, then: &str) -> KillOnDrop {
    let script = format!(
        "\"$BIN\" register --namespace author --registry \"$1\" --ttl {ttl} \
         --repository-binding prgs/gitea-tools >/dev/null || exit 1; {then}"
    );
    let child = std::process::Command::new("sh")
        .args(["-c", &script, "sh"])
        .arg(&stores.registry)
        .env("BIN", env!("CARGO_BIN_EXE_fleet-retire"))
        .env("GITEA_MCP_WORKER_IDENTITY", format!("w-{n}"))
        .env("GITEA_MCP_PROFILE", "author-prgs")
        .env("GITEA_MCP_NAMESPACE", "author")
        .env("GITEA_CLIENT_MANAGED", "1")
        .env("GITEA_MCP_CLIENT", "codex")
        .env(
            "GITEA_MCP_CLIENT_INSTANCE",
            format!("inst-codex-20261205T132348Z-3f1eceb9{n:04}"),
        )
        .env("GITEA_MCP_INSTANCE_PROVENANCE", "trusted_launcher")
        .env(
            "GITEA_MCP_CLIENT_SESSION",
            format!("launch-58d4d79184600f3b7526{n:04}"),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let child = KillOnDrop(child);
    wait_for(Duration::from_secs(20), "the worker to register", || {
        status(&stores.registry, &format!("w-{n}")).as_deref() == Some("active")
    });
    child
}

/// A worker's status, if it has a row (SQLite file or PostgreSQL URL).
pub fn status(registry: &Path, worker: &str) -> Option<String> {
    let sql = "SELECT status FROM worker_registrations WHERE worker_identity = ";
    if let Some(url) = pg_url(registry) {
        let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).ok()?;
        return c.query_opt(&format!("{sql}$1"), &[&worker]).ok()??.get(0);
    }
    let conn = rusqlite::Connection::open(registry).ok()?;
    conn.query_row(&format!("{sql}?1"), [worker], |r| r.get(0))
        .ok()
}

/// The URL, when the registry is a PostgreSQL database.
pub fn pg_url(registry: &Path) -> Option<&str> {
    registry.to_str().filter(|r| r.starts_with("postgres://"))
}

/// Stores whose registry is a fresh PostgreSQL database (its tables made
/// by its first worker), the lease store a SQLite file; `None` without a
/// cluster.
pub fn pg_stores(tag: &str) -> Option<(Stores, super::PgDb)> {
    let db = super::postgres(tag)?;
    let mut stores = Stores::new(&[]);
    stores.registry = PathBuf::from(&db.url);
    Some((stores, db))
}

/// `registry versions` on a PostgreSQL registry (after its first worker
/// made its tables), so apply judges outside its transaction.
pub fn install_versions(stores: &Stores) {
    let out = bin()
        .args(["registry", "versions", "--registry"])
        .arg(&stores.registry)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

/// `fleet-retire controller` on `stores` as `profile`, with the short
/// lease times.
pub fn command(stores: &Stores, profile: &str) -> std::process::Command {
    let mut c = bin();
    c.arg("controller")
        .arg("--registry")
        .arg(&stores.registry)
        .arg("--leases")
        .arg(&stores.leases)
        .arg("--profiles")
        .arg(&stores.profiles)
        .args(["--profile", profile])
        .args(["--canonical-repository", "prgs/gitea-tools"])
        .args(LEASE_TIMES);
    c
}

/// One `--once` run of [`command`], serving nothing.
pub fn once(stores: &Stores, profile: &str, extra: &[&str]) -> std::process::Output {
    command(stores, profile)
        .args(["--listen", "none", "--once"])
        .args(extra)
        .output()
        .unwrap()
}

/// Kill the workers' processes and wait out their heartbeat TTL (1 s).
pub fn kill_and_expire(workers: &mut [KillOnDrop]) {
    for w in workers {
        w.0.kill().unwrap();
        w.0.wait().unwrap();
    }
    std::thread::sleep(Duration::from_millis(1100));
}

/// A controller child, its JSON log in a file.
pub struct Controller {
    pub child: KillOnDrop,
    pub log: PathBuf,
}

impl Controller {
    pub fn start(stores: &Stores, name: &str, extra: &[&str]) -> Controller {
        let log = stores.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = command(stores, "controller-prgs")
            .args(["--log-format", "json"])
            .args(extra)
            .args(if extra.contains(&"--listen") {
                &[][..]
            } else {
                &["--listen", "none"][..]
            })
            .args(if extra.contains(&"--interval") {
                &[][..]
            } else {
                &["--interval", "1s"][..]
            })
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Controller {
            child: KillOnDrop(child),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, s: Signal) {
        kill(Pid::from_raw(self.pid() as i32), s).unwrap();
    }

    /// Its log, one JSON object per line.
    pub fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The outcomes of its ticks, in order.
    pub fn outcomes(&self) -> Vec<String> {
        self.lines()
            .iter()
            .filter_map(|l| l["fields"]["outcome"].as_str().map(str::to_string))
            .collect()
    }

    pub fn says(&self, message: &str) -> bool {
        self.lines()
            .iter()
            .any(|l| l["fields"]["message"].as_str() == Some(message))
    }

    /// The terms it logged taking the lease under.
    pub fn terms_taken(&self) -> Vec<i64> {
        self.lines()
            .iter()
            .filter(|l| l["fields"]["message"] == "leading: took the controller lease")
            .filter_map(|l| l["fields"]["term"].as_i64())
            .collect()
    }
}

/// The unexpired lease holder's pid and term, on the store's clock (the
/// host's for SQLite, the server's for PostgreSQL).
pub fn leader(registry: &Path) -> Option<(u32, i64)> {
    let (holder, term, expires, now): (String, i64, i64, i64) = match pg_url(registry) {
        Some(url) => {
            let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).ok()?;
            let r = c
                .query_opt(
                    "SELECT holder, term, expires_at_ms, \
                     (date_part('epoch', clock_timestamp()) * 1000)::int8 \
                     FROM fleet_retire_controller_leases",
                    &[],
                )
                .ok()??;
            (r.get(0), r.get(1), r.get(2), r.get(3))
        }
        None => {
            let conn = rusqlite::Connection::open(registry).ok()?;
            let (h, t, e) = conn
                .query_row(
                    "SELECT holder, term, expires_at_ms FROM fleet_retire_controller_leases",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .ok()?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            (h, t, e, now)
        }
    };
    let pid = holder.split(':').nth(1)?.parse().ok()?;
    (expires > now).then_some((pid, term))
}

pub fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
    started.elapsed()
}

/// The leader's pid and term, once there is one.
pub fn wait_for_leader(stores: &Stores) -> (u32, i64) {
    wait_for(Duration::from_secs(20), "a leader", || {
        leader(&stores.registry).is_some()
    });
    leader(&stores.registry).unwrap()
}

/// SIGKILL the leader among `cs` (removing it) and wait until the other
/// leads: how long that took.
pub fn kill_the_leader(stores: &Stores, cs: &mut Vec<Controller>) -> Duration {
    let (pid, _) = wait_for_leader(stores);
    let at = cs.iter().position(|c| c.pid() == pid).unwrap();
    let mut dead = cs.remove(at);
    dead.signal(Signal::SIGKILL);
    let _ = dead.child.0.wait();
    let took = wait_for(Duration::from_secs(30), "a new leader", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == cs[0].pid())
    });
    eprintln!("took over {took:?} after SIGKILL");
    took
}

/// The child's exit status, waited for until `limit` after `since`.
pub fn exit_within(
    child: &mut KillOnDrop,
    since: Instant,
    limit: Duration,
) -> std::process::ExitStatus {
    loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            return s;
        }
        assert!(
            since.elapsed() < limit,
            "still running {limit:?} after the signal"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A controller serving its endpoints on a free loopback port, and the
/// port: started again on another port when the one picked was taken
/// meanwhile (by a test beside it) and the controller could not listen.
pub fn start_listening(stores: &Stores, name: &str) -> (Controller, u16) {
    start_listening_with(stores, name, &[])
}

/// [`start_listening`] with more arguments.
pub fn start_listening_with(stores: &Stores, name: &str, extra: &[&str]) -> (Controller, u16) {
    for _ in 0..5 {
        let port = super::free_port();
        let listen = format!("127.0.0.1:{port}");
        let args = [&["--listen", listen.as_str()][..], extra].concat();
        let mut c = Controller::start(stores, name, &args);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return (c, port);
            }
            if c.child.0.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
    panic!("no controller could listen on a free port");
}

/// One HTTP GET on 127.0.0.1: the status code and the body.
pub fn get(port: u16, path: &str, accept: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n{accept}\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let code = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// A sample's value in a scrape.
pub fn sample(scrape: &str, name: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
