//! SARIF 2.1.0, the static-analysis log that code-scanning views of pull
//! requests and SARIF viewers read: the findings of `policy verify` (a
//! property that does not hold) and `policy mutate` (a mutant no property or
//! fixture kills), each located in its `.cedar` file. File names are
//! relative to the policy folder (`originalUriBaseIds` `POLICYROOT`), so a
//! log is the same on every machine. Built as JSON values, never as text.

use serde_json::{json, Value as Json};

/// A kind of finding: a SARIF rule with a stable id.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Stable id (`FR…`).
    pub id: &'static str,
    /// A name in PascalCase.
    pub name: &'static str,
    /// One sentence.
    pub text: &'static str,
}

/// A property of `policy verify` does not hold.
pub const PROPERTY_NOT_PROVED: Rule = Rule {
    id: "FR1001",
    name: "PropertyNotProved",
    text: "A property the policies must satisfy does not hold for some request the schema allows.",
};

/// A mutant of `policy mutate` survived.
pub const MUTANT_SURVIVED: Rule = Rule {
    id: "FR1002",
    name: "MutantSurvived",
    text: "A single-point change of a policy changes some decision, and no property or fixture case notices.",
};

/// One finding, located in a file of the policy folder.
#[derive(Debug, Clone)]
pub struct Finding {
    /// Its kind.
    pub rule: Rule,
    /// What is wrong, a sentence or more, ending with a period.
    pub message: String,
    /// The file, relative to the policy folder.
    pub file: String,
    /// 1-based line and column.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Anything else a reader may want (the policy's `@id`, the
    /// counterexample or the fixture case that would kill a mutant).
    pub properties: Json,
}

/// A sentence ends with a period (SARIF viewers show messages as
/// sentences).
fn sentence(s: &str) -> String {
    let t = s.trim_end();
    if t.ends_with('.') {
        t.to_string()
    } else {
        format!("{t}.")
    }
}

/// The log: one run of fleet-retire, with the rules it can report.
pub fn log(rules: &[Rule], findings: &[Finding]) -> Json {
    let index = |id: &str| rules.iter().position(|r| r.id == id).unwrap_or(0);
    let results: Vec<Json> = findings
        .iter()
        .map(|f| {
            json!({
                "ruleId": f.rule.id,
                "ruleIndex": index(f.rule.id),
                "level": "error",
                "message": {"text": sentence(&f.message)},
                "locations": [{
                    "physicalLocation": {
                        "artifactLocation": {"uri": f.file, "uriBaseId": "POLICYROOT"},
                        "region": {"startLine": f.line.max(1), "startColumn": f.column.max(1)},
                    }
                }],
                "properties": f.properties,
            })
        })
        .collect();
    let rules: Vec<Json> = rules
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "name": r.name,
                "shortDescription": {"text": r.text},
                "fullDescription": {"text": r.text},
                "defaultConfiguration": {"level": "error"},
            })
        })
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "fleet-retire",
                "version": env!("CARGO_PKG_VERSION"),
                "semanticVersion": env!("CARGO_PKG_VERSION"),
                "rules": rules,
            }},
            "originalUriBaseIds": {"POLICYROOT": {
                "description": {"text": "The policy folder (--policies DIR, or the built-in set's policies/)."}
            }},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    })
}

/// Where `needle` first appears in `text` from line `from` on (1-based
/// line and column), if it does.
pub fn find_from(text: &str, from: usize, needle: &str) -> Option<(usize, usize)> {
    if needle.is_empty() {
        return None;
    }
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate().skip(from.saturating_sub(1)) {
        if let Some(at) = line.find(needle) {
            return Some((i + 1, line[..at].chars().count() + 1));
        }
    }
    None
}

/// A file name as the log names it: relative to the policy folder (the
/// built-in properties are `properties/…` there too).
pub fn in_folder(file: &str) -> String {
    file.trim_start_matches("built-in ").to_string()
}
