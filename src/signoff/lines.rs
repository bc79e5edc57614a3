//! The page's file listings: every policy and property file line by line,
//! each line with its anchor, the policy that spans it, and what is said of
//! it (a surviving or equivalent mutant at the start of the mutated text, a
//! proof at its property's first line).

use super::view::{File, Line, Note};
use super::{visible, Evidence, Judged};
use std::collections::BTreeMap;

/// The files in the order the page lists them: the policy files, then the
/// property files (the built-in ones named `built-in properties/…`).
pub fn order(e: &Evidence) -> Vec<(String, String)> {
    let mut texts: Vec<(String, String)> = e
        .policies
        .texts
        .iter()
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    texts.sort();
    texts.extend(e.property_texts.iter().cloned());
    texts
}

/// The anchor of line `line` of the `file`-th file listed: `L2-232`
/// (the policy files in name order, then the property files, as
/// [`order`] lists them).
pub fn anchor(e: &Evidence, file: &str, line: usize) -> String {
    let mut names: Vec<&String> = e.policies.texts.keys().collect();
    names.sort();
    let index = names
        .into_iter()
        .chain(e.property_texts.iter().map(|(n, _)| n))
        .position(|n| n == file)
        .unwrap_or(0);
    format!("L{index}-{line}")
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
        let word = if kind == "survivor" {
            "SURVIVING"
        } else {
            "equivalent"
        };
        out.entry(at.start.0).or_default().push(Note {
            kind,
            text: visible(&format!(
                "{word} mutant of {} ({}: {} → {})",
                m.policy, m.operator, m.before, m.after
            )),
            detail: m
                .witness
                .as_ref()
                .map(|w| visible(&serde_json::to_string_pretty(w).unwrap_or_default()))
                .unwrap_or_default(),
        });
    }
    out
}

/// A note for each proof whose property (or never-errors policy) starts
/// at a line of `file`.
fn proof_notes(e: &Evidence, file: &str) -> BTreeMap<usize, Vec<Note>> {
    let mut out: BTreeMap<usize, Vec<Note>> = BTreeMap::new();
    for p in e.verification.proofs.iter().filter(|p| p.file == file) {
        out.entry(p.line).or_default().push(Note {
            kind: if p.holds { "proved" } else { "failing" },
            text: visible(&format!(
                "{} {} [{}]",
                if p.holds { "proved" } else { "FAILED" },
                p.id,
                p.request_env
            )),
            detail: visible(p.counterexample.as_deref().unwrap_or_default()),
        });
    }
    out
}

/// Every file, line by line.
pub fn files(e: &Evidence, mutants: &[Judged]) -> Vec<File> {
    order(e)
        .into_iter()
        .enumerate()
        .map(|(index, (name, text))| {
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
                        text: visible(t),
                        anchor: format!("L{index}-{number}"),
                        head: within.is_some_and(|s| s.0 == number),
                        policy: within.map_or(String::new(), |s| visible(s.2)),
                        mark: mark(&notes),
                        notes,
                    }
                })
                .collect();
            File {
                name: visible(&name),
                lines,
            }
        })
        .collect()
}

/// How a line is marked: a survivor outranks a failing proof.
fn mark(notes: &[Note]) -> &'static str {
    if notes.iter().any(|n| n.kind == "survivor") {
        "survivor"
    } else if notes.iter().any(|n| n.kind == "failing") {
        "failing"
    } else {
        ""
    }
}
