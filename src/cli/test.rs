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

/// One fixture file's result.
#[derive(Debug, serde::Serialize)]
struct CaseResult {
    /// The file, as given or found.
    file: String,
    /// The case's name, when the file could be read as one.
    #[serde(skip_serializing_if = "Option::is_none")]
    case: Option<String>,
    /// `pass`, `fail` or `error` (the file is not a case this runner reads).
    status: &'static str,
    /// For a failure, each expectation that does not hold, saying what was
    /// expected and what came out; for an error, what is wrong with the file.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    details: Vec<String>,
    /// For a failure, the same as fields: what, expected, actual.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    differences: Vec<crate::fixture::Difference>,
    /// For a failing plan case, each worker it got wrong: how its rows
    /// were decided, and the `explain` command that shows why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    decided: Vec<WorkerDecided>,
    /// How long it took, in seconds (for JUnit).
    #[serde(skip)]
    seconds: f64,
}

/// A worker a failing plan case got wrong: how each of its rows was
/// decided, and the command that explains it.
#[derive(Debug, serde::Serialize)]
struct WorkerDecided {
    /// Its worker identity.
    worker: String,
    /// Each of its rows: the deciding policy and reason.
    rows: Vec<crate::fixture::Decided>,
    /// `fleet-retire explain --fixture FILE --worker W`, ready to paste.
    explain: String,
}

/// A judged fixture file: its case's name, what differs, and for a plan
/// case that fails, who decided what it got wrong.
type Judged = (String, Vec<crate::fixture::Difference>, Vec<WorkerDecided>);

/// Load and judge one fixture file.
fn judge(cli: &Cli, policies: &crate::policy::Policies, file: &std::path::Path) -> Result<Judged> {
    Ok(match &load(file)? {
        Case::Plan(c) => {
            let plan = c.plan(policies)?;
            let decided = c
                .workers_differing(&plan)
                .into_iter()
                .map(|worker| WorkerDecided {
                    rows: crate::fixture::decided(&plan, policies, &worker),
                    explain: explain_command(cli, file, &worker),
                    worker,
                })
                .collect();
            (c.name.clone(), c.differences(&plan), decided)
        }
        Case::Capability(c) => (c.name.clone(), c.differences(policies)?, Vec::new()),
        Case::Snapshot(c) => (c.name.clone(), c.differences(), Vec::new()),
        Case::Entity(c) => (c.name.clone(), c.differences(policies, file)?, Vec::new()),
    })
}

/// Load and judge one fixture file for the reviewer's page: its case's
/// name and what differs (who decided it is `fleet-retire test`'s part).
pub(crate) fn differences(
    policies: &crate::policy::Policies,
    file: &std::path::Path,
) -> Result<(String, Vec<crate::fixture::Difference>)> {
    Ok(match &load(file)? {
        Case::Plan(c) => (c.name.clone(), c.differences(&c.plan(policies)?)),
        Case::Capability(c) => (c.name.clone(), c.differences(policies)?),
        Case::Snapshot(c) => (c.name.clone(), c.differences()),
        Case::Entity(c) => (c.name.clone(), c.differences(policies, file)?),
    })
}

/// The command that explains `worker`'s rows in `file` under the policies
/// this run used, each word quoted for a shell as needed.
fn explain_command(cli: &Cli, file: &std::path::Path, worker: &str) -> String {
    use crate::text::shell_word;
    // A value that starts with `-` would read as an option: join it to its flag.
    let option = |flag: &str, value: &str| {
        if value.starts_with('-') {
            shell_word(&format!("{flag}={value}")).into_owned()
        } else {
            format!("{flag} {}", shell_word(value))
        }
    };
    let mut words = vec!["fleet-retire".to_string()];
    if let Some(dir) = &cli.policies {
        words.push(option("--policies", &dir.display().to_string()));
    }
    words.push("explain".into());
    words.push(option("--fixture", &file.display().to_string()));
    words.push(option("--worker", worker));
    words.join(" ")
}

/// Every file's result, in order: a malformed file is an error of its own,
/// and the run goes on to the next.
fn run_all(cli: &Cli, policies: &crate::policy::Policies, files: &[PathBuf]) -> Vec<CaseResult> {
    files
        .iter()
        .map(|file| {
            let shown = file.display().to_string();
            let started = std::time::Instant::now();
            let judged = judge(cli, policies, file);
            let seconds = started.elapsed().as_secs_f64();
            match judged {
                Ok((name, diffs, decided)) => CaseResult {
                    file: shown,
                    case: Some(name),
                    status: if diffs.is_empty() { "pass" } else { "fail" },
                    details: diffs.iter().map(ToString::to_string).collect(),
                    differences: diffs,
                    decided,
                    seconds,
                },
                Err(e) => CaseResult {
                    file: shown,
                    case: None,
                    status: "error",
                    details: vec![e.to_string()],
                    differences: Vec::new(),
                    decided: Vec::new(),
                    seconds,
                },
            }
        })
        .collect()
}

/// The lines that say who decided what a failing case got wrong: a row's
/// deciding policy, then the command that explains the worker.
fn decided_lines(r: &CaseResult) -> Vec<String> {
    let mut lines = Vec::new();
    for w in &r.decided {
        lines.extend(w.rows.iter().map(ToString::to_string));
        lines.push(format!("  to see why: {}", w.explain));
    }
    lines
}

/// The results as JUnit suites: one per fixture file, with its case; a
/// failure says what was expected and what came out, an error what is
/// wrong with the file.
fn case_suites(results: &[CaseResult]) -> Vec<crate::junit::Suite> {
    use crate::junit::{Outcome, Suite, TestCase};
    results
        .iter()
        .map(|r| {
            let path = std::path::Path::new(&r.file);
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            let folder = path.parent().and_then(|p| p.file_name()).map_or_else(
                || "fixtures".to_string(),
                |f| f.to_string_lossy().into_owned(),
            );
            let text = [r.details.clone(), decided_lines(r)].concat().join("\n");
            let first = r.details.first().cloned().unwrap_or_default();
            Suite {
                name: r.file.clone(),
                cases: vec![TestCase {
                    name: r.case.clone().or(stem).unwrap_or_else(|| r.file.clone()),
                    classname: folder,
                    seconds: r.seconds,
                    outcome: match r.status {
                        "pass" => Outcome::Passed,
                        "fail" => Outcome::Failed(first, text),
                        _ => Outcome::Error(first, text),
                    },
                }],
            }
        })
        .collect()
}

/// The human lines of the results: PASS, FAIL with what differs, ERROR with
/// what is wrong.
fn print_results(results: &[CaseResult]) -> Result<()> {
    let esc = |s: &str| crate::text::esc(s).into_owned();
    for r in results {
        match (r.status, &r.case) {
            ("pass", Some(name)) => crate::outln!("PASS {}", esc(name))?,
            ("fail", Some(name)) => crate::outln!("FAIL {} ({})", esc(name), esc(&r.file))?,
            _ => crate::outln!("ERROR {}", esc(&r.file))?,
        }
        for d in r.details.iter().chain(&decided_lines(r)) {
            crate::outln!("    {}", esc(d))?;
        }
    }
    Ok(())
}

/// Run `test`: one line per case (a malformed file is reported and the
/// rest still run), then `N passed, M failed, K errors`; with `--format
/// json`, one document with every case's result.
pub fn run(cli: &Cli, args: &TestArgs) -> Result<ExitCode> {
    let junit = cli.format == crate::cli::Format::Junit;
    if junit && args.coverage {
        return Err(crate::error::Error::input(
            crate::error::About::Option("--format"),
            "--format junit reports the cases; run --coverage with --format human or json",
        ));
    }
    let policies = cli.load_policies()?;
    let files = collect(&args.paths)?;
    let results = run_all(cli, &policies, &files);
    let count = |status: &str| results.iter().filter(|r| r.status == status).count();
    let (passed, failed, errors) = (count("pass"), count("fail"), count("error"));
    // Export and coverage read the files that are cases.
    let readable: Vec<PathBuf> = files
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.status != "error")
        .map(|(f, _)| f.clone())
        .collect();
    let json = cli.format == crate::cli::Format::Json;
    // The LCOV tracefile alone goes to stdout; the count to stderr.
    let lcov = cli.format == crate::cli::Format::Lcov;
    if junit {
        let xml = crate::junit::write("fleet-retire test", &case_suites(&results))
            .map_err(crate::error::Error::Output)?;
        crate::out!("{}", String::from_utf8_lossy(&xml))?;
    } else if !json && !lcov {
        print_results(&results)?;
    }
    if let Some(dir) = &args.export_cedar {
        let n = crate::export::export(&readable, dir, &policies)?;
        eprintln!(
            "exported {n} Cedar test case(s) to {} (run {}/run.sh)",
            dir.display(),
            dir.display()
        );
    }
    let mut doc = serde_json::json!({
        "passed": passed,
        "failed": failed,
        "errors": errors,
        "cases": results,
    });
    let below = match args.coverage {
        true => coverage(cli, args, &policies, &readable, &mut doc)?,
        false => false,
    };
    if json {
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("results serialise")
        )?;
    } else if lcov {
        eprintln!("{passed} passed, {failed} failed, {errors} errors");
    } else if !junit {
        crate::outln!("{passed} passed, {failed} failed, {errors} errors")?;
    }
    Ok(if failed == 0 && errors == 0 && !below {
        ExitCode::Ok
    } else {
        ExitCode::Error
    })
}

/// `--coverage`: the report (printed, or put into `doc` for JSON), and
/// whether it is below `--min-coverage`.
fn coverage(
    cli: &Cli,
    args: &TestArgs,
    policies: &crate::policy::Policies,
    files: &[PathBuf],
    doc: &mut serde_json::Value,
) -> Result<bool> {
    let proved = match crate::coverage::Proved::prove(policies) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!(
                "not proved which forbids are shadowed or can never decide, so each counts \
                 only if a case shows it deciding: {e}"
            );
            None
        }
    };
    let report = crate::coverage::coverage(policies, files, proved.as_ref())?;
    let below = args
        .min_coverage
        .is_some_and(|n| report.forbids_deciding_percent < f64::from(n));
    if cli.format == crate::cli::Format::Lcov {
        // The built-in set's files are this repository's `policies/`.
        let folder = cli
            .policies
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from("policies"));
        crate::out!("{}", crate::coverage::lcov(&report, &folder))?;
    } else if cli.format == crate::cli::Format::Json {
        doc["coverage"] = serde_json::to_value(&report).expect("coverage serialises");
        doc["min_coverage"] = serde_json::json!(args.min_coverage);
        doc["below_min_coverage"] = serde_json::json!(below);
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
    Ok(below)
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
