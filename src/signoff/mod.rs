//! `policy report --out DIR`: one static page a reviewer opens from disk
//! and attaches to a sign-off. It opens with a verdict, **Ready to sign**
//! or **Not ready to sign**, and every reason, each linked to its place on
//! the page ([`verdict`]); then, with `--base`, the change itself
//! ([`change`]: the proved difference per action with a counterexample
//! each, the fixture verdicts that move, each changed file as a diff in
//! the source view); the failing proofs, each once, with the change that
//! breaks it ([`blame`], [`failing`]); the failing fixtures; every policy
//! with its proofs, fixture coverage and mutants ([`rows`]); the grants
//! ([`grants`]); and every policy and property file line by line
//! ([`lines`]).
//!
//! The page is rendered by askama from `page.html`, which escapes every
//! value; it holds no script and its content security policy forbids
//! fetching anything, so it works from a `file://` URL with no network.

pub mod blame;
mod cex;
mod change;
mod failing;
mod grants;
mod linediff;
mod lines;
mod rows;
mod verdict;
mod view;

pub use blame::Blame;
pub use verdict::Verdict;
pub use view::Reason;

use crate::capability::Grants as Matrix;
use crate::coverage::Coverage;
use crate::diff::{Observed, PolicyDiff};
use crate::mutate::locate::Span;
use crate::policy::Policies;
use crate::verify::{Property, Verification};
use askama::Template;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use view::Page;

/// One judged mutant, as `policy mutate --format json` writes it (so a
/// run kept from CI and one made now read alike).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Judged {
    /// The mutated policy's `@id`.
    pub policy: String,
    /// The operator.
    pub operator: String,
    /// The mutated place, before.
    pub before: String,
    /// After.
    pub after: String,
    /// Where it stands in its file.
    pub location: Option<Span>,
    /// `killed`, `survived`, `equivalent` or `invalid`.
    pub status: String,
    /// What killed it.
    pub killed_by_property: Option<String>,
    /// What killed it.
    pub killed_by_fixture: Option<String>,
    /// For a survivor, the case that would kill it.
    pub witness: Option<Json>,
    /// For a survivor, its witness in one sentence.
    #[serde(default)]
    pub sentence: Option<String>,
    /// For a survivor, the witness's deciding attributes.
    #[serde(default)]
    pub deciding: Vec<String>,
}

/// The capability grants and what changed.
pub struct GrantsSeen {
    /// The profiles file, as named.
    pub file: String,
    /// profile → operation → allowed.
    pub now: Matrix,
    /// With `--against`: the earlier file and its grants.
    pub against: Option<(String, Matrix)>,
    /// What `grants` warns of in the file (profile, warning).
    pub warnings: Vec<(String, String)>,
}

/// The base revision (`--base`), compared or not.
pub struct BaseSeen {
    /// The revision or folder, as named.
    pub name: String,
    /// The comparison, or why there is none (the base does not load, or
    /// its policies do not type-check under this set's schema).
    pub compared: std::result::Result<Compared, String>,
}

/// The base, compared with the set.
pub struct Compared {
    /// The base's policies.
    pub old: Policies,
    /// The difference, as `policy diff BASE` proves it.
    pub diff: PolicyDiff,
    /// The base's property files, by their name in a policy folder
    /// (`properties/retirement.cedar`).
    pub old_properties: BTreeMap<String, String>,
    /// The fixture verdicts that move from the base to the set; `None`
    /// when no fixtures were given.
    pub moved: Option<Vec<Observed>>,
}

/// One fixture file, run under the set as `fleet-retire test` runs it.
pub struct FixtureRun {
    /// The file.
    pub file: String,
    /// The case's name, when the file could be read as one.
    pub case: Option<String>,
    /// What differs from its expectations, or why it could not run; empty
    /// when it passes.
    pub problems: Vec<String>,
}

/// Everything the page reports.
pub struct Evidence<'a> {
    /// The set.
    pub policies: &'a Policies,
    /// The folder it was read from (`--policies`), if not built in.
    pub folder: Option<String>,
    /// Who pinned it, when a profiles file does.
    pub pinned_by: Option<String>,
    /// The properties proved.
    pub properties: &'a [Property],
    /// The property files' texts: (name in the folder, text).
    pub property_texts: Vec<(String, String)>,
    /// The proofs.
    pub verification: &'a Verification,
    /// The fixture coverage, when fixtures were given.
    pub coverage: Option<&'a Coverage>,
    /// `--min-coverage`: below it, each forbid not covered is a reason.
    pub min_coverage: Option<u8>,
    /// Every fixture file, run.
    pub fixtures: Vec<FixtureRun>,
    /// The judged mutants, or why there are none.
    pub mutants: Result<Vec<Judged>, String>,
    /// The grants, with `--profiles`.
    pub grants: Option<GrantsSeen>,
    /// The base, with `--base`.
    pub base: Option<BaseSeen>,
    /// Per failing property (or `never-errors:` proof), the policies that
    /// break it.
    pub blame: BTreeMap<String, Blame>,
}

impl Evidence<'_> {
    /// The base, when it was compared.
    fn compared(&self) -> Option<(&str, &Compared)> {
        let base = self.base.as_ref()?;
        base.compared.as_ref().ok().map(|c| (base.name.as_str(), c))
    }

    /// How a command line names the set reviewed: its folder, or the
    /// `policies` folder the built-in set is built from.
    fn reviewed(&self) -> String {
        self.folder.clone().unwrap_or_else(|| "policies".into())
    }

    /// `--policies DIR ` for a command about the set reviewed, or nothing.
    fn policies_flag(&self) -> String {
        self.folder
            .as_ref()
            .map_or_else(String::new, |f| format!("--policies {f} "))
    }
}

/// The page, rendered, and its verdict.
pub fn render(e: &Evidence) -> Result<(String, Verdict), askama::Error> {
    let page = page(e);
    let verdict = Verdict {
        ready: page.reasons.is_empty(),
        reasons: page.reasons.clone(),
    };
    Ok((page.render()?, verdict))
}

fn page(e: &Evidence) -> Page {
    let mutants = e.mutants.as_deref().unwrap_or_default();
    let policies = rows::policy_rows(e, mutants);
    let grants = e
        .grants
        .as_ref()
        .map(|g| grants::matrix(g, e.properties, e.verification));
    let failing = failing::failing(e);
    let fixtures = failing::fixtures(e);
    let change = change::change(e);
    let reasons = verdict::reasons(
        e,
        mutants,
        &verdict::Found {
            change: change.as_ref(),
            failing: &failing,
            fixtures: &fixtures,
            grants: grants.as_ref(),
            policies: &policies,
        },
    );
    Page {
        version: env!("CARGO_PKG_VERSION"),
        ready: reasons.is_empty(),
        reasons,
        fingerprint: e.policies.fingerprint.clone(),
        source: visible(&source(e)),
        summary: summary(e, mutants),
        notes: notes(e),
        change,
        failing,
        fixtures,
        files: lines::files(e, mutants, &policies),
        policies,
        grants,
    }
}

/// What was not run, and why, so an empty column is never mistaken for a
/// clean one.
fn notes(e: &Evidence) -> Vec<String> {
    let mut notes = Vec::new();
    if e.coverage.is_none() {
        notes.push(
            "No fixtures were run (--fixtures PATH): the coverage column is empty.".to_string(),
        );
    }
    if let Err(why) = &e.mutants {
        notes.push(format!("Mutants were not judged: {why}."));
    }
    if e.grants.is_none() {
        notes.push("No profiles.json was given (--profiles): no grants matrix.".to_string());
    }
    if e.base.is_none() {
        notes.push(
            "No base was given (--base REV): the change against the last signed set is not shown."
                .to_string(),
        );
    }
    notes
}

/// Where the set comes from, and who pins it.
fn source(e: &Evidence) -> String {
    let Some(folder) = &e.folder else {
        return "the set built into fleet-retire".into();
    };
    if e.policies.is_builtin() {
        return format!(
            "the folder {folder}, whose policy files are the built-in set's (its properties/ \
             are its own)"
        );
    }
    match &e.pinned_by {
        Some(by) => format!("the folder {folder}, pinned by {by}"),
        None => format!(
            "the folder {folder} (not the built-in set; no profiles.json given here pins it)"
        ),
    }
}

/// A text as the page shows it: characters that would hide or reorder
/// what a reviewer reads (bidirectional marks, overrides and isolates,
/// zero-width marks, and controls other than a tab or a line break, which
/// print nothing) written as `\u{…}`, as every terminal output of
/// fleet-retire writes them; everything else, printable text and line
/// breaks, as it is (askama escapes the markup).
pub fn visible(s: &str) -> String {
    let hidden = |c: char| {
        (c.is_control() && c != '\t' && c != '\n')
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}' | '\u{feff}')
    };
    if !s.chars().any(hidden) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if hidden(c) {
                format!("\\u{{{:x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The headline figures.
fn summary(e: &Evidence, mutants: &[Judged]) -> Vec<(String, String)> {
    let proofs = &e.verification.proofs;
    let failed = proofs.iter().filter(|p| !p.holds).count();
    let count = |s: &str| mutants.iter().filter(|m| m.status == s).count();
    let (killed, survived) = (count("killed"), count("survived"));
    let mut out = vec![
        ("policies".into(), e.policies.rules.len().to_string()),
        (
            "proofs".into(),
            format!("{} proved, {failed} failed", proofs.len() - failed),
        ),
    ];
    if let Some(c) = e.coverage {
        out.push((
            "fixture cases".into(),
            format!(
                "{} run; forbids deciding or proved never to: {:.1} %",
                c.cases, c.forbids_deciding_percent
            ),
        ));
    }
    if e.mutants.is_ok() {
        let counted = killed + survived;
        let score = if counted == 0 {
            100.0
        } else {
            killed as f64 * 100.0 / counted as f64
        };
        out.push((
            "mutants".into(),
            format!(
                "{killed} killed, {survived} survived, {} equivalent; score {score:.1} %",
                count("equivalent")
            ),
        ));
    }
    out
}
