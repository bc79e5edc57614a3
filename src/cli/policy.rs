//! `fleet-retire policy validate | list | verify`: tools for the people who
//! read and edit the policies.

use crate::cli::{Cli, Format};
use crate::error::{Error, ExitCode, Result};
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
    Verify,
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
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| Error::Policy(format!("{}: cannot read ({e})", path.display())))?;
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
    for (name, text, path) in sources(cli)? {
        if name == SCHEMA_FILE {
            continue;
        }
        let pretty = cedar_policy_formatter::policies_str_to_pretty(&text, &config)
            .map_err(|e| Error::Policy(format!("{name}: cannot format: {e}")))?;
        if pretty.trim_end() != text.trim_end() {
            let line = pretty
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .map(|i| i + 1)
                .unwrap_or_else(|| pretty.lines().count().min(text.lines().count()) + 1);
            match (&path, fix) {
                (Some(p), true) => {
                    std::fs::write(p, format!("{}\n", pretty.trim_end())).map_err(|e| {
                        Error::Policy(format!("{}: cannot rewrite ({e})", p.display()))
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
        return Err(Error::Policy(problems.join("\n")));
    }
    crate::outln!(
        "policies valid ({} policies, strict validation, canonical layout); policy_fingerprint {}",
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
        Format::Human => {
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

fn verify(cli: &Cli) -> Result<ExitCode> {
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
        Format::Human => {
            for p in proofs {
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
            for f in &verification.forbids {
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
        ExitCode::InvalidPolicy
    })
}

/// Run `policy`.
pub fn run(cli: &Cli, args: &PolicyArgs) -> Result<ExitCode> {
    match &args.command {
        PolicyCommand::Validate { fix_format } => validate(cli, *fix_format),
        PolicyCommand::List => list(cli),
        PolicyCommand::Verify => verify(cli),
    }
}
