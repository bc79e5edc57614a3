//! `fleet-retire policy report --out DIR`: gather the proofs, the fixture
//! coverage, the mutants, the grants and the difference from a base, and
//! write the reviewer's page (`signoff`) as DIR/index.html.

use super::report_gather as gather;
use crate::cli::Cli;
use crate::error::{Error, ExitCode, Result};
use crate::signoff::Evidence;
use std::path::{Path, PathBuf};

pub use super::report_gather::ReportArgs;

/// Run `policy report`: exit 0 when the page says "Ready to sign", 2 when
/// it says "Not ready to sign" (as `policy diff` exits 2 on a loosening).
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
    let property_texts = property_texts(dir, own_properties)?;
    let verification = crate::verify::verify(&policies, &properties)?;
    let files = match args.fixtures.is_empty() {
        true => Vec::new(),
        false => crate::fixture::collect(&args.fixtures)?,
    };
    let coverage = coverage(&policies, &files)?;
    let failed = verification.proofs.iter().filter(|p| !p.holds).count();
    // Judged as `policy mutate` judges: a folder with properties of its own
    // by those alone.
    let judges = crate::verify::load_properties(dir, &policies, !own_properties)?;
    let mutants = gather::mutants(args, &policies, &judges, failed)?;
    let (grants, pinned_by) = gather::grants(args, &policies)?;
    let names: Vec<String> = property_texts
        .iter()
        .map(|(n, _)| n.trim_start_matches("built-in ").to_string())
        .collect();
    let base = gather::base(args, &policies, &files, &names);
    let old = base
        .as_ref()
        .and_then(|b| b.compared.as_ref().ok().map(|c| (b.name.as_str(), &c.old)));
    let blame = crate::signoff::blame::blame(&policies, &properties, &verification, old)?;
    let evidence = Evidence {
        policies: &policies,
        folder: dir.map(|d| d.display().to_string()),
        pinned_by,
        properties: &properties,
        property_texts,
        verification: &verification,
        coverage: coverage.as_ref(),
        min_coverage: args.min_coverage,
        fixtures: gather::fixtures(&policies, &files),
        mutants,
        grants,
        base,
        blame,
    };
    let (page, verdict) = crate::signoff::render(&evidence).map_err(|e| Error::Internal {
        doing: "rendering the reviewer's page".into(),
        source: Box::new(e),
    })?;
    let written = write(&args.out, &page)?;
    say_written(cli, &written, &verdict, verification.proofs.len(), failed)?;
    Ok(if verdict.ready {
        ExitCode::Ok
    } else {
        ExitCode::Refused
    })
}

/// The property files the page lists: the built-in ones, then a folder's
/// own.
fn property_texts(dir: Option<&Path>, own: bool) -> Result<Vec<(String, String)>> {
    let mut texts: Vec<(String, String)> = crate::verify::property_files(None)?
        .into_iter()
        .map(|(name, text, _)| (format!("built-in {name}"), text))
        .collect();
    if own {
        texts.extend(
            crate::verify::property_files(dir)?
                .into_iter()
                .map(|(name, text, _)| (name, text)),
        );
    }
    Ok(texts)
}

/// The fixtures' coverage of each policy, when fixtures were given.
fn coverage(
    policies: &crate::policy::Policies,
    files: &[PathBuf],
) -> Result<Option<crate::coverage::Coverage>> {
    if files.is_empty() {
        return Ok(None);
    }
    let proved = crate::coverage::Proved::prove(policies)?;
    crate::coverage::coverage(policies, files, Some(&proved)).map(Some)
}

/// The verdict and its reasons, and where the page is, for a person or as
/// JSON.
fn say_written(
    cli: &Cli,
    page: &Path,
    verdict: &crate::signoff::Verdict,
    proofs: usize,
    failed: usize,
) -> Result<()> {
    if cli.format == crate::cli::Format::Json {
        return crate::outln!(
            "{}",
            serde_json::json!({"page": page, "ready": verdict.ready, "reasons": verdict.reasons,
                               "proofs": proofs, "failed": failed})
        );
    }
    crate::outln!("{}", verdict.headline())?;
    for r in &verdict.reasons {
        crate::outln!("  - {}", crate::text::esc(&r.text))?;
    }
    let shown = crate::text::esc(&page.display().to_string()).into_owned();
    crate::outln!(
        "wrote {shown} ({proofs} proofs, {failed} failed); open it in a browser: {}",
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

/// Write the page as DIR/index.html.
fn write(dir: &Path, page: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create the folder"))?;
    let path = dir.join("index.html");
    crate::outfile::replace(&path, page.as_bytes())
        .map_err(Error::io(&path, "cannot write the page"))?;
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}
