//! Who leads, as the two controllers of `tests/patroni_freeze.rs` say it
//! and as the registry's audit records it: their `/metrics` sampled all
//! through the test, their logs (the holder each one is, the terms it took
//! and when), and the audit rows joined with the applies' terms.

use super::common::controller::{sample, Controller};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often both controllers' `/metrics` are read.
pub const EVERY: Duration = Duration::from_millis(150);

/// A controller of the test and the port of its `/metrics`.
pub struct Ctl {
    pub name: &'static str,
    pub c: Controller,
    pub port: u16,
}

/// One look at both controllers: for each, whether it said it leads and
/// its term (None: it did not answer).
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Instant,
    pub seen: Vec<Option<(bool, i64)>>,
}

impl Sample {
    /// The controllers (their index) that said they lead, with their terms.
    pub fn leaders(&self) -> Vec<(usize, i64)> {
        self.seen
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.filter(|(l, _)| *l).map(|(_, t)| (i, t)))
            .collect()
    }
}

/// `/metrics` of every port, read every [`EVERY`] until stopped.
pub struct Watch {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    pub fn start(ports: Vec<u16>) -> Watch {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (noted, stopped) = (samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                let at = Instant::now();
                let seen = ports.iter().map(|p| scrape(*p)).collect();
                noted.lock().unwrap().push(Sample { at, seen });
                std::thread::sleep(EVERY.saturating_sub(at.elapsed()));
            }
        });
        Watch {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// Every sample so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// The last sample taken.
    pub fn last(&self) -> Option<Sample> {
        self.samples.lock().unwrap().last().cloned()
    }

    /// Stop sampling: every sample taken.
    pub fn stop(&mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.samples()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The leader gauge and the term of the controller serving on `port`, if
/// it answers within seconds.
pub fn scrape(port: u16) -> Option<(bool, i64)> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let body = answer.split_once("\r\n\r\n")?.1;
    let leader = sample(body, "fleet_retire_controller_leader")?;
    let term = sample(body, "fleet_retire_controller_term")?;
    Some((leader == 1.0, term as i64))
}

/// At every sample at most one controller said it leads, and no two ever
/// said they lead under one term.
pub fn one_leader_at_a_time(samples: &[Sample], ctls: &[Ctl], from: Instant) {
    let mut term_of: Vec<(i64, usize)> = Vec::new();
    for (n, s) in samples.iter().enumerate() {
        let leaders = s.leaders();
        let around = &samples[n.saturating_sub(5)..(n + 5).min(samples.len())];
        assert!(
            leaders.len() <= 1,
            "two controllers said they lead at {:.2} s: {:#?}",
            (s.at - from).as_secs_f64(),
            around
        );
        for (i, t) in leaders {
            match term_of.iter().find(|(term, _)| *term == t) {
                Some((_, j)) => assert_eq!(
                    *j, i,
                    "{} and {} both led under term {t}",
                    ctls[*j].name, ctls[i].name
                ),
                None => term_of.push((t, i)),
            }
        }
    }
}

/// A log line's time, in milliseconds since the Unix epoch.
fn ms_of(line: &Value) -> i64 {
    let at = line["timestamp"].as_str().unwrap_or_default();
    chrono::DateTime::parse_from_rfc3339(at)
        .unwrap_or_else(|e| panic!("a log line's timestamp {at:?}: {e}"))
        .timestamp_millis()
}

/// The holder a controller says it is.
pub fn holder_of(c: &Controller) -> String {
    c.lines()
        .iter()
        .find(|l| l["fields"]["message"] == "controller started")
        .and_then(|l| l["fields"]["holder"].as_str().map(str::to_string))
        .expect("the controller logs its holder")
}

/// The terms a controller took, each with when it said so (ms since the
/// epoch: later than the takeover's COMMIT).
pub fn took(c: &Controller) -> Vec<(i64, i64)> {
    c.lines()
        .iter()
        .filter(|l| l["fields"]["message"] == "leading: took the controller lease")
        .filter_map(|l| Some((l["fields"]["term"].as_i64()?, ms_of(l))))
        .collect()
}

/// One retirement of the audit, with its apply's row of
/// `fleet_retire_controller_applies` (None for an apply made by hand).
#[derive(Debug)]
pub struct Audited {
    pub worker: String,
    pub holder: Option<String>,
    pub term: Option<i64>,
    pub recorded_at_ms: Option<i64>,
}

/// The audit rows of `url`, in the order they were written.
pub fn audited(url: &str) -> Vec<Audited> {
    let mut client = super::common::patroni::connect(url);
    client
        .query(
            "SELECT a.worker_identity, c.holder, c.controller_term, c.recorded_at_ms \
             FROM retirement_audit a LEFT JOIN fleet_retire_controller_applies c \
             USING (apply_id) ORDER BY a.audit_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| Audited {
            worker: r.get(0),
            holder: r.get(1),
            term: r.get(2),
            recorded_at_ms: r.get(3),
        })
        .collect()
}

/// The audit agrees with the controllers: every retirement carries a term
/// and a holder; a term is one controller's, the one whose log took it,
/// and whose `/metrics` said it led under it; terms grow in the audit's
/// order; and no apply was recorded after a later term was taken (a
/// deposed leader commits nothing).
pub fn audit_agrees(rows: &[Audited], ctls: &[Ctl], samples: &[Sample]) {
    let holders: Vec<String> = ctls.iter().map(|c| holder_of(&c.c)).collect();
    let taken: Vec<Vec<(i64, i64)>> = ctls.iter().map(|c| took(&c.c)).collect();
    for (i, t) in taken.iter().enumerate() {
        for j in i + 1..taken.len() {
            assert!(
                t.iter()
                    .all(|(term, _)| taken[j].iter().all(|(u, _)| u != term)),
                "{} and {} took one term: {taken:?}",
                ctls[i].name,
                ctls[j].name
            );
        }
    }
    let mut last = 0;
    for r in rows {
        let (Some(holder), Some(term), Some(at)) = (&r.holder, r.term, r.recorded_at_ms) else {
            panic!("a retirement without its controller's term: {r:?}");
        };
        assert!(term >= last, "terms went back in the audit: {rows:#?}");
        last = term;
        let i = holders
            .iter()
            .position(|h| h == holder)
            .unwrap_or_else(|| panic!("{r:?}: no controller of the test is {holder}"));
        assert!(
            taken[i].iter().any(|(t, _)| *t == term),
            "{r:?}: {} never took term {term}: {taken:?}",
            ctls[i].name
        );
        assert!(
            samples.iter().any(|s| s.seen[i] == Some((true, term))),
            "{r:?}: the /metrics of {} never said it led under term {term}",
            ctls[i].name
        );
        let deposed = taken
            .iter()
            .flatten()
            .find(|(t, when)| *t > term && *when < at);
        assert!(
            deposed.is_none(),
            "{r:?} was recorded after term {deposed:?} was taken"
        );
    }
}
