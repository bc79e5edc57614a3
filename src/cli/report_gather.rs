//! What `policy report` is asked for (its arguments), and what it
//! gathers beside the proofs: the mutants (judged now or read from a run
//! kept earlier), the grants, the base compared, and the fixtures run.

use crate::error::{About, Error, Result};
use crate::signoff::{BaseSeen, Compared, FixtureRun, GrantsSeen, Judged};
use clap::Args;
use std::path::{Path, PathBuf};

/// Arguments of `policy report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The folder to write index.html into (made when missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Fixture files or folders: their coverage of each policy, and (with
    /// --mutate) the cases that may kill a mutant.
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub fixtures: Vec<PathBuf>,
    /// Judge the mutants now (needs cvc5; every policy of the built-in set
    /// takes minutes on two cores).
    #[arg(long, conflicts_with = "mutants")]
    pub mutate: bool,
    /// With --mutate: only these policies' mutants (by `@id`).
    #[arg(long, num_args = 1.., value_name = "ID", requires = "mutate")]
    pub only: Vec<String>,
    /// Read the mutants judged earlier by `policy mutate --format json`
    /// (the same policy set: its fingerprint is checked).
    #[arg(long, value_name = "FILE")]
    pub mutants: Option<PathBuf>,
    /// profiles.json: the grants matrix.
    #[arg(long, env = "GITEA_MCP_CONFIG", value_name = "PATH")]
    pub profiles: Option<PathBuf>,
    /// An earlier profiles.json: the matrix marks what the edit grants and
    /// revokes.
    #[arg(long, value_name = "OLD.json", requires = "profiles")]
    pub against: Option<PathBuf>,
    /// A git revision (or a policy folder) to prove the difference from,
    /// as `policy diff BASE` does: the change shown as a diff with its
    /// counterexamples and the fixture verdicts that move; a loosening is a
    /// reason not to sign.
    #[arg(long, value_name = "REV")]
    pub base: Option<String>,
    /// With --fixtures: each forbid no fixture case shows deciding (and
    /// not proved never to) is a reason not to sign when fewer than N
    /// percent of the forbids are covered, as `test --min-coverage` fails.
    #[arg(long, value_name = "N", requires = "fixtures", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub min_coverage: Option<u8>,
}

/// The mutants: judged now (`--mutate`), read from a run kept earlier
/// (`--mutants`), or why there are none.
pub fn mutants(
    args: &ReportArgs,
    policies: &crate::policy::Policies,
    properties: &[crate::verify::Property],
    failed: usize,
) -> Result<std::result::Result<Vec<Judged>, String>> {
    let cases = crate::mutate::load_cases(&args.fixtures)?;
    if let Some(file) = &args.mutants {
        let judged_by = crate::mutate::judged_by(properties, &cases);
        return read_mutants(file, &policies.fingerprint, &judged_by).map(Ok);
    }
    if !args.mutate {
        return Ok(Err(
            "pass --mutate to judge them now, or --mutants FILE with the output of \
             `policy mutate --format json`"
                .into(),
        ));
    }
    if failed > 0 {
        return Ok(Err(format!(
            "{failed} proof(s) fail, and mutants are judged only against properties that hold"
        )));
    }
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let run = crate::mutate::run(policies, properties, &cases, &args.only, jobs, &())?;
    let outcomes = serde_json::to_value(&run.outcomes).expect("outcomes serialise");
    Ok(Ok(
        serde_json::from_value(outcomes).expect("outcomes read back")
    ))
}

/// The outcomes of a `policy mutate --format json` run of this very set,
/// judged by the same properties and fixture cases, by a fleet-retire
/// that placed each mutant.
fn read_mutants(file: &Path, fingerprint: &str, judged_by: &str) -> Result<Vec<Judged>> {
    let shown = crate::text::esc(&file.display().to_string()).into_owned();
    let bad = |message: String| {
        Error::input(
            About::File(file.to_path_buf()),
            format!("--mutants {shown}: {message}"),
        )
    };
    let (doc, _) = crate::jsonfile::read_json(file).map_err(|e| bad(e.to_string()))?;
    let report = &doc["report"];
    if !report["outcomes"].is_array() {
        return Err(bad(
            "not the output of `fleet-retire policy mutate --format json`".into(),
        ));
    }
    let made_for = report["fingerprint"].as_str().unwrap_or("");
    if made_for != fingerprint {
        return Err(bad(format!(
            "the mutants were judged for policy set {made_for:?}, not this one ({fingerprint}); \
             run `fleet-retire policy mutate --format json` on this set again"
        )));
    }
    if report["judged_by"].as_str() != Some(judged_by) {
        return Err(bad(
            "the mutants were judged by other properties or fixture cases than this page's \
             (the folder's properties/, --fixtures); run `policy mutate --format json` with the \
             same --fixtures again"
                .into(),
        ));
    }
    let judged: Vec<Judged> = serde_json::from_value(report["outcomes"].clone()).map_err(|e| {
        bad(format!(
            "not the output of `policy mutate --format json` ({e})"
        ))
    })?;
    if judged.iter().any(|m| m.location.is_none()) {
        return Err(bad(
            "its mutants carry no place in the policy text (an older fleet-retire wrote it); \
             run `policy mutate --format json` again"
                .into(),
        ));
    }
    Ok(judged)
}

/// The grants matrix (with `--profiles`), and who pins the set.
pub fn grants(
    args: &ReportArgs,
    policies: &crate::policy::Policies,
) -> Result<(Option<GrantsSeen>, Option<String>)> {
    let Some(path) = &args.profiles else {
        return Ok((None, None));
    };
    let profiles = crate::capability::Profiles::load(path)?;
    let now = crate::capability::grants(policies, &profiles)?;
    let against = match &args.against {
        Some(old) => Some((
            old.display().to_string(),
            crate::capability::grants(policies, &crate::capability::Profiles::load(old)?)?,
        )),
        None => None,
    };
    let known = crate::capability::known::Known::of(policies, crate::launcher::NAMESPACES);
    // Quoted as they are: the page escapes only what hides or reorders text.
    let warnings =
        crate::capability::warnings_quoted(&profiles, &known, &|s: &str| format!("\"{s}\""));
    let pinned = profiles
        .policy_pins
        .contains(&policies.fingerprint)
        .then(|| format!("policy_pins of {}", path.display()));
    let seen = GrantsSeen {
        file: path.display().to_string(),
        now,
        against,
        warnings,
    };
    Ok((Some(seen), pinned))
}

/// With `--base REV`: the base compared with the set (as `policy diff REV`
/// proves it), its property files, and the fixture verdicts that move.
/// A base that cannot be compared (it does not load, or its policies do
/// not type-check under this set's schema) is not an error: the page
/// says why, as a reason not to sign.
pub fn base(
    args: &ReportArgs,
    policies: &crate::policy::Policies,
    fixture_files: &[PathBuf],
    property_files: &[String],
) -> Option<BaseSeen> {
    let rev = args.base.as_ref()?;
    let compared = compare(rev, policies, fixture_files, property_files).map_err(|e| e.to_string());
    Some(BaseSeen {
        name: rev.clone(),
        compared,
    })
}

fn compare(
    rev: &str,
    policies: &crate::policy::Policies,
    fixture_files: &[PathBuf],
    property_files: &[String],
) -> Result<Compared> {
    let old = crate::diff::load_named(rev)?;
    let diff = crate::diff::diff(&old, policies)?;
    let moved = match fixture_files.is_empty() {
        true => None,
        false => Some(crate::diff::observe_fixtures(
            &old,
            policies,
            fixture_files,
        )?),
    };
    let old_properties = property_files
        .iter()
        .filter_map(|name| crate::diff::named_file(rev, name).map(|text| (name.clone(), text)))
        .collect();
    Ok(Compared {
        old,
        diff,
        old_properties,
        moved,
    })
}

/// Every fixture file run under the set, as `fleet-retire test` runs it.
pub fn fixtures(policies: &crate::policy::Policies, files: &[PathBuf]) -> Vec<FixtureRun> {
    files
        .iter()
        .map(|file| {
            let shown = file.display().to_string();
            match crate::cli::test::differences(policies, file) {
                Ok((name, differences)) => FixtureRun {
                    file: shown,
                    case: Some(name),
                    problems: differences.iter().map(ToString::to_string).collect(),
                },
                Err(e) => FixtureRun {
                    file: shown,
                    case: None,
                    problems: vec![e.to_string()],
                },
            }
        })
        .collect()
}
