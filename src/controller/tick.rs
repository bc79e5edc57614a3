//! One tick: look, plan, and apply the candidates the budget and the brake
//! allow, through the same guarded apply as `fleet-retire apply` (the
//! plan's rows given to it, as a saved plan would be). A tick that cannot
//! see everything (`sight.rs`) retires nothing.

use super::resync::{Judged, Recording};
use super::watch::Interest;
use super::{Config, Run, TickScope};
use crate::apply::{apply, Context, Hooks, Outcome, Request, Tokens};
use crate::error::ExitCode;
use crate::evidence::probe::SystemProbe;
use crate::observe::RunFacts;
use crate::plan::planned::PlannedRows;
use crate::plan::Plan;
use crate::store::controller::Stamp;
use std::sync::Arc;

/// How a tick ended.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The `outcome` label: an apply's outcome code, or `idle` (nothing to
    /// retire), `unchanged` (a resync that found nothing the last
    /// judgement rested on moved: not planned), `dry_run`, `blind` (could
    /// not see), `braked`,
    /// `budget_exhausted`, `stopped` (no longer leading or stopping).
    pub outcome: String,
    /// The exit code `--once` ends with.
    pub exit: ExitCode,
    /// What happened, for the log.
    pub detail: String,
    /// Workers retired.
    pub retired: usize,
    /// The apply's id, for an outcome that must be resolved.
    pub apply_id: Option<String>,
    /// When the first heartbeat the plan kept a row for expires
    /// (microseconds since the Unix epoch): the next tick is due then.
    pub next_expiry_us: Option<i64>,
    /// Registry rows this tick read: its plan's, and its apply's under
    /// the lock.
    pub rows_read: usize,
}

impl Ended {
    /// This (blind) ending, saying how the apply it replaces ended.
    fn besides(mut self, apply: &Ended) -> Ended {
        self.detail = format!(
            "{} (the apply ended {}: {})",
            self.detail, apply.outcome, apply.detail
        );
        self
    }

    fn new(outcome: &str, exit: ExitCode, detail: String) -> Ended {
        Ended {
            outcome: outcome.into(),
            exit,
            detail,
            retired: 0,
            apply_id: None,
            next_expiry_us: None,
            rows_read: 0,
        }
    }
}

/// Run one tick under `term`; `resync`: due by the interval alone, so it
/// may skip planning when nothing the last full judgement rested on moved
/// (`resync.rs`).
pub fn tick(cfg: &Config, run: &mut Run, term: i64, number: i64, resync: bool) -> Ended {
    if let Some(why) = run.sight.blind(&cfg.proc_root) {
        run.cache.forget();
        run.judged = None;
        return Ended::new(
            "blind",
            ExitCode::Error,
            format!("cannot see: {why}; retiring nothing"),
        );
    }
    if let Some(blind) = same_server(run) {
        return blind;
    }
    if resync {
        if let Some(ended) = unchanged(cfg, run, term) {
            return ended;
        }
    }
    run.judged = None;
    // Until this tick has read, any change makes the next one due.
    run.interest = None;
    let (plan, interest, read, judged) = match plan_tick(cfg, run, term) {
        Ok(p) => p,
        Err(e) => {
            let code = e.envelope()["error"]["reason_code"]
                .as_str()
                .unwrap_or("registry_unavailable")
                .to_string();
            return Ended::new(
                &code,
                e.exit_code(),
                format!("cannot see: {e}; retiring nothing"),
            );
        }
    };
    run.interest = interest;
    run.metrics.rows_read.inc_by(read.now as u64);
    // A failover while the plan read (it reads wherever the URL leads now).
    if let Some(blind) = same_server(run) {
        return blind;
    }
    // A clock that jumped while the plan read: its ages mix two clocks.
    if let Some(blind) = clock_moved(run) {
        return blind;
    }
    let mut ended = act(cfg, run, term, number, &plan);
    ended.next_expiry_us = next_expiry(&plan);
    ended.rows_read += read.now + read.by_checks;
    if ended.outcome == "idle" {
        run.judged = judged.map(|mut j| {
            j.next_expiry_us = ended.next_expiry_us;
            j
        });
    }
    if matches!(
        ended.outcome.as_str(),
        "registry_revision_moved" | "candidate_set_moved"
    ) {
        // The scope moved under the plan: read it afresh next time.
        run.cache.forget();
    }
    ended
}

/// A resync that skips planning, when the last full judgement found no
/// candidate and nothing it rested on moved since (`resync.rs`): the scope
/// kept (no change of it announced, younger than its limit), the same
/// term, the same processes, leases and host facts. It retires nothing.
fn unchanged(cfg: &Config, run: &mut Run, term: i64) -> Option<Ended> {
    let max_age = cfg.interval * super::watch::Cache::MAX_AGE_INTERVALS;
    let judged = run.judged.as_ref()?;
    if !run.cache.holds(max_age) {
        return None;
    }
    let probe = SystemProbe::new(&cfg.proc_root);
    match judged.unchanged(term, max_age, &cfg.proc_root, &cfg.leases, &probe) {
        Ok(()) => {
            let mut e = Ended::new(
                "unchanged",
                ExitCode::Ok,
                "nothing the last judgement rested on moved: not planned again".into(),
            );
            e.next_expiry_us = judged.next_expiry_us;
            Some(e)
        }
        Err(why) => {
            tracing::debug!("a full judgement: {why}");
            None
        }
    }
}

/// The rows a tick's plan took: read now, or read by the checks since the
/// last tick and patched into the kept scope.
struct Read {
    now: usize,
    by_checks: usize,
}

/// This host's scope (its active rows and their peers, `plan --scope
/// host`) or the whole registry, planned; what a scoped plan read, for the
/// checks until the next tick; the rows read; what the judgement rested on
/// besides the rows (a scoped plan's). The scope the last tick read is
/// planned again without a read while the checks found nothing of it
/// changed, or only changes they could patch in (`watch::Cache`): that
/// changes when a tick happens, never what it retires, since the apply
/// reads and judges the scope again under its lock.
fn plan_tick(
    cfg: &Config,
    run: &mut Run,
    term: i64,
) -> crate::error::Result<(Plan, Option<Interest>, Read, Option<Judged>)> {
    if cfg.scope == TickScope::Registry {
        let plan = crate::plan::plan_from_files(
            &cfg.registry,
            &cfg.leases,
            &cfg.proc_root,
            cfg.canonical_repository.clone(),
            &run.policies,
        )?;
        let now = plan.rows.len();
        return Ok((plan, None, Read { now, by_checks: 0 }, None));
    }
    // `plan --scope host`'s steps (plan::scoped), keeping the peers'
    // identities, which the plan drops.
    let host = crate::plan::scoped::this_host(&RunFacts::of_this_host(&cfg.proc_root, None, &[]))?;
    let max_age = cfg.interval * super::watch::Cache::MAX_AGE_INTERVALS;
    let (scope, read) = match run.cache.fresh(max_age) {
        Some((scope, _)) if scope.host_id == host => {
            let by_checks = run.cache.take_absorbed();
            (scope, Read { now: 0, by_checks })
        }
        _ => {
            run.cache.forget();
            let scope = crate::evidence::registry::load_scope(&cfg.registry, &host)?;
            run.cache.keep(scope.clone(), std::time::Instant::now());
            let now = scope.own.len() + scope.peers.len();
            (scope, Read { now, by_checks: 0 })
        }
    };
    let peers = scope.peers.clone();
    let lease_rows = crate::evidence::leases::load(&cfg.leases)?;
    let facts = RunFacts::of_this_host(
        &cfg.proc_root,
        Some(cfg.canonical_repository.clone()),
        &lease_rows,
    );
    let host_facts = facts.host.clone();
    let system = SystemProbe::new(&cfg.proc_root);
    let probe = Recording::new(&system);
    let plan = crate::plan::scoped::plan_scope(scope, facts, &probe, &run.policies)?;
    let interest = Interest::of(&plan, &host, &peers);
    let judged = Judged {
        at: std::time::Instant::now(),
        term,
        seen: probe.into_seen(),
        leases: lease_rows,
        host: host_facts,
        next_expiry_us: None,
    };
    Ok((plan, Some(interest), read, Some(judged)))
}

/// How the tick ends when the registry's server is not the one the last
/// look found (a failover, a restart) or cannot be asked.
fn same_server(run: &mut Run) -> Option<Ended> {
    let server = match run.rows.server() {
        Ok(server) => server,
        Err(e) => {
            run.cache.forget();
            run.judged = None;
            let why = format!("cannot see: {e}; retiring nothing");
            return Some(Ended::new("registry_unavailable", e.exit_code(), why));
        }
    };
    let why = run.sight.server_changed(server)?;
    // The scope kept from before is of another server: read it afresh.
    run.cache.forget();
    run.judged = None;
    let why = format!("cannot see: {why}; retiring nothing");
    Some(Ended::new("blind", ExitCode::Error, why))
}

/// How the tick ends when the wall clock jumped against the monotonic
/// clock since it looked (`Sight::moved`): blind, and the next tick judges
/// afresh from the clocks as they are now.
fn clock_moved(run: &mut Run) -> Option<Ended> {
    let why = run.sight.moved()?;
    run.sight.look_again();
    run.cache.forget();
    run.judged = None;
    let why = format!("cannot see: {why}; retiring nothing");
    Some(Ended::new("blind", ExitCode::Error, why))
}

/// What a tick that sees does with its plan.
fn act(cfg: &Config, run: &mut Run, term: i64, number: i64, plan: &Plan) -> Ended {
    let candidates: Vec<String> = plan.candidates().map(|e| plan.identity(e)).collect();
    run.metrics.candidates.set(candidates.len() as i64);
    let allowed = run.brake.allow(plan, &candidates, cfg.brake_fraction);
    run.metrics.brake.set(i64::from(run.brake.engaged()));
    if allowed.is_empty() {
        let (outcome, why) = if candidates.is_empty() {
            ("idle", "no candidate".to_string())
        } else {
            ("braked", run.brake.why())
        };
        return Ended::new(outcome, ExitCode::Ok, why);
    }
    let tokens = match run.rows.budget(&run.holder.scope, cfg.bucket) {
        Ok(t) => t,
        Err(e) => return Ended::new("registry_unavailable", ExitCode::Error, e.to_string()),
    };
    run.metrics.budget_remaining.set(tokens);
    let n = allowed
        .len()
        .min(cfg.max_retire)
        .min(tokens.floor() as usize);
    if n == 0 {
        return Ended::new(
            "budget_exhausted",
            ExitCode::Ok,
            format!(
                "{} candidate(s), but the host's budget is spent",
                allowed.len()
            ),
        );
    }
    if cfg.dry_run {
        run.metrics.would_retire.inc_by(n as u64);
        let e = Ended::new(
            "dry_run",
            ExitCode::Ok,
            format!("would retire {n}: {:?}", &allowed[..n]),
        );
        return e;
    }
    let stamp = Stamp {
        scope: run.holder.scope.clone(),
        holder: run.holder.id.clone(),
        term,
        tick: number,
        bucket: cfg.bucket,
        lease_ttl_ms: i64::try_from(cfg.times.ttl.as_millis()).unwrap_or(i64::MAX),
    };
    apply_allowed(cfg, run, plan, allowed, n, stamp)
}

/// The earliest expiry of a heartbeat the plan kept a row for
/// (`heartbeat_not_expired`, among its reasons: a live process is kept for
/// that too until it dies), in microseconds since the Unix epoch: a row
/// may become a candidate then, and no write announces it.
fn next_expiry(plan: &Plan) -> Option<i64> {
    plan.entries
        .iter()
        .filter(|e| {
            e.reason_codes()
                .contains(&crate::reasons::Reason::HeartbeatFresh)
        })
        .filter_map(|e| {
            let l = &plan.observation(e).liveness;
            let ttl_us = (l.heartbeat_ttl_seconds * 1e6).clamp(0.0, 1e15) as i64;
            Some((l.assessed_at - l.heartbeat_age_us?).saturating_add(ttl_us))
        })
        .min()
}

/// Apply the first `n` of `allowed` through the guarded apply.
fn apply_allowed(
    cfg: &Config,
    run: &mut Run,
    plan: &Plan,
    allowed: Vec<String>,
    n: usize,
    stamp: Stamp,
) -> Ended {
    let tokens = Tokens {
        registry_fingerprint: plan.registry_fingerprint.clone(),
        candidate_fingerprint: plan.candidate_fingerprint.clone(),
        policy_fingerprint: plan.policy_fingerprint.clone(),
    };
    let term = stamp.term;
    let req =
        match Request::new(tokens, allowed).with_planned(Some(Arc::new(PlannedRows::of(plan)))) {
            Ok(mut r) => {
                r.canonical_repository = Some(cfg.canonical_repository.clone());
                r.max_retire = cfg.max_retire;
                r.first = Some(n);
                r.skip_fleet_summary = true;
                r.controller = Some(stamp);
                // A scoped plan is applied as `apply PLAN.json` applies
                // one: its scope read and judged again under the lock.
                r.scope = plan.scope.as_ref().map(|s| s.host_id.clone());
                r
            }
            Err(why) => return Ended::new("transaction_failed", ExitCode::Error, why),
        };
    let probe = SystemProbe::new(&cfg.proc_root);
    let ctx = Context {
        registry: &cfg.registry,
        leases: &cfg.leases,
        profiles: &cfg.profiles,
        profile: &cfg.profile,
        proc_root: &cfg.proc_root,
        policies: &run.policies,
        probe: &probe,
        busy_timeout: cfg.busy_timeout,
    };
    tracing::info!(targets = n, "applying");
    let lease = &run.lease;
    let stop = &run.stop;
    let sight = &run.sight;
    // A clock jump under way cancels the apply too: it judges on the wall
    // clock, and asks this before COMMIT, after its last judgement.
    let cancelled = || {
        stop.load(std::sync::atomic::Ordering::SeqCst)
            || lease.leading() != Some(term)
            || sight.moved().is_some()
    };
    let hooks = Hooks {
        cancelled: Some(&cancelled),
        ..Hooks::default()
    };
    match apply(&req, &ctx, hooks) {
        Ok(report) => {
            let under_lock = report.read_under_lock.as_ref().map_or(0, |r| r.rows);
            run.metrics.rows_read.inc_by(under_lock as u64);
            let mut e = Ended::new(
                report.outcome.code(),
                report.outcome.exit_code(),
                report.detail.clone(),
            );
            e.rows_read = under_lock;
            e.retired = report.retired_count;
            if report.outcome == Outcome::OutcomeUnknown {
                e.apply_id = report.apply_id.clone();
                return e;
            }
            // A refusal that waits for the operator keeps its outcome (and
            // so its hold) whatever the clock did.
            let operators = matches!(
                e.outcome.as_str(),
                "permission_denied" | "policy_set_not_pinned" | "policy_set_moved"
            );
            if e.retired == 0 && !operators {
                return clock_moved(run).map_or(e.clone(), |blind| blind.besides(&e));
            }
            e
        }
        Err(err) => {
            let failed = Ended::new("transaction_failed", err.exit_code(), err.to_string());
            clock_moved(run).map_or(failed.clone(), |blind| blind.besides(&failed))
        }
    }
}
