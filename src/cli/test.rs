//! `fleet-retire test`: run fixture files and folders.

use crate::cli::Cli;
use crate::error::{ExitCode, Result};
use crate::fixture::{collect, load, Case};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `test`.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// Fixture files or folders (every *.json below a folder).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Also write the cases as Cedar CLI `run-tests` files into DIR.
    #[arg(long, value_name = "DIR")]
    pub export_cedar: Option<PathBuf>,
}

/// Run `test`: one line per case, then `N passed, M failed`.
pub fn run(cli: &Cli, args: &TestArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let files = collect(&args.paths)?;
    let (mut passed, mut failed) = (0usize, 0usize);
    for file in &files {
        let case = load(file)?;
        let (name, diffs) = match &case {
            Case::Plan(c) => {
                let plan = c.plan(&policies)?;
                (c.name.clone(), c.differences(&plan))
            }
            Case::Capability(c) => (c.name.clone(), c.differences(&policies)?),
            Case::Snapshot(c) => (c.name.clone(), c.differences()),
            Case::Entity(c) => (c.name.clone(), c.differences(&policies, file)?),
        };
        if diffs.is_empty() {
            passed += 1;
            crate::outln!("PASS {}", crate::text::esc(&name))?;
        } else {
            failed += 1;
            crate::outln!("FAIL {} ({})", crate::text::esc(&name), file.display())?;
            for d in diffs {
                crate::outln!("    {}", crate::text::esc(&d))?;
            }
        }
    }
    if let Some(dir) = &args.export_cedar {
        let n = crate::export::export(&files, dir, &policies)?;
        eprintln!(
            "exported {n} Cedar test case(s) to {} (run {}/run.sh)",
            dir.display(),
            dir.display()
        );
    }
    crate::outln!("{passed} passed, {failed} failed")?;
    Ok(if failed == 0 {
        ExitCode::Ok
    } else {
        ExitCode::Error
    })
}
