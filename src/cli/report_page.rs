//! `fleet-retire policy report --out DIR`: gather the proofs, the fixture
//! coverage, the mutants, the grants and the difference from a base, and
//! write the reviewer's page (`signoff`) as DIR/index.html.

use crate::cli::Cli;
use crate::error::{About, Error, ExitCode, Result};
use crate::signoff::{Evidence, GrantsSeen, Judged};
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
    /// as `policy diff BASE` does; shown at the top.
    #[arg(long, value_name = "REV")]
    pub base: Option<String>,
}

/// Run `policy report`.
pub fn run(cli: &Cli, args: &ReportArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let dir = cli.policies.as_deref();
    let own_properties = dir.is_some_and(|d| d.join("properties").is_dir());
    let properties = crate::verify::load_properties(dir, &policies, !own_properties)?;
    let property_texts = crate::verify::property_files(if own_properties { dir } else { None })?
        .into_iter()
        .map(|(name, text, _)| (name, text))
        .collect();
    let verification = crate::verify::verify(&policies, &properties)?;
    let fixtures = if args.fixtures.is_empty() {
        Vec::new()
    } else {
        crate::fixture::collect(&args.fixtures)?
    };
    let coverage = match fixtures.is_empty() {
        true => None,
        false => {
            let proved = crate::coverage::Proved::prove(&policies)?;
            Some(crate::coverage::coverage(
                &policies,
                &fixtures,
                Some(&proved),
            )?)
        }
    };
    let failed = verification.proofs.iter().filter(|p| !p.holds).count();
    let mutants = mutants(args, &policies, &properties, failed)?;
    let (grants, pinned_by) = grants(args, &policies)?;
    let base = match &args.base {
        Some(rev) => {
            let old = crate::diff::load_named(rev)?;
            Some((rev.clone(), crate::diff::diff(&old, &policies)?))
        }
        None => None,
    };
    let evidence = Evidence {
        policies: &policies,
        pinned_by,
        properties: &properties,
        property_texts,
        verification: &verification,
        coverage: coverage.as_ref(),
        mutants,
        grants,
        base,
    };
    let page = crate::signoff::render(&evidence).map_err(|e| Error::Internal {
        doing: "rendering the reviewer's page".into(),
        source: Box::new(e),
    })?;
    let written = write(&args.out, &page)?;
    if cli.format == crate::cli::Format::Json {
        crate::outln!(
            "{}",
            serde_json::json!({
                "page": written,
                "policies": policies.rules.len(),
                "proofs": verification.proofs.len(),
                "failed": failed,
            })
        )?;
    } else {
        crate::outln!(
            "wrote {} ({} policies, {} proofs, {failed} failed); open it in a browser: file://{}",
            crate::text::esc(&written.display().to_string()),
            policies.rules.len(),
            verification.proofs.len(),
            crate::text::esc(&written.display().to_string())
        )?;
    }
    Ok(ExitCode::Ok)
}

/// The mutants: judged now (`--mutate`), read from a run kept earlier
/// (`--mutants`), or why there are none.
fn mutants(
    args: &ReportArgs,
    policies: &crate::policy::Policies,
    properties: &[crate::verify::Property],
    failed: usize,
) -> Result<std::result::Result<Vec<Judged>, String>> {
    if let Some(file) = &args.mutants {
        return read_mutants(file, &policies.fingerprint).map(Ok);
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
    let cases = crate::mutate::load_cases(&args.fixtures)?;
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let run = crate::mutate::run(policies, properties, &cases, &args.only, jobs, &())?;
    let outcomes = serde_json::to_value(&run.outcomes).expect("outcomes serialise");
    Ok(Ok(
        serde_json::from_value(outcomes).expect("outcomes read back")
    ))
}

/// The outcomes of a `policy mutate --format json` run of this very set.
fn read_mutants(file: &Path, fingerprint: &str) -> Result<Vec<Judged>> {
    let bad = |message: String| Error::input(About::File(file.to_path_buf()), message);
    let (doc, _) = crate::jsonfile::read_json(file).map_err(|e| bad(e.to_string()))?;
    let made_for = doc["report"]["fingerprint"].as_str().unwrap_or("");
    if made_for != fingerprint {
        return Err(bad(format!(
            "{}: the mutants were judged for policy set {made_for:?}, not this one ({fingerprint}); \
             run `fleet-retire policy mutate --format json` on this set again",
            file.display()
        )));
    }
    serde_json::from_value(doc["report"]["outcomes"].clone()).map_err(|e| {
        bad(format!(
            "{}: not the output of `policy mutate --format json` ({e})",
            file.display()
        ))
    })
}

/// The grants matrix (with `--profiles`), and who pins the set.
fn grants(
    args: &ReportArgs,
    policies: &crate::policy::Policies,
) -> Result<(Option<GrantsSeen>, Option<String>)> {
    let Some(path) = &args.profiles else {
        return Ok((None, None));
    };
    let profiles = crate::capability::Profiles::load(path)?;
    let now = crate::capability::grants(policies, &profiles)?;
    let against = match &args.against {
        Some(old) => {
            let before =
                crate::capability::grants(policies, &crate::capability::Profiles::load(old)?)?;
            Some((
                old.display().to_string(),
                crate::capability::changes(&before, &now),
            ))
        }
        None => None,
    };
    let pinned = profiles
        .policy_pins
        .contains(&policies.fingerprint)
        .then(|| format!("policy_pins of {}", path.display()));
    let seen = GrantsSeen {
        file: path.display().to_string(),
        now,
        against,
    };
    Ok((Some(seen), pinned))
}

/// Write the page as DIR/index.html.
fn write(dir: &Path, page: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create the folder"))?;
    let path = dir.join("index.html");
    crate::outfile::replace(&path, page.as_bytes())
        .map_err(Error::io(&path, "cannot write the page"))?;
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}
