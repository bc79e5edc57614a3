//! `fleet-retire grants`: who may snapshot, plan and apply, by asking the
//! capability policies about every profile; `--against OLD.json` shows what
//! an edit of profiles.json grants or revokes.

use crate::capability::Profiles;
use crate::cli::{Cli, Format};
use crate::error::{About, Error, ExitCode, Result};
use crate::policy::Policies;
use clap::Args;
use serde_json::json;
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
    /// can apply. Needs cvc5. Exits 2 when an edit grants anything it did
    /// not grant before (as `policy diff` does when a policy loosens), 4
    /// when a proof fails.
    #[arg(long, value_name = "OLD.json")]
    pub against: Option<PathBuf>,
}

use crate::capability::{changes, grants, Grants};

/// Run `grants`.
pub fn run(cli: &Cli, args: &GrantsArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let profiles = Profiles::load(&args.profiles)?;
    let known = crate::capability::known::Known::of(&policies, crate::launcher::NAMESPACES);
    let warnings = crate::capability::warnings(&profiles, &known);
    let now = grants(&policies, &profiles)?;
    let diff = match &args.against {
        Some(old) => Some(changes(&grants(&policies, &Profiles::load(old)?)?, &now)),
        None => None,
    };
    let (proofs, not_proved) = match &args.against {
        Some(_) => proofs_or_why_not(cli, &policies)?,
        None => (None, None),
    };
    let failed = proofs.iter().flatten().filter(|p| !p.holds).count();
    // As `policy diff` exits 2 when a policy loosens: a grant that widens
    // is something a CI job stops for.
    let widened = diff.iter().flatten().filter(|(_, _, now)| *now).count();
    match cli.format {
        Format::Json => {
            let mut doc = json_doc(&warnings, &now, diff.as_deref(), proofs.as_deref());
            if let Some(why) = &not_proved {
                doc["proofs_not_run"] = json!(why);
            }
            if args.against.is_some() {
                doc["verdict"] = json!(verdict(failed, widened, not_proved.as_deref()));
            }
            crate::outln!(
                "{}",
                serde_json::to_string_pretty(&doc)
                    .map_err(|e| Error::input(About::Machine, e.to_string()))?
            )?;
        }
        Format::Sarif => {
            let mut findings = profile_findings(
                &args.profiles,
                &crate::capability::warnings_by_profile(&profiles, &known),
                diff.as_deref().unwrap_or_default(),
            );
            findings.extend(crate::cli::policy::proof_findings(
                proofs.as_deref().unwrap_or_default(),
            ));
            crate::cli::print_sarif(
                &[
                    crate::sarif::GRANT_WIDENED,
                    crate::sarif::PROPERTY_NOT_PROVED,
                    crate::sarif::PROFILE_WARNING,
                ],
                &findings,
            )?;
        }
        Format::Human | Format::Junit | Format::Lcov | Format::MutationReport => {
            print_table(&warnings, &now)?;
            if let Some(d) = &diff {
                print_changes(d, args.against.as_deref())?;
            }
            if let Some(proofs) = &proofs {
                print_proofs(proofs, &policies)?;
            }
            if let Some(why) = &not_proved {
                crate::outln!("\nproofs not run: {}", crate::text::esc(why))?;
            }
            if args.against.is_some() {
                crate::outln!("\n{}", verdict(failed, widened, not_proved.as_deref()))?;
            }
        }
    }
    Ok(if failed > 0 {
        ExitCode::ProofFailed
    } else if widened > 0 {
        ExitCode::Refused
    } else {
        ExitCode::Ok
    })
}

/// The capability proofs, or, when no solver can run here, why not (the
/// table and what changed are shown all the same, and the exit code is the
/// widening's).
fn proofs_or_why_not(
    cli: &Cli,
    policies: &Policies,
) -> Result<(Option<Vec<crate::verify::Proof>>, Option<String>)> {
    match prove_capabilities(cli, policies) {
        Ok(proofs) => Ok((Some(proofs), None)),
        Err(e) if matches!(e.about(), Some(About::Machine)) => Ok((None, Some(e.to_string()))),
        Err(e) => Err(e),
    }
}

/// The one-line verdict `grants --against` ends with, as `policy diff` does.
fn verdict(failed: usize, widened: usize, not_proved: Option<&str>) -> String {
    let proofs = match (failed, not_proved) {
        (0, None) => "every capability property proved".to_string(),
        (0, Some(_)) => "the capability properties were not proved (no solver here)".to_string(),
        (n, _) => format!(
            "{n} capability propert{} FAILED",
            if n == 1 { "y" } else { "ies" }
        ),
    };
    match widened {
        0 => format!("verdict: no grant widened; {proofs}"),
        n => format!("verdict: {n} grant(s) widened: review each before merging; {proofs}"),
    }
}

/// The grants an edit widened and the warnings about profiles.json, as
/// SARIF findings at each profile's name in the file.
fn profile_findings(
    path: &std::path::Path,
    warnings: &[(String, String)],
    diff: &[(String, String, bool)],
) -> Vec<crate::sarif::Finding> {
    let text = crate::jsonfile::read_json(path)
        .map(|(_, bytes)| bytes.text)
        .unwrap_or_default();
    let file = path.file_name().map_or_else(
        || "profiles.json".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    let finding = |rule, profile: &str, message: String| {
        let line = key_line(&text, profile);
        crate::sarif::Finding {
            rule,
            message,
            file: file.clone(),
            base: crate::sarif::PROFILES_ROOT,
            line,
            column: 1,
            end: None,
            properties: json!({"profile": profile}),
        }
    };
    let widened = diff
        .iter()
        .filter(|(_, _, now)| *now)
        .map(|(profile, op, _)| {
            finding(
                crate::sarif::GRANT_WIDENED,
                profile,
                format!(
                    "profile {:?} may now {op}, which it could not before",
                    crate::text::esc(profile)
                ),
            )
        });
    let warned = warnings
        .iter()
        .map(|(profile, w)| finding(crate::sarif::PROFILE_WARNING, profile, w.clone()));
    widened.chain(warned).collect()
}

/// The line of `text` (profiles.json) where the profile `name` is
/// written as a key of the top-level `"profiles"` object (escapes decoded);
/// 1 when it is not found there.
fn key_line(text: &str, name: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut depth, mut line, mut i) = (0usize, 1usize, 0usize);
    let mut top_key = String::new();
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => line += 1,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                let end = (i + 1).min(bytes.len());
                let key = serde_json::from_str::<String>(&text[start..end]).unwrap_or_default();
                if text[end..].trim_start().starts_with(':') {
                    if depth == 1 {
                        top_key = key;
                    } else if depth == 2 && top_key == "profiles" && key == name {
                        return line;
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    1
}

/// Prove the properties about capabilities.cedar (with `--against`).
fn prove_capabilities(cli: &Cli, policies: &Policies) -> Result<Vec<crate::verify::Proof>> {
    let properties: Vec<crate::verify::Property> =
        crate::verify::load_properties(cli.policies.as_deref(), policies, true)?
            .into_iter()
            .filter(|p| p.subject == "capabilities.cedar")
            .collect();
    crate::verify::prove(policies, &properties)
}

/// Everything as one JSON document (`--format json`).
fn json_doc(
    warnings: &[String],
    now: &Grants,
    diff: Option<&[(String, String, bool)]>,
    proofs: Option<&[crate::verify::Proof]>,
) -> serde_json::Value {
    let mut doc = json!({"warnings": warnings, "grants": now});
    if let Some(p) = proofs {
        doc["proofs"] = json!(p);
    }
    if let Some(d) = diff {
        doc["changes"] = json!(d
            .iter()
            .map(|(p, op, allowed)| json!({"profile": p, "operation": op, "change": if *allowed { "granted" } else { "revoked" }}))
            .collect::<Vec<_>>());
    }
    doc
}

/// The warnings about profiles.json, then one line per profile saying
/// which operations it may run.
fn print_table(warnings: &[String], now: &Grants) -> Result<()> {
    for w in warnings {
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
    for (name, ops) in now {
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
    Ok(())
}

/// What the edit grants and revokes against the file `against`.
fn print_changes(diff: &[(String, String, bool)], against: Option<&std::path::Path>) -> Result<()> {
    if diff.is_empty() {
        return crate::outln!("\nno change in who may snapshot, plan or apply");
    }
    crate::outln!(
        "\nchanges against {}:",
        against.map(|p| p.display().to_string()).unwrap_or_default()
    )?;
    for (p, op, allowed) in diff {
        crate::outln!(
            "  {} {op} for {}",
            if *allowed { "+ GRANTS" } else { "- revokes" },
            crate::text::esc(p)
        )?;
    }
    Ok(())
}

/// The capability proofs, each with its action and any counterexample.
fn print_proofs(proofs: &[crate::verify::Proof], policies: &Policies) -> Result<()> {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_profile_is_found_where_it_is_a_key_of_profiles() {
        let text = "{\"profiles\": {\n  \"ctl\": {\"role\": \"controller\"},\n  \"role\": {\"role\": \"x\"},\n  \"\\u00fcber\": {}\n}}";
        assert_eq!(super::key_line(text, "ctl"), 2);
        assert_eq!(super::key_line(text, "role"), 3);
        assert_eq!(super::key_line(text, "über"), 4);
        assert_eq!(super::key_line(text, "absent"), 1);
    }
}
