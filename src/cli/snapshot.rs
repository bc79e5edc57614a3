//! `fleet-retire snapshot`: the live fleet, its instances and its blockers.

use crate::apply::residual;
use crate::cli::{Cli, Format, OperatorArgs};
use crate::error::{About, Error, ExitCode, Result};
use crate::evidence::probe::SystemProbe;
use crate::evidence::registry;
use crate::report::PlanWords;
use crate::snapshot::{compare, Options, Snapshot};
use clap::Args;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// Arguments of `snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// The worker registry: a SQLite file, or a postgres:// URL.
    #[arg(
        long,
        env = "FLEET_RETIRE_REGISTRY",
        hide_env_values = true,
        value_name = "PATH|URL"
    )]
    pub registry: PathBuf,
    /// The lease store. With it (and the canonical repository, and a
    /// profile that may plan), the human report groups the stale rows by
    /// the reason code a plan of the same read keeps each for, as apply
    /// does; the snapshot itself (and its JSON document) reads the registry
    /// alone.
    #[arg(
        long,
        env = "FLEET_RETIRE_LEASES",
        hide_env_values = true,
        value_name = "PATH|URL"
    )]
    pub leases: Option<PathBuf>,
    /// Expected repository binding; workers bound elsewhere are findings.
    #[arg(long, env = "FLEET_RETIRE_CANONICAL_REPOSITORY", value_name = "REPO")]
    pub canonical_repository: Option<String>,
    /// Expected revision; workers on another revision are findings.
    #[arg(long, value_name = "REV")]
    pub expected_revision: Option<String>,
    /// The approved fleet manifest: {"instances": [{"client_instance_id": ...}, ...]}.
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// An earlier snapshot (JSON) to prove heartbeat continuity against.
    #[arg(long, value_name = "EARLIER.json")]
    pub compare: Option<PathBuf>,
    /// Exit 2 when the live fleet is not safe.
    #[arg(long)]
    pub strict: bool,
    /// Root of the proc filesystem.
    #[arg(long, default_value = "/proc", value_name = "DIR", hide = true)]
    pub proc_root: PathBuf,
    /// Operator profile.
    #[command(flatten)]
    pub operator: OperatorArgs,
    /// How much of each list the human report shows.
    #[command(flatten)]
    pub list: crate::cli::ListArgs,
}

fn read_json(path: &Path, what: &str) -> Result<Json> {
    crate::jsonfile::read_json(path)
        .map(|(doc, _)| doc)
        .map_err(|e| {
            Error::input(
                About::Option("snapshot"),
                format!("{what} {}: {e}", path.display()),
            )
        })
}

/// Read a manifest: an object with `instances`, or a bare list.
pub fn load_manifest(path: &Path) -> Result<Vec<Json>> {
    let doc = read_json(path, "manifest")?;
    crate::snapshot::manifest_entries(doc).map_err(|e| {
        Error::input(
            About::Option("snapshot"),
            format!("manifest {}: {e}", path.display()),
        )
    })
}

/// A plan of the same read, for the human report's stale rows in the
/// plan's words (issue 52 §1: "snapshot and plan speaking one
/// vocabulary"). Made only when a person reads the report and the leases,
/// the repository and a profile that may plan are given; otherwise why
/// not, in a line the report ends its blockers with (empty when JSON is
/// asked for). A plan that fails says so there and the snapshot stands
/// alone: the snapshot never needs the leases.
fn plan_for_words(
    cli: &Cli,
    args: &SnapshotArgs,
    policies: &crate::policy::Policies,
) -> std::result::Result<crate::plan::Plan, String> {
    if cli.format != Format::Human {
        return Err(String::new());
    }
    let (Some(leases), Some(canonical)) = (&args.leases, &args.canonical_repository) else {
        return Err(
            "give --leases and --canonical-repository (or their variables) to see the \
                    stale rows grouped by the plan's reason codes"
                .into(),
        );
    };
    if args
        .operator
        .require(policies, crate::capability::Operation::Plan)
        .is_err()
    {
        return Err(
            "this profile may not plan, so the stale rows are not grouped by the \
                    plan's reason codes"
                .into(),
        );
    }
    crate::plan::plan_from_files(
        &args.registry,
        leases,
        &args.proc_root,
        canonical.clone(),
        policies,
    )
    .map_err(|e| format!("the stale rows are not grouped by the plan's reason codes: {e}"))
}

/// Run `snapshot`.
pub fn run(cli: &Cli, args: &SnapshotArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    args.operator
        .require(&policies, crate::capability::Operation::Snapshot)?;
    let started = std::time::Instant::now();
    let spinner = crate::cli::progress::Spinner::start("snapshot: reading the registry");
    let (plan, words) = match plan_for_words(cli, args, &policies) {
        Ok(plan) => (Some(plan), None),
        Err(why) => (None, Some(why)),
    };
    let loaded;
    let rows = match &plan {
        Some(plan) => &plan.rows,
        None => {
            loaded = registry::load(&args.registry)?;
            &loaded
        }
    };
    spinner.step(&format!("snapshot: probing {} rows", rows.len()));
    tracing::debug!(elapsed = ?started.elapsed(), rows = rows.len(), "registry read");
    let opts = Options::here(
        &args.proc_root,
        args.canonical_repository.clone(),
        args.expected_revision.clone(),
        args.manifest.as_deref().map(load_manifest).transpose()?,
    );
    let mut snap = Snapshot::take(rows, &opts, &SystemProbe::new(&args.proc_root));
    drop(spinner);
    if let Some(path) = &args.compare {
        let earlier = read_json(path, "earlier snapshot")?;
        let later = serde_json::json!({"live_workers": snap.live_workers()});
        snap.comparison = Some(compare(&earlier, &later));
    }
    match cli.format {
        // Streamed: rows that are not live are rendered a batch at a time.
        Format::Json => {
            use std::io::Write;
            let stdout = std::io::stdout();
            let mut w = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
            snap.write_json(&mut w)
                .and_then(|()| w.flush())
                .map_err(Error::Output)?;
        }
        Format::Human | Format::Junit | Format::Lcov | Format::Sarif | Format::MutationReport => {
            crate::out!(
                "{}",
                crate::report::snapshot_summary(
                    &snap.summary_json(),
                    args.list.cap(),
                    &match (&plan, words) {
                        (Some(plan), _) => PlanWords::Grouped(residual::of(plan, &snap)),
                        (None, why) => PlanWords::Not(why.unwrap_or_default()),
                    }
                )
            )?
        }
    }
    let safe = snap.live_fleet_safe();
    // The process ends next: returning a large registry's rows to the
    // allocator one by one would only add time.
    std::mem::forget(snap);
    std::mem::forget(plan);
    Ok(if args.strict && !safe {
        ExitCode::Refused
    } else {
        ExitCode::Ok
    })
}
