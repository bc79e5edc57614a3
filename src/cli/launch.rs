//! `fleet-retire launch`: mint one launch identity and print the five-server
//! `mcpServers` configuration that carries it.

use crate::cli::Cli;
use crate::error::{About, Error, ExitCode, Result};
use crate::launcher::{launch, LaunchRequest};
use clap::Args;
use std::collections::BTreeMap;

/// Arguments of `launch`.
#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// The client type (codex, claude_code, gemini, grok, cursor, …).
    #[arg(long)]
    pub client: String,
    /// The profile of each namespace: author=P,reviewer=P,merger=P,controller=P,reconciler=P.
    #[arg(long = "profiles", value_name = "NS=PROFILE,...")]
    pub profiles: String,
    /// Reuse a trusted instance id (reconnecting the same launch); untrusted ids are refused.
    #[arg(long, value_name = "INST-ID")]
    pub instance: Option<String>,
    /// The launch's session id (minted when absent).
    #[arg(long)]
    pub session: Option<String>,
    /// Operator-approved enrollment id.
    #[arg(long)]
    pub fleet_run_id: Option<String>,
    /// profiles.json path handed to the workers.
    #[arg(long, value_name = "PATH")]
    pub config: Option<String>,
    /// The worker command (default: this executable, absolute, with `serve`).
    #[arg(long)]
    pub command: Option<String>,
    /// An argument of the worker command (repeatable; default `serve` when
    /// --command is not given).
    #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Extra environment KEY=VALUE (repeatable). KEY is `[A-Za-z_][A-Za-z0-9_]*`; the
    /// keys the launch sets itself and every GITEA_MCP_* key are refused.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Launch time (for reproducing an id; default now).
    #[arg(long, hide = true)]
    pub now: Option<String>,
    /// Launch nonce (for reproducing an id; default random).
    #[arg(long, hide = true)]
    pub nonce: Option<String>,
}

/// Parse `ns=profile,ns=profile`.
pub fn parse_profiles(text: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (ns, profile) = part.split_once('=').ok_or_else(|| {
            Error::input(
                About::Option("launch"),
                format!("--profiles entry {part:?} is not NAMESPACE=PROFILE"),
            )
        })?;
        if !crate::launcher::NAMESPACES.contains(&ns.trim()) {
            return Err(Error::input(
                About::Option("launch"),
                format!(
                    "--profiles names {ns:?}, which is not a namespace ({})",
                    crate::launcher::NAMESPACES.join(", ")
                ),
            ));
        }
        out.insert(ns.trim().to_string(), profile.trim().to_string());
    }
    Ok(out)
}

/// Run `launch`.
pub fn run(_cli: &Cli, args: &LaunchArgs) -> Result<ExitCode> {
    let mut extra_env = Vec::new();
    for kv in &args.env {
        let (k, v) = kv.split_once('=').ok_or_else(|| {
            Error::input(
                About::Option("launch"),
                format!("--env {kv:?} is not KEY=VALUE; write the key, `=`, then the value"),
            )
        })?;
        extra_env.push((k.to_string(), v.to_string()));
    }
    let now = match &args.now {
        Some(t) => crate::time::parse_ts(t).ok_or_else(|| {
            Error::input(
                About::Option("launch"),
                format!("--now {t:?} is not a strict UTC stamp"),
            )
        })?,
        None => crate::time::now(),
    };
    let (command, worker_args) = match &args.command {
        Some(c) => (c.clone(), args.args.clone()),
        None => {
            let exe = std::env::current_exe().map_err(|e| {
                Error::input(
                    About::Option("launch"),
                    format!("cannot find this executable's path ({e}); pass --command"),
                )
            })?;
            let mut a = vec!["serve".to_string()];
            a.extend(args.args.iter().cloned());
            (exe.display().to_string(), a)
        }
    };
    let doc = launch(&LaunchRequest {
        client: Some(args.client.clone()),
        profiles: parse_profiles(&args.profiles)?,
        instance: args.instance.clone(),
        session: args.session.clone(),
        fleet_run_id: args.fleet_run_id.clone(),
        config: args.config.clone(),
        command,
        args: worker_args,
        extra_env,
        now,
        nonce: args.nonce.clone(),
    })?;
    crate::outln!(
        "{}",
        serde_json::to_string_pretty(&doc).expect("launch JSON serialises")
    )?;
    Ok(ExitCode::Ok)
}
