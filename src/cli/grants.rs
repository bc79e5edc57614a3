//! `fleet-retire grants`: who may snapshot, plan and apply, by asking the
//! capability policies about every profile; `--against OLD.json` shows what
//! an edit of profiles.json grants or revokes.

use crate::capability::{check, Profiles, OPERATIONS};
use crate::cli::{Cli, Format};
use crate::error::{About, Error, ExitCode, Result};
use crate::policy::Policies;
use clap::Args;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Arguments of `grants`.
#[derive(Debug, Args)]
pub struct GrantsArgs {
    /// profiles.json.
    #[arg(long = "profiles", env = "GITEA_MCP_CONFIG", value_name = "PATH")]
    pub profiles: PathBuf,
    /// An earlier profiles.json to compare with. Also proves, with the
    /// solver over capabilities.cedar, the statements an operator relies on
    /// whatever either file says (policies/properties/capabilities.cedar):
    /// only a controller or reconciler holding gitea.worker_registry.retire
    /// can apply. Needs cvc5.
    #[arg(long, value_name = "OLD.json")]
    pub against: Option<PathBuf>,
}

/// profile → operation → allowed.
pub type Grants = BTreeMap<String, BTreeMap<String, bool>>;

/// Ask the capability policies about every profile and operation.
pub fn grants(policies: &Policies, profiles: &Profiles) -> Result<Grants> {
    let mut out = Grants::new();
    for name in profiles.profiles.keys() {
        let mut ops = BTreeMap::new();
        for op in OPERATIONS {
            ops.insert(op.to_string(), check(policies, profiles, name, op)?.allowed);
        }
        out.insert(name.clone(), ops);
    }
    Ok(out)
}

/// What changes from `old` to `new`: (profile, operation, now allowed).
pub fn changes(old: &Grants, new: &Grants) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    let names: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for name in names {
        for op in OPERATIONS {
            let before = old
                .get(name)
                .and_then(|m| m.get(*op))
                .copied()
                .unwrap_or(false);
            let after = new
                .get(name)
                .and_then(|m| m.get(*op))
                .copied()
                .unwrap_or(false);
            if before != after {
                out.push((name.clone(), op.to_string(), after));
            }
        }
    }
    out
}

/// Run `grants`.
pub fn run(cli: &Cli, args: &GrantsArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let profiles = Profiles::load(&args.profiles)?;
    let warnings = crate::capability::warnings(&profiles);
    let now = grants(&policies, &profiles)?;
    let diff = match &args.against {
        Some(old) => Some(changes(&grants(&policies, &Profiles::load(old)?)?, &now)),
        None => None,
    };
    let proofs = match &args.against {
        Some(_) => {
            let properties: Vec<crate::verify::Property> =
                crate::verify::load_properties(cli.policies.as_deref(), &policies, true)?
                    .into_iter()
                    .filter(|p| p.subject == "capabilities.cedar")
                    .collect();
            Some(crate::verify::prove(&policies, &properties)?)
        }
        None => None,
    };
    let failed = proofs.iter().flatten().filter(|p| !p.holds).count();
    match cli.format {
        Format::Json => {
            let mut doc = json!({"warnings": warnings, "grants": now});
            if let Some(p) = &proofs {
                doc["proofs"] = json!(p);
            }
            if let Some(d) = &diff {
                doc["changes"] = json!(d
                    .iter()
                    .map(|(p, op, allowed)| json!({"profile": p, "operation": op, "change": if *allowed { "granted" } else { "revoked" }}))
                    .collect::<Vec<_>>());
            }
            crate::outln!(
                "{}",
                serde_json::to_string_pretty(&doc)
                    .map_err(|e| Error::input(About::Machine, e.to_string()))?
            )?;
        }
        Format::Human => {
            for w in &warnings {
                crate::outln!("WARNING {w}")?;
            }
            if !warnings.is_empty() {
                crate::outln!()?;
            }
            crate::outln!(
                "{:<32} {:<9} {:<9} {:<9}",
                "PROFILE",
                "SNAPSHOT",
                "PLAN",
                "APPLY"
            )?;
            for (name, ops) in &now {
                let yes = |op: &str| {
                    if ops.get(op).copied().unwrap_or(false) {
                        "yes"
                    } else {
                        "-"
                    }
                };
                crate::outln!(
                    "{:<32} {:<9} {:<9} {:<9}",
                    crate::text::esc(name),
                    yes("snapshot"),
                    yes("plan"),
                    yes("apply")
                )?;
            }
            if let Some(d) = &diff {
                if d.is_empty() {
                    crate::outln!("\nno change in who may snapshot, plan or apply")?;
                } else {
                    crate::outln!(
                        "\nchanges against {}:",
                        args.against
                            .as_ref()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default()
                    )?;
                    for (p, op, allowed) in d {
                        crate::outln!(
                            "  {} {op} for {}",
                            if *allowed { "+ GRANTS" } else { "- revokes" },
                            crate::text::esc(p)
                        )?;
                    }
                }
            }
            if let Some(proofs) = &proofs {
                crate::outln!(
                    "\nproved over {}, whatever profiles.json says:",
                    if policies.is_builtin() {
                        "the built-in capabilities.cedar".to_string()
                    } else {
                        format!("{}/capabilities.cedar", policies.origin)
                    }
                )?;
                for p in proofs {
                    crate::outln!(
                        "  {} {} [{}]: {}",
                        if p.holds { "PROVED" } else { "FAILED" },
                        p.id,
                        p.request_env
                            .split_whitespace()
                            .nth(1)
                            .and_then(|a| a.rsplit("::").next())
                            .unwrap_or("")
                            .trim_matches('"'),
                        p.description
                    )?;
                    if let Some(c) = &p.counterexample {
                        for line in c.lines() {
                            crate::outln!("      {}", crate::text::esc(line))?;
                        }
                    }
                }
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::Ok
    } else {
        ExitCode::InvalidPolicy
    })
}
