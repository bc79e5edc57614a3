//! `fleet-retire plan`: the dry run.

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
}

/// Gather evidence from the world and plan (for `plan` and `explain`).
pub fn plan_from_world(store: &StoreArgs, policies: &Policies) -> Result<Plan> {
    let canonical = store.canonical_repository.clone().ok_or_else(|| {
        Error::input(
            About::Option("plan"),
            "the expected repository binding is not given: pass --canonical-repository \
             OWNER/REPO (or set FLEET_RETIRE_CANONICAL_REPOSITORY)",
        )
    })?;
    crate::plan::plan_from_files(
        &store.registry,
        &store.leases,
        &store.proc_root,
        canonical,
        policies,
    )
}

/// Run `plan`.
pub fn run(cli: &Cli, args: &PlanArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    args.operator
        .require(&policies, crate::capability::Operation::Plan)?;
    let spinner = crate::cli::progress::Spinner::start(
        "planning: reading the registry and leases, judging every row",
    );
    let plan = plan_from_world(&args.store, &policies)?;
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
        write(out).map_err(Error::io(out, "cannot write the plan"))?;
        spinner
            .0
            .suspend(|| eprintln!("{}", saved_note(out, &plan, args)));
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
/// operator (on stderr: stdout is the plan itself).
fn saved_note(out: &std::path::Path, plan: &Plan, args: &PlanArgs) -> String {
    let esc = |p: &std::path::Path| crate::text::esc(&p.display().to_string()).into_owned();
    // Each store as every message names it: a PostgreSQL URL without its
    // password (the lease store's was once printed as given; row 50.6 of
    // docs/security.md).
    let store =
        |p: &std::path::Path| crate::text::esc(&crate::store::location::label(p)).into_owned();
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    let candidates = plan.candidates().count();
    let mut command = format!(
        "fleet-retire apply {} --registry {} --leases {}",
        esc(out),
        store(&args.store.registry),
        store(&args.store.leases)
    );
    if let Some(p) = &args.operator.profiles_path {
        command.push_str(&format!(" --profiles {}", esc(p)));
    }
    command.push_str(" --profile NAME");
    if candidates > 100 {
        command.push_str(" --first 100");
    }
    let size = if size >= 1_000_000 {
        format!("{:.1} MB", size as f64 / 1_000_000.0)
    } else {
        format!("{:.1} kB", size as f64 / 1_000.0)
    };
    if command.contains(":***@") {
        command.push_str("\n  (a password is shown as ***: put it back, or give it in PGPASSWORD)");
    }
    format!(
        "wrote the plan to {} ({size}, {candidates} candidate(s)); apply it (a profile \
         holding gitea.worker_registry.retire) with:\n  {command}",
        esc(out)
    )
}
