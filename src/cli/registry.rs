//! `fleet-retire registry create`: make a new SQLite registry, the one act
//! that creates one (workers only open an existing registry); and
//! `fleet-retire registry copy`: move a SQLite registry onto PostgreSQL.

use crate::cli::{Cli, Format};
use crate::error::{About, ExitCode, Result};
use crate::outln;
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Arguments of `registry`.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// What to do with the registry.
    #[command(subcommand)]
    pub command: RegistryCommand,
}

/// `registry` subcommands.
#[derive(Debug, Subcommand)]
pub enum RegistryCommand {
    /// Create a new, empty SQLite registry (workers, `serve` included, open
    /// an existing registry only).
    Create(CreateArgs),
    /// Copy a SQLite registry (rows and audit; optionally a lease store) into
    /// empty PostgreSQL tables, in one transaction, and prove the tokens equal.
    Copy(CopyArgs),
    /// Install the change record in an existing PostgreSQL registry, as the
    /// tables' owner, so that apply judges outside its transaction (`registry
    /// copy` installs it; apply installs it when its role may).
    Versions(VersionsArgs),
    /// Write a small sample fleet for this machine into a folder (a
    /// registry, a lease store and profiles.json) to try `plan` on: two
    /// candidates, and a row kept for each of several reasons.
    Sample(crate::cli::sample::SampleArgs),
}

/// Arguments of `registry versions`.
#[derive(Debug, Args)]
pub struct VersionsArgs {
    /// The PostgreSQL registry: postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE.
    #[arg(
        long,
        env = "FLEET_RETIRE_REGISTRY",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub registry: String,
}

/// Run `registry versions`: the shape checks apply makes, then the install,
/// in one transaction.
fn versions(args: &VersionsArgs) -> Result<ExitCode> {
    let at = std::path::Path::new(&args.registry);
    let installed = crate::store::open::install_versions(at)?;
    outln!(
        "{} {}",
        if installed {
            "installed the change record in"
        } else {
            "the change record was already whole in"
        },
        crate::store::location::label(at)
    )?;
    Ok(ExitCode::Ok)
}

/// Arguments of `registry copy`.
#[derive(Debug, Args)]
pub struct CopyArgs {
    /// The SQLite registry to copy (read only).
    #[arg(long, value_name = "SQLITE_PATH")]
    pub from: PathBuf,
    /// The PostgreSQL database: postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE.
    #[arg(long, value_name = "URL")]
    pub to: String,
    /// Also copy this SQLite lease store into the same database.
    #[arg(long, value_name = "SQLITE_PATH")]
    pub leases: Option<PathBuf>,
}

/// Arguments of `registry create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Where to create the registry (a SQLite file that does not exist yet).
    #[arg(
        long,
        env = "FLEET_RETIRE_REGISTRY",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub registry: PathBuf,
}

/// Run `registry create`: refused when the path exists or names PostgreSQL.
fn create(args: &CreateArgs) -> Result<ExitCode> {
    let path = &args.registry;
    let name = path.display().to_string();
    let shown = crate::text::esc(&name);
    // Made with O_EXCL: an existing path, a symbolic link (dangling or not)
    // included, is refused rather than followed.
    if !crate::store::open::create_registry(path)? {
        return Err(crate::error::Error::input(
            About::File(path.clone()),
            format!(
                "{shown} exists already (a file, folder or symbolic link, which is never \
                 followed); `registry create` makes a new registry only: name a path that \
                 does not exist"
            ),
        ));
    }
    outln!("created the registry {shown}")?;
    Ok(ExitCode::Ok)
}

/// Run `registry`.
pub fn run(cli: &Cli, args: &RegistryArgs) -> Result<ExitCode> {
    match &args.command {
        RegistryCommand::Create(c) => create(c),
        RegistryCommand::Versions(v) => versions(v),
        RegistryCommand::Sample(s) => crate::cli::sample::run(s),
        RegistryCommand::Copy(c) => {
            let spinner = crate::cli::progress::Spinner::start(&format!(
                "copying the registry into {}",
                crate::store::location::label(std::path::Path::new(&c.to))
            ));
            let report = crate::copy::copy(&c.from, c.leases.as_deref(), &c.to);
            drop(spinner);
            let report = report?;
            match cli.format {
                Format::Json => {
                    let doc = serde_json::to_string_pretty(&report).map_err(|e| {
                        crate::error::Error::input(About::Option("registry copy"), e.to_string())
                    })?;
                    outln!("{doc}")?;
                }
                Format::Human
                | Format::Junit
                | Format::Lcov
                | Format::Sarif
                | Format::MutationReport => {
                    outln!(
                        "copied {} registry rows and {} audit rows from {} to {}",
                        report.rows,
                        report.audit_rows,
                        report.from,
                        report.to
                    )?;
                    if let Some(n) = report.leases {
                        outln!("copied {n} leases")?;
                    }
                    outln!(
                        "registry token, source and copy: {} = {}",
                        report.registry_fingerprint,
                        report.copied_registry_fingerprint
                    )?;
                    if let Some((was, now)) = &report.external_state_fingerprint {
                        outln!("lease token, source and copy: {was} = {now}")?;
                    }
                    outln!("every row reads back value for value; committed")?;
                }
            }
            Ok(ExitCode::Ok)
        }
    }
}
