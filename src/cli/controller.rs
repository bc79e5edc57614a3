//! `fleet-retire controller`: retire stale workers by itself, one leader
//! per (registry, host), fenced, budgeted and observable
//! (docs/controller.md). This file reads and checks the command line;
//! `crate::controller` is the loop.

use crate::capability::Operation;
use crate::cli::{Cli, OperatorArgs, StoreArgs};
use crate::controller::lease::LeaseTimes;
use crate::controller::{http, metrics::Metrics, Config, Health, TickScope};
use crate::error::{About, Error, ExitCode, Result};
use crate::policy::Policies;
use crate::store::controller::Bucket;
use clap::{Args, ValueEnum};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Human,
    /// One JSON object per line, the tick's number and term in each line
    /// of that tick.
    Json,
}

/// What a controller's tick reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ControllerScope {
    /// This host's active rows and the peer rows their verdicts need.
    Host,
    /// The whole registry.
    Registry,
}

/// Arguments of `controller`.
#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Registry, leases, canonical repository.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Operator profile (it must hold gitea.worker_registry.retire, unless
    /// --dry-run).
    #[command(flatten)]
    pub operator: OperatorArgs,
    /// Where to serve /metrics, /livez and /readyz, or `none`.
    #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDR|none")]
    pub listen: String,
    /// The resync period: a tick runs at least this often while leading.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = duration)]
    pub interval: Duration,
    /// At most N retirements per DURATION on this host (a token bucket kept
    /// in the registry, so a restart or a new leader inherits what is left).
    #[arg(long, default_value = "100/10m", value_name = "N/DURATION", value_parser = budget)]
    pub budget: Bucket,
    /// How long the lease lasts after its last renewal.
    #[arg(long, default_value = "15s", value_name = "DURATION", value_parser = duration)]
    pub lease_ttl: Duration,
    /// How long after its last renewal a leader stops acting.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = duration)]
    pub renew_deadline: Duration,
    /// How often the lease is tried and the registry's change signal polled.
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = duration)]
    pub retry_period: Duration,
    /// The brake: retire nothing on a tick that would retire more than
    /// this fraction of the rows active on this host (and at least 10).
    #[arg(long, default_value_t = 0.5, value_name = "FRACTION")]
    pub brake_fraction: f64,
    /// Shadow mode: plan every tick and count what would be retired
    /// (`would_retire`); write nothing but the lease.
    #[arg(long)]
    pub dry_run: bool,
    /// One tick, then exit with apply's exit codes.
    #[arg(long)]
    pub once: bool,
    /// Retire at most this many workers per apply.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_retire: usize,
    /// How long an apply waits for a locked registry, in milliseconds. A
    /// tick that does not get the lock tries again later; kept short by
    /// default so that SIGTERM is honoured within 5 s even while an apply
    /// waits (the wait cannot be interrupted).
    #[arg(long, default_value_t = 3_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub busy_timeout_ms: u64,
    /// What a tick reads and judges: this host's scope (its active rows
    /// and the peer rows their verdicts need, as `plan --scope host`), or
    /// the whole registry.
    #[arg(long, value_enum, default_value_t = ControllerScope::Host)]
    pub scope: ControllerScope,
    /// Log lines as human text or JSON, on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

/// A duration: a number and a unit (`ms`, `s`, `m`, `h`), e.g. `15s`.
pub fn duration(text: &str) -> std::result::Result<Duration, String> {
    let t = text.trim();
    let at = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (n, unit) = t.split_at(at);
    let n: f64 = n.parse().map_err(|_| {
        format!("{text:?} is not a duration: write a number and a unit, e.g. 15s, 500ms, 10m")
    })?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "{text:?}: the unit must be ms, s, m or h (e.g. 15s)"
            ))
        }
    };
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(format!("{text:?} must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A budget `N/DURATION`, e.g. `100/10m`.
pub fn budget(text: &str) -> std::result::Result<Bucket, String> {
    let (n, per) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?} is not a budget: write N/DURATION, e.g. 100/10m"))?;
    let n: u32 = n
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: N must be a whole number of retirements (e.g. 100/10m)"))?;
    let per = duration(per)?;
    Ok(Bucket {
        capacity: f64::from(n),
        per_ms: i64::try_from(per.as_millis()).unwrap_or(i64::MAX),
    })
}

/// The checked configuration of a command line.
fn config(cli: &Cli, args: &ControllerArgs) -> Result<Config> {
    let times = LeaseTimes {
        ttl: args.lease_ttl,
        renew_deadline: args.renew_deadline,
        retry: args.retry_period,
    }
    .checked()
    .map_err(|e| Error::input(About::Option("--lease-ttl"), e))?;
    if !(args.brake_fraction > 0.0 && args.brake_fraction <= 1.0) {
        return Err(Error::input(
            About::Option("--brake-fraction"),
            "--brake-fraction must be above 0 and at most 1 (default 0.5)",
        ));
    }
    // The digest of the texts loaded: a change during the load is seen by
    // the first poll.
    let policy_source = cli.policy_source();
    let policies = Policies::load(&policy_source)?;
    let policy_digest = crate::policy::loaded_digest(&policy_source, &policies);
    let operation = if args.dry_run {
        Operation::Plan
    } else {
        Operation::Apply
    };
    args.operator.require(&policies, operation)?;
    let scope = match args.scope {
        ControllerScope::Host => {
            scope_precondition(&policies)?;
            TickScope::Host
        }
        ControllerScope::Registry => TickScope::Registry,
    };
    let (profiles, profile) = args.operator.given(operation)?;
    let canonical_repository = args.store.canonical_repository.clone().ok_or_else(|| {
        Error::input(
            About::Option("controller"),
            "the expected repository binding is not given: pass --canonical-repository \
             OWNER/REPO (or set FLEET_RETIRE_CANONICAL_REPOSITORY)",
        )
    })?;
    Ok(Config {
        registry: args.store.registry.clone(),
        leases: args.store.leases.clone(),
        profiles: profiles.to_path_buf(),
        profile: profile.to_string(),
        proc_root: args.store.proc_root.clone(),
        canonical_repository,
        policies: Arc::new(policies),
        policy_source,
        policy_digest,
        interval: args.interval,
        bucket: args.budget,
        times,
        dry_run: args.dry_run,
        once: args.once,
        max_retire: args.max_retire,
        busy_timeout: Duration::from_millis(args.busy_timeout_ms),
        brake_fraction: args.brake_fraction,
        scope,
    })
}

/// A tick of this host's scope judges only what the scoped read fetches:
/// a policy set that does not show what that read assumes of it is refused
/// before anything starts (failing closed), saying the way out.
fn scope_precondition(policies: &crate::policy::Policies) -> Result<()> {
    crate::policy::scope_check::scope_assumptions(policies).map_err(|why| {
        Error::input(
            About::Option("--scope"),
            format!(
                "the controller plans this host's scope by default, and the policy set ({}) \
                 does not keep a host's scope exact: {why}. Fix the policy set, or start the \
                 controller with --scope registry (every tick then reads and judges the whole \
                 registry)",
                policies.origin
            ),
        )
    })
}

/// The `--listen` address, or `None` for `none`.
fn listen(given: &str) -> Result<Option<std::net::SocketAddr>> {
    if given == "none" {
        return Ok(None);
    }
    given.parse().map(Some).map_err(|e| {
        Error::input(
            About::Option("--listen"),
            format!("--listen {given:?}: {e}; write HOST:PORT (e.g. 127.0.0.1:9464) or none"),
        )
    })
}

/// Run `controller`.
pub fn run(cli: &Cli, args: &ControllerArgs) -> Result<ExitCode> {
    let listen = listen(&args.listen)?;
    let cfg = config(cli, args)?;
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let stop = Arc::new(AtomicBool::new(false));
    let live_limit = 2 * cfg.interval + Duration::from_secs(20);
    let bound = http::start(
        listen,
        metrics.clone(),
        health.clone(),
        live_limit,
        stop.clone(),
    )?;
    if let Some(addr) = bound {
        tracing::info!(%addr, "serving /metrics, /livez and /readyz");
    }
    crate::controller::run(&cfg, stop, metrics, health)
}
