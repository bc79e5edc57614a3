//! `policy mutate`: which single-point changes of the policies the proofs
//! and fixtures would catch.
//!
//! Every mutant ([`generate`]) is first compared with the original by the
//! solver, per action it can touch: when every request is decided alike it
//! is **equivalent** and not counted (and when the mutated policy is a
//! forbid whose own matches did change, the mutant is equivalent only
//! because that forbid is shadowed: it is reported so). Otherwise it is
//! **killed** when a property fails or a fixture case fails under it, and
//! **survives** otherwise, with the solver's witness written as a
//! Cedar-level fixture case that expects the original's decision. A mutant
//! that does not type-check under the schema (or that the loader would
//! refuse) is **invalid** and not counted either.

pub mod generate;
mod judge;
pub mod locate;
pub mod render;

use crate::error::{About, Error, Result};
use crate::fixture::Case;
use crate::policy::Policies;
use crate::verify::Property;
use generate::{mutants_of, Mutant, Vocabulary};
use serde_json::Value as Json;
use std::path::PathBuf;

/// What became of one mutant.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// The mutated policy's `@id`.
    pub policy: String,
    /// The operator.
    pub operator: &'static str,
    /// The mutated place, before.
    pub before: String,
    /// After.
    pub after: String,
    /// Where the mutated place stands in its file (the whole policy when
    /// the mutated text is not found in it as written).
    pub location: Option<locate::Span>,
    /// `killed`, `survived`, `equivalent` or `invalid`.
    pub status: &'static str,
    /// Equivalent only because the mutated forbid is shadowed: its own
    /// matches moved (so a row's reason codes may), no decision did.
    pub shadowed: bool,
    /// The first property that fails under the mutant.
    pub killed_by_property: Option<String>,
    /// The first fixture case that fails under the mutant.
    pub killed_by_fixture: Option<String>,
    /// Per action whose decisions moved: `retire: loosening`, ...
    pub moved: Vec<String>,
    /// For a survivor: a request the mutant decides otherwise, as a fixture
    /// case expecting the original's decision (save it to kill the mutant),
    /// made plain ([`crate::counterexample`]).
    pub witness: Option<Json>,
    /// For a survivor: its witness in one sentence.
    pub sentence: Option<String>,
    /// For a survivor: the witness's deciding attributes.
    pub deciding: Vec<String>,
    /// For an invalid mutant: why.
    pub invalid: Option<String>,
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Where the policies came from.
    pub policies: String,
    /// Their fingerprint.
    pub fingerprint: String,
    /// What judged the mutants ([`judged_by`]): a run is read back
    /// (`policy report --mutants`) only by the same properties and cases.
    pub judged_by: String,
    /// How many properties and fixture cases could kill a mutant.
    pub properties: usize,
    /// Fixture cases run under every non-equivalent mutant.
    pub fixture_cases: usize,
    /// Mutants generated (all statuses).
    pub mutants: usize,
    /// Killed.
    pub killed: usize,
    /// Killed by some fixture but by no property.
    pub killed_by_fixture_only: usize,
    /// Survived.
    pub survived: usize,
    /// Equivalent to the original (not counted).
    pub equivalent: usize,
    /// Of those, equivalent only because a forbid is shadowed.
    pub equivalent_shadowed: usize,
    /// Invalid (not counted).
    pub invalid: usize,
    /// killed ÷ (killed + survived), in percent; 100 when nothing counts.
    pub score: f64,
    /// Every mutant, in policy file order.
    pub outcomes: Vec<Outcome>,
}

/// `sha256:` over the properties (id and text) and the fixture cases
/// (file and case) that judge mutants, in a fixed order: which mutants die
/// depends on them as much as on the policies.
pub fn judged_by(properties: &[Property], cases: &[(PathBuf, Case)]) -> String {
    use sha2::Digest;
    let mut parts: Vec<String> = properties
        .iter()
        .map(|p| format!("property\u{0}{}\u{0}{}", p.id, p.policy))
        .chain(
            cases
                .iter()
                .map(|(path, case)| format!("case\u{0}{}\u{0}{case:?}", path.display())),
        )
        .collect();
    parts.sort();
    let mut digest = sha2::Sha256::new();
    for part in &parts {
        digest.update(part.as_bytes());
        digest.update([0xff]);
    }
    format!("sha256:{}", crate::fingerprint::hex(&digest.finalize()))
}

/// Every mutant of the set, in policy file order.
pub fn mutants(policies: &Policies) -> Result<Vec<Mutant>> {
    let mut rules = policies.ordered_rules();
    rules.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    let mut jsons = Vec::new();
    for rule in &rules {
        let policy = policies
            .set
            .policy(&cedar_policy::PolicyId::new(&rule.id))
            .expect("every rule is in the set");
        let json = policy.to_json().map_err(|e| {
            Error::policy(About::Policy(rule.id.clone()), format!("{}: {e}", rule.id))
        })?;
        jsons.push((rule.id.clone(), json));
    }
    let vocab = Vocabulary::new(
        &jsons.iter().map(|(_, j)| j.clone()).collect::<Vec<_>>(),
        &schema_json(policies)?,
    );
    let mut all: Vec<Mutant> = jsons
        .iter()
        .flat_map(|(id, json)| mutants_of(id, json, &vocab))
        .collect();
    for m in &mut all {
        m.at = place_of(policies, m);
    }
    Ok(all)
}

/// Where a mutant's place stands in its policy file: the mutated text
/// when it is found among the policy's lines, else the whole policy.
fn place_of(policies: &Policies, m: &Mutant) -> Option<locate::Span> {
    let rule = policies
        .rules
        .get(&cedar_policy::PolicyId::new(&m.policy))?;
    let text = policies.texts.get(&rule.file)?;
    let body = locate::after_annotations(text, rule.line, rule.end_line);
    locate::locate(text, body, rule.end_line, &m.place, m.occurrence)
        .or_else(|| Some(locate::lines(text, rule.line, rule.end_line)))
}

fn schema_json(policies: &Policies) -> Result<Json> {
    let bad = |e: String| Error::policy(About::PolicySet, format!("the schema: {e}"));
    let (fragment, _) = cedar_policy::SchemaFragment::from_cedarschema_str(&policies.schema_text)
        .map_err(|e| bad(e.to_string()))?;
    fragment.to_json_value().map_err(|e| bad(e.to_string()))
}

/// Load the fixture cases that can kill a mutant (snapshot cases do not
/// read the policies and are left out).
pub fn load_cases(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Case)>> {
    let mut out = Vec::new();
    for file in crate::fixture::collect(paths)? {
        let case = crate::fixture::load(&file)?;
        if !matches!(case, Case::Snapshot(_)) {
            out.push((file, case));
        }
    }
    Ok(out)
}

/// Judge every mutant on `jobs` threads, each with its own solver.
/// Told how the judging goes, for a person watching (the CLI's progress
/// bar); `()` tells no one.
pub trait Progress: Sync {
    /// How many mutants there are to judge.
    fn start(&self, total: usize);
    /// One more is judged.
    fn judged(&self);
}

impl Progress for () {
    fn start(&self, _: usize) {}
    fn judged(&self) {}
}

/// Judge every mutant of the policies (those of `only`'s policies, when
/// given) on `jobs` threads, telling `progress`.
pub fn run(
    policies: &Policies,
    properties: &[Property],
    cases: &[(PathBuf, Case)],
    only: &[String],
    jobs: usize,
    progress: &dyn Progress,
) -> Result<Report> {
    refuse_failing_properties(policies, properties)?;
    let mut all = mutants(policies)?;
    if !only.is_empty() {
        let unknown: Vec<&String> = only
            .iter()
            .filter(|id| {
                !policies
                    .rules
                    .contains_key(&cedar_policy::PolicyId::new(id.as_str()))
            })
            .collect();
        if !unknown.is_empty() {
            return Err(Error::input(
                About::PolicySet,
                format!(
                    "--only names no policy of the set: {unknown:?}; `fleet-retire policy list` shows the ids"
                ),
            ));
        }
        all.retain(|m| only.contains(&m.policy));
    }
    let jobs = jobs.clamp(1, all.len().max(1));
    progress.start(all.len());
    let outcomes = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs)
            .map(|j| {
                let share: Vec<(usize, &Mutant)> =
                    all.iter().enumerate().skip(j).step_by(jobs).collect();
                scope.spawn(move || judge::judge_all(policies, properties, cases, share, progress))
            })
            .collect();
        let mut out: Vec<(usize, Outcome)> = Vec::new();
        for h in handles {
            out.extend(h.join().map_err(|_| Error::Internal {
                doing: "judging mutants".into(),
                source: "a judging thread panicked".into(),
            })??);
        }
        out.sort_by_key(|(i, _)| *i);
        Ok::<_, Error>(out.into_iter().map(|(_, o)| o).collect::<Vec<_>>())
    })?;
    let mut report = report(policies, properties.len(), cases.len(), outcomes);
    report.judged_by = judged_by(properties, cases);
    Ok(report)
}

/// A property the policies themselves break would "kill" every mutant:
/// stop instead, and say so.
fn refuse_failing_properties(policies: &Policies, properties: &[Property]) -> Result<()> {
    let failing: Vec<String> = crate::verify::prove(policies, properties)?
        .into_iter()
        .filter(|p| !p.holds)
        .map(|p| p.id)
        .collect();
    if failing.is_empty() {
        return Ok(());
    }
    Err(Error::policy(
        About::PolicySet,
        format!(
            "the policies break these properties themselves: {}; run `fleet-retire policy \
             verify`, fix the policies or the properties, and mutate again",
            failing.join(", ")
        ),
    ))
}

fn report(policies: &Policies, properties: usize, cases: usize, outcomes: Vec<Outcome>) -> Report {
    let count = |s: &str| outcomes.iter().filter(|o| o.status == s).count();
    let (killed, survived) = (count("killed"), count("survived"));
    Report {
        policies: policies.source_label(),
        fingerprint: policies.fingerprint.clone(),
        judged_by: String::new(),
        properties,
        fixture_cases: cases,
        mutants: outcomes.len(),
        killed,
        killed_by_fixture_only: outcomes
            .iter()
            .filter(|o| o.status == "killed" && o.killed_by_property.is_none())
            .count(),
        survived,
        equivalent: count("equivalent"),
        equivalent_shadowed: outcomes.iter().filter(|o| o.shadowed).count(),
        invalid: count("invalid"),
        score: if killed + survived == 0 {
            100.0
        } else {
            killed as f64 * 100.0 / (killed + survived) as f64
        },
        outcomes,
    }
}
