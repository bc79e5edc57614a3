//! The page's source view: every policy and property file line by line
//! (and the schema, when it differs from the base), each line with its
//! anchor, the policy that spans it, and what is said of it: a surviving
//! or equivalent mutant at the start of the mutated text, a proof at its
//! property's first line, and, at the head of a policy that differs from
//! the base, its proofs, fixture coverage and mutants. A file that
//! differs from the base shows the diff: removed lines in `<del>`, added
//! ones in `<ins>`.

use super::linediff::{diff, Op};
use super::view::{File, Line, Note, PolicyRow};
use super::{cex, visible, Evidence, Judged};
use crate::policy::SCHEMA_FILE;
use std::collections::BTreeMap;

/// The files in the order the page lists them: the policy files, then the
/// property files (the built-in ones named `built-in properties/…`), then
/// the schema when it differs from the base.
pub fn order(e: &Evidence) -> Vec<(String, String)> {
    let mut texts: Vec<(String, String)> = e
        .policies
        .texts
        .iter()
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    texts.sort();
    texts.extend(e.property_texts.iter().cloned());
    let schema = &e.policies.schema_text;
    if old_text(e, SCHEMA_FILE).is_some_and(|old| &old != schema) {
        texts.push((SCHEMA_FILE.to_string(), schema.clone()));
    }
    texts
}

/// The base's text of a file the page lists, when the base was compared.
fn old_text(e: &Evidence, name: &str) -> Option<String> {
    let (_, c) = e.compared()?;
    if name == SCHEMA_FILE {
        return Some(c.old.schema_text.clone());
    }
    if let Some(text) = c.old.texts.get(name) {
        return Some(text.clone());
    }
    c.old_properties
        .get(name.trim_start_matches("built-in "))
        .cloned()
}

fn index_of(e: &Evidence, file: &str) -> usize {
    order(e).iter().position(|(n, _)| n == file).unwrap_or(0)
}

/// The anchor of line `line` of a listed file: `L2-232` (the files
/// numbered as [`order`] lists them).
pub fn anchor(e: &Evidence, file: &str, line: usize) -> String {
    format!("L{}-{line}", index_of(e, file))
}

/// The anchor of a removed line, by its number in the base's text.
pub fn removed_anchor(e: &Evidence, file: &str, line: usize) -> String {
    format!("R{}-{line}", index_of(e, file))
}

/// Each file that differs from the base, with the anchor of its first
/// changed line.
pub fn changed_files(e: &Evidence) -> Vec<(String, String)> {
    order(e)
        .into_iter()
        .enumerate()
        .filter_map(|(index, (name, text))| {
            let old = old_text(e, &name)?;
            let first = diff(&old, &text).into_iter().find_map(|op| match op {
                Op::Same(..) => None,
                Op::Removed(n) => Some(format!("R{index}-{n}")),
                Op::Added(n) => Some(format!("L{index}-{n}")),
            })?;
            Some((visible(&name), first))
        })
        .collect()
}

/// A note for each mutant that survived or was proved equivalent, at the
/// first line of its mutated text; a survivor's with its witness.
fn mutant_notes(mutants: &[Judged], e: &Evidence, file: &str) -> BTreeMap<usize, Vec<Note>> {
    let mut out: BTreeMap<usize, Vec<Note>> = BTreeMap::new();
    for m in mutants {
        let in_file = e
            .policies
            .rules
            .get(&cedar_policy::PolicyId::new(&m.policy))
            .is_some_and(|r| r.file == file);
        let (kind, word) = match m.status.as_str() {
            "survived" => ("survivor", "SURVIVING"),
            "equivalent" => ("equivalent", "equivalent"),
            _ => continue,
        };
        let Some(at) = m.location.filter(|_| in_file) else {
            continue;
        };
        let save = format!(
            "fleet-retire {}policy mutate --only {} --save-survivors survivors",
            e.policies_flag(),
            m.policy
        );
        out.entry(at.start.0).or_default().push(Note {
            kind,
            text: visible(&format!(
                "{word} mutant of {} ({}: {} → {})",
                m.policy, m.operator, m.before, m.after
            )),
            cex: m.witness.as_ref().map(|w| {
                let sentence = m.sentence.as_deref().unwrap_or("");
                cex::view("a case that kills it", sentence, &m.deciding, w, &save)
            }),
        });
    }
    out
}

/// A note for each proof whose property (or never-errors policy) starts
/// at a line of `file`; a failing one names what breaks it (its
/// counterexample is under "Failing proofs", once).
fn proof_notes(e: &Evidence, file: &str) -> BTreeMap<usize, Vec<Note>> {
    let mut out: BTreeMap<usize, Vec<Note>> = BTreeMap::new();
    for p in e.verification.proofs.iter().filter(|p| p.file == file) {
        let broken_by = e
            .blame
            .get(&p.id)
            .filter(|b| !b.policies.is_empty())
            .map(|b| format!("; broken by {}", b.policies.join(", ")))
            .unwrap_or_default();
        out.entry(p.line).or_default().push(Note {
            kind: if p.holds { "proved" } else { "failing" },
            text: visible(&format!(
                "{} {} [{}]{}",
                if p.holds { "proved" } else { "FAILED" },
                p.id,
                p.request_env,
                if p.holds { "" } else { &broken_by }
            )),
            cex: None,
        });
    }
    out
}

/// A note at the head of each policy of `file` that differs from the
/// base: what it is now proved, exercised and judged.
fn change_notes(e: &Evidence, rows: &[PolicyRow], file: &str) -> BTreeMap<usize, Vec<Note>> {
    let mut out: BTreeMap<usize, Vec<Note>> = BTreeMap::new();
    let base = e.compared().map_or("", |(name, _)| name);
    for row in rows.iter().filter(|r| !r.change.is_empty()) {
        let Some(r) = e.policies.rules.get(&cedar_policy::PolicyId::new(&row.id)) else {
            continue;
        };
        if r.file != file {
            continue;
        }
        let failing: Vec<&str> = row
            .proofs
            .iter()
            .filter(|p| !p.holds)
            .map(|p| p.id.as_str())
            .collect();
        let mut said = format!(
            "{} {} against {base}: {} proof(s) hold",
            row.id, row.change, row.proved
        );
        if !failing.is_empty() {
            said.push_str(&format!(", it breaks {}", failing.join(", ")));
        }
        if let (Some(f), Some(d)) = (row.fired, row.decided) {
            said.push_str(&format!("; fixture cases: fired in {f}, decided {d}"));
        }
        if row.mutated {
            said.push_str(&format!(
                "; mutants: {} killed, {} surviving",
                row.killed, row.survived
            ));
        }
        if let Some(flag) = super::change::description_flag(e, &row.id) {
            said.push_str(&format!(". {flag}"));
        }
        out.entry(r.line).or_default().push(Note {
            kind: "change",
            text: visible(&said),
            cex: None,
        });
    }
    out
}

/// Every file, line by line; one that differs from the base as a diff.
pub fn files(e: &Evidence, mutants: &[Judged], rows: &[PolicyRow]) -> Vec<File> {
    order(e)
        .into_iter()
        .enumerate()
        .map(|(index, (name, text))| {
            let mut notes = mutant_notes(mutants, e, &name);
            for more in [proof_notes(e, &name), change_notes(e, rows, &name)] {
                for (line, said) in more {
                    notes.entry(line).or_default().extend(said);
                }
            }
            let old = old_text(e, &name).filter(|old| *old != text);
            let ops = match &old {
                Some(old) => diff(old, &text),
                None => (1..=text.lines().count()).map(|n| Op::Same(n, n)).collect(),
            };
            let listing = Listing {
                e,
                index,
                name: &name,
                new: text.lines().collect(),
                old: old
                    .as_deref()
                    .map_or_else(Vec::new, |o| o.lines().collect()),
            };
            File {
                name: visible(&name),
                changed: old.is_some(),
                lines: ops
                    .into_iter()
                    .map(|op| listing.line(op, &mut notes))
                    .collect(),
            }
        })
        .collect()
}

/// One file being listed.
struct Listing<'a> {
    e: &'a Evidence<'a>,
    index: usize,
    name: &'a str,
    new: Vec<&'a str>,
    old: Vec<&'a str>,
}

impl Listing<'_> {
    /// The policy of `rules` whose lines span `number`: (first line, id).
    fn spanning<'r>(
        rules: impl Iterator<Item = &'r crate::policy::Rule>,
        file: &str,
        number: usize,
    ) -> Option<(usize, String)> {
        rules
            .filter(|r| r.file == file && r.line <= number && number <= r.end_line)
            .map(|r| (r.line, r.id.clone()))
            .next()
    }

    fn line(&self, op: Op, notes: &mut BTreeMap<usize, Vec<Note>>) -> Line {
        let (number, text, change) = match op {
            Op::Same(_, n) => (n, self.new[n - 1], ""),
            Op::Added(n) => (n, self.new[n - 1], "added"),
            Op::Removed(n) => (n, self.old[n - 1], "removed"),
        };
        let within = match op {
            Op::Removed(_) => self
                .e
                .compared()
                .and_then(|(_, c)| Self::spanning(c.old.rules.values(), self.name, number)),
            _ => Self::spanning(self.e.policies.rules.values(), self.name, number),
        };
        let notes = match op {
            Op::Removed(_) => Vec::new(),
            _ => notes.remove(&number).unwrap_or_default(),
        };
        Line {
            number,
            text: visible(text),
            anchor: match op {
                Op::Removed(_) => format!("R{}-{number}", self.index),
                _ => format!("L{}-{number}", self.index),
            },
            change,
            head: within.as_ref().is_some_and(|(first, _)| *first == number),
            policy: within.map_or(String::new(), |(_, id)| visible(&id)),
            mark: mark(&notes),
            notes,
        }
    }
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
