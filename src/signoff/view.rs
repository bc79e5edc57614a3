//! What the reviewer's page shows, as plain values the template prints:
//! every text here is escaped by askama when the page is rendered, so a
//! policy's text or description can hold markup and is shown as text.

use askama::Template;

/// The whole page (`page.html`).
#[derive(Template)]
#[template(path = "page.html")]
pub struct Page {
    /// fleet-retire's version.
    pub version: &'static str,
    /// Whether nothing stands in the way of signing.
    pub ready: bool,
    /// Why not, each linked to its place on the page.
    pub reasons: Vec<Reason>,
    /// The set's fingerprint.
    pub fingerprint: String,
    /// Where the set comes from, and who pinned it.
    pub source: String,
    /// Headline figures: (what, how many).
    pub summary: Vec<(String, String)>,
    /// What was not run, and why (so an empty column is never mistaken for
    /// a clean one).
    pub notes: Vec<String>,
    /// The change against `--base`.
    pub change: Option<Change>,
    /// Each failing property, once.
    pub failing: Vec<Failing>,
    /// Each fixture that fails.
    pub fixtures: Vec<FixtureFail>,
    /// One row per policy, in file order.
    pub policies: Vec<PolicyRow>,
    /// Every policy and property file, line by line.
    pub files: Vec<File>,
    /// The grants matrix, with `--profiles`.
    pub grants: Option<Grants>,
}

/// One reason not to sign.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reason {
    /// `base`, `loosened`, `proof`, `fixture`, `survivor`, `grant`,
    /// `warning` or `coverage`.
    pub kind: &'static str,
    /// In words.
    pub text: String,
    /// Its place on the page (an element's id).
    pub anchor: String,
}

/// A counterexample as a person reads and reuses it.
pub struct Cex {
    /// What it is about (`retire: loosening`).
    pub title: String,
    /// In one sentence.
    pub sentence: String,
    /// Its deciding attributes, in words.
    pub deciding: String,
    /// The fixture case, pretty-printed, line by line, the deciding
    /// attributes' lines marked.
    pub lines: Vec<CexLine>,
    /// The command that saves it as a fixture file.
    pub save: String,
}

/// One line of a counterexample's case.
pub struct CexLine {
    /// The text.
    pub text: String,
    /// Whether it holds a deciding attribute.
    pub marked: bool,
}

/// The change against `--base`.
pub struct Change {
    /// The revision compared with.
    pub name: String,
    /// Why it could not be compared; empty when it was.
    pub problem: String,
    /// `equivalent`, `tightened`, `loosened` or `both`.
    pub overall: String,
    /// Whether anything loosened.
    pub loosened: bool,
    /// Whether the schema differs.
    pub schema_changed: bool,
    /// Per action, with its counterexamples.
    pub actions: Vec<ActionChange>,
    /// The policies that differ, each linked to its diff.
    pub policies: Vec<ChangedPolicy>,
    /// The files that differ, each linked to its first changed line.
    pub files: Vec<(String, String)>,
    /// The fixture verdicts that move; `None` without `--fixtures`.
    pub moved: Option<Vec<MovedVerdict>>,
}

/// One action's proved change.
pub struct ActionChange {
    /// `change-<action>`.
    pub anchor: String,
    /// The action.
    pub action: String,
    /// `equivalent`, `tightened`, `loosened` or `both`.
    pub change: String,
    /// Whether it loosens.
    pub loosens: bool,
    /// One per direction that moved.
    pub counterexamples: Vec<Cex>,
}

/// A policy that differs from the base.
pub struct ChangedPolicy {
    /// `@id`.
    pub id: String,
    /// `added`, `removed` or `changed`.
    pub status: String,
    /// Its place in the source view.
    pub anchor: String,
    /// Said when its code changed and its description did not.
    pub flag: String,
}

/// One fixture verdict that moves from the base to the set.
pub struct MovedVerdict {
    /// The case.
    pub case: String,
    /// The worker, operator or request.
    pub subject: String,
    /// Before.
    pub old: String,
    /// After.
    pub new: String,
    /// Whether it lets through what the base stopped.
    pub loosens: bool,
}

/// A failing property (or a policy that can error), once.
pub struct Failing {
    /// `failing-<n>`.
    pub anchor: String,
    /// Its `@id` (or `never-errors:<policy>`).
    pub id: String,
    /// In words.
    pub description: String,
    /// `file:line`.
    pub place: String,
    /// The anchor of its line in the source view.
    pub at: String,
    /// The request environments it fails for.
    pub envs: Vec<String>,
    /// What breaks it, in words.
    pub blame: String,
    /// The policies that break it, each with its place.
    pub blamed: Vec<(String, String)>,
    /// Its counterexample.
    pub cex: Option<Cex>,
}

/// A fixture that fails.
pub struct FixtureFail {
    /// `fixture-<n>`.
    pub anchor: String,
    /// The file.
    pub file: String,
    /// The case's name.
    pub case: String,
    /// What differs, or why it could not run.
    pub problems: Vec<String>,
}

/// One policy's marks: proofs, coverage, mutants.
pub struct PolicyRow {
    /// `@id`.
    pub id: String,
    /// `policy-<n>`: the row's own anchor.
    pub row: String,
    /// The anchor of its first line in the file listing.
    pub anchor: String,
    /// Its file and first line.
    pub file: String,
    /// Its first line.
    pub line: usize,
    /// `permit` or `forbid`, with its reason code.
    pub effect: String,
    /// `@description`.
    pub description: String,
    /// `added` or `changed` against the base; empty otherwise.
    pub change: String,
    /// The proofs about it: properties over its file and actions, and
    /// that it never errors (a failing one only when it is the policy that
    /// breaks it).
    pub proofs: Vec<ProofMark>,
    /// How many of those hold.
    pub proved: usize,
    /// How many fail.
    pub failed: usize,
    /// Fixture cases in which it fired; `None` when no fixtures were run.
    pub fired: Option<usize>,
    /// Fixture cases in which it decided.
    pub decided: Option<usize>,
    /// Whether its mutants were judged.
    pub mutated: bool,
    /// Its mutants killed.
    pub killed: usize,
    /// Its mutants proved equivalent.
    pub equivalent: usize,
    /// Its mutants that survived.
    pub survived: usize,
    /// What killed its mutants: `property-or-case (n)`, most first.
    pub killers: Vec<String>,
}

/// One proof obligation.
pub struct ProofMark {
    /// The property's `@id` (or `never-errors:<policy>`).
    pub id: String,
    /// Whether it holds.
    pub holds: bool,
}

/// One file, line by line.
pub struct File {
    /// Its name in the policy folder.
    pub name: String,
    /// Whether it differs from the base (its lines then show the diff).
    pub changed: bool,
    /// The lines.
    pub lines: Vec<Line>,
}

/// One line of a file, with what is said of it.
pub struct Line {
    /// 1-based (in the base's text for a removed line).
    pub number: usize,
    /// The text.
    pub text: String,
    /// The line's anchor.
    pub anchor: String,
    /// `removed`, `added` or empty, against the base.
    pub change: &'static str,
    /// Whether a policy starts here.
    pub head: bool,
    /// The policy that spans it, if any.
    pub policy: String,
    /// `survivor`, `failing` or empty: how the line is marked.
    pub mark: &'static str,
    /// What is said of the line.
    pub notes: Vec<Note>,
}

/// Something said of a line.
pub struct Note {
    /// `survivor`, `failing`, `proved`, `equivalent` or `change`.
    pub kind: &'static str,
    /// In words.
    pub text: String,
    /// The witness case or counterexample, when there is one.
    pub cex: Option<Cex>,
}

/// The capability grants: profile × operation.
pub struct Grants {
    /// The profiles file.
    pub file: String,
    /// The file compared with, with `--against`.
    pub against: Option<String>,
    /// The operations, in column order.
    pub operations: Vec<String>,
    /// Per operation, the capability properties about it and whether each
    /// was proved.
    pub proved_by: Vec<String>,
    /// One row per profile.
    pub rows: Vec<GrantRow>,
    /// What `grants` warns of in the file (a misspelt role, a malformed
    /// entry, names that look alike), each with its anchor.
    pub warnings: Vec<(String, String)>,
}

/// One profile's row.
pub struct GrantRow {
    /// The profile's name.
    pub profile: String,
    /// One cell per operation.
    pub cells: Vec<GrantCell>,
    /// Whether the edit removed the profile (it is only in `--against`).
    pub removed: bool,
}

/// One cell of the matrix.
pub struct GrantCell {
    /// `grant-<row>-<column>`.
    pub anchor: String,
    /// The operation.
    pub operation: String,
    /// Whether the policies allow it.
    pub allowed: bool,
    /// `granted`, `revoked` or empty against `--against`.
    pub change: &'static str,
    /// The capability properties about this operation, each with
    /// `proved` or `FAILED`.
    pub proofs: String,
}
