//! SARIF 2.1.0, the static-analysis log that code-scanning views of pull
//! requests and SARIF viewers read: the findings of `policy validate` (a
//! rejected policy, a file out of canonical layout), `policy verify` (a
//! property that does not hold), `policy mutate` (a mutant no property or
//! fixture kills), `policy diff` (a loosening) and `grants --against` (a
//! grant widened), each located in its file. File names are relative to
//! the policy folder (`originalUriBaseIds` `POLICYROOT`) or to the folder
//! of profiles.json (`PROFILESROOT`), so a log is the same on every
//! machine. Built as JSON values, never as text.

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
    /// `error` (the command fails on it) or `warning`.
    pub level: &'static str,
}

/// A property of `policy verify` does not hold.
pub const PROPERTY_NOT_PROVED: Rule = Rule {
    id: "FR1001",
    name: "PropertyNotProved",
    text: "A property the policies must satisfy does not hold for some request the schema allows.",
    level: "error",
};

/// A mutant of `policy mutate` survived.
pub const MUTANT_SURVIVED: Rule = Rule {
    id: "FR1002",
    name: "MutantSurvived",
    text: "A single-point change of a policy changes some decision, and no property or fixture case notices.",
    level: "error",
};

/// `policy validate` rejects a policy file.
pub const POLICY_REJECTED: Rule = Rule {
    id: "FR1003",
    name: "PolicyRejected",
    text: "A policy file does not parse, does not validate strictly against the schema, or breaks a rule of the set (ids, reason codes, orders).",
    level: "error",
};

/// `policy validate` finds a file out of Cedar's canonical layout.
pub const NOT_CANONICAL_LAYOUT: Rule = Rule {
    id: "FR1004",
    name: "NotCanonicalLayout",
    text: "A policy file is not in Cedar's canonical layout from this line on; `policy validate --fix-format` rewrites it.",
    level: "error",
};

/// `policy diff` proves that NEW lets through something OLD stopped.
pub const POLICY_LOOSENED: Rule = Rule {
    id: "FR1005",
    name: "PolicyLoosened",
    text: "A policy change lets through a request the old policies stopped (or counts fewer rows as may-be-live).",
    level: "error",
};

/// `grants --against` finds an operation granted that was not before.
pub const GRANT_WIDENED: Rule = Rule {
    id: "FR1006",
    name: "GrantWidened",
    text: "An edit of profiles.json lets a profile run an operation it could not run before.",
    level: "error",
};

/// `grants` warns about profiles.json (a likely typo).
pub const PROFILE_WARNING: Rule = Rule {
    id: "FR1007",
    name: "ProfileWarning",
    text: "profiles.json names something the policies never look at, or grants nothing; most often a typo.",
    level: "warning",
};

/// The policy folder, the base of `.cedar` file names.
pub const POLICY_ROOT: &str = "POLICYROOT";

/// The folder of profiles.json.
pub const PROFILES_ROOT: &str = "PROFILESROOT";

/// One finding, located in a file of the policy folder.
#[derive(Debug, Clone)]
pub struct Finding {
    /// Its kind.
    pub rule: Rule,
    /// What is wrong, a sentence or more, ending with a period.
    pub message: String,
    /// The file, relative to its base folder.
    pub file: String,
    /// Its base folder: [`POLICY_ROOT`] or [`PROFILES_ROOT`].
    pub base: &'static str,
    /// 1-based line and column.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Where the located text ends (line, column just after it), when the
    /// finding is about a stretch of text (a mutated expression).
    pub end: Option<(usize, usize)>,
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
            let mut region = json!({"startLine": f.line.max(1), "startColumn": f.column.max(1)});
            if let Some((line, column)) = f.end {
                region["endLine"] = json!(line.max(f.line.max(1)));
                region["endColumn"] = json!(column.max(1));
            }
            json!({
                "ruleId": f.rule.id,
                "ruleIndex": index(f.rule.id),
                "level": f.rule.level,
                "message": {"text": sentence(&f.message)},
                "locations": [{
                    "physicalLocation": {
                        "artifactLocation": {"uri": uri(&f.file), "uriBaseId": f.base},
                        "region": region,
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
                "defaultConfiguration": {"level": r.level},
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
            "originalUriBaseIds": {
                POLICY_ROOT: {"description": {"text": "The policy folder (--policies DIR, or the built-in set's policies/)."}},
                PROFILES_ROOT: {"description": {"text": "The folder of profiles.json (grants --profiles)."}},
            },
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    })
}

/// A relative file name as a URI reference (RFC 3986): every byte but
/// the unreserved ones and `/` percent-encoded, so a space, a quote or a
/// letter outside ASCII makes a valid `artifactLocation.uri`.
pub fn uri(file: &str) -> String {
    let mut out = String::with_capacity(file.len());
    for b in file.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A file name as the log names it: relative to the policy folder (the
/// built-in properties are `properties/…` there too).
pub fn in_folder(file: &str) -> String {
    file.trim_start_matches("built-in ").to_string()
}
