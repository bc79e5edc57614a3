//! `policy report --out DIR`: one static page a reviewer opens from disk
//! and attaches to a sign-off. It shows the set's fingerprint and source,
//! every policy and property file line by line, each policy with its
//! proofs, its fixture coverage and its mutants (a survivor marked at the
//! line of the mutated text, a failing property at its own line), the
//! capability grants as a matrix, and the proved difference from a base.
//!
//! The page is rendered by askama from `page.html`, which escapes every
//! value; it holds no script and its content security policy forbids
//! fetching anything, so it works from a `file://` URL with no network.

mod grants;
mod lines;
mod view;

use crate::capability::Grants as Matrix;
use crate::coverage::Coverage;
use crate::diff::PolicyDiff;
use crate::mutate::locate::Span;
use crate::policy::Policies;
use crate::verify::{Property, Verification};
use askama::Template;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use view::{Attention, Page, PolicyRow, ProofMark};

/// One judged mutant, as `policy mutate --format json` writes it (so a
/// run kept from CI and one made now read alike).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Judged {
    /// The mutated policy's `@id`.
    pub policy: String,
    /// The operator.
    pub operator: String,
    /// The mutated place, before and after.
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
    /// The judged mutants, or why there are none.
    pub mutants: Result<Vec<Judged>, String>,
    /// The grants, with `--profiles`.
    pub grants: Option<GrantsSeen>,
    /// The proved difference from a base, with its name.
    pub base: Option<(String, PolicyDiff)>,
}

/// The page, rendered.
pub fn render(e: &Evidence) -> Result<String, askama::Error> {
    page(e).render()
}

fn page(e: &Evidence) -> Page {
    let mutants = e.mutants.as_deref().unwrap_or_default();
    let rows = policy_rows(e, mutants);
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
    Page {
        version: env!("CARGO_PKG_VERSION"),
        fingerprint: e.policies.fingerprint.clone(),
        source: visible(&source(e)),
        summary: summary(e, mutants),
        notes,
        attention: attention(e, mutants),
        base: e.base.as_ref().map(|(name, d)| base(name, d)),
        files: lines::files(e, mutants),
        policies: rows,
        grants: e
            .grants
            .as_ref()
            .map(|g| grants::matrix(g, e.properties, e.verification)),
    }
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
/// what a reviewer reads (controls, bidirectional overrides and isolates,
/// zero-width marks) written as `\u{…}`, as every terminal output of
/// fleet-retire writes them; everything else as it is (askama escapes the
/// markup).
pub fn visible(s: &str) -> String {
    let hidden = |c: char| {
        (c.is_control() && c != '\t')
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

/// Whether two policies can apply to a common action.
fn share_an_action(a: &cedar_policy::Policy, b: &cedar_policy::Policy) -> bool {
    use cedar_policy::ActionConstraint::{Any, Eq, In};
    let list = |p: &cedar_policy::Policy| match p.action_constraint() {
        Any => None,
        Eq(uid) => Some(vec![uid]),
        In(uids) => Some(uids),
    };
    match (list(a), list(b)) {
        (Some(x), Some(y)) => x.iter().any(|u| y.contains(u)),
        _ => true,
    }
}

/// The proofs about one policy: the properties over its file that share
/// an action with it, and its never-errors proof.
fn proofs_of(e: &Evidence, id: &str, file: &str) -> Vec<ProofMark> {
    let Some(policy) = e.policies.set.policy(&cedar_policy::PolicyId::new(id)) else {
        return Vec::new();
    };
    let about: Vec<&str> = e
        .properties
        .iter()
        .filter(|p| p.subject == file && share_an_action(&p.policy, policy))
        .map(|p| p.id.as_str())
        .collect();
    let never_errors = format!("never-errors:{id}");
    let mut marks: BTreeMap<&str, bool> = BTreeMap::new();
    for p in &e.verification.proofs {
        if about.contains(&p.id.as_str()) || p.id == never_errors {
            *marks.entry(p.id.as_str()).or_insert(true) &= p.holds;
        }
    }
    marks
        .into_iter()
        .map(|(id, holds)| ProofMark {
            id: visible(id),
            holds,
        })
        .collect()
}

fn policy_rows(e: &Evidence, mutants: &[Judged]) -> Vec<PolicyRow> {
    let mut rules: Vec<&crate::policy::Rule> = e.policies.rules.values().collect();
    rules.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    rules
        .into_iter()
        .map(|r| {
            let proofs = proofs_of(e, &r.id, &r.file);
            let covered = e
                .coverage
                .and_then(|c| c.policies.iter().find(|p| p.id == r.id));
            let own: Vec<&Judged> = mutants.iter().filter(|m| m.policy == r.id).collect();
            let count = |s: &str| own.iter().filter(|m| m.status == s).count();
            PolicyRow {
                anchor: lines::anchor(e, &r.file, r.line),
                file: visible(&r.file),
                line: r.line,
                effect: match (r.effect, r.reason) {
                    (cedar_policy::Effect::Permit, _) => "permit".into(),
                    (_, Some(reason)) => format!("forbid ({})", reason.code()),
                    (_, None) => "forbid".into(),
                },
                description: visible(&r.description),
                proved: proofs.iter().filter(|p| p.holds).count(),
                failed: proofs.iter().filter(|p| !p.holds).count(),
                proofs,
                fired: covered.map(|c| c.fired.len()),
                decided: covered.map(|c| c.decided.len()),
                mutated: e.mutants.is_ok() && !own.is_empty(),
                killed: count("killed"),
                equivalent: count("equivalent"),
                survived: count("survived"),
                killers: killers(&own),
                id: visible(&r.id),
            }
        })
        .collect()
}

/// What killed a policy's mutants, each with how many, most first.
fn killers(own: &[&Judged]) -> Vec<String> {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for m in own.iter().filter(|m| m.status == "killed") {
        let killer = m
            .killed_by_property
            .as_deref()
            .or(m.killed_by_fixture.as_deref())
            .unwrap_or("?");
        *by.entry(killer).or_default() += 1;
    }
    let mut listed: Vec<(&str, usize)> = by.into_iter().collect();
    listed.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    listed
        .into_iter()
        .map(|(k, n)| visible(&format!("{k} ({n})")))
        .collect()
}

/// At most this many entries under "Needs attention".
const ATTENTION_SHOWN: usize = 200;

/// Every failing proof (once per property) and every survivor, in file
/// order, each linked to its line.
fn attention(e: &Evidence, mutants: &[Judged]) -> Vec<Attention> {
    let mut out: Vec<(String, usize, String)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for p in e.verification.proofs.iter().filter(|p| !p.holds) {
        let file = p.file.clone();
        if seen.insert((file.clone(), p.id.clone())) {
            let text = format!("{file}:{}: proof {} fails: {}", p.line, p.id, p.description);
            out.push((file, p.line, text));
        }
    }
    for m in mutants.iter().filter(|m| m.status == "survived") {
        let rule = e
            .policies
            .rules
            .get(&cedar_policy::PolicyId::new(&m.policy));
        let (Some(r), Some(at)) = (rule, m.location) else {
            continue;
        };
        let text = format!(
            "{}:{}: a mutant of {} survives ({}: {} → {})",
            r.file, at.start.0, m.policy, m.operator, m.before, m.after
        );
        out.push((r.file.clone(), at.start.0, text));
    }
    out.sort();
    let more = out.len().saturating_sub(ATTENTION_SHOWN);
    let mut shown: Vec<Attention> = out
        .into_iter()
        .take(ATTENTION_SHOWN)
        .map(|(file, line, text)| Attention {
            text: visible(&text),
            anchor: lines::anchor(e, &file, line),
        })
        .collect();
    if more > 0 {
        shown.push(Attention {
            text: format!("… and {more} more, each marked at its line below"),
            anchor: "policies".into(),
        });
    }
    shown
}

fn base(name: &str, d: &PolicyDiff) -> view::Base {
    view::Base {
        name: visible(name),
        overall: d.overall().word().to_string(),
        loosened: d.overall().loosens(),
        actions: d
            .actions
            .iter()
            .map(|a| (visible(&a.action), a.change.word().to_string()))
            .collect(),
        changed: d
            .policies
            .iter()
            .filter(|p| p.status != "unchanged")
            .map(|p| visible(&format!("{} ({})", p.id, p.status)))
            .collect(),
    }
}
