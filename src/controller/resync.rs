//! A resync that costs what may have changed (issue 53 §3,
//! docs/controller.md "Ticks").
//!
//! The resync exists to catch what no write announces, above all a kept
//! row's process dying. A full re-judgement of the scope probes every
//! process and evaluates every policy again; most resyncs find what the
//! last one found. So a full judgement that found **no candidate** is
//! remembered with everything it rested on besides the registry's rows
//! ([`Judged`]), and a resync first looks at just that: the processes it
//! probed, the lease store, this host's facts. When none of them moved it
//! skips planning (outcome `unchanged`); otherwise it judges in full.
//!
//! Why a skip can only delay a retirement, never cause one: a skip
//! retires nothing and changes nothing; every retirement still comes from
//! a full judgement, and the apply reads and judges the scope again under
//! its lock. A judgement is a function of its inputs, and each input is
//! either re-checked here or shown unchanged elsewhere:
//!
//! * the scope's rows: the change signal (`watch.rs`); any change that
//!   concerns them makes the tick a full one, and the kept scope is read
//!   again at least every `Cache::MAX_AGE_INTERVALS` intervals;
//! * the clock: only a heartbeat's age depends on it
//!   (`heartbeat_age_us`; a lease's `expires_at` is ignored), and the
//!   first expiry of a heartbeat a kept row rests on schedules a full tick
//!   by itself (`Schedule::due`);
//! * the leases and this host's facts: read again and compared whole;
//! * the processes: `/proc` listed once; every pid the judgement saw
//!   alive (or could not tell) is probed again and must answer exactly as
//!   it did (alive, same start time: a pid reused by a new process shows
//!   a new start time); every pid it saw gone must still be absent from
//!   the listing.
//!
//! What is not re-checked: a pid seen gone that is now a *thread* of some
//! process (threads are not listed) or a process that exec'd (its start
//! time stays; the probe never reads what runs). Either can only make the
//! full judgement answer differently later, and until then the row is
//! kept: a delay, bounded by the full judgement every
//! [`super::watch::Cache::MAX_AGE_INTERVALS`] intervals (the skip requires
//! a judgement younger than that).

use crate::evidence::leases::Lease;
use crate::evidence::probe::{HostFacts, PidObservation, ProcessProbe};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A probe that remembers every answer it gave.
pub struct Recording<'a> {
    inner: &'a dyn ProcessProbe,
    seen: Mutex<HashMap<i64, PidObservation>>,
}

impl<'a> Recording<'a> {
    /// Record what `inner` answers.
    pub fn new(inner: &'a dyn ProcessProbe) -> Recording<'a> {
        Recording {
            inner,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Every pid probed, with its answer.
    pub fn into_seen(self) -> HashMap<i64, PidObservation> {
        self.seen
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ProcessProbe for Recording<'_> {
    fn observe(&self, pid: i64) -> PidObservation {
        let answer = self.inner.observe(pid);
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(pid, answer.clone());
        answer
    }
}

/// A full judgement that found no candidate, and what it rested on besides
/// the registry's rows.
pub struct Judged {
    /// When it was made.
    pub at: Instant,
    /// Under which term.
    pub term: i64,
    /// Every pid it probed, with the answer.
    pub seen: HashMap<i64, PidObservation>,
    /// The active leases it read.
    pub leases: Vec<Lease>,
    /// This host's facts it read.
    pub host: HostFacts,
    /// The first heartbeat expiry it kept a row for.
    pub next_expiry_us: Option<i64>,
}

impl Judged {
    /// Whether a resync under `term` may skip planning: `Err` says why not.
    pub fn unchanged(
        &self,
        term: i64,
        max_age: Duration,
        proc_root: &Path,
        leases: &Path,
        probe: &dyn ProcessProbe,
    ) -> Result<(), String> {
        if self.term != term {
            return Err("a new term".into());
        }
        if self.at.elapsed() >= max_age {
            return Err("the last full judgement is too old".into());
        }
        if HostFacts::observe(proc_root) != self.host {
            return Err("this host's facts changed".into());
        }
        let listed = listing(proc_root)?;
        for (pid, was) in &self.seen {
            if was.alive == Some(false) {
                if listed.contains(pid) {
                    return Err(format!("pid {pid}, gone at the last judgement, is listed"));
                }
            } else if probe.observe(*pid) != *was {
                return Err(format!("pid {pid} answers differently"));
            }
        }
        match crate::evidence::leases::load(leases) {
            Ok(now) if now == self.leases => Ok(()),
            Ok(_) => Err("the leases changed".into()),
            Err(e) => Err(format!("the leases cannot be read: {e}")),
        }
    }
}

/// The pids `/proc` lists now (processes, not threads).
fn listing(proc_root: &Path) -> Result<HashSet<i64>, String> {
    let dir = std::fs::read_dir(proc_root).map_err(|e| format!("cannot list /proc: {e}"))?;
    let mut pids = HashSet::new();
    for entry in dir {
        let entry = entry.map_err(|e| format!("cannot list /proc: {e}"))?;
        if let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
            pids.insert(pid);
        }
    }
    Ok(pids)
}
