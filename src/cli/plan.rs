//! `fleet-retire plan`: the dry run.

use crate::cli::next::NextCommand;
use crate::cli::{Cli, Format, OperatorArgs, StoreArgs};
use crate::error::{About, Error, ExitCode, Result};
use crate::plan::Plan;
use crate::policy::Policies;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Registry, leases, canonical repository.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Operator profile.
    #[command(flatten)]
    pub operator: OperatorArgs,
    /// Also write the plan (JSON) to this file, for `fleet-retire apply`.
    #[arg(long, value_name = "PLAN.json")]
    pub out: Option<PathBuf>,
    /// Human format: list every preserved row too (by default only their
    /// counts per reason are shown, with the candidates).
    #[arg(long, conflicts_with = "limit")]
    pub all: bool,
    /// Human format: list the first N candidates (default 20) and the
    /// first N preserved rows (default none).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// `host`: read and judge only this host's active rows and the peer
    /// rows their verdicts depend on, through the registry's indexes; its
    /// tokens vouch for that scope alone (`host-scope:`). Without it, the
    /// whole registry (docs/multi-host.md, "One host's scope").
    #[arg(long, value_enum, value_name = "SCOPE")]
    pub scope: Option<PlanScope>,
}

/// What a plan reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanScope {
    /// This host's rows and their peers.
    Host,
}

/// Gather evidence from the world and plan (for `plan` and `explain`).
pub fn plan_from_world(store: &StoreArgs, policies: &Policies) -> Result<Plan> {
    crate::plan::plan_from_files(
        &store.registry,
        &store.leases,
        &store.proc_root,
        canonical_of(store)?,
        policies,
    )
}

/// The expected repository binding, which a plan requires.
fn canonical_of(store: &StoreArgs) -> Result<String> {
    store.canonical_repository.clone().ok_or_else(|| {
        Error::input(
            About::Option("plan"),
            "the expected repository binding is not given: pass --canonical-repository \
             OWNER/REPO (or set FLEET_RETIRE_CANONICAL_REPOSITORY)",
        )
    })
}

/// Run `plan`.
pub fn run(cli: &Cli, args: &PlanArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let profiles = args
        .operator
        .require(&policies, crate::capability::Operation::Plan)?;
    let spinner = crate::cli::progress::Spinner::start(
        "planning: reading the registry and leases, judging every row",
    );
    let planning = std::time::Instant::now();
    let plan = match args.scope {
        None => plan_from_world(&args.store, &policies)?,
        Some(PlanScope::Host) => crate::plan::scoped::plan_scope_from_files(
            &args.store.registry,
            &args.store.leases,
            &args.store.proc_root,
            canonical_of(&args.store)?,
            &policies,
        )?,
    };
    let planned_in = planning.elapsed();
    spinner.step(&format!(
        "planning: writing the plan of {} rows",
        plan.rows.len()
    ));
    if let Some(out) = &args.out {
        // The path is replaced, never followed: a link at it, or a FIFO,
        // is not written through (crate::outfile).
        let write = |path: &std::path::Path| -> std::io::Result<()> {
            crate::outfile::replace_with(path, |w| plan.write_saved(w))
        };
        let writing = std::time::Instant::now();
        write(out).map_err(Error::io(out, "cannot write the plan"))?;
        tracing::debug!(elapsed = ?writing.elapsed(), plan = ?planned_in, "saved plan written");
        spinner.0.suspend(|| {
            eprintln!(
                "{}",
                saved_note(out, &plan, cli, args, &profiles, &policies)
            )
        });
    }
    let started = std::time::Instant::now();
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    let written = match cli.format {
        Format::Json => plan.write_json(&mut w),
        Format::Human | Format::Junit | Format::Lcov | Format::Sarif | Format::MutationReport => w
            .write_all(
                crate::report::plan_table(
                    &plan,
                    &policies.source_label(),
                    if args.all {
                        None
                    } else {
                        Some(args.limit.unwrap_or(0))
                    },
                    if args.all {
                        None
                    } else {
                        Some(args.limit.unwrap_or(crate::report::LIST_DEFAULT))
                    },
                )
                .as_bytes(),
            ),
    };
    written.and_then(|_| w.flush()).map_err(Error::Output)?;
    drop(spinner);
    tracing::debug!(elapsed = ?started.elapsed(), "plan written");
    // The process ends next: returning a large registry's rows to the
    // allocator one by one would only add time.
    std::mem::forget(plan);
    Ok(ExitCode::Ok)
}

/// What `plan --out` wrote and the command that applies it, for the
/// operator (on stderr: stdout is the plan itself). No command when there
/// is nothing to apply; every batch at once (`--all-batches`) when there
/// are more candidates than one apply retires by default.
fn saved_note(
    out: &std::path::Path,
    plan: &Plan,
    cli: &Cli,
    args: &PlanArgs,
    profiles: &crate::capability::Profiles,
    policies: &Policies,
) -> String {
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    let size = if size >= 1_000_000 {
        format!("{:.1} MB", size as f64 / 1_000_000.0)
    } else {
        format!("{:.1} kB", size as f64 / 1_000.0)
    };
    let candidates = plan.candidates().count();
    let wrote = format!(
        "wrote the plan to {} ({size}, {} candidate(s))",
        crate::text::esc(&out.display().to_string()),
        crate::text::count(candidates)
    );
    if candidates == 0 {
        return format!("{wrote}: nothing to apply");
    }
    let (command, who) = apply_command(out, cli, args, profiles, policies, candidates);
    format!("{wrote}; apply it{who} with:\n  {command}")
}

/// The command that applies the plan saved at `out`, and who may run it
/// when that is not this command's profile.
fn apply_command(
    out: &std::path::Path,
    cli: &Cli,
    args: &PlanArgs,
    profiles: &crate::capability::Profiles,
    policies: &Policies,
    candidates: usize,
) -> (NextCommand, String) {
    let mut command = crate::cli::apply_args::apply_head(out, &args.store, &args.operator);
    let profile = args.operator.profile.as_deref().unwrap_or_default();
    let may_apply = crate::capability::check(
        policies,
        profiles,
        profile,
        crate::capability::Operation::Apply,
    )
    .is_ok_and(|d| d.allowed);
    let who = if may_apply {
        command.flag("--profile", Some("GITEA_MCP_PROFILE"), profile, profile);
        String::new()
    } else {
        // This profile may plan but not apply: the operator names one that
        // may (a placeholder, since no flag could be right here).
        command.word("--profile").word("NAME");
        format!(
            " (NAME: a profile holding gitea.worker_registry.retire; {} may not apply)",
            crate::text::esc(profile)
        )
    };
    let dir = cli.policies.as_ref().map(|p| p.to_string_lossy());
    command.flag_opt("--policies", Some("FLEET_RETIRE_POLICIES"), dir.as_deref());
    if candidates > 100 {
        // The default blast radius: every batch, one transaction each.
        command.word("--all-batches");
    }
    (command, who)
}
