//! `fleet-retire apply-status APPLY_ID`: whether an apply committed, read
//! from the registry's own audit, for an apply that ended `outcome_unknown`
//! (its COMMIT went out and its reply never came).

use crate::cli::{Cli, Format};
use crate::error::{ExitCode, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `apply-status`.
#[derive(Debug, Args)]
pub struct ApplyStatusArgs {
    /// The apply's id, as its report (`apply_id`) names it.
    #[arg(value_name = "APPLY_ID", value_parser = apply_id)]
    pub apply_id: String,
    /// The registry the apply wrote to (for PostgreSQL behind failover, a
    /// URL naming every member with `target_session_attrs=read-write`).
    #[arg(
        long,
        env = "FLEET_RETIRE_REGISTRY",
        hide_env_values = true,
        value_name = "PATH|URL"
    )]
    pub registry: PathBuf,
    /// How long to wait for a transaction still writing the audit (its
    /// COMMIT in flight) to end, in milliseconds.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub wait_ms: u64,
}

/// An apply id: the 32 hexadecimal digits apply mints.
fn apply_id(s: &str) -> std::result::Result<String, String> {
    if s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s.to_ascii_lowercase())
    } else {
        Err("an apply id is the 32 hexadecimal digits of a report's apply_id".into())
    }
}

/// Run `apply-status`: exit 0 when the apply committed, 2 when it did not.
pub fn run(cli: &Cli, args: &ApplyStatusArgs) -> Result<ExitCode> {
    let engine = crate::store::open::engine(&args.registry)?;
    let rows = engine.audit_of(&args.apply_id, Duration::from_millis(args.wait_ms))?;
    let committed = !rows.is_empty();
    let shown = engine.label();
    if cli.format == Format::Json {
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "apply_id": args.apply_id,
                "registry": shown,
                "committed": committed,
                "retired": rows,
            }))
            .expect("a status serialises")
        )?;
    } else if committed {
        crate::outln!(
            "apply {} COMMITTED on {}: {} worker(s) retired",
            args.apply_id,
            crate::text::esc(&shown),
            rows.len()
        )?;
        for r in &rows {
            crate::outln!(
                "  {}  retired_at {}  by {}",
                crate::text::esc(&r.worker_identity),
                crate::text::esc(&r.retired_at),
                crate::text::esc(&r.retired_by)
            )?;
        }
    } else {
        crate::outln!(
            "apply {} did NOT commit on {}: its audit holds no row of it, and no transaction \
             was still writing the audit when it was read. Nothing it planned was retired by \
             it; plan and apply again",
            args.apply_id,
            crate::text::esc(&shown)
        )?;
    }
    Ok(if committed {
        ExitCode::Ok
    } else {
        ExitCode::Refused
    })
}
