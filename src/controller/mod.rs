//! `fleet-retire controller`: plan and apply by itself, one leader per
//! (registry, host) (docs/controller.md). A reconcile (`tick.rs`) and a
//! runtime that schedules it: a tick runs when the registry's change
//! signal moved, when the resync interval passed, or when this process
//! newly leads, polled every retry period, and only while it leads
//! (`lease.rs`); how a tick ended decides the next wait (`backoff.rs`).
//! Everything a restart must not forget (the lease's term, the budget) is
//! in the registry, never here.

mod backoff;
mod brake;
mod follow;
pub mod http;
pub mod lease;
pub mod metrics;
mod resync;
mod sight;
mod tick;
mod watch;

use crate::error::{Error, ExitCode, Result};
use crate::policy::{Policies, PolicySource};
use crate::store::controller::Bucket;
use crate::store::seam::{ControllerRows, Engine};
use lease::{sleep_unless, Holder, Leadership, LeaseTimes};
use metrics::Metrics;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the controller was started with.
pub struct Config {
    /// The worker registry (its lease and budget live there too).
    pub registry: PathBuf,
    /// The lease store of the workflows.
    pub leases: PathBuf,
    /// `profiles.json`.
    pub profiles: PathBuf,
    /// The profile it applies as.
    pub profile: String,
    /// The `/proc` root.
    pub proc_root: PathBuf,
    /// The repository binding required.
    pub canonical_repository: String,
    /// The policies loaded at start.
    pub policies: Arc<Policies>,
    /// Where they were read from, followed while the controller runs
    /// (`follow.rs`).
    pub policy_source: PolicySource,
    /// `policy::source_digest` of that source, taken before the load.
    pub policy_digest: Vec<u8>,
    /// The resync period.
    pub interval: Duration,
    /// The host's budget.
    pub bucket: Bucket,
    /// The lease's times.
    pub times: LeaseTimes,
    /// Plan and count, write nothing but the lease.
    pub dry_run: bool,
    /// One tick, then exit.
    pub once: bool,
    /// At most this many retirements per apply.
    pub max_retire: usize,
    /// How long an apply waits for the registry's lock.
    pub busy_timeout: Duration,
    /// The brake's fraction of the host's active rows.
    pub brake_fraction: f64,
    /// What a tick reads and judges.
    pub scope: TickScope,
}

/// What a tick reads and judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickScope {
    /// This host's active rows and the peer rows their verdicts need
    /// (`plan --scope host`), applied as a scoped plan is: the default.
    Host,
    /// The whole registry, as `plan` without `--scope`.
    Registry,
}

/// What `/livez` and `/readyz` read.
#[derive(Default)]
pub struct Health {
    inner: Mutex<HealthState>,
    /// The lease, read at every `/readyz`.
    lease: std::sync::OnceLock<lease::View>,
}

#[derive(Default, Clone)]
struct HealthState {
    last_tick: Option<Instant>,
    registry_unreachable: Option<String>,
    /// Why the policy set on disk cannot be used, while it cannot.
    policy_invalid: Option<String>,
    /// Why the last tick could not read the stores, if it could not.
    stores_unreadable: Option<String>,
    lease_overdue: bool,
}

impl Health {
    fn set(&self, f: impl FnOnce(&mut HealthState)) {
        f(&mut self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    fn get(&self) -> HealthState {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Why the loop is not alive (no tick, nor a poll that found nothing to
    /// do, within `limit`), if it is not.
    pub fn not_live(&self, limit: Duration) -> Option<String> {
        match self.get().last_tick {
            Some(t) if t.elapsed() <= limit => None,
            Some(t) => Some(format!(
                "the loop last ran {:?} ago (limit {limit:?})",
                t.elapsed()
            )),
            None => Some("the loop has not run yet".into()),
        }
    }

    /// Why this process is not ready, if it is not.
    pub fn not_ready(&self) -> Option<String> {
        let s = self.get();
        if let Some(why) = s.registry_unreachable.or(s.stores_unreadable) {
            return Some(format!("the registry cannot be reached: {why}"));
        }
        if let Some(why) = s.policy_invalid {
            return Some(format!("the policy set on disk cannot be used: {why}"));
        }
        (s.lease_overdue || self.lease.get().is_some_and(lease::View::overdue))
            .then(|| "this process leads with a lease past its renew deadline".into())
    }
}

/// The loop's parts.
pub struct Run {
    holder: Holder,
    lease: Leadership,
    rows: Box<dyn ControllerRows>,
    engine: Box<dyn Engine>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    stop: Arc<AtomicBool>,
    sight: sight::Sight,
    brake: brake::Brake,
    /// What the last tick read, to judge the registry's changes against
    /// (`None`: any change makes a tick due).
    interest: Option<watch::Interest>,
    /// The scope the last tick read, while nothing of it changed.
    cache: watch::Cache,
    /// The last full judgement, while it found no candidate: what a
    /// resync compares before it plans (`resync.rs`).
    judged: Option<resync::Judged>,
    /// The policy set ticks judge by (reloaded when it changes on disk).
    policies: Arc<Policies>,
    follow: follow::Follow,
    /// When `rows` was last used (or opened).
    rows_used: Instant,
}

/// Run the controller until `stop` is set (or one tick with `--once`);
/// the exit code (`--once`: the tick's apply's).
pub fn run(
    cfg: &Config,
    stop: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> Result<ExitCode> {
    let engine = crate::store::open::engine(&cfg.registry)?;
    let host = crate::evidence::probe::HostFacts::observe(&cfg.proc_root)
        .host_id
        .ok_or_else(|| {
            Error::Refused(format!(
                "this host's name cannot be read under {}: the controller's lease is per host",
                cfg.proc_root.display()
            ))
        })?;
    let holder = Holder {
        id: format!(
            "{host}:{}:{}",
            std::process::id(),
            crate::evidence::random_hex(4)?
        ),
        scope: host,
    };
    let lease_rows = engine.controller_rows(cfg.times.retry)?;
    let rows = engine.controller_rows(cfg.times.retry)?;
    tracing::info!(holder = %holder.id, dry_run = cfg.dry_run, "controller started");
    let lease = Leadership::start(lease_rows, &holder, cfg.times, cfg.bucket);
    metrics.watch_lease(lease.view());
    let _ = health.lease.set(lease.view());
    let mut run = Run {
        holder,
        lease,
        rows,
        engine,
        metrics,
        health,
        stop,
        sight: sight::Sight::default(),
        brake: brake::Brake::default(),
        interest: None,
        cache: watch::Cache::default(),
        judged: None,
        policies: cfg.policies.clone(),
        follow: follow::Follow::new(
            cfg.policy_source.clone(),
            cfg.policy_digest.clone(),
            cfg.scope == TickScope::Host,
        ),
        rows_used: Instant::now(),
    };
    let code = run_loop(cfg, &mut run);
    run.metrics.leader.set(0);
    run.lease.release();
    tracing::info!("controller stopped");
    Ok(code)
}

/// When the next tick is due.
#[derive(Default)]
struct Schedule {
    last: Option<(Instant, i64)>,
    /// The next heartbeat expiry of a kept row (µs since the epoch).
    expiry_us: Option<i64>,
    /// The change record's mark the changes are read since: taken before
    /// the last tick, or moved past changes that did not concern it.
    mark: Option<String>,
    /// The mark the last check read.
    next_mark: Option<String>,
}

/// Whether a tick is due, and of which kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Not yet.
    No,
    /// The resync interval passed and nothing else: the tick may skip
    /// planning when nothing it rests on moved (`resync.rs`).
    Resync,
    /// A change, an expiry, a new term, a signal that cannot be read: a
    /// full judgement.
    Full,
}

impl Schedule {
    /// Due by time alone: when newly leading (a new term: judged afresh),
    /// when a kept row's heartbeat expires, or when the interval has
    /// passed.
    fn due(&self, term: i64, interval: Duration) -> Due {
        if self.expiry_us.is_some_and(|at| crate::time::now() >= at) {
            return Due::Full;
        }
        match &self.last {
            None => Due::Full,
            Some((_, t)) if *t != term => Due::Full,
            Some((at, _)) if at.elapsed() >= interval => Due::Resync,
            Some(_) => Due::No,
        }
    }
}

/// Whether a tick is due: by time, or because the registry changed in a
/// way that concerns what the last tick read (`watch.rs`). Changes that do
/// not are passed over (the mark moves past them) while no tick is due.
/// Changes that do are patched into the kept scope when they can be
/// exactly (`watch::Cache::absorb`), so the tick reads nothing again.
fn check(run: &mut Run, schedule: &mut Schedule, term: i64, interval: Duration) -> Due {
    let timely = schedule.due(term, interval);
    let found = match run.rows.changes(schedule.mark.as_deref(), watch::LIMIT) {
        // A signal that cannot be read makes a tick due: it will say why
        // it cannot see, and back off.
        Err(e) => {
            tracing::debug!("the change signal cannot be read: {e}");
            schedule.next_mark = None;
            run.cache.forget();
            return Due::Full;
        }
        Ok(None) => {
            schedule.next_mark = None;
            run.cache.forget();
            return timely;
        }
        Ok(Some((mark, changes))) => {
            run.metrics
                .rows_read
                .inc_by(watch::rows_read(&changes) as u64);
            schedule.next_mark = Some(mark);
            let judged = watch::judge(&changes, run.interest.as_ref());
            run.cache.patch(&judged.heartbeats);
            if matches!(judged.found, watch::Found::Here(_)) {
                match &judged.here {
                    Some(rows) => run.cache.absorb(rows),
                    None => run.cache.forget(),
                }
            }
            judged.found
        }
    };
    run.metrics.check(&found);
    match found {
        watch::Found::Here(why) => {
            tracing::debug!("a tick is due: {why}");
            Due::Full
        }
        watch::Found::Quiet | watch::Found::Elsewhere => {
            if timely == Due::No {
                schedule.mark = schedule.next_mark.clone();
            }
            timely
        }
    }
}

/// `rows` opened afresh when it sat unused for longer than the lease's
/// ttl (while this process followed): its server may have frozen or lost
/// a failover meanwhile, and the first use of a connection to a frozen
/// server waits out the reply bound (15 s) before it is given up. A leader
/// uses it every retry period.
fn fresh_rows(cfg: &Config, run: &mut Run) {
    if run.rows_used.elapsed() > cfg.times.ttl {
        match run.engine.controller_rows(cfg.times.retry) {
            // Closing a connection waits for its server: a frozen one is
            // given up on by the store within the reply bound, off the loop.
            Ok(rows) => {
                let old = std::mem::replace(&mut run.rows, rows);
                std::thread::spawn(move || drop(old));
            }
            Err(e) => tracing::debug!("cannot open the registry afresh: {e}"),
        }
    }
    run.rows_used = Instant::now();
}

fn run_loop(cfg: &Config, run: &mut Run) -> ExitCode {
    let started = Instant::now();
    let mut schedule = Schedule::default();
    let mut backoff = backoff::Backoff::default();
    let mut number: i64 = 0;
    while !run.stop.load(Ordering::SeqCst) {
        let term = observe(run);
        resolve_unknown(run, &mut backoff, cfg.times.retry);
        follow_policies(run, &mut schedule, &mut backoff);
        if let (true, Some(why)) = (cfg.once, run.follow.invalid()) {
            tracing::error!(
                "--once: the policy set on disk cannot be used ({why}); nothing was done"
            );
            return ExitCode::Error;
        }
        let Some(term) = term else {
            if cfg.once && started.elapsed() > cfg.times.ttl + 2 * cfg.times.retry {
                return once_without_lease(run);
            }
            sleep_unless(&run.stop, cfg.times.retry.min(Duration::from_millis(200)));
            continue;
        };
        fresh_rows(cfg, run);
        let due = check(run, &mut schedule, term, cfg.interval);
        if due == Due::No || !backoff.ready() || run.follow.invalid().is_some() {
            sleep_unless(&run.stop, cfg.times.retry);
            continue;
        }
        number += 1;
        let span = tracing::info_span!("tick", tick = number, term);
        let resync = due == Due::Resync;
        let ended = span.in_scope(|| timed_tick(cfg, run, term, number, resync));
        schedule.last = Some((Instant::now(), term));
        schedule.mark = schedule.next_mark.take();
        schedule.expiry_us = ended.next_expiry_us;
        let unreadable = matches!(
            ended.outcome.as_str(),
            "registry_unavailable" | "lease_store_unavailable"
        );
        run.health
            .set(|h| h.stores_unreadable = unreadable.then(|| ended.detail.clone()));
        backoff.after(&ended.outcome, ended.apply_id.clone(), &cfg.profiles);
        if cfg.once {
            return ended.exit;
        }
    }
    ExitCode::Ok
}

/// The policy set on disk, when it changed: judged by from the next tick
/// on, afresh (a full tick, nothing kept from the old set's judgement),
/// and a refusal's hold ends. While the set on disk cannot be used, no
/// tick runs and `/readyz` says why.
fn follow_policies(run: &mut Run, schedule: &mut Schedule, backoff: &mut backoff::Backoff) {
    if let Some(policies) = run.follow.poll() {
        run.policies = Arc::new(policies);
        run.judged = None;
        schedule.last = None;
        backoff.policies_changed();
    }
    let why = run.follow.invalid().map(str::to_string);
    run.health.set(|h| h.policy_invalid = why);
}

/// `--once` that never held the lease: refused when another controller
/// holds it (2), an error when it could not be reached (1).
fn once_without_lease(run: &Run) -> ExitCode {
    match run.lease.status().1 {
        Some(why) => {
            tracing::error!(
                "--once: the controller's lease cannot be reached ({why}); nothing was done"
            );
            ExitCode::Error
        }
        None => {
            tracing::error!("--once: another controller leads this host's lease; nothing was done");
            ExitCode::Refused
        }
    }
}

/// The lease and the registry as this poll finds them, into the metrics
/// and the health endpoints; the term this process may act under.
fn observe(run: &Run) -> Option<i64> {
    let term = run.lease.leading();
    let (held, failing) = run.lease.status();
    run.metrics.leader.set(i64::from(term.is_some()));
    if let Some(t) = held.or(term) {
        run.metrics.term.set(t);
    }
    run.health.set(|h| {
        h.last_tick = Some(Instant::now());
        h.registry_unreachable = failing;
        h.lease_overdue = held.is_some() && term.is_none();
    });
    term
}

/// An apply whose outcome is unknown, resolved from the registry's audit
/// rows before anything else is applied.
fn resolve_unknown(run: &Run, backoff: &mut backoff::Backoff, wait: Duration) {
    let Some(id) = backoff.unresolved.clone() else {
        return;
    };
    match run.engine.audit_of(&id, wait) {
        Ok(rows) => {
            tracing::warn!(apply_id = %id, committed = !rows.is_empty(), retired = rows.len(), "an apply whose outcome was unknown is resolved");
            backoff.unresolved = None;
        }
        Err(e) => tracing::warn!(apply_id = %id, "the outcome of an apply is still unknown: {e}"),
    }
}

/// One tick, timed and counted.
fn timed_tick(cfg: &Config, run: &mut Run, term: i64, number: i64, resync: bool) -> tick::Ended {
    let t0 = Instant::now();
    let ended = tick::tick(cfg, run, term, number, resync);
    run.metrics
        .tick_duration
        .observe(t0.elapsed().as_secs_f64());
    run.metrics.tick(&ended.outcome);
    run.metrics.retired.inc_by(ended.retired as u64);
    run.metrics.last_tick_rows_read.set(ended.rows_read as i64);
    let sees = !matches!(
        ended.outcome.as_str(),
        "blind"
            | "registry_unavailable"
            | "lease_store_unavailable"
            | "transaction_failed"
            | "outcome_unknown"
    );
    if !sees {
        run.brake.blinded();
    }
    if sees {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        run.metrics.last_success.set(now);
    }
    if ended.exit == ExitCode::Ok {
        tracing::info!(outcome = %ended.outcome, retired = ended.retired, rows_read = ended.rows_read, "tick: {}", ended.detail);
    } else {
        tracing::warn!(outcome = %ended.outcome, retired = ended.retired, rows_read = ended.rows_read, "tick: {}", ended.detail);
    }
    ended
}
