//! A throwaway Patroni cluster for the failover tests (`tests/patroni.rs`,
//! `tests/patroni_apply.rs`): three PostgreSQL members run by Debian's
//! patroni with etcd, synchronous mode on, started by `.ci/patroni-cluster`
//! and stopped on drop, even when a test fails.

use super::{skip_unless, text};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One cluster at a time: two at once on a two-core machine make
/// elections slow enough to miss their bounds.
pub static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A running Patroni cluster; stopped on drop.
pub struct Cluster {
    dir: tempfile::TempDir,
    base: u16,
    pub url: String,
    /// Processes [`Cluster::freeze`] stopped: killed and continued on
    /// drop (a stopped process's children outlive its SIGKILL, stopped).
    frozen: std::sync::Mutex<Vec<i32>>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/patroni-cluster")
}

impl Cluster {
    pub fn start() -> Option<Cluster> {
        let present = ["patroni", "etcd", "curl"].iter().all(|tool| {
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        if skip_unless(
            present,
            "Debian's patroni and etcd-server (.ci/run installs them)",
        ) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        // Ports from the process id (20000..31993), or from
        // FLEET_RETIRE_TEST_PATRONI_PORT for a run beside others.
        let base = std::env::var("FLEET_RETIRE_TEST_PATRONI_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(20_000 + (std::process::id() % 400) as u16 * 30);
        let out = Command::new(script())
            .arg("start")
            .arg(dir.path())
            .arg(base.to_string())
            .output()
            .unwrap();
        let cluster = Cluster {
            url: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            dir,
            base,
            frozen: Default::default(),
        };
        assert!(out.status.success(), "{}", text(&out));
        Some(cluster)
    }

    /// The member (1..3) that is the leader now, if one is.
    pub fn leader(&self) -> Option<u16> {
        (1..=3).find(|n| {
            Command::new("curl")
                .args(["-fs", "-o", "/dev/null", "--max-time", "2"])
                .arg(format!("http://127.0.0.1:{}/primary", self.base + 20 + n))
                .status()
                .is_ok_and(|s| s.success())
        })
    }

    /// SIGKILL member `n`'s patroni and its PostgreSQL server.
    pub fn kill(&self, n: u16) {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let patroni = read(self.dir.path().join(format!("patroni{n}.pid")));
        let postmaster = read(self.dir.path().join(format!("pg{n}/postmaster.pid")));
        for pid in [patroni.trim(), postmaster.lines().next().unwrap_or("")] {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// Wait (at most `limit`) for a leader other than `old`.
    pub fn new_leader(&self, old: u16, limit: Duration) -> Option<u16> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(n) = self.leader().filter(|n| *n != old) {
                return Some(n);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        None
    }

    pub fn client(&self) -> ::postgres::Client {
        connect(&self.url)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let frozen = self.frozen.lock().map(|f| f.clone()).unwrap_or_default();
        for pid in frozen {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        }
        let _ = Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

/// A connection to the writable member, waited for (at most 30 s) while
/// Patroni restarts or elects one.
pub fn connect(url: &str) -> ::postgres::Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match ::postgres::Client::connect(url, ::postgres::NoTls) {
            Ok(client) => return client,
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting for a writable member: {e}");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => panic!("no writable member of {url}: {e}"),
        }
    }
}

impl Cluster {
    /// Wait (at most `limit`) until some member is the synchronous
    /// standby: only it may be promoted in synchronous mode, so a leader
    /// killed before one is named leaves the cluster without a leader, by
    /// design.
    pub fn wait_sync(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !(1..=3).any(|n| {
            Command::new("curl")
                .args(["-fs", "-o", "/dev/null", "--max-time", "2"])
                .arg(format!("http://127.0.0.1:{}/sync", self.base + 20 + n))
                .status()
                .is_ok_and(|s| s.success())
        }) {
            assert!(
                Instant::now() < deadline,
                "no synchronous standby within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The cluster's URL for database `db`.
    pub fn url_of(&self, db: &str) -> String {
        self.url.replacen("/postgres?", &format!("/{db}?"), 1)
    }
}

impl Cluster {
    /// Start member `n` again after a kill and wait (at most `limit`) until
    /// all three run and one is the synchronous standby (the old leader
    /// rejoins through `pg_rewind`).
    pub fn restart(&self, n: u16, limit: Duration) {
        let out = Command::new(script())
            .arg("member")
            .arg(self.dir.path())
            .arg(n.to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let deadline = Instant::now() + limit;
        let healthy = |m: u16| {
            Command::new("curl")
                .args(["-fs", "-o", "/dev/null", "--max-time", "2"])
                .arg(format!("http://127.0.0.1:{}/health", self.base + 20 + m))
                .status()
                .is_ok_and(|s| s.success())
        };
        while !(1..=3).all(healthy) {
            assert!(
                Instant::now() < deadline,
                "member {n} did not rejoin within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        self.wait_sync(limit);
    }
}

impl Cluster {
    /// Member `n`'s PostgreSQL port.
    pub fn port_of(&self, n: u16) -> u16 {
        self.base + 10 + n
    }

    /// `url` without member `n` (a frozen member would hold a test's own
    /// connection, which the driver does not bound, for ever).
    pub fn url_without(&self, url: &str, n: u16) -> String {
        let others: Vec<String> = (1..=3)
            .filter(|m| *m != n)
            .map(|m| format!("127.0.0.1:{}", self.port_of(m)))
            .collect();
        url.replacen(&self.hosts(), &others.join(","), 1)
    }

    /// The URL's host list, as it is written there.
    pub fn hosts(&self) -> String {
        (1..=3)
            .map(|n| format!("127.0.0.1:{}", self.port_of(n)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Cluster {
    /// The last lines of every member's Patroni log, for a failure message.
    pub fn logs(&self) -> String {
        (1..=3)
            .map(|n| {
                let log = std::fs::read_to_string(self.dir.path().join(format!("patroni{n}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(12).collect();
                format!(
                    "-- patroni{n}.log\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Cluster {
    /// SIGSTOP member `n` whole, as a paused machine would be: its patroni,
    /// its postmaster and every process of its server. The kernel keeps
    /// their sockets open and acknowledges what is sent to them; nothing
    /// answers. The cluster's stop (SIGKILL) ends them, frozen or not.
    pub fn freeze(&self, n: u16) {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let patroni = read(self.dir.path().join(format!("patroni{n}.pid")));
        let postmaster = read(self.dir.path().join(format!("pg{n}/postmaster.pid")));
        let postmaster: i32 = postmaster.lines().next().unwrap_or("").parse().unwrap();
        let children: Vec<i32> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let stat = read(PathBuf::from(format!("/proc/{pid}/stat")));
                let after = stat.rsplit_once(") ").map(|(_, a)| a).unwrap_or("");
                after.split(' ').nth(1) == Some(&postmaster.to_string())
            })
            .collect();
        // Patroni as the pid file names it, and any process running its
        // configuration (the pid file may name a wrapper).
        let yml = self.dir.path().join(format!("pg{n}.yml"));
        let yml = yml.to_string_lossy().into_owned();
        let runs_it: Vec<i32> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&yml))
            })
            .collect();
        let pids = patroni
            .trim()
            .parse::<i32>()
            .into_iter()
            .chain(runs_it)
            .chain([postmaster]);
        for pid in pids.chain(children) {
            if let Ok(mut frozen) = self.frozen.lock() {
                frozen.push(pid);
            }
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGSTOP,
            );
        }
    }
}
