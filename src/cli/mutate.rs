//! `fleet-retire policy mutate`: the mutation score of the policies'
//! proofs and fixtures, and every survivor with the case that kills it.

use crate::cli::{Cli, Format};
use crate::error::{Error, ExitCode, Result};
use crate::mutate::{Outcome, Report};
use crate::text::esc;
use std::path::{Path, PathBuf};

/// Run `policy mutate`.
pub fn run(
    cli: &Cli,
    fixtures: &[PathBuf],
    min_score: Option<u8>,
    save: Option<&Path>,
    only: &[String],
    jobs: Option<usize>,
) -> Result<ExitCode> {
    let started = std::time::Instant::now();
    let policies = cli.load_policies()?;
    // A folder with properties of its own is judged by those alone: they
    // are what its reviewer signs. Otherwise the built-in ones.
    let dir = cli.policies.as_deref();
    let builtin = dir.is_none_or(|d| !d.join("properties").is_dir());
    let properties = crate::verify::load_properties(dir, &policies, builtin)?;
    let cases = crate::mutate::load_cases(fixtures)?;
    let jobs = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bar = Bar(indicatif::ProgressBar::with_draw_target(
        None,
        indicatif::ProgressDrawTarget::stderr(),
    ));
    let report = crate::mutate::run(&policies, &properties, &cases, only, jobs, &bar)?;
    bar.0.finish_and_clear();
    let saved = save_survivors(&report, save)?;
    let below = min_score.is_some_and(|n| report.score < f64::from(n));
    match cli.format {
        Format::Json => crate::outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "report": report,
                "min_score": min_score,
                "below_min_score": below,
                "saved": saved,
                "seconds": started.elapsed().as_secs_f64(),
            }))
            .expect("the report serialises")
        )?,
        Format::Sarif => crate::cli::print_sarif(
            &[crate::sarif::MUTANT_SURVIVED],
            &survivor_findings(&report, &policies),
        )?,
        Format::MutationReport => crate::outln!(
            "{}",
            serde_json::to_string_pretty(&crate::mutation_report::report(
                &report,
                &policies,
                &properties,
                &cases,
            ))
            .expect("the report serialises")
        )?,
        Format::Human | Format::Junit | Format::Lcov => {
            print_human(&report, &policies, &saved, started.elapsed())?
        }
    }
    if below {
        eprintln!(
            "policy mutate: score {:.1} % is below --min-score {}: save the survivors' cases \
             (--save-survivors DIR) or add the properties they show missing",
            report.score,
            min_score.unwrap_or(0)
        );
    }
    Ok(if below { ExitCode::Error } else { ExitCode::Ok })
}

fn save_survivors(report: &Report, save: Option<&Path>) -> Result<Vec<PathBuf>> {
    let mut saved = Vec::new();
    let Some(dir) = save else {
        return Ok(saved);
    };
    std::fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create the folder"))?;
    let survivors = report.outcomes.iter().filter(|o| o.witness.is_some());
    for (n, o) in survivors.enumerate() {
        // The policy's `@id` is the policy author's text: made a safe name,
        // and the path replaced rather than followed or written into.
        let name = format!("mutant-{n:03}-{}-{}.json", o.policy, o.operator);
        let path = dir.join(crate::outfile::safe_name(&name));
        let text = serde_json::to_string_pretty(&o.witness).expect("a case serialises");
        crate::outfile::replace(&path, format!("{text}\n").as_bytes())
            .map_err(Error::io(&path, "cannot write the survivor's case"))?;
        saved.push(path);
    }
    Ok(saved)
}

fn print_human(
    report: &Report,
    policies: &crate::policy::Policies,
    saved: &[PathBuf],
    took: std::time::Duration,
) -> Result<()> {
    for o in report.outcomes.iter().filter(|o| o.status == "survived") {
        print_survivor(o, policies)?;
    }
    print_shadowed(report)?;
    crate::outln!(
        "policy mutate: {} mutants of {} ({} properties, {} fixture cases, {:.1} s)",
        report.mutants,
        esc(&report.policies),
        report.properties,
        report.fixture_cases,
        took.as_secs_f64()
    )?;
    crate::outln!(
        "  killed      {} (by a property {}, by a fixture only {})",
        report.killed,
        report.killed - report.killed_by_fixture_only,
        report.killed_by_fixture_only
    )?;
    crate::outln!("  survived    {}", report.survived)?;
    crate::outln!(
        "  equivalent  {} (not counted; {} only because a forbid is shadowed)",
        report.equivalent,
        report.equivalent_shadowed
    )?;
    crate::outln!(
        "  invalid     {} (do not type-check; not counted)",
        report.invalid
    )?;
    for path in saved {
        crate::outln!("saved {}", esc(&path.display().to_string()))?;
    }
    crate::outln!(
        "score {:.1} % ({} killed of {} counted)",
        report.score,
        report.killed,
        report.killed + report.survived
    )?;
    Ok(())
}

/// A survivor: where it stands (`file:line:column`), its line before and
/// with the replacement in place, its witness in one sentence and as a
/// fixture case that kills it.
fn print_survivor(o: &Outcome, policies: &crate::policy::Policies) -> Result<()> {
    let rule = policies.rules.get(&cedar_policy::PolicyId::new(&o.policy));
    let file = rule.map_or("?", |r| r.file.as_str());
    let text = rule.and_then(|r| policies.texts.get(&r.file));
    let (line, column) = o.location.map_or((0, 0), |at| at.start);
    crate::outln!(
        "SURVIVED {}:{line}:{column} {} {}: `{}` -> `{}` ({})",
        esc(file),
        esc(&o.policy),
        o.operator,
        esc(&o.before),
        esc(&o.after),
        o.moved.join(", ")
    )?;
    if let (Some(text), Some(at)) = (text, o.location) {
        for shown in in_place(text, at, &o.after) {
            crate::outln!("    {}", esc(&shown))?;
        }
    }
    if let Some(sentence) = &o.sentence {
        crate::outln!("    {}", esc(sentence))?;
        crate::outln!(
            "    deciding attributes: {}",
            crate::counterexample::deciding_text(&o.deciding)
        )?;
    }
    if let Some(case) = &o.witness {
        crate::outln!("    a case that kills it (--save-survivors DIR writes it):")?;
        for line in crate::text::json_for_terminal(case).lines() {
            crate::outln!("    {line}")?;
        }
    }
    Ok(())
}

/// The mutated lines of `text` as they are (`-`) and with `after` in place
/// of the span (`+`), each with its line number; a long span shows its
/// first lines. A deletion or a removed condition shows its words.
fn in_place(text: &str, at: crate::mutate::locate::Span, after: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let (first, last) = (at.start.0, at.end.0.max(at.start.0));
    if first == 0 || last > lines.len() {
        return Vec::new();
    }
    let mut out: Vec<String> = (first..=last)
        .take(3)
        .map(|n| format!("{n:>4} - {}", lines[n - 1]))
        .collect();
    if last - first >= 3 {
        out.push(format!("     - … to line {last}"));
    }
    let described = after.starts_with('(') && after.ends_with(')');
    let replaced = if described {
        after.to_string()
    } else {
        let head: String = lines[first - 1]
            .chars()
            .take(at.start.1.saturating_sub(1))
            .collect();
        let tail: String = lines[last - 1]
            .chars()
            .skip(at.end.1.saturating_sub(1))
            .collect();
        format!("{head}{after}{tail}")
    };
    out.push(format!("{first:>4} + {replaced}"));
    out
}

/// Per forbid, how many mutants changed only which rows it names (shadowed).
fn print_shadowed(report: &Report) -> Result<()> {
    let mut per: std::collections::BTreeMap<&str, usize> = Default::default();
    for o in report.outcomes.iter().filter(|o| o.shadowed) {
        *per.entry(o.policy.as_str()).or_default() += 1;
    }
    for (policy, n) in per {
        crate::outln!(
            "SHADOWED {}: {n} mutant(s) change which requests it matches but no decision (other \
             forbids keep every row it keeps; only reason codes can move)",
            esc(policy)
        )?;
    }
    Ok(())
}

/// Each survivor as a SARIF finding: at the mutated text where it stands
/// verbatim in its policy, else at the policy's first line; the fixture
/// case that would kill it in the properties.
fn survivor_findings(
    report: &crate::mutate::Report,
    policies: &crate::policy::Policies,
) -> Vec<crate::sarif::Finding> {
    report
        .outcomes
        .iter()
        .filter(|o| o.status == "survived")
        .map(|o| {
            let rule = policies.rules.get(&cedar_policy::PolicyId::new(&o.policy));
            let file = rule.map_or_else(String::new, |r| r.file.clone());
            let (line, column) = o.location.map_or((1, 1), |at| at.start);
            crate::sarif::Finding {
                rule: crate::sarif::MUTANT_SURVIVED,
                message: format!(
                    "A mutant of policy {} survived ({}: {} -> {}); no property or fixture \
                     case tells it from the original",
                    o.policy, o.operator, o.before, o.after
                ),
                file,
                line,
                column,
                end: o.location.map(|at| at.end),
                base: crate::sarif::POLICY_ROOT,
                properties: serde_json::json!({
                    "policy": o.policy,
                    "operator": o.operator,
                    "before": o.before,
                    "after": o.after,
                    "moved": o.moved,
                    "witness": o.witness,
                }),
            }
        })
        .collect()
}

/// The progress of the judging on stderr, when stderr is a terminal
/// (indicatif draws nothing otherwise).
struct Bar(indicatif::ProgressBar);

impl crate::mutate::Progress for Bar {
    fn start(&self, total: usize) {
        self.0.set_length(total as u64);
        self.0.set_style(
            indicatif::ProgressStyle::with_template(
                "judging mutants {bar:40} {pos}/{len} ({eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
    }

    fn judged(&self) {
        self.0.inc(1);
    }
}
