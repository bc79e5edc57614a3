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
    /// After the run, report per policy in how many cases it fired and in
    /// how many it decided (policies that never fire or never decide are
    /// listed first); shadowed forbids are marked when cvc5 is installed.
    #[arg(long)]
    pub coverage: bool,
    /// With --coverage: fail (exit 1) when fewer than N percent of the
    /// forbids decided some case.
    #[arg(long, value_name = "N", requires = "coverage", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub min_coverage: Option<u8>,
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
        let json = cli.format == crate::cli::Format::Json && args.coverage;
        if diffs.is_empty() {
            passed += 1;
            if !json {
                crate::outln!("PASS {}", crate::text::esc(&name))?;
            }
        } else {
            failed += 1;
            if !json {
                crate::outln!("FAIL {} ({})", crate::text::esc(&name), file.display())?;
                for d in diffs {
                    crate::outln!("    {}", crate::text::esc(&d))?;
                }
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
    let mut below = false;
    if args.coverage {
        let proved = match crate::verify::shadowed_forbids(&policies).and_then(|shadowed| {
            Ok(crate::coverage::Proved {
                shadowed,
                never_primary: crate::verify::never_primary_forbids(&policies)?,
            })
        }) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!(
                    "not proved which forbids are shadowed or can never decide, so each counts \
                     only if a case shows it deciding: {e}"
                );
                None
            }
        };
        let report = crate::coverage::coverage(&policies, &files, proved.as_ref())?;
        below = args
            .min_coverage
            .is_some_and(|n| report.forbids_deciding_percent < f64::from(n));
        if cli.format == crate::cli::Format::Json {
            crate::outln!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "passed": passed,
                    "failed": failed,
                    "coverage": report,
                    "min_coverage": args.min_coverage,
                    "below_min_coverage": below,
                }))
                .expect("coverage serialises")
            )?;
        } else {
            crate::outln!()?;
            render_coverage(&report)?;
        }
        if below {
            eprintln!(
                "coverage: {:.1} % of forbids decided some case (or are proved never to), below --min-coverage {}",
                report.forbids_deciding_percent,
                args.min_coverage.unwrap_or(0)
            );
        }
    }
    if !(args.coverage && cli.format == crate::cli::Format::Json) {
        crate::outln!("{passed} passed, {failed} failed")?;
    }
    Ok(if failed == 0 && !below {
        ExitCode::Ok
    } else {
        ExitCode::Error
    })
}

fn render_coverage(report: &crate::coverage::Coverage) -> Result<()> {
    let esc = |s: &str| crate::text::esc(s).into_owned();
    crate::outln!(
        "coverage over {} case(s): {} of {} forbids ({:.1} %) decided some case or are proved never to decide",
        report.cases,
        report.forbids_deciding.0,
        report.forbids_deciding.1,
        report.forbids_deciding_percent
    )?;
    crate::outln!(
        "{:<7} {:<40} {:>5} {:>7}  NOTE",
        "EFFECT",
        "POLICY",
        "FIRED",
        "DECIDED"
    )?;
    for p in &report.policies {
        let mut notes = Vec::new();
        if p.fired.is_empty() {
            notes.push("NEVER FIRES".to_string());
        } else if p.decided.is_empty() {
            notes.push("NEVER DECIDES".to_string());
        }
        if p.decided.is_empty() && p.never_primary == Some(true) {
            notes.push(
                "covered by proof: whenever it fires a lower-order forbid fires too, so it can never decide"
                    .to_string(),
            );
        }
        if p.shadowed == Some(true) {
            notes.push(
                "shadowed: proved by the solver to decide nothing the others do not".to_string(),
            );
        }
        if let Some(first) = p.decided.first() {
            notes.push(format!(
                "e.g. {}{}",
                esc(first),
                if p.decided.len() > 1 {
                    format!(" (+{} more)", p.decided.len() - 1)
                } else {
                    String::new()
                }
            ));
        }
        crate::outln!(
            "{:<7} {:<40} {:>5} {:>7}  {}",
            p.effect,
            esc(&p.id),
            p.fired.len(),
            p.decided.len(),
            notes.join("; ")
        )?;
    }
    Ok(())
}
