//! `fleet-retire fixture capture`: a real registry's rows as a fixture case.

use crate::capture::{capture_from_files, Selection};
use crate::cli::{Cli, OperatorArgs, StoreArgs};
use crate::error::{About, Error, ExitCode, Result};
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `fixture`.
#[derive(Debug, Args)]
pub struct FixtureArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: FixtureCommand,
}

/// `fixture` subcommands.
#[derive(Debug, Subcommand)]
pub enum FixtureCommand {
    /// Write a fixture case holding the chosen rows of a real registry,
    /// every row bearing on their verdict, the leases protecting them, the
    /// probe answers observed now and this host's facts, expecting today's
    /// verdicts. `fleet-retire test` passes on it at once; after a policy
    /// change it shows what moved. Secrets become placeholders.
    Capture(CaptureArgs),
}

/// Arguments of `fixture capture`.
#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// Registry, leases, canonical repository (as for `plan`).
    #[command(flatten)]
    pub store: StoreArgs,
    /// Operator profile (capturing is planning: it needs the plan capability).
    #[command(flatten)]
    pub operator: OperatorArgs,
    /// The worker identity to capture (repeat for several).
    #[arg(long = "worker", value_name = "ID", required_unless_present_any = ["all_preserved_by", "candidates"], conflicts_with_all = ["all_preserved_by", "candidates"])]
    pub workers: Vec<String>,
    /// Capture every row preserved with this primary reason code.
    #[arg(long, value_name = "CODE", conflicts_with = "candidates")]
    pub all_preserved_by: Option<String>,
    /// Capture every candidate.
    #[arg(long)]
    pub candidates: bool,
    /// Write the case here, as a new file (standard output without it). An
    /// existing path, a symbolic link included, is refused without --force.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Replace an existing --out path: the case is written to a temporary
    /// file beside it and renamed over the path, so a symbolic link there is
    /// replaced, never followed.
    #[arg(long, requires = "out")]
    pub force: bool,
}

/// Run `fixture`.
pub fn run(cli: &Cli, args: &FixtureArgs) -> Result<ExitCode> {
    let FixtureCommand::Capture(args) = &args.command;
    let policies = cli.load_policies()?;
    args.operator
        .require(&policies, crate::capability::Operation::Plan)?;
    let canonical = args.store.canonical_repository.clone().ok_or_else(|| {
        Error::input(
            About::Option("--canonical-repository"),
            "fixture capture needs the expected repository binding: pass --canonical-repository \
             OWNER/REPO (or set FLEET_RETIRE_CANONICAL_REPOSITORY)",
        )
    })?;
    let selection = if let Some(code) = &args.all_preserved_by {
        Selection::PreservedBy(code.clone())
    } else if args.candidates {
        Selection::Candidates
    } else {
        Selection::Workers(args.workers.clone())
    };
    let captured = capture_from_files(
        &args.store.registry,
        &args.store.leases,
        &args.store.proc_root,
        canonical,
        &policies,
        &selection,
    )?;
    let text = format!(
        "{}\n",
        serde_json::to_string_pretty(&captured.case).expect("a case serialises")
    );
    match &args.out {
        Some(path) => {
            write_case(path, &text, args.force)?;
            eprintln!(
                "wrote {}: {} chosen row(s), {} row(s) in all; edit its name and description",
                path.display(),
                captured.chosen.len(),
                captured.rows
            );
        }
        None => crate::outln!("{}", text.trim_end())?,
    }
    for (column, n) in &captured.redacted {
        eprintln!("replaced {n} secret value(s) of {column} with placeholders");
    }
    Ok(ExitCode::Ok)
}

/// Write the case to `path` as a new file: the open fails on any existing
/// path, a symbolic link (dangling or not) included, so nothing is written
/// through a link or over a file. With `force`, the path itself is replaced.
fn write_case(path: &Path, text: &str, force: bool) -> Result<()> {
    if force {
        return replace_path(path, text);
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Error::input(
                About::Option("--out"),
                format!(
                    "--out {}: the path exists (a file, folder or symbolic link) and is not \
                 written over; name a new file, or pass --force to replace the path itself \
                 (a symbolic link is replaced, never followed)",
                    path.display()
                ),
            ),
            _ => Error::io(path, "cannot create the fixture")(e),
        })?;
    fill(file, text).map_err(Error::io(path, "cannot write the fixture"))
}

/// Replace `path` itself with the case (a link is replaced, not the file
/// it points to): `crate::outfile`.
fn replace_path(path: &Path, text: &str) -> Result<()> {
    crate::outfile::replace(path, text.as_bytes())
        .map_err(Error::io(path, "cannot replace the path with the fixture"))
}

/// Write all of `text` to `file` and flush it to disk.
fn fill(mut file: std::fs::File, text: &str) -> std::io::Result<()> {
    file.write_all(text.as_bytes())?;
    file.sync_all()
}
