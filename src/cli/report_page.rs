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
    // The folder first: a page that cannot be written is said before the
    // minutes the proofs and mutants may take.
    std::fs::create_dir_all(&args.out).map_err(Error::io(&args.out, "cannot create the folder"))?;
    let policies = cli.load_policies()?;
    let dir = cli.policies.as_deref();
    let own_properties = dir.is_some_and(|d| d.join("properties").is_dir());
    // Proved as `policy verify` proves: the built-in properties always, a
    // folder's own beside them.
    let properties = crate::verify::load_properties(dir, &policies, true)?;
    let mut property_texts: Vec<(String, String)> = crate::verify::property_files(None)?
        .into_iter()
        .map(|(name, text, _)| (format!("built-in {name}"), text))
        .collect();
    if own_properties {
        property_texts.extend(
            crate::verify::property_files(dir)?
                .into_iter()
                .map(|(name, text, _)| (name, text)),
        );
    }
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
    // Judged as `policy mutate` judges: a folder with properties of its own
    // by those alone.
    let judges = crate::verify::load_properties(dir, &policies, !own_properties)?;
    let mutants = mutants(args, &policies, &judges, failed)?;
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
        folder: dir.map(|d| d.display().to_string()),
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
    say_written(
        cli,
        &written,
        policies.rules.len(),
        verification.proofs.len(),
        failed,
    )?;
    Ok(ExitCode::Ok)
}

/// Where the page is, for a person or as JSON.
fn say_written(
    cli: &Cli,
    page: &Path,
    policies: usize,
    proofs: usize,
    failed: usize,
) -> Result<()> {
    if cli.format == crate::cli::Format::Json {
        return crate::outln!(
            "{}",
            serde_json::json!({"page": page, "policies": policies, "proofs": proofs, "failed": failed})
        );
    }
    let shown = crate::text::esc(&page.display().to_string()).into_owned();
    crate::outln!(
        "wrote {shown} ({policies} policies, {proofs} proofs, {failed} failed); open it in a \
         browser: {}",
        file_url(page)
    )
}

/// A `file://` URL for a path, every byte that is not unreserved encoded.
fn file_url(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The mutants: judged now (`--mutate`), read from a run kept earlier
/// (`--mutants`), or why there are none.
fn mutants(
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
        Some(old) => Some((
            old.display().to_string(),
            crate::capability::grants(policies, &crate::capability::Profiles::load(old)?)?,
        )),
        None => None,
    };
    let known = crate::capability::known::Known::of(policies, crate::launcher::NAMESPACES);
    let warnings = crate::capability::warnings_by_profile(&profiles, &known);
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

/// Write the page as DIR/index.html.
fn write(dir: &Path, page: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create the folder"))?;
    let path = dir.join("index.html");
    crate::outfile::replace(&path, page.as_bytes())
        .map_err(Error::io(&path, "cannot write the page"))?;
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}
