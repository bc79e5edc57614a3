//! `fleet-retire policy diff`: what a change of the policy files does,
//! proved per action, observed on fixtures and a registry, and reported
//! for a person, as JSON, or as a SARIF log of its loosenings.

use crate::cli::{Cli, Format};
use crate::error::{Error, ExitCode, Result};
use serde_json::json;

/// Run `policy diff`.
pub fn run(
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
        Format::Sarif => crate::cli::print_sarif(
            &[crate::sarif::POLICY_LOOSENED],
            &loosenings(&report.proved, &old_set, &new_set),
        )?,
        Format::Human | Format::Junit | Format::Lcov | Format::MutationReport => {
            report.print_human()?
        }
    }
    Ok(if loosened {
        ExitCode::Refused
    } else {
        ExitCode::Ok
    })
}

/// Each action NEW loosens, as a SARIF finding at the first policy that
/// changed for it: one NEW added or changed (by its head line), else one
/// it dropped (line 1 of the file OLD had it in), else the schema.
fn loosenings(
    proved: &crate::diff::PolicyDiff,
    old_set: &crate::policy::Policies,
    new_set: &crate::policy::Policies,
) -> Vec<crate::sarif::Finding> {
    let mut out = Vec::new();
    for a in proved.actions.iter().filter(|a| a.change.loosens()) {
        let names = |set: &crate::policy::Policies, id: &str| {
            set.set
                .policy(&cedar_policy::PolicyId::new(id))
                .is_some_and(|p| crate::diff::names_action(p, &a.action))
        };
        let moved: Vec<&crate::diff::PolicyNote> = proved
            .policies
            .iter()
            .filter(|p| p.status != "unchanged")
            .filter(|p| names(new_set, &p.id) || names(old_set, &p.id))
            .collect();
        let at = moved.iter().find_map(|p| {
            let in_new = new_set.rules.get(&cedar_policy::PolicyId::new(&p.id));
            let in_old = old_set.rules.get(&cedar_policy::PolicyId::new(&p.id));
            match (p.status, in_new, in_old) {
                ("removed", _, Some(r)) => Some((r.file.clone(), 1)),
                (_, Some(r), _) => Some((r.file.clone(), r.line)),
                _ => None,
            }
        });
        let (file, line) = at.unwrap_or_else(|| (crate::policy::SCHEMA_FILE.to_string(), 1));
        let changed: Vec<String> = moved
            .iter()
            .map(|p| format!("{} ({})", p.id, p.status))
            .collect();
        out.push(crate::sarif::Finding {
            rule: crate::sarif::POLICY_LOOSENED,
            message: format!(
                "NEW loosens the {} action{}: some request OLD stopped gets through ({}); \
                 policies that changed for it: {}",
                a.action,
                if a.change == crate::diff::Change::Both {
                    " (and tightens it elsewhere)"
                } else {
                    ""
                },
                a.request_env,
                if changed.is_empty() {
                    "none (the schema changed)".to_string()
                } else {
                    changed.join(", ")
                }
            ),
            file,
            base: crate::sarif::POLICY_ROOT,
            line,
            column: 1,
            end: None,
            properties: json!({
                "action": a.action,
                "change": a.change.word(),
                "policies": changed,
                "counterexamples": a.counterexamples,
            }),
        });
    }
    out
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
        crate::outln!("    counterexample ({}): {}", c.direction, esc(&c.sentence))?;
        crate::outln!(
            "    deciding attributes: {}",
            crate::counterexample::deciding_text(&c.deciding)
        )?;
        crate::outln!("    as a fixture case (--save-counterexamples DIR writes it):")?;
        for line in crate::text::json_for_terminal(&c.case).lines() {
            crate::outln!("      {line}")?;
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
