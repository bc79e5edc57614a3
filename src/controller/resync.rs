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
//! * the processes: every pid the judgement saw alive (or could not
//!   tell) is probed again and must answer exactly as it did: alive, with
//!   the same start time (a pid reused by a new process shows a new one),
//!   so a kept row's process that died is seen by the next resync.
//!
//! What is not re-checked, and why it can only keep a row for longer:
//!
//! * a pid seen **gone** that a new process (or thread) took since: for
//!   its own row that can only add a block (`pid-alive`, or the start
//!   time forbid), and a row it makes "live" again (a fresh heartbeat and
//!   a pid not known dead) only occupies a slot or holds evidence, which
//!   keeps rows; where it would free another row, that retirement waits
//!   for the next full judgement. Not listing `/proc` keeps a resync's
//!   cost to the pids seen alive: on a busy host the dead pids a registry
//!   names are reused all the time, and each reuse would cost a full
//!   judgement that finds the same;
//! * a process that exec'd: its start time stays and the probe never
//!   reads what runs, so no judgement sees it either.
//!
//! Every such delay is bounded: the skip needs a full judgement younger
//! than [`super::watch::Cache::MAX_AGE_INTERVALS`] intervals.

use crate::evidence::leases::Lease;
use crate::evidence::probe::{HostFacts, PidObservation, ProcessProbe};
use std::collections::HashMap;
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
        for (pid, was) in &self.seen {
            if was.alive != Some(false) && probe.observe(*pid) != *was {
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
