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
    /// The set's fingerprint.
    pub fingerprint: String,
    /// Where the set comes from, and who pinned it.
    pub source: String,
    /// Headline figures: (what, how many).
    pub summary: Vec<(String, String)>,
    /// What was not run, and why (so an empty column is never mistaken for
    /// a clean one).
    pub notes: Vec<String>,
    /// What a reviewer must look at first: each failing proof and each
    /// surviving mutant, linked to its line.
    pub attention: Vec<Attention>,
    /// The proved difference from `--base REV`.
    pub base: Option<Base>,
    /// One row per policy, in file order.
    pub policies: Vec<PolicyRow>,
    /// Every policy and property file, line by line.
    pub files: Vec<File>,
    /// The grants matrix, with `--profiles`.
    pub grants: Option<Grants>,
}

/// A failing proof or a survivor, linked to its line.
pub struct Attention {
    /// In words, with its file and line.
    pub text: String,
    /// The line's anchor.
    pub anchor: String,
}

/// One policy's marks: proofs, coverage, mutants.
pub struct PolicyRow {
    /// `@id`.
    pub id: String,
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
    /// The proofs about it: properties over its file and actions, and
    /// that it never errors.
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
    /// The lines.
    pub lines: Vec<Line>,
}

/// One line of a file, with what is said of it.
pub struct Line {
    /// 1-based.
    pub number: usize,
    /// The text.
    pub text: String,
    /// The line's anchor ([`super::line_anchor`]).
    pub anchor: String,
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
    /// `survivor`, `failing`, `proved` or `equivalent`.
    pub kind: &'static str,
    /// In words.
    pub text: String,
    /// The witness case or counterexample, when there is one.
    pub detail: String,
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
    /// entry, names that look alike).
    pub warnings: Vec<String>,
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

/// The proved difference from a base revision.
pub struct Base {
    /// The revision (or folder) compared with.
    pub name: String,
    /// `equivalent`, `tightened`, `loosened` or `both`.
    pub overall: String,
    /// Whether anything loosened.
    pub loosened: bool,
    /// Per action: (action, change).
    pub actions: Vec<(String, String)>,
    /// The policies that changed: `id (status)`.
    pub changed: Vec<String>,
}
