//! `fleet-retire policy validate | list | verify | mutate | diff`: tools for the people who
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
        #[arg(long, env = "FLEET_RETIRE_REGISTRY", value_name = "PATH", requires_all = ["leases", "canonical_repository"])]
        registry: Option<std::path::PathBuf>,
        /// The lease store, with --registry.
        #[arg(long, env = "FLEET_RETIRE_LEASES", value_name = "PATH")]
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
    let policies = cli.load_policies()?;
    crate::verify::load_properties(cli.policies.as_deref(), &policies, false)?;
    let mut problems = Vec::new();
    let config = cedar_policy_formatter::Config::default();
    let files = sources(cli)?
        .into_iter()
        .chain(crate::verify::property_files(cli.policies.as_deref())?);
    for (name, text, path) in files {
        if name == SCHEMA_FILE {
            continue;
        }
        let pretty = cedar_policy_formatter::policies_str_to_pretty(&text, &config)
            .map_err(|e| Error::policy(About::PolicySet, format!("{name}: cannot format: {e}")))?;
        if pretty.trim_end() != text.trim_end() {
            let line = pretty
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .map(|i| i + 1)
                .unwrap_or_else(|| pretty.lines().count().min(text.lines().count()) + 1);
            match (&path, fix) {
                (Some(p), true) => {
                    let text = format!("{}\n", pretty.trim_end());
                    crate::outfile::replace(p, text.as_bytes()).map_err(|e| {
                        Error::policy(
                            About::File(p.to_path_buf()),
                            format!("{}: cannot rewrite ({e})", p.display()),
                        )
                    })?;
                    eprintln!("{name}: reformatted");
                }
                _ => problems.push(format!(
                    "{name}:{line}:1: not in Cedar's canonical layout from here on; \
                     run `fleet-retire --policies DIR policy validate --fix-format`"
                )),
            }
        }
    }
    if !problems.is_empty() {
        return Err(Error::policy(About::PolicySet, problems.join("\n")));
    }
    crate::outln!(
        "policies valid ({} policies, strict validation, canonical layout, properties too); policy_fingerprint {}",
        policies.rules.len(),
        policies.fingerprint
    )?;
    Ok(ExitCode::Ok)
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

fn verify(cli: &Cli, quiet: bool) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let properties = crate::verify::load_properties(cli.policies.as_deref(), &policies, true)?;
    let verification = crate::verify::verify(&policies, &properties)?;
    let proofs = &verification.proofs;
    let failed = proofs.iter().filter(|p| !p.holds).count();
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
        Format::Sarif => {
            let log = crate::sarif::log(
                &[crate::sarif::PROPERTY_NOT_PROVED],
                &proof_findings(proofs),
            );
            crate::outln!(
                "{}",
                serde_json::to_string_pretty(&log).expect("a log serialises")
            )?;
        }
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

/// Each proof that does not hold, as a SARIF finding at the property (or
/// the policy that can error) in its file.
fn proof_findings(proofs: &[crate::verify::Proof]) -> Vec<crate::sarif::Finding> {
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
            line: p.line,
            column: 1,
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

fn diff(
    cli: &Cli,
    old: &str,
    new: &str,
    fixtures: &[std::path::PathBuf],
    save: Option<&std::path::Path>,
    world: Option<(&std::path::Path, &std::path::Path, &std::path::Path, String)>,
) -> Result<ExitCode> {
    let (old_set, new_set) = (crate::diff::load_named(old)?, crate::diff::load_named(new)?);
    let proved = crate::diff::diff(&old_set, &new_set)?;
    let files = if fixtures.is_empty() {
        Vec::new()
    } else {
        crate::fixture::collect(fixtures)?
    };
    let mut observed = crate::diff::observe_fixtures(&old_set, &new_set, &files)?;
    let registry_rows = observe_world(&old_set, &new_set, world, &mut observed)?;
    let saved = save_counterexamples(&proved, save)?;
    let loosened = proved.overall().loosens() || observed.iter().any(|o| o.loosens);
    let report = DiffReport {
        proved,
        observed,
        fixtures_run: files.len(),
        registry_rows,
        saved,
        loosened,
    };
    match cli.format {
        Format::Json => report.print_json()?,
        Format::Human | Format::Junit | Format::Lcov | Format::Sarif | Format::MutationReport => {
            report.print_human()?
        }
    }
    Ok(if loosened {
        ExitCode::Refused
    } else {
        ExitCode::Ok
    })
}

/// With `--registry`: plan the real registry under both sets, add the
/// verdicts that moved to `observed`, and return its label and row count.
fn observe_world(
    old_set: &crate::policy::Policies,
    new_set: &crate::policy::Policies,
    world: Option<(&std::path::Path, &std::path::Path, &std::path::Path, String)>,
    observed: &mut Vec<crate::diff::Observed>,
) -> Result<Option<(String, usize)>> {
    let Some((registry, leases, proc_root, canonical)) = world else {
        return Ok(None);
    };
    let (n, moved) =
        crate::diff::observe_registry(old_set, new_set, registry, leases, proc_root, canonical)?;
    observed.extend(moved);
    Ok(Some((crate::store::location::label(registry), n)))
}

/// With `--save DIR`: write every counterexample as a fixture file there,
/// and return the paths written.
fn save_counterexamples(
    proved: &crate::diff::PolicyDiff,
    save: Option<&std::path::Path>,
) -> Result<Vec<std::path::PathBuf>> {
    let mut saved = Vec::new();
    let Some(dir) = save else {
        return Ok(saved);
    };
    std::fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create the folder"))?;
    for a in &proved.actions {
        for (n, c) in a.counterexamples.iter().enumerate() {
            let name = format!("{}-{}-{n}.json", a.action, c.direction);
            let path = dir.join(crate::outfile::safe_name(&name));
            let text = serde_json::to_string_pretty(&c.case).expect("a case serialises");
            crate::outfile::replace(&path, format!("{text}\n").as_bytes())
                .map_err(Error::io(&path, "cannot write the counterexample"))?;
            saved.push(path);
        }
    }
    Ok(saved)
}

/// Everything `policy diff` reports: what was proved, what moved on
/// fixtures and the registry, and what was saved.
struct DiffReport {
    /// The proofs per action and the notes per policy.
    proved: crate::diff::PolicyDiff,
    /// Every fixture or registry verdict that moved.
    observed: Vec<crate::diff::Observed>,
    /// How many fixture files were run.
    fixtures_run: usize,
    /// The registry's label and row count, when one was planned.
    registry_rows: Option<(String, usize)>,
    /// The counterexample files written.
    saved: Vec<std::path::PathBuf>,
    /// NEW lets through something OLD stopped.
    loosened: bool,
}

/// Escape a text for the terminal.
fn esc(s: &str) -> String {
    crate::text::esc(s).into_owned()
}

impl DiffReport {
    /// The report as one JSON document (`--format json`).
    fn print_json(&self) -> Result<()> {
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "overall": self.proved.overall().word(),
                "loosened": self.loosened,
                "proved": self.proved,
                "observed": self.observed,
                "fixtures_run": self.fixtures_run,
                "registry_rows": self.registry_rows.as_ref().map(|(_, n)| n),
                "saved": self.saved,
            }))
            .expect("a diff serialises")
        )
    }

    /// The report for a person: the sets, the proofs per action, the notes
    /// per policy, what moved, what was saved, and the verdict.
    fn print_human(&self) -> Result<()> {
        let proved = &self.proved;
        crate::outln!("OLD {} ({})", esc(&proved.old), proved.old_fingerprint)?;
        crate::outln!("NEW {} ({})", esc(&proved.new), proved.new_fingerprint)?;
        if proved.schema_changed {
            crate::outln!("the schema changed; both sets were compared under NEW's")?;
        }
        crate::outln!("\nproved, for every request and entity store the schema allows:")?;
        for a in &proved.actions {
            print_action(a)?;
        }
        crate::outln!("\npolicies of NEW:")?;
        for p in &proved.policies {
            print_policy_note(p)?;
        }
        if self.fixtures_run > 0 || self.registry_rows.is_some() {
            self.print_observed()?;
        }
        for p in &self.saved {
            crate::outln!("saved {}", p.display())?;
        }
        crate::outln!(
            "\n{}: {}",
            proved.overall().word().to_uppercase(),
            if self.loosened {
                "NEW lets through something OLD stopped (exit 2)"
            } else {
                "nothing loosened"
            }
        )
    }

    /// What the verdicts moved on: each move (the first fifty), then a
    /// count per kind of move.
    fn print_observed(&self) -> Result<()> {
        let observed = &self.observed;
        let mut on = Vec::new();
        if self.fixtures_run > 0 {
            on.push(format!("{} fixture file(s)", self.fixtures_run));
        }
        if let Some((path, n)) = &self.registry_rows {
            on.push(format!("{n} row(s) of {}", esc(path)));
        }
        crate::outln!(
            "\nobserved on {}: {} verdict(s) moved",
            on.join(" and "),
            observed.len()
        )?;
        let mut counts: std::collections::BTreeMap<(String, String), usize> = Default::default();
        const SHOWN: usize = 50;
        for (n, o) in observed.iter().enumerate() {
            *counts.entry((o.old.clone(), o.new.clone())).or_default() += 1;
            if n == SHOWN {
                crate::outln!(
                    "  ... {} more (--format json lists every one)",
                    observed.len() - SHOWN
                )?;
            }
            if n >= SHOWN {
                continue;
            }
            crate::outln!(
                "  {} {} / {}: {} -> {}",
                if o.loosens { "LOOSENS" } else { "tightens" },
                esc(&o.case),
                esc(&o.subject),
                o.old,
                o.new
            )?;
        }
        for ((a, b), n) in counts {
            crate::outln!("  {n} x {a} -> {b}")?;
        }
        Ok(())
    }
}

/// One action's proved change, with its counterexamples as fixture cases.
fn print_action(a: &crate::diff::ActionDiff) -> Result<()> {
    let how = match (a.allows_more, a.allows_fewer) {
        (false, false) => "decides every request alike",
        (true, false) => "allows more requests",
        (false, true) => "allows fewer requests",
        (true, true) => "allows some requests more and some fewer",
    };
    let note = if crate::diff::MAY_BE_LIVE_ACTIONS.contains(&a.action.as_str()) && a.allows_fewer {
        " (fewer rows count as may-be-live, so rows sharing their evidence or slot lose that protection)"
    } else {
        ""
    };
    crate::outln!(
        "  {:<24} {:<10} NEW {how}{note}",
        a.action,
        a.change.word().to_uppercase()
    )?;
    for c in &a.counterexamples {
        crate::outln!(
            "    counterexample ({}): OLD {}, NEW {}; as a fixture case:",
            c.direction,
            if c.old_allows { "allows" } else { "refuses" },
            if c.new_allows { "allows" } else { "refuses" }
        )?;
        let text = serde_json::to_string_pretty(&c.case).expect("a case serialises");
        for line in text.lines() {
            crate::outln!("      {}", esc(line))?;
        }
    }
    Ok(())
}

/// One policy of NEW, when anything is known about it: its status against
/// OLD and what was proved of it.
fn print_policy_note(p: &crate::diff::PolicyNote) -> Result<()> {
    let mut notes = Vec::new();
    if p.status != "unchanged" {
        notes.push(p.status.to_string());
    }
    if p.never_matches {
        notes.push("NEVER MATCHES (proved)".into());
    }
    if p.always_matches {
        notes.push(if p.effect == "forbid" {
            "ALWAYS MATCHES (proved): it refuses every request of its actions".to_string()
        } else {
            "ALWAYS MATCHES (proved)".to_string()
        });
    }
    if p.redundant && !p.never_matches && p.status != "removed" {
        notes.push(if p.effect == "forbid" && p.reason.is_some() {
            "shadowed: decides nothing the others do not (it only names a reason code)".to_string()
        } else {
            "redundant: the set without it decides every request alike".to_string()
        });
    }
    if notes.is_empty() {
        return Ok(());
    }
    crate::outln!("  {:<7} {:<40} {}", p.effect, esc(&p.id), notes.join("; "))
}

/// Run `policy`.
pub fn run(cli: &Cli, args: &PolicyArgs) -> Result<ExitCode> {
    match &args.command {
        PolicyCommand::Validate { fix_format } => validate(cli, *fix_format),
        PolicyCommand::List => list(cli),
        PolicyCommand::Verify { quiet } => verify(cli, *quiet),
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
            diff(
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
