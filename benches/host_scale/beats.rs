//! Heartbeats: writers that beat live rows of the registry flat out, each
//! beat the statements `fleet-retire heartbeat` sends (read the row's
//! owner, then move its `last_heartbeat_at` to now, each autocommit), on a
//! connection of its own kept open as a worker keeps it. Part `beats`
//! (issue 54 §4) measures the rate one PostgreSQL takes with the change
//! record's triggers and without them; part `apply` runs writers beside
//! its applies.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Live rows (identity, pid) of hosts other than `except`.
pub fn live_rows(url: &str, except: &str) -> Vec<(String, i64)> {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.query(
        "SELECT worker_identity, pid FROM worker_registrations WHERE status = 'active' \
         AND heartbeat_ttl_seconds = 7200 AND host_id <> $1",
        &[&except],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// One heartbeat of `row`, as the `heartbeat` command sends it.
fn beat(c: &mut postgres::Client, row: &(String, i64)) -> Result<(), postgres::Error> {
    c.query_opt(
        "SELECT pid, process_start_time, host_id, boot_id, pid_namespace \
         FROM worker_registrations WHERE worker_identity = $1 AND status = 'active'",
        &[&row.0],
    )?;
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    c.execute(
        "UPDATE worker_registrations SET last_heartbeat_at = $1 WHERE worker_identity = $2 \
         AND status = 'active' AND pid = $3",
        &[&now, &row.0, &row.1],
    )?;
    Ok(())
}

/// Writers running until [`Writers::stop`].
pub struct Writers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<(Vec<Duration>, usize)>>,
    started: Instant,
}

/// What the writers did.
pub struct Beats {
    pub rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub failed: usize,
}

impl Writers {
    /// `n` writers over `rows` (each its own share), each beating every
    /// `every` (zero: flat out).
    pub fn start(url: &str, n: usize, rows: Arc<Vec<(String, i64)>>, every: Duration) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|w| {
                let (stop, rows, url) = (stop.clone(), rows.clone(), url.to_string());
                std::thread::spawn(move || {
                    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                    let (mut took, mut failed) = (Vec::new(), 0);
                    let mut i = w;
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        if beat(&mut c, &rows[i % rows.len()]).is_err() {
                            failed += 1;
                        }
                        took.push(t.elapsed());
                        std::thread::sleep(every.saturating_sub(t.elapsed()));
                        i += n * 7 + 1;
                    }
                    (took, failed)
                })
            })
            .collect();
        Writers {
            stop,
            threads,
            started: Instant::now(),
        }
    }

    /// Stop them: their rate and latency.
    pub fn stop(self) -> Beats {
        self.stop.store(true, Ordering::Relaxed);
        let elapsed = self.started.elapsed();
        let mut all = Vec::new();
        let mut failed = 0;
        for t in self.threads {
            let (took, f) = t.join().unwrap();
            all.extend(took);
            failed += f;
        }
        all.sort();
        Beats {
            rate: all.len() as f64 / elapsed.as_secs_f64(),
            p50_ms: crate::common::percentile(&all, 0.50),
            p99_ms: crate::common::percentile(&all, 0.99),
            failed,
        }
    }
}

/// Whether the server flushes its commits (`fsync`, `synchronous_commit`).
fn durability(url: &str) -> String {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let show = |c: &mut postgres::Client, what: &str| -> String {
        c.query_one(&format!("SHOW {what}"), &[]).unwrap().get(0)
    };
    format!(
        "fsync={}, synchronous_commit={}",
        show(&mut c, "fsync"),
        show(&mut c, "synchronous_commit")
    )
}

fn measure(url: &str, writers: usize, secs: u64, rows: &Arc<Vec<(String, i64)>>) -> Beats {
    let w = Writers::start(url, writers, rows.clone(), Duration::ZERO);
    std::thread::sleep(Duration::from_secs(secs));
    w.stop()
}

/// Part `beats`: `writers` flat out for `secs` seconds with the change
/// record's row trigger, then the same after dropping it (this database
/// only: the bench drops it after).
pub fn run(url: &str, writers: usize, secs: u64) {
    let rows = Arc::new(live_rows(url, ""));
    let show = |what: &str, b: &Beats| {
        println!(
            "beats   {what}: {:.0} heartbeats/s, p50 {:.2} ms, p99 {:.2} ms, {} failed \
             ({writers} writers, {secs} s, {} live rows)",
            b.rate,
            b.p50_ms,
            b.p99_ms,
            b.failed,
            rows.len()
        )
    };
    println!("beats   server: {}", durability(url));
    let with = measure(url, writers, secs, &rows);
    show("with the change record   ", &with);
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.batch_execute("DROP TRIGGER fleet_retire_stamp ON worker_registrations")
        .unwrap();
    let without = measure(url, writers, secs, &rows);
    show("without (trigger dropped)", &without);
    println!(
        "beats   the change record costs {:.0} % of the rate",
        100.0 * (1.0 - with.rate / without.rate)
    );
}
