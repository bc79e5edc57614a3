//! What `apply` takes and what it tells the operator to run next, apart
//! from `apply` itself, so that the batch runner (`cli::batches`), which
//! `apply` calls, shares them without an import circle.

use crate::apply::Outcome;
use crate::cli::next::NextCommand;
use crate::cli::{Cli, OperatorArgs, StoreArgs};
use clap::Args;
use std::path::{Path, PathBuf};

/// Arguments of `apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A plan saved with `fleet-retire plan --out PLAN.json`.
    #[arg(value_name = "PLAN.json", conflicts_with_all = ["registry_fingerprint", "candidate_fingerprint", "policy_fingerprint"])]
    pub plan: Option<PathBuf>,
    /// The plan's registry_fingerprint.
    #[arg(long, requires_all = ["candidate_fingerprint", "policy_fingerprint", "workers"])]
    pub registry_fingerprint: Option<String>,
    /// The plan's candidate_fingerprint.
    #[arg(long)]
    pub candidate_fingerprint: Option<String>,
    /// The plan's policy_fingerprint.
    #[arg(long)]
    pub policy_fingerprint: Option<String>,
    /// Workers to retire: comma-separated, or a JSON list; `@FILE` reads
    /// either from FILE (one per line also works), for lists longer than a
    /// command line holds. With a saved plan: a subset of its candidates
    /// (refused if any is not one), for retiring a large plan in batches.
    #[arg(long)]
    pub workers: Option<String>,
    /// With a saved plan: retire only the first N of its candidates not
    /// retired yet, in the plan's order: one batch under --max-retire. Run
    /// the same command again for the next batch (one saved plan serves
    /// every batch), or use --all-batches.
    #[arg(long, value_name = "N", requires = "plan", conflicts_with = "workers",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub first: Option<u64>,
    /// With a saved plan: retire all its candidates, batch after batch
    /// (each of --first N, else --max-retire, in a transaction of its
    /// own), one line per batch; stops at the first refusal. Ctrl-C stops
    /// it between batches (a batch under way is committed whole or rolled
    /// back whole) and prints the command that continues.
    #[arg(long, requires = "plan", conflicts_with = "workers")]
    pub all_batches: bool,
    /// Retire nothing if more than this many workers would be retired.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_retire: usize,
    /// How long to wait for a locked registry, in milliseconds (at most an hour).
    #[arg(long, default_value_t = 10_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub busy_timeout_ms: u64,
    /// Registry, leases, canonical repository.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Operator profile.
    #[command(flatten)]
    pub operator: OperatorArgs,
    /// How much of each list the human report shows.
    #[command(flatten)]
    pub list: crate::cli::ListArgs,
}

/// Of a saved plan's `candidates`, how many this apply leaves to retire,
/// when its outcome says (`None` after a refusal).
pub fn left_after(report: &crate::apply::Report, candidates: usize) -> Option<usize> {
    match report.outcome {
        Outcome::Applied => {
            Some(candidates.saturating_sub(report.retired_since_plan.len() + report.retired_count))
        }
        Outcome::AlreadyRetired
            if report.requested.len() == candidates || report.first.is_some() =>
        {
            Some(0)
        }
        _ => None,
    }
}

/// `fleet-retire apply PLAN` with the stores and `--profiles` that the
/// environment does not give already: the start of every apply command we
/// print (`plan --out`'s and the next batch's).
pub fn apply_head(plan: &Path, store: &StoreArgs, operator: &OperatorArgs) -> NextCommand {
    let mut c = NextCommand::new(&["apply"]);
    c.path(plan)
        .store("--registry", "FLEET_RETIRE_REGISTRY", &store.registry)
        .store("--leases", "FLEET_RETIRE_LEASES", &store.leases);
    let profiles = operator.profiles_path.as_ref().map(|p| p.to_string_lossy());
    c.flag_opt("--profiles", Some("GITEA_MCP_CONFIG"), profiles.as_deref());
    c
}

/// `fleet-retire apply PLAN` with the flags of this invocation that the
/// environment does not give already, then `tail`.
pub fn next_apply(cli: &Cli, args: &ApplyArgs, plan: &Path, tail: &[&str]) -> NextCommand {
    let mut c = apply_head(plan, &args.store, &args.operator);
    c.flag_opt(
        "--profile",
        Some("GITEA_MCP_PROFILE"),
        args.operator.profile.as_deref(),
    )
    .flag_opt(
        "--canonical-repository",
        Some("FLEET_RETIRE_CANONICAL_REPOSITORY"),
        args.store.canonical_repository.as_deref(),
    );
    let policies = cli.policies.as_ref().map(|p| p.to_string_lossy());
    c.flag_opt(
        "--policies",
        Some("FLEET_RETIRE_POLICIES"),
        policies.as_deref(),
    );
    if args.max_retire != 100 {
        c.word("--max-retire").word(&args.max_retire.to_string());
    }
    if args.busy_timeout_ms != 10_000 {
        c.word("--busy-timeout-ms")
            .word(&args.busy_timeout_ms.to_string());
    }
    for w in tail {
        c.word(w);
    }
    c
}
