//! `fleet-retire policy validate | list | verify | mutate | report | diff`: tools for the people who
//! read and edit the policies.

use crate::cli::{Cli, Format};
use crate::error::{About, Error, ExitCode, Result};
use crate::policy::{POLICY_FILES, SCHEMA_FILE};
use clap::{Args, Subcommand};
use serde_json::json;

/// Arguments of `policy`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: PolicyCommand,
}

/// `policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Strict validation (warnings are errors) and a formatting check.
    Validate {
        /// Rewrite policy files that are not in Cedar's canonical layout
        /// (only with --policies DIR).
        #[arg(long)]
        fix_format: bool,
    },
    /// Every policy with its id, effect, reason, order and description.
    List,
    /// Prove the properties in policies/properties/ for all requests and entities (needs cvc5).
    /// Failed proofs come first; exit 4 when one fails.
    Verify {
        /// Print only the failed proofs and the closing count.
        #[arg(long)]
        quiet: bool,
        /// Write each failed proof's counterexample into DIR as a fixture
        /// case (`PROPERTY-N.json`, N counting its request environments):
        /// it expects what the property demands, so it fails until the
        /// policies are mended.
        #[arg(long, value_name = "DIR")]
        save_counterexamples: Option<std::path::PathBuf>,
    },
    /// Every single-point mutant of the policies, and whether a property
    /// (policies/properties/) or a fixture case kills it; each survivor is
    /// printed with a fixture case that would (needs cvc5). Mutants the
    /// solver proves equivalent are not counted.
    Mutate {
        /// Fixture files or folders run under every mutant.
        #[arg(long, num_args = 1.., value_name = "PATH")]
        fixtures: Vec<std::path::PathBuf>,
        /// Exit 1 when fewer than N percent of the counted mutants are killed.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=100))]
        min_score: Option<u8>,
        /// Write each survivor's witness case into DIR as a fixture file.
        #[arg(long, value_name = "DIR")]
        save_survivors: Option<std::path::PathBuf>,
        /// Mutate only these policies (by `@id`); every policy by default.
        #[arg(long, num_args = 1.., value_name = "ID")]
        only: Vec<String>,
        /// Mutants judged side by side (default: the machine's cores).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
        jobs: Option<u16>,
    },
    /// Write the reviewer's page, DIR/index.html: every policy and property
    /// file line by line, each policy with its proofs, fixture coverage and
    /// mutants (a survivor marked at its line), the grants matrix, and the
    /// proved difference from --base. Open it from disk; it fetches nothing
    /// (needs cvc5).
    Report(crate::cli::report_page::ReportArgs),
    /// What a policy change does: proved per action (tightened, loosened,
    /// equivalent, both) with a counterexample fixture case for each
    /// difference, what each policy contributes, and, with --fixtures,
    /// every fixture verdict that moves. Exit 0 when nothing loosened, 2
    /// when something did (needs cvc5).
    ///
    /// OLD and NEW each name a policy folder (schema.cedarschema,
    /// retirement.cedar, capabilities.cedar) or, when no such folder
    /// exists, a git revision of this repository read with `git show`:
    /// `HEAD~1` reads `HEAD~1:policies/`, `main:path/to/policies` reads
    /// that folder. Example: `fleet-retire policy diff main policies`.
    Diff {
        /// The policies before the change.
        old: String,
        /// The policies after the change.
        new: String,
        /// Fixture files or folders to run under both sets.
        #[arg(long, num_args = 1.., value_name = "PATH")]
        fixtures: Vec<std::path::PathBuf>,
        /// Write each counterexample case into DIR as a fixture file.
        #[arg(long, value_name = "DIR")]
        save_counterexamples: Option<std::path::PathBuf>,
        /// Also plan this worker registry under both sets (one reading,
        /// one set of probe answers) and list every verdict that moves.
        #[arg(long, env = "FLEET_RETIRE_REGISTRY", hide_env_values = true, value_name = "PATH", requires_all = ["leases", "canonical_repository"])]
        registry: Option<std::path::PathBuf>,
        /// The lease store, with --registry.
        #[arg(
            long,
            env = "FLEET_RETIRE_LEASES",
            hide_env_values = true,
            value_name = "PATH"
        )]
        leases: Option<std::path::PathBuf>,
        /// The expected repository binding, with --registry.
        #[arg(long, value_name = "REPO", value_parser = crate::text::nonblank_repository)]
        canonical_repository: Option<String>,
        /// Root of the proc filesystem.
        #[arg(long, default_value = "/proc", value_name = "DIR", hide = true)]
        proc_root: std::path::PathBuf,
    },
}

/// The text of every policy file in use: (name, text, path if on disk).
fn sources(cli: &Cli) -> Result<Vec<(String, String, Option<std::path::PathBuf>)>> {
    let names: Vec<&str> = std::iter::once(SCHEMA_FILE)
        .chain(POLICY_FILES.iter().copied())
        .collect();
    let mut out = Vec::new();
    for name in names {
        match &cli.policies {
            Some(dir) => {
                let path = dir.join(name);
                let text = crate::policy::read_folder_file(&path)?;
                out.push((name.to_string(), text, Some(path)));
            }
            None => out.push((
                name.to_string(),
                crate::policy::embedded(name).to_string(),
                None,
            )),
        }
    }
    Ok(out)
}

fn validate(cli: &Cli, fix: bool) -> Result<ExitCode> {
    match validate_files(cli, fix) {
        // A file that cannot be read, or a property file that does not
        // parse, is a finding too: a code-scanning upload gets a log.
        Err(e @ Error::Policy { .. }) if cli.format == Format::Sarif => {
            crate::cli::print_sarif(&VALIDATE_RULES, &[unreadable_finding(cli, &e)])?;
            Ok(ExitCode::InvalidPolicy)
        }
        other => other,
    }
}

/// A policy error that is not a located problem of the set (a file that
/// cannot be read, a property file that does not parse), as a SARIF
/// finding at the first line of the file it is about (the folder itself
/// when it names none); the message says where in the file.
fn unreadable_finding(cli: &Cli, e: &Error) -> crate::sarif::Finding {
    let file = match e.about() {
        Some(About::File(path)) => cli
            .policies
            .as_ref()
            .and_then(|d| path.strip_prefix(d).ok())
            .unwrap_or(path)
            .display()
            .to_string(),
        Some(About::Policy(name)) => crate::sarif::in_folder(name),
        _ => ".".to_string(),
    };
    crate::sarif::Finding {
        rule: crate::sarif::POLICY_REJECTED,
        message: e.to_string(),
        file,
        base: crate::sarif::POLICY_ROOT,
        line: 1,
        column: 1,
        end: None,
        properties: json!({}),
    }
}

fn validate_files(cli: &Cli, fix: bool) -> Result<ExitCode> {
    let files = sources(cli)?;
    let set: Vec<(String, String)> = files
        .iter()
        .map(|(n, t, _)| (n.clone(), t.clone()))
        .collect();
    let origin = cli
        .policies
        .as_ref()
        .map_or_else(|| "embedded".to_string(), |d| d.display().to_string());
    let policies = match (
        crate::policy::Policies::check_texts(&set, origin),
        cli.format,
    ) {
        (Ok(p), _) => p,
        (Err(found), Format::Sarif) => {
            let findings: Vec<_> = found.iter().map(rejected_finding).collect();
            crate::cli::print_sarif(&VALIDATE_RULES, &findings)?;
            return Ok(ExitCode::InvalidPolicy);
        }
        (Err(found), _) => return Err(crate::policy::policy_error(&found)),
    };
    crate::verify::load_properties(cli.policies.as_deref(), &policies, false)?;
    let files = files
        .into_iter()
        .chain(crate::verify::property_files(cli.policies.as_deref())?);
    let mut out_of_layout = Vec::new();
    for (name, text, path) in files.filter(|(n, _, _)| n != SCHEMA_FILE) {
        let Some(line) = first_line_out_of_layout(&name, &text)? else {
            continue;
        };
        match (&path, fix) {
            (Some(p), true) => reformat(&name, &text, p)?,
            _ => out_of_layout.push((name, line)),
        }
    }
    if cli.format == Format::Sarif {
        let findings: Vec<_> = out_of_layout.iter().map(layout_finding).collect();
        crate::cli::print_sarif(&VALIDATE_RULES, &findings)?;
        return Ok(if findings.is_empty() {
            ExitCode::Ok
        } else {
            ExitCode::InvalidPolicy
        });
    }
    if !out_of_layout.is_empty() {
        let problems: Vec<String> = out_of_layout
            .iter()
            .map(|(name, line)| {
                format!(
                    "{name}:{line}:1: not in Cedar's canonical layout from here on; \
                     run `fleet-retire --policies DIR policy validate --fix-format`"
                )
            })
            .collect();
        return Err(Error::policy(About::PolicySet, problems.join("\n")));
    }
    crate::outln!(
        "policies valid ({} policies, strict validation, canonical layout, properties too); policy_fingerprint {}",
        policies.rules.len(),
        policies.fingerprint
    )?;
    Ok(ExitCode::Ok)
}

/// The rules `policy validate --format sarif` reports under.
const VALIDATE_RULES: [crate::sarif::Rule; 2] = [
    crate::sarif::POLICY_REJECTED,
    crate::sarif::NOT_CANONICAL_LAYOUT,
];

/// The first line (1-based) where `text` leaves Cedar's canonical layout,
/// if it does.
fn first_line_out_of_layout(name: &str, text: &str) -> Result<Option<usize>> {
    let config = cedar_policy_formatter::Config::default();
    let pretty = cedar_policy_formatter::policies_str_to_pretty(text, &config)
        .map_err(|e| Error::policy(About::PolicySet, format!("{name}: cannot format: {e}")))?;
    if pretty.trim_end() == text.trim_end() {
        return Ok(None);
    }
    Ok(Some(
        pretty
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or_else(|| pretty.lines().count().min(text.lines().count()) + 1),
    ))
}

/// Rewrite the file at `path` in Cedar's canonical layout.
fn reformat(name: &str, text: &str, path: &std::path::Path) -> Result<()> {
    let config = cedar_policy_formatter::Config::default();
    let pretty = cedar_policy_formatter::policies_str_to_pretty(text, &config)
        .map_err(|e| Error::policy(About::PolicySet, format!("{name}: cannot format: {e}")))?;
    let text = format!("{}\n", pretty.trim_end());
    crate::outfile::replace(path, text.as_bytes()).map_err(|e| {
        Error::policy(
            About::File(path.to_path_buf()),
            format!("{}: cannot rewrite ({e})", path.display()),
        )
    })?;
    eprintln!("{name}: reformatted");
    Ok(())
}

/// A problem that rejects the set, as a SARIF finding in its file.
fn rejected_finding(p: &crate::policy::diagnostics::Problem) -> crate::sarif::Finding {
    crate::sarif::Finding {
        rule: crate::sarif::POLICY_REJECTED,
        message: p.message.clone(),
        file: p.file.clone(),
        base: crate::sarif::POLICY_ROOT,
        line: p.line,
        column: p.column,
        end: None,
        properties: json!({"text": p.drawn}),
    }
}

/// A file out of Cedar's canonical layout, as a SARIF finding at the first
/// line that differs.
fn layout_finding((name, line): &(String, usize)) -> crate::sarif::Finding {
    crate::sarif::Finding {
        rule: crate::sarif::NOT_CANONICAL_LAYOUT,
        message: format!(
            "{name} is not in Cedar's canonical layout from line {line} on; run \
             `fleet-retire --policies DIR policy validate --fix-format`"
        ),
        file: name.clone(),
        base: crate::sarif::POLICY_ROOT,
        line: *line,
        column: 1,
        end: None,
        properties: json!({}),
    }
}

fn list(cli: &Cli) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let rules = policies.ordered_rules();
    match cli.format {
        Format::Json => {
            let items: Vec<_> = rules
                .iter()
                .map(|r| {
                    json!({
                        "id": r.id,
                        "file": r.file,
                        "line": r.line,
                        "effect": if r.effect == cedar_policy::Effect::Permit { "permit" } else { "forbid" },
                        "reason": r.reason.map(|x| x.code()),
                        "order": r.reason.map(|_| r.order),
                        "description": r.description,
                    })
                })
                .collect();
            crate::outln!(
                "{}",
                serde_json::to_string_pretty(&items).expect("list serialises")
            )?;
        }
        Format::Human | Format::Junit | Format::Lcov | Format::Sarif | Format::MutationReport => {
            crate::outln!(
                "{:<5} {:<7} {:<38} {:<32} DESCRIPTION",
                "ORDER",
                "EFFECT",
                "ID",
                "REASON"
            )?;
            for r in rules {
                crate::outln!(
                    "{:<5} {:<7} {:<38} {:<32} {}",
                    r.reason.map(|_| r.order.to_string()).unwrap_or_default(),
                    if r.effect == cedar_policy::Effect::Permit {
                        "permit"
                    } else {
                        "forbid"
                    },
                    r.id,
                    r.reason.map(|x| x.code()).unwrap_or(""),
                    r.description
                )?;
            }
        }
    }
    Ok(ExitCode::Ok)
}

fn verify(cli: &Cli, quiet: bool, save: Option<&std::path::Path>) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let properties = crate::verify::load_properties(cli.policies.as_deref(), &policies, true)?;
    let verification = crate::verify::verify(&policies, &properties)?;
    let proofs = &verification.proofs;
    let failed = proofs.iter().filter(|p| !p.holds).count();
    for path in save_counterexamples(proofs, save)? {
        eprintln!("saved {}", crate::text::esc(&path.display().to_string()));
    }
    match cli.format {
        Format::Json => crate::outln!(
            "{}",
            serde_json::to_string_pretty(&verification).expect("proofs serialise")
        )?,
        Format::Junit => {
            let xml = crate::junit::write("fleet-retire policy verify", &proof_suites(proofs))
                .map_err(Error::Output)?;
            crate::out!("{}", String::from_utf8_lossy(&xml))?;
        }
        Format::Sarif => crate::cli::print_sarif(
            &[crate::sarif::PROPERTY_NOT_PROVED],
            &proof_findings(proofs),
        )?,
        Format::Human | Format::Lcov | Format::MutationReport => {
            // Failures first: one failed proof among seventy must not scroll away.
            let mut ordered: Vec<&crate::verify::Proof> = proofs.iter().collect();
            ordered.sort_by_key(|p| p.holds);
            for p in ordered.into_iter().filter(|p| !quiet || !p.holds) {
                crate::outln!(
                    "{} {} [{}]",
                    if p.holds { "PROVED" } else { "FAILED" },
                    p.id,
                    p.request_env
                )?;
                if let Some(c) = &p.counterexample {
                    crate::outln!("    {}: counterexample", p.description)?;
                    for line in c.lines() {
                        crate::outln!("    {line}")?;
                    }
                }
            }
            // Not obligations: which forbids decide on their own (a property
            // above must then catch their deletion) and which are shadowed.
            for f in verification.forbids.iter().filter(|_| !quiet) {
                if f.shadowed {
                    crate::outln!(
                        "SHADOWED {} ({}): proved: the set without it decides every retire \
                         request alike; it only names a reason code",
                        f.forbid,
                        f.reason
                    )?;
                } else {
                    crate::outln!(
                        "DECIDES {} ({}): without it some row would be retired",
                        f.forbid,
                        f.reason
                    )?;
                }
            }
            crate::outln!("{} proved, {failed} failed", proofs.len() - failed)?;
        }
    }
    Ok(if failed == 0 {
        ExitCode::Ok
    } else {
        ExitCode::ProofFailed
    })
}

/// With `--save-counterexamples DIR`: each failed proof's counterexample
/// as a fixture file, `PROPERTY-N.json` (N counts the property's failed
/// request environments); the paths written.
fn save_counterexamples(
    proofs: &[crate::verify::Proof],
    save: Option<&std::path::Path>,
) -> Result<Vec<std::path::PathBuf>> {
    let Some(dir) = save else {
        return Ok(Vec::new());
    };
    std::fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create the folder"))?;
    let mut saved = Vec::new();
    let mut per: std::collections::BTreeMap<&str, usize> = Default::default();
    for p in proofs.iter().filter(|p| !p.holds) {
        let Some(w) = &p.witness else {
            continue;
        };
        let n = per.entry(p.id.as_str()).or_default();
        let path = dir.join(crate::outfile::safe_name(&format!("{}-{n}.json", p.id)));
        *n += 1;
        let text = serde_json::to_string_pretty(&w.case).expect("a case serialises");
        crate::outfile::replace(&path, format!("{text}\n").as_bytes())
            .map_err(Error::io(&path, "cannot write the counterexample"))?;
        saved.push(path);
    }
    Ok(saved)
}

/// Each proof that does not hold, as a SARIF finding at the property (or
/// the policy that can error) in its file.
pub fn proof_findings(proofs: &[crate::verify::Proof]) -> Vec<crate::sarif::Finding> {
    proofs
        .iter()
        .filter(|p| !p.holds)
        .map(|p| crate::sarif::Finding {
            rule: crate::sarif::PROPERTY_NOT_PROVED,
            message: format!(
                "{} does not hold for {}: {}",
                p.id, p.request_env, p.description
            ),
            file: crate::sarif::in_folder(&p.file),
            base: crate::sarif::POLICY_ROOT,
            line: p.line,
            column: 1,
            end: None,
            properties: json!({
                "id": p.id,
                "request_env": p.request_env,
                "counterexample": p.counterexample,
            }),
        })
        .collect()
}

/// The proofs as JUnit suites: one per file (a property file, or the
/// policy file whose policies must never error), a case per proof and
/// request environment; a failure carries the counterexample.
fn proof_suites(proofs: &[crate::verify::Proof]) -> Vec<crate::junit::Suite> {
    use crate::junit::{Outcome, Suite, TestCase};
    let mut suites: Vec<Suite> = Vec::new();
    for p in proofs {
        let case = TestCase {
            name: format!("{} [{}]", p.id, p.request_env),
            classname: p.file.trim_end_matches(".cedar").replace('/', "."),
            seconds: p.seconds,
            outcome: match &p.counterexample {
                None if p.holds => Outcome::Passed,
                c => Outcome::Failed(
                    format!("not proved: {}", p.description),
                    format!(
                        "{}\ncounterexample:\n{}",
                        p.description,
                        c.as_deref().unwrap_or("(none given)")
                    ),
                ),
            },
        };
        match suites.iter_mut().find(|s| s.name == p.file) {
            Some(s) => s.cases.push(case),
            None => suites.push(Suite {
                name: p.file.clone(),
                cases: vec![case],
            }),
        }
    }
    suites
}

/// Run `policy`.
pub fn run(cli: &Cli, args: &PolicyArgs) -> Result<ExitCode> {
    match &args.command {
        PolicyCommand::Validate { fix_format } => validate(cli, *fix_format),
        PolicyCommand::List => list(cli),
        PolicyCommand::Verify {
            quiet,
            save_counterexamples,
        } => verify(cli, *quiet, save_counterexamples.as_deref()),
        PolicyCommand::Report(args) => crate::cli::report_page::run(cli, args),
        PolicyCommand::Mutate {
            fixtures,
            min_score,
            save_survivors,
            only,
            jobs,
        } => crate::cli::mutate::run(
            cli,
            fixtures,
            *min_score,
            save_survivors.as_deref(),
            only,
            jobs.map(usize::from),
        ),
        PolicyCommand::Diff {
            old,
            new,
            fixtures,
            save_counterexamples,
            registry,
            leases,
            canonical_repository,
            proc_root,
        } => {
            let world = match (registry, leases, canonical_repository) {
                (Some(r), Some(l), Some(c)) => {
                    Some((r.as_path(), l.as_path(), proc_root.as_path(), c.clone()))
                }
                _ => None,
            };
            crate::cli::diff::run(
                cli,
                old,
                new,
                fixtures,
                save_counterexamples.as_deref(),
                world,
            )
        }
    }
}
