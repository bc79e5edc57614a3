//! `fleet-retire demo`: the whole story on a small real fleet.

use crate::cli::Cli;
use crate::error::{ExitCode, Result};
use clap::Args;

/// Arguments of `demo` (none).
#[derive(Debug, Args)]
pub struct DemoArgs {}

/// Run `demo`.
pub fn run(cli: &Cli, _args: &DemoArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    crate::demo::run(&policies)?;
    Ok(ExitCode::Ok)
}
