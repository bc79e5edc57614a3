//! `fleet-retire serve`: the MCP server over stdio, bound at launch.

use crate::cli::Cli;
use crate::error::{About, Error, ExitCode, Result};
use crate::identity::env;
use crate::serve::{run as serve, Binding, Lifecycle};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `serve`. Every one comes from the command line or the
/// environment the launcher set; no tool call can change them.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The worker registry (an existing one: create it with `fleet-retire registry create`).
    #[arg(
        long,
        env = "FLEET_RETIRE_REGISTRY",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub registry: PathBuf,
    /// The control-plane lease store (SQLite).
    #[arg(
        long,
        env = "FLEET_RETIRE_LEASES",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub leases: PathBuf,
    /// profiles.json (read afresh at every call).
    #[arg(long = "profiles", env = env::CONFIG, value_name = "PATH")]
    pub profiles: PathBuf,
    /// The profile this server acts as.
    #[arg(long, env = env::PROFILE, value_name = "NAME")]
    pub profile: String,
    /// The canonical repository, fixed for the server's life: a tool call
    /// may restate it, and one naming another is refused.
    #[arg(long, env = "FLEET_RETIRE_CANONICAL_REPOSITORY", value_name = "REPO",
          value_parser = crate::text::nonblank_repository)]
    pub canonical_repository: Option<String>,
    /// This server's namespace (author, reviewer, merger, controller, reconciler).
    #[arg(long, env = env::NAMESPACE, value_name = "NS")]
    pub namespace: String,
    /// The heartbeat TTL this server registers with, in seconds.
    #[arg(
        long,
        env = "FLEET_RETIRE_HEARTBEAT_TTL",
        default_value_t = 60.0,
        value_name = "SECONDS"
    )]
    pub heartbeat_ttl: f64,
    /// How often it heartbeats, in seconds (default: a quarter of the TTL).
    #[arg(long, env = "FLEET_RETIRE_HEARTBEAT_INTERVAL", value_name = "SECONDS")]
    pub heartbeat_interval: Option<f64>,
    /// Apply retires nothing above this many targets.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_retire: usize,
    /// How long apply waits for a locked registry, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub busy_timeout_ms: u64,
    /// Where the rows of the plans this server issues are kept for the
    /// servers after it, so a client that starts a server per call can
    /// apply a plan another server issued (default:
    /// $XDG_STATE_HOME/fleet-retire/plans or ~/.local/state/fleet-retire/plans).
    #[arg(long, env = "FLEET_RETIRE_PLAN_DIR", value_name = "DIR")]
    pub plan_dir: Option<PathBuf>,
    /// The most the kept plans take in all, in MiB (a 100,000-row plan
    /// takes about 24 MB); the oldest go first, and the plan just written
    /// is kept even when alone larger.
    #[arg(long, env = "FLEET_RETIRE_PLAN_DIR_MAX_MIB", default_value_t = 256, value_name = "MIB",
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub plan_dir_max_mib: u64,
    /// Root of the proc filesystem.
    #[arg(long, default_value = "/proc", value_name = "DIR", hide = true)]
    pub proc_root: PathBuf,
}

/// The folder of kept plans: the one named (an error when it cannot be
/// used), else the default (a warning when it cannot, and plans are kept in
/// memory only); none without a canonical repository, since plan and apply
/// then refuse to run.
fn plan_dir(
    args: &ServeArgs,
    policies: &crate::policy::Policies,
) -> Result<Option<crate::serve::plan_dir::PlanDir>> {
    use crate::serve::plan_dir::{default_path, registry_identity, MadeBy, PlanDir};
    let Some(canonical) = &args.canonical_repository else {
        return Ok(None);
    };
    // What every plan this server makes is made by, and all a kept plan
    // vouches for (finding 50.7).
    let made_by = MadeBy {
        policy_fingerprint: policies.fingerprint.clone(),
        registry: registry_identity(&args.registry),
        canonical_repository: canonical.clone(),
        profile: args.profile.clone(),
    };
    let dir = match &args.plan_dir {
        Some(path) => PlanDir::open(path, made_by)
            .map_err(|why| Error::input(About::Option("serve"), format!("--plan-dir: {why}")))?,
        None => {
            let opened = default_path()
                .ok_or_else(|| "neither XDG_STATE_HOME nor HOME is set".to_string())
                .and_then(|path| PlanDir::open(&path, made_by));
            match opened {
                Ok(dir) => dir,
                Err(why) => {
                    tracing::warn!(
                        "plans are kept in memory only, so a client that starts a server per \
                         call cannot apply them: {why}"
                    );
                    return Ok(None);
                }
            }
        }
    };
    let dir = dir.with_max_bytes(args.plan_dir_max_mib << 20);
    // Said at start at the default log level: the folder grows with the
    // registry, and its user should know where and how far.
    tracing::info!(target: "fleet_retire::start", "{}", dir.describe());
    Ok(Some(dir))
}

/// Run `serve`.
pub fn run(cli: &Cli, args: &ServeArgs) -> Result<ExitCode> {
    if !(args.heartbeat_ttl.is_finite() && args.heartbeat_ttl >= 1.0) {
        return Err(Error::input(
            About::Option("serve"),
            format!(
                "--heartbeat-ttl {} must be a number of seconds, at least 1",
                args.heartbeat_ttl
            ),
        ));
    }
    let interval = args.heartbeat_interval.unwrap_or(args.heartbeat_ttl / 4.0);
    if !(interval.is_finite() && interval >= 0.1 && interval <= args.heartbeat_ttl / 2.0) {
        return Err(Error::input(
            About::Option("serve"),
            format!(
                "--heartbeat-interval {interval} must be between 0.1 s and half the TTL ({} s), \
             so one late heartbeat never lets the row lapse",
                args.heartbeat_ttl / 2.0
            ),
        ));
    }
    if !crate::launcher::NAMESPACES.contains(&args.namespace.as_str()) {
        return Err(Error::input(
            About::Option("serve"),
            format!(
                "--namespace {:?} is not one of {}",
                args.namespace,
                crate::launcher::NAMESPACES.join(", ")
            ),
        ));
    }
    let policies = cli.load_policies()?;
    let plan_dir = plan_dir(args, &policies)?;
    let binding = Binding {
        registry: args.registry.clone(),
        leases: args.leases.clone(),
        profiles: args.profiles.clone(),
        profile: args.profile.clone(),
        policies,
        canonical_repository: args.canonical_repository.clone(),
        proc_root: args.proc_root.clone(),
        busy_timeout: Duration::from_millis(args.busy_timeout_ms),
        max_retire: args.max_retire,
        plan_dir,
    };
    serve(
        binding,
        Lifecycle {
            namespace: args.namespace.clone(),
            ttl_seconds: args.heartbeat_ttl,
            interval: Duration::from_secs_f64(interval),
        },
    )
}
