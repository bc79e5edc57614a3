//! `fleet-retire explain --worker ID`: why one worker is kept or would be retired.

use crate::cli::{Cli, Format, OperatorArgs, StoreArgs};
use crate::error::{About, Error, ExitCode, Result};
use crate::explain::{explain_entry, render};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The worker identity to explain.
    #[arg(long)]
    pub worker: String,
    /// Explain a row of a fixture instead of the live registry (the
    /// registry and lease store, and their environment variables, are then
    /// not read: an operator's FLEET_RETIRE_REGISTRY does not stand in the
    /// way of the command `fleet-retire test` prints for a failing case).
    #[arg(long, value_name = "FIXTURE.json")]
    pub fixture: Option<PathBuf>,
    /// The worker registry (SQLite).
    #[arg(
        long,
        env = "FLEET_RETIRE_REGISTRY",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub registry: Option<PathBuf>,
    /// The lease store (SQLite).
    #[arg(
        long,
        env = "FLEET_RETIRE_LEASES",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub leases: Option<PathBuf>,
    /// The expected repository binding.
    #[arg(long, env = "FLEET_RETIRE_CANONICAL_REPOSITORY", value_name = "REPO",
          value_parser = crate::text::nonblank_repository)]
    pub canonical_repository: Option<String>,
    /// Root of the proc filesystem.
    #[arg(long, default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
    /// Operator profile (not needed with --fixture).
    #[command(flatten)]
    pub operator: OperatorArgs,
}

/// Run `explain`.
pub fn run(cli: &Cli, args: &ExplainArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let plan = match &args.fixture {
        Some(path) => match crate::fixture::load(path)? {
            crate::fixture::Case::Plan(c) => c.plan(&policies)?,
            crate::fixture::Case::Capability(_)
            | crate::fixture::Case::Snapshot(_)
            | crate::fixture::Case::Entity(_) => {
                return Err(Error::input(
                    About::Option("explain"),
                    format!(
                        "{}: explain reads plan fixtures (rows and expect); this one is not",
                        path.display()
                    ),
                ))
            }
        },
        None => {
            args.operator
                .require(&policies, crate::capability::Operation::Plan)?;
            let store = StoreArgs {
                registry: args.registry.clone().ok_or_else(|| {
                    Error::input(
                        About::Option("explain"),
                        "explain needs --registry (or --fixture)",
                    )
                })?,
                leases: args.leases.clone().ok_or_else(|| {
                    Error::input(
                        About::Option("explain"),
                        "explain needs --leases (or --fixture)",
                    )
                })?,
                canonical_repository: args.canonical_repository.clone(),
                proc_root: args.proc_root.clone(),
            };
            crate::cli::plan::plan_from_world(&store, &policies)?
        }
    };
    let found: Vec<_> = plan
        .entries
        .iter()
        .filter(|e| plan.identity(e) == args.worker)
        .collect();
    if found.is_empty() {
        return Err(Error::input(
            About::Worker(args.worker.clone()),
            format!("no registry row has worker_identity {:?}", args.worker),
        ));
    }
    let explained: Vec<_> = found
        .iter()
        .map(|e| explain_entry(&plan, e, &policies))
        .collect();
    match cli.format {
        Format::Json => crate::outln!(
            "{}",
            serde_json::to_string_pretty(&explained).expect("explain serialises")
        )?,
        Format::Human | Format::Junit | Format::Lcov | Format::Sarif | Format::MutationReport => {
            for e in &explained {
                crate::out!("{}", render(e))?;
            }
        }
    }
    Ok(ExitCode::Ok)
}
