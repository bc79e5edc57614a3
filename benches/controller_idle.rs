//! Benchmark (issue 53 §3): what a leading `fleet-retire controller` costs
//! while nothing changes, and what a tick after one change reads.
//!
//! A realistic SQLite registry from `../shared/bench/gen_registry.py`
//! (`CONTROLLER_IDLE_ROWS`, default 1,000,000; about 90 % of the rows on
//! this host), its row versions and scope indexes made by `registry
//! versions`, recent heartbeats moved to 2099 (still fresh, so no expiry
//! drives a tick: nothing changes), and the other active rows of this host
//! retired (the state after a controller worked off its backlog: no
//! candidate). One real controller process at the
//! default times (interval 30 s, retry 2 s, lease 15 s), serving
//! `/metrics`. Once it leads and its first ticks have settled (its first
//! applies spend the budget or engage the brake):
//!
//! 1. **idle cost**: its CPU time (utime + stime of `/proc/PID/stat`) over
//!    `CONTROLLER_IDLE_SECONDS` (default 60), as a share of one core;
//!    the ticks and checks it made meanwhile;
//! 2. **one row of another host added** (a worker registering there, no
//!    key shared with this host's rows): the rows the next check read, and
//!    whether a tick ran;
//! 3. **one row of this host changed**, first in a column no peer is
//!    fetched by (`fleet_run_id`: patched into the kept scope), then in a
//!    key (`generation_id`: the scope read again): the rows the check
//!    read, and the rows the tick it caused read
//!    (`fleet_retire_controller_last_tick_rows_read`).
//!
//! The registry is deleted at the end. Run with `cargo bench --bench
//! controller_idle`; the machine's other load shows in the figures.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fleet-retire");

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The controller, killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn generate(dir: &Path, rows: usize) {
    let generator = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/gen_registry.py");
    let started = Instant::now();
    let ok = Command::new("python3")
        .arg(&generator)
        .args(["--rows", &rows.to_string(), "--out"])
        .arg(dir)
        .stdout(Stdio::null())
        .status()
        .expect("run python3")
        .success();
    assert!(ok, "gen_registry.py failed");
    let registry = dir.join("registry.sqlite");
    let conn = rusqlite::Connection::open(&registry).unwrap();
    let frozen = conn
        .execute(
            "UPDATE worker_registrations SET last_heartbeat_at = '2099-01-01T00:00:00Z'
             WHERE status = 'active'
               AND last_heartbeat_at > strftime('%Y-%m-%dT%H:%M:%SZ', 'now', '-3 hours')",
            [],
        )
        .unwrap();
    // A fleet whose controller has worked off its backlog: every active row
    // of this host whose heartbeat is not fresh is retired (nothing is a
    // candidate), so nothing changes while it is measured.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let backlog = conn
        .execute(
            "UPDATE worker_registrations SET status = 'retired'
             WHERE status = 'active' AND host_id = ?1
               AND last_heartbeat_at < '2099-01-01T00:00:00Z'",
            [host.trim()],
        )
        .unwrap();
    // Its row versions and scope indexes, as `registry create` makes them
    // (the generator writes the file straight).
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    fleet_retire::store::sqlite::versions::install(&conn).unwrap();
    conn.execute_batch("COMMIT").unwrap();
    drop(conn);
    std::fs::write(
        dir.join("profiles.json"),
        r#"{"profiles": {"controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}}"#,
    )
    .unwrap();
    println!(
        "generated {rows} rows, row versions and indexes made, in {:.1?} ({frozen} recent \
         heartbeats moved to 2099, {backlog} stale active rows of this host retired)",
        started.elapsed()
    );
}

/// One `plan --scope host` of the registry, output discarded: its wall
/// time (what a tick's plan costs, beside the controller's).
fn scoped_plan(dir: &Path) -> Duration {
    let started = Instant::now();
    let ok = Command::new(BIN)
        .args(["--format", "json", "plan", "--scope", "host", "--registry"])
        .arg(dir.join("registry.sqlite"))
        .arg("--leases")
        .arg(dir.join("leases.sqlite"))
        .arg("--profiles")
        .arg(dir.join("profiles.json"))
        .args(["--profile", "controller-prgs"])
        .args(["--canonical-repository", "prgs/gitea-tools"])
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "plan --scope host failed");
    started.elapsed()
}

fn start(dir: &Path, port: u16) -> Running {
    let child = Command::new(BIN)
        .arg("controller")
        .arg("--registry")
        .arg(dir.join("registry.sqlite"))
        .arg("--leases")
        .arg(dir.join("leases.sqlite"))
        .arg("--profiles")
        .arg(dir.join("profiles.json"))
        .args(["--profile", "controller-prgs"])
        .args(["--canonical-repository", "prgs/gitea-tools"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Running(child)
}

fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    );
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
}

/// The sum of every sample of `name` (across its labels).
fn total(port: u16, name: &str) -> f64 {
    scrape(port)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis: state is the
    // first, utime the 12th, stime the 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Write `sql` to the registry, then wait for the next check (and the
/// tick it may cause) to be over; the rows read in all meanwhile
/// (`rows_read_total`), and the rows the tick took if one ran (its
/// `last_tick_rows_read`: read by it, or read by the check and patched
/// in, counted once in the total).
fn one_change(dir: &Path, port: u16, sql: &str) -> (f64, Option<f64>) {
    let ticks = total(port, "fleet_retire_controller_ticks_total");
    let checks = total(port, "fleet_retire_controller_checks_total");
    let read = total(port, "fleet_retire_controller_rows_read_total");
    let conn = rusqlite::Connection::open(dir.join("registry.sqlite")).unwrap();
    // A tick may be reading (a shared lock): wait for it.
    conn.busy_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(conn.execute(sql, []).unwrap(), 1, "{sql}");
    drop(conn);
    wait_until(Duration::from_secs(30), "a check", || {
        total(port, "fleet_retire_controller_checks_total") >= checks + 2.0
    });
    let ticked = total(port, "fleet_retire_controller_ticks_total") > ticks;
    let by_tick = ticked.then(|| total(port, "fleet_retire_controller_last_tick_rows_read"));
    let all = total(port, "fleet_retire_controller_rows_read_total") - read;
    (all, by_tick)
}

/// One row of another host added, then one own row changed outside its
/// keys, then in a key: what each cost.
fn changes(dir: &Path, port: u16) {
    // A worker registering on another host: a row no key of this host's
    // rows names (a row of another host already there may be a peer).
    let elsewhere = one_change(
        dir,
        port,
        "INSERT INTO worker_registrations (worker_identity, host_id, status, session_id, \
         generation_id, pid, client_instance_id, last_heartbeat_at) VALUES ('w-elsewhere', \
         'build-02', 'active', 's-elsewhere', 'g-elsewhere', 4999999, 'inst-elsewhere', \
         '2099-01-01T00:00:00Z')",
    );
    println!(
        "one row of another host added: {} row(s) read in all; a tick ran (rows it took): {:?}",
        elsewhere.0, elsewhere.1
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let one_own = |set: &str| {
        format!(
            "UPDATE worker_registrations SET {set} \
             WHERE rowid = (SELECT rowid FROM worker_registrations \
             WHERE host_id = '{}' AND status = 'active' LIMIT 1)",
            host.trim()
        )
    };
    let here = one_change(dir, port, &one_own("fleet_run_id = 'run-moved'"));
    println!(
        "one active row of this host changed (fleet_run_id): {} row(s) read in all; the tick \
         it caused took {:?} row(s)",
        here.0, here.1
    );
    let key = one_change(dir, port, &one_own("generation_id = generation_id || '-x'"));
    println!(
        "one active row of this host changed in a key (generation_id): {} row(s) read in all; \
         the tick it caused took {:?} row(s)",
        key.0, key.1
    );
}

fn main() {
    let rows = env_or("CONTROLLER_IDLE_ROWS", 1_000_000usize);
    let seconds = env_or("CONTROLLER_IDLE_SECONDS", 60u64);
    let base = std::env::var("CONTROLLER_IDLE_TMP").unwrap_or_else(|_| "/tmp".into());
    // Removed on drop, a panic included.
    let tmp = tempfile::tempdir_in(base).unwrap();
    let dir: PathBuf = tmp.path().to_path_buf();
    generate(&dir, rows);
    println!("plan --scope host of it: {:.2?} wall", scoped_plan(&dir));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = start(&dir, port);
    let pid = c.0.id();
    wait_until(Duration::from_secs(120), "a first tick", || {
        total(port, "fleet_retire_controller_ticks_total") >= 1.0
    });
    // Settled: two checks in a row that found nothing to tick for.
    wait_until(Duration::from_secs(300), "the ticks to settle", || {
        let (t, q) = (
            total(port, "fleet_retire_controller_ticks_total"),
            total(
                port,
                "fleet_retire_controller_checks_total{found=\"quiet\"}",
            ),
        );
        std::thread::sleep(Duration::from_secs(5));
        total(port, "fleet_retire_controller_ticks_total") == t
            && total(
                port,
                "fleet_retire_controller_checks_total{found=\"quiet\"}",
            ) >= q + 2.0
    });
    let scrape_before = scrape(port);
    let ticks0 = total(port, "fleet_retire_controller_ticks_total");
    let read0 = total(port, "fleet_retire_controller_rows_read_total");
    let clk = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    let cpu0 = cpu_ticks(pid);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let cpu = (cpu_ticks(pid) - cpu0) as f64 / clk;
    let wall = t0.elapsed().as_secs_f64();
    let ticks = total(port, "fleet_retire_controller_ticks_total") - ticks0;
    let took = total(port, "fleet_retire_controller_tick_duration_seconds_sum");
    let count = total(port, "fleet_retire_controller_tick_duration_seconds_count");
    let read = total(port, "fleet_retire_controller_rows_read_total") - read0;
    println!(
        "idle: {:.3} s CPU over {wall:.1} s = {:.2} % of one core; {ticks} tick(s), {read} \
         row(s) read meanwhile (the last tick read {} rows)",
        cpu,
        100.0 * cpu / wall,
        total(port, "fleet_retire_controller_last_tick_rows_read")
    );
    println!(
        "ticks so far: {count}, {:.2} s wall each on average; {} skipped planning (unchanged)",
        took / count.max(1.0),
        total(
            port,
            "fleet_retire_controller_ticks_total{outcome=\"unchanged\"}"
        )
    );
    changes(&dir, port);
    if std::env::var_os("CONTROLLER_IDLE_SCRAPE").is_some() {
        println!("{scrape_before}");
    }
    drop(c);
    drop(tmp);
}
