//! `fleet-retire register | heartbeat | release`: write the registry as a
//! worker would, and only the caller's own registration.
//!
//! The worker identity comes from the launcher's environment
//! (`GITEA_MCP_WORKER_IDENTITY`), never from a flag, and the registered
//! process is the one that runs the command (its parent). `heartbeat` and
//! `release` prove the row is the caller's: its process, with the same start
//! time, host, boot and pid namespace, must be this command's parent or an
//! ancestor. Touching another worker's row is what `apply` is for.

use crate::cli::Cli;
use crate::error::{About, Error, ExitCode, Result};
use crate::identity::env::WORKER_IDENTITY;
use crate::worker::{heartbeat, identity_from_env, register, release, Registration, Writer};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `register`.
#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// The worker registry (an existing one: create it with `fleet-retire registry create`).
    #[arg(
        long,
        env = "FLEET_RETIRE_REGISTRY",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub registry: PathBuf,
    /// The worker's namespace.
    #[arg(long)]
    pub namespace: String,
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
    #[arg(
        long,
        env = "FLEET_RETIRE_REGISTRY",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub registry: PathBuf,
    /// (release) the historical status to set: released or superseded.
    #[arg(long, default_value = "released")]
    pub status: String,
    /// Root of the proc filesystem.
    #[arg(long, default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
}

fn required_identity(command: &str) -> Result<String> {
    identity_from_env().ok_or_else(|| {
        Error::input(
            About::Option(WORKER_IDENTITY),
            format!(
                "{command} writes the caller's own registration, named by {WORKER_IDENTITY}, \
             which is not set; run it from the worker with the identity `register` printed"
            ),
        )
    })
}

/// Run `register`.
pub fn run_register(_cli: &Cli, args: &RegisterArgs) -> Result<ExitCode> {
    let pid = i64::from(nix::unistd::getppid().as_raw());
    let registered = register(
        &args.registry,
        &args.proc_root,
        &Registration {
            worker_identity: identity_from_env(),
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
    crate::outln!(
        "{}",
        serde_json::to_string_pretty(&registered.row).expect("row serialises")
    )?;
    Ok(ExitCode::Ok)
}

/// Run `heartbeat`.
pub fn run_heartbeat(_cli: &Cli, args: &WorkerArgs) -> Result<ExitCode> {
    let worker = required_identity("heartbeat")?;
    let at = heartbeat(&args.registry, &worker, Writer::Descendant(&args.proc_root))?;
    crate::outln!("{} heartbeat at {at}", crate::text::esc(&worker))?;
    Ok(ExitCode::Ok)
}

/// Run `release`.
pub fn run_release(_cli: &Cli, args: &WorkerArgs) -> Result<ExitCode> {
    let worker = required_identity("release")?;
    release(
        &args.registry,
        &worker,
        &args.status,
        Writer::Descendant(&args.proc_root),
    )?;
    crate::outln!("{} {}", crate::text::esc(&worker), args.status)?;
    Ok(ExitCode::Ok)
}
