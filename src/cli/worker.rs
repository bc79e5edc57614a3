//! `fleet-retire register | heartbeat | release`: write the registry as a
//! worker would.

use crate::cli::Cli;
use crate::error::{ExitCode, Result};
use crate::worker::{heartbeat, register, release, Registration};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `register`.
#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// The worker registry (created if missing).
    #[arg(long, env = "FLEET_RETIRE_REGISTRY", value_name = "PATH")]
    pub registry: PathBuf,
    /// The worker's namespace.
    #[arg(long)]
    pub namespace: String,
    /// The worker identity (minted when absent).
    #[arg(long)]
    pub worker_identity: Option<String>,
    /// The worker process (default: the process that ran this command).
    #[arg(long)]
    pub pid: Option<i64>,
    /// Heartbeat TTL in seconds.
    #[arg(long, default_value_t = 900.0)]
    pub ttl: f64,
    /// Repository binding.
    #[arg(long, value_name = "REPO")]
    pub repository_binding: Option<String>,
    /// Remote.
    #[arg(long)]
    pub remote: Option<String>,
    /// Declared role (default: the namespace).
    #[arg(long)]
    pub role: Option<String>,
    /// Root of the proc filesystem.
    #[arg(long, default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
}

/// Arguments of `heartbeat` and `release`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The worker registry.
    #[arg(long, env = "FLEET_RETIRE_REGISTRY", value_name = "PATH")]
    pub registry: PathBuf,
    /// The worker identity.
    #[arg(long)]
    pub worker_identity: String,
    /// (release) the historical status to set: released or superseded.
    #[arg(long, default_value = "released")]
    pub status: String,
}

/// Run `register`.
pub fn run_register(_cli: &Cli, args: &RegisterArgs) -> Result<ExitCode> {
    let pid = args
        .pid
        .unwrap_or_else(|| i64::from(nix::unistd::getppid().as_raw()));
    let row = register(
        &args.registry,
        &args.proc_root,
        &Registration {
            worker_identity: args.worker_identity.clone(),
            namespace: args.namespace.clone(),
            role: args.role.clone(),
            pid,
            ttl_seconds: args.ttl,
            repository_binding: args.repository_binding.clone(),
            remote: args.remote.clone(),
            transport: None,
            env: std::env::vars().collect(),
        },
    )?;
    println!(
        "{}",
        serde_json::to_string_pretty(&row).expect("row serialises")
    );
    Ok(ExitCode::Ok)
}

/// Run `heartbeat`.
pub fn run_heartbeat(_cli: &Cli, args: &WorkerArgs) -> Result<ExitCode> {
    let at = heartbeat(&args.registry, &args.worker_identity)?;
    println!("{} heartbeat at {at}", args.worker_identity);
    Ok(ExitCode::Ok)
}

/// Run `release`.
pub fn run_release(_cli: &Cli, args: &WorkerArgs) -> Result<ExitCode> {
    release(&args.registry, &args.worker_identity, &args.status)?;
    println!("{} {}", args.worker_identity, args.status);
    Ok(ExitCode::Ok)
}
