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

mod view;

use crate::capability::{Grants as Matrix, Operation};
use crate::coverage::Coverage;
use crate::diff::PolicyDiff;
use crate::mutate::locate::Span;
use crate::policy::Policies;
use crate::verify::{Property, Verification};
use askama::Template;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use view::{Attention, File, GrantCell, GrantRow, Line, Note, Page, PolicyRow, ProofMark};

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

/// What an edit of profiles.json changed: (profile, operation, now
/// allowed).
pub type GrantChanges = Vec<(String, String, bool)>;

/// The capability grants and what changed.
pub struct GrantsSeen {
    /// The profiles file, as named.
    pub file: String,
    /// profile → operation → allowed.
    pub now: Matrix,
    /// With `--against`: the file, and (profile, operation, now allowed).
    pub against: Option<(String, GrantChanges)>,
}

/// Everything the page reports.
pub struct Evidence<'a> {
    /// The set.
    pub policies: &'a Policies,
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
        source: match (&e.pinned_by, e.policies.is_builtin()) {
            (_, true) => "the set built into fleet-retire".to_string(),
            (Some(by), false) => format!("the folder {}, pinned by {by}", e.policies.origin),
            (None, false) => format!(
                "the folder {} (not the built-in set; no profiles.json given here pins it)",
                e.policies.origin
            ),
        },
        summary: summary(e, mutants),
        notes,
        attention: attention(e, mutants),
        base: e.base.as_ref().map(|(name, d)| base(name, d)),
        files: files(e, mutants),
        policies: rows,
        grants: e
            .grants
            .as_ref()
            .map(|g| grants(g, e.properties, e.verification)),
    }
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
            id: id.to_string(),
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
                anchor: line_anchor(&r.file, r.line),
                file: r.file.clone(),
                line: r.line,
                effect: match (r.effect, r.reason) {
                    (cedar_policy::Effect::Permit, _) => "permit".into(),
                    (_, Some(reason)) => format!("forbid ({})", reason.code()),
                    (_, None) => "forbid".into(),
                },
                description: r.description.clone(),
                proved: proofs.iter().filter(|p| p.holds).count(),
                failed: proofs.iter().filter(|p| !p.holds).count(),
                proofs,
                fired: covered.map(|c| c.fired.len()),
                decided: covered.map(|c| c.decided.len()),
                mutated: e.mutants.is_ok() && !own.is_empty(),
                killed: count("killed"),
                equivalent: count("equivalent"),
                survived: count("survived"),
                id: r.id.clone(),
            }
        })
        .collect()
}

/// A note for each mutant that survived or was proved equivalent, at the
/// first line of its mutated text.
fn mutant_notes(mutants: &[Judged], e: &Evidence, file: &str) -> BTreeMap<usize, Vec<Note>> {
    let mut out: BTreeMap<usize, Vec<Note>> = BTreeMap::new();
    for m in mutants {
        let in_file = e
            .policies
            .rules
            .get(&cedar_policy::PolicyId::new(&m.policy))
            .is_some_and(|r| r.file == file);
        let kind = match m.status.as_str() {
            "survived" => "survivor",
            "equivalent" => "equivalent",
            _ => continue,
        };
        let Some(at) = m.location.filter(|_| in_file) else {
            continue;
        };
        out.entry(at.start.0).or_default().push(Note {
            kind,
            text: format!(
                "{} mutant of {} ({}: {} → {})",
                if kind == "survivor" {
                    "SURVIVING"
                } else {
                    "equivalent"
                },
                m.policy,
                m.operator,
                m.before,
                m.after
            ),
            detail: m
                .witness
                .as_ref()
                .map(|w| serde_json::to_string_pretty(w).unwrap_or_default())
                .unwrap_or_default(),
        });
    }
    out
}

/// A note for each property proof at its property's line.
fn proof_notes(e: &Evidence, file: &str) -> BTreeMap<usize, Vec<Note>> {
    let mut out: BTreeMap<usize, Vec<Note>> = BTreeMap::new();
    for p in &e.verification.proofs {
        if crate::sarif::in_folder(&p.file) != file {
            continue;
        }
        out.entry(p.line).or_default().push(Note {
            kind: if p.holds { "proved" } else { "failing" },
            text: format!(
                "{} {} [{}]",
                if p.holds { "proved" } else { "FAILED" },
                p.id,
                p.request_env
            ),
            detail: p.counterexample.clone().unwrap_or_default(),
        });
    }
    out
}

fn files(e: &Evidence, mutants: &[Judged]) -> Vec<File> {
    let mut texts: Vec<(String, String)> = e
        .policies
        .texts
        .iter()
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    texts.sort();
    texts.extend(e.property_texts.iter().cloned());
    texts
        .into_iter()
        .map(|(name, text)| {
            let mut notes = mutant_notes(mutants, e, &name);
            for (line, more) in proof_notes(e, &name) {
                notes.entry(line).or_default().extend(more);
            }
            let spans: Vec<(usize, usize, &str)> = e
                .policies
                .rules
                .values()
                .filter(|r| r.file == name)
                .map(|r| (r.line, r.end_line, r.id.as_str()))
                .collect();
            let lines = text
                .lines()
                .enumerate()
                .map(|(i, t)| {
                    let number = i + 1;
                    let within = spans.iter().find(|s| s.0 <= number && number <= s.1);
                    let notes = notes.remove(&number).unwrap_or_default();
                    Line {
                        number,
                        text: t.to_string(),
                        anchor: line_anchor(&name, number),
                        head: within.is_some_and(|s| s.0 == number),
                        policy: within.map_or(String::new(), |s| s.2.to_string()),
                        mark: line_mark(&notes),
                        notes,
                    }
                })
                .collect();
            File { name, lines }
        })
        .collect()
}

/// The anchor of line `line` of `file`: `L-retirement-cedar-232`.
pub fn line_anchor(file: &str, line: usize) -> String {
    let slug: String = file
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("L-{slug}-{line}")
}

/// At most this many entries under "Needs attention".
const ATTENTION_SHOWN: usize = 200;

/// Every failing proof (once per property) and every survivor, in file
/// order, each linked to its line.
fn attention(e: &Evidence, mutants: &[Judged]) -> Vec<Attention> {
    let mut out: Vec<(String, usize, String)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for p in e.verification.proofs.iter().filter(|p| !p.holds) {
        let file = crate::sarif::in_folder(&p.file);
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
            text,
            anchor: line_anchor(&file, line),
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

/// How a line is marked: a survivor outranks a failing proof.
fn line_mark(notes: &[Note]) -> &'static str {
    if notes.iter().any(|n| n.kind == "survivor") {
        "survivor"
    } else if notes.iter().any(|n| n.kind == "failing") {
        "failing"
    } else {
        ""
    }
}

fn grants(g: &GrantsSeen, properties: &[Property], v: &Verification) -> view::Grants {
    let operations: Vec<String> = Operation::ALL.iter().map(|o| o.code().into()).collect();
    let proofs_about = |op: &str| -> String {
        let about: Vec<String> = properties
            .iter()
            .filter(|p| p.subject == "capabilities.cedar")
            .filter(|p| crate::diff::names_action(&p.policy, op))
            .map(|p| {
                let holds = v.proofs.iter().filter(|x| x.id == p.id).all(|x| x.holds);
                format!("{} {}", p.id, if holds { "proved" } else { "FAILED" })
            })
            .collect();
        about.join("; ")
    };
    let changes = g
        .against
        .as_ref()
        .map(|(_, c)| c.as_slice())
        .unwrap_or_default();
    let rows = g
        .now
        .iter()
        .map(|(profile, ops)| GrantRow {
            profile: profile.clone(),
            cells: operations
                .iter()
                .map(|op| GrantCell {
                    operation: op.clone(),
                    allowed: ops.get(op).copied().unwrap_or(false),
                    change: changes
                        .iter()
                        .find(|(p, o, _)| p == profile && o == op)
                        .map_or("", |(_, _, now)| if *now { "granted" } else { "revoked" }),
                    proofs: proofs_about(op),
                })
                .collect(),
        })
        .collect();
    view::Grants {
        file: g.file.clone(),
        against: g.against.as_ref().map(|(f, _)| f.clone()),
        operations,
        rows,
    }
}

fn base(name: &str, d: &PolicyDiff) -> view::Base {
    view::Base {
        name: name.to_string(),
        overall: d.overall().word().to_string(),
        loosened: d.overall().loosens(),
        actions: d
            .actions
            .iter()
            .map(|a| (a.action.clone(), a.change.word().to_string()))
            .collect(),
        changed: d
            .policies
            .iter()
            .filter(|p| p.status != "unchanged")
            .map(|p| format!("{} ({})", p.id, p.status))
            .collect(),
    }
}
