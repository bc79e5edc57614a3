//! `fleet-retire snapshot`: the live fleet, its instances and its blockers.

use crate::cli::{Cli, Format, OperatorArgs};
use crate::error::{About, Error, ExitCode, Result};
use crate::evidence::probe::SystemProbe;
use crate::evidence::registry;
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
    /// The lease store. Accepted (and its variable FLEET_RETIRE_LEASES
    /// read) so one set of store flags serves every command; a snapshot
    /// reads the registry alone, so it is not opened.
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

/// Run `snapshot`.
pub fn run(cli: &Cli, args: &SnapshotArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    args.operator
        .require(&policies, crate::capability::Operation::Snapshot)?;
    let started = std::time::Instant::now();
    let spinner = crate::cli::progress::Spinner::start("snapshot: reading the registry");
    let rows = registry::load(&args.registry)?;
    spinner.step(&format!("snapshot: probing {} rows", rows.len()));
    tracing::debug!(elapsed = ?started.elapsed(), rows = rows.len(), "registry read");
    let opts = Options::here(
        &args.proc_root,
        args.canonical_repository.clone(),
        args.expected_revision.clone(),
        args.manifest.as_deref().map(load_manifest).transpose()?,
    );
    let mut snap = Snapshot::take(&rows, &opts, &SystemProbe::new(&args.proc_root));
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
                crate::report::snapshot_summary(&snap.summary_json(), args.list.cap())
            )?
        }
    }
    let safe = snap.live_fleet_safe();
    // The process ends next: returning a large registry's rows to the
    // allocator one by one would only add time.
    std::mem::forget(snap);
    std::mem::forget(rows);
    Ok(if args.strict && !safe {
        ExitCode::Refused
    } else {
        ExitCode::Ok
    })
}
