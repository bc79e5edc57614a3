//! Loading, validating and fingerprinting the policy set.
//!
//! Policies and schema are loaded once and validated in strict mode with
//! warnings treated as errors. Anything wrong rejects the whole set with the
//! file, line, column and Cedar's own words: a half-loaded policy set would
//! be a weaker one. The policy layer never touches a file other than these
//! and never probes anything.

pub mod diagnostics;
pub mod engine;
pub mod entities;
pub mod eval;
pub mod memo;
pub mod scope_check;

use crate::error::{About, Error, Result};
use crate::fingerprint::hex;
use crate::reasons::Reason;
use cedar_policy::{Effect, Policy, PolicyId, PolicySet, Schema, ValidationMode, Validator};
use diagnostics::{problems, Problem};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use entities::SCHEMA_FILE;

/// The policy files a policy folder must hold, in load order.
pub const POLICY_FILES: &[&str] = &["retirement.cedar", "capabilities.cedar"];

/// The file whose forbids are the eligibility requirements.
pub const ELIGIBILITY_FILE: &str = "retirement.cedar";

const EMBEDDED: &[(&str, &str)] = &[
    (
        SCHEMA_FILE,
        include_str!("../../policies/schema.cedarschema"),
    ),
    (
        "retirement.cedar",
        include_str!("../../policies/retirement.cedar"),
    ),
    (
        "capabilities.cedar",
        include_str!("../../policies/capabilities.cedar"),
    ),
];

/// The text of an embedded policy file.
pub fn embedded(name: &str) -> &'static str {
    EMBEDDED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .unwrap_or("")
}

/// One loaded policy with the annotations the program reads.
#[derive(Debug, Clone)]
pub struct Rule {
    /// `@id`.
    pub id: String,
    /// permit or forbid.
    pub effect: Effect,
    /// `@reason` (forbids only).
    pub reason: Option<Reason>,
    /// `@order` (forbids only).
    pub order: u32,
    /// `@description`.
    pub description: String,
    /// The file it came from.
    pub file: String,
    /// 1-based line of its first character.
    pub line: usize,
    /// 1-based line of its last character (its `;`).
    pub end_line: usize,
}

/// A validated policy set with its schema and annotations.
#[derive(Debug)]
pub struct Policies {
    /// The schema every entity is checked against.
    pub schema: Schema,
    /// The policies, each under its `@id`.
    pub set: PolicySet,
    /// Annotations by policy id.
    pub rules: HashMap<PolicyId, Rule>,
    /// sha256 over the files, as `sha256:<hex>`.
    pub fingerprint: String,
    /// Where the policies came from (`embedded` or a folder).
    pub origin: String,
    /// The schema file's text, as read.
    pub schema_text: String,
    /// Each policy file's text, as read (for reports that point into it).
    pub texts: std::collections::BTreeMap<String, String>,
}

/// Where to read policies from.
#[derive(Debug, Clone)]
pub enum PolicySource {
    /// The copy built into the binary.
    Embedded,
    /// A reviewer's folder with the same file names.
    Dir(PathBuf),
}

/// The error that stops a command over a rejected set: every problem, as
/// a person reads it.
pub fn policy_error(found: &[Problem]) -> Error {
    let lines: Vec<&str> = found.iter().map(|p| p.drawn.as_str()).collect();
    Error::policy(
        About::PolicySet,
        format!(
            "the policy set was rejected; nothing was evaluated. Fix these and run again:\n{}",
            lines.join("\n")
        ),
    )
}

/// What loading a set found wrong, before anything was evaluated.
pub type Checked<T> = std::result::Result<T, Vec<Problem>>;

impl Policies {
    /// Load from the given source, validate, and fingerprint.
    pub fn load(source: &PolicySource) -> Result<Policies> {
        let (files, origin): (Vec<(String, String)>, String) = match source {
            PolicySource::Embedded => (
                EMBEDDED
                    .iter()
                    .map(|(n, t)| (n.to_string(), t.to_string()))
                    .collect(),
                "embedded".to_string(),
            ),
            PolicySource::Dir(dir) => (read_dir_files(dir)?, dir.display().to_string()),
        };
        Self::from_texts(&files, origin)
    }

    /// The same set with the policy `id` replaced by `replacement` (or
    /// removed), checked as a loaded set is: strict validation and the
    /// first-stage rule (warnings are let through: a mutant may well be
    /// one). Err carries the validator's words.
    pub fn with_replaced(
        &self,
        id: &str,
        replacement: Option<Policy>,
    ) -> std::result::Result<Policies, String> {
        let pid = PolicyId::new(id);
        let mut parsed = Parsed {
            set: PolicySet::new(),
            rules: self.rules.clone(),
            texts: HashMap::new(),
        };
        let others = self.set.policies().filter(|p| p.id() != &pid).cloned();
        for p in others.chain(replacement.map(|r| r.new_id(pid.clone()))) {
            parsed.set.add(p).map_err(|e| e.to_string())?;
        }
        if parsed.set.policy(&pid).is_none() {
            parsed.rules.remove(&pid);
        }
        let result =
            Validator::new(self.schema.clone()).validate(&parsed.set, ValidationMode::Strict);
        if let Some(e) = result.validation_errors().next() {
            return Err(e.to_string());
        }
        if let Some(problem) = first_stage_reads_aggregates(&parsed).into_iter().next() {
            return Err(problem.drawn);
        }
        Ok(Policies {
            schema: self.schema.clone(),
            set: parsed.set,
            rules: parsed.rules,
            fingerprint: self.fingerprint.clone(),
            origin: format!("{} (mutant of {id})", self.origin),
            schema_text: self.schema_text.clone(),
            texts: self.texts.clone(),
        })
    }

    /// Load from `(file name, text)` pairs: the schema and the policy files.
    pub fn from_texts(files: &[(String, String)], origin: String) -> Result<Policies> {
        Self::check_texts(files, origin).map_err(|found| policy_error(&found))
    }

    /// As [`Policies::from_texts`], with what is wrong as located problems
    /// (`policy validate --format sarif` places each in its file).
    pub fn check_texts(files: &[(String, String)], origin: String) -> Checked<Policies> {
        let fingerprint = fingerprint_of(files.iter().map(|(n, t)| (n.as_str(), t.as_str())));
        // Messages name a folder's files with the folder, so a reviewer
        // comparing two folders knows which one is wrong.
        let folder = (origin != "embedded").then(|| origin.clone());
        let shown = |name: &str| match &folder {
            Some(dir) => format!("{}", Path::new(dir).join(name).display()),
            None => name.to_string(),
        };
        let schema = load_schema(files, &shown)?;
        let parsed = parse_policies(files, &shown)?;
        validate(&schema, &parsed, &shown)?;
        Ok(Policies {
            schema,
            set: parsed.set,
            rules: parsed.rules,
            fingerprint,
            origin,
            schema_text: files
                .iter()
                .find(|(n, _)| n == SCHEMA_FILE)
                .map(|(_, t)| t.clone())
                .unwrap_or_default(),
            texts: files
                .iter()
                .filter(|(n, _)| n != SCHEMA_FILE)
                .cloned()
                .collect(),
        })
    }

    /// Whether this is the policy set built into the binary (by content:
    /// a folder holding exactly the built-in files is the built-in set).
    pub fn is_builtin(&self) -> bool {
        self.fingerprint == builtin_fingerprint()
    }

    /// Where the policies came from, for a person: `built-in`, or the
    /// folder with the fingerprint.
    pub fn source_label(&self) -> String {
        if self.is_builtin() {
            format!("built-in ({})", self.fingerprint)
        } else {
            format!("{} ({})", self.origin, self.fingerprint)
        }
    }

    /// The rules in `@order` order (permits first).
    pub fn ordered_rules(&self) -> Vec<&Rule> {
        let mut rules: Vec<&Rule> = self.rules.values().collect();
        rules.sort_by(|a, b| (a.order, &a.file, a.line).cmp(&(b.order, &b.file, b.line)));
        rules
    }
}

/// The schema, parsed; a warning rejects it as an error would.
fn load_schema(files: &[(String, String)], shown: &dyn Fn(&str) -> String) -> Checked<Schema> {
    let (schema_name, schema_text) =
        files
            .iter()
            .find(|(n, _)| n == SCHEMA_FILE)
            .ok_or_else(|| {
                vec![Problem {
                    file: SCHEMA_FILE.to_string(),
                    line: 1,
                    column: 1,
                    message: "missing".to_string(),
                    drawn: format!("{SCHEMA_FILE}: missing"),
                }]
            })?;
    let shown_name = shown(schema_name);
    let (schema, warnings) = Schema::from_cedarschema_str(schema_text)
        .map_err(|e| problems(&e, schema_name, &shown_name, schema_text))?;
    let warnings: Vec<Problem> = warnings
        .flat_map(|w| problems(&w, schema_name, &shown_name, schema_text))
        .collect();
    if !warnings.is_empty() {
        return Err(warnings);
    }
    Ok(schema)
}

/// The policy files, parsed: every policy with its rule (id, reason,
/// order), and which file holds it.
struct Parsed {
    set: PolicySet,
    rules: HashMap<PolicyId, Rule>,
    texts: HashMap<PolicyId, (String, String)>,
}

fn parse_policies(files: &[(String, String)], shown: &dyn Fn(&str) -> String) -> Checked<Parsed> {
    let mut found = Vec::new();
    let mut out = Parsed {
        set: PolicySet::new(),
        rules: HashMap::new(),
        texts: HashMap::new(),
    };
    for (name, text) in files.iter().filter(|(n, _)| n != SCHEMA_FILE) {
        let parsed = match PolicySet::from_str(text) {
            Ok(p) => p,
            Err(e) => {
                found.extend(problems(&e, name, &shown(name), text));
                continue;
            }
        };
        let mut policies: Vec<((usize, usize), &Policy)> = parsed
            .policies()
            .map(|p| (policy_lines(p, text), p))
            .collect();
        policies.sort_by_key(|(lines, _)| *lines);
        for ((line, end_line), policy) in policies {
            let rule = match rule_of(policy, name, line) {
                Ok(rule) => Rule { end_line, ..rule },
                Err(msg) => {
                    found.push(Problem::at(name, &shown(name), line, msg));
                    continue;
                }
            };
            let id = PolicyId::new(&rule.id);
            if let Some(prev) = out.rules.get(&id) {
                let msg = format!(
                    "@id(\"{}\") is already used at {}:{}; ids must be unique",
                    rule.id,
                    shown(&prev.file),
                    prev.line
                );
                found.push(Problem::at(name, &shown(name), line, msg));
                continue;
            }
            if let Err(e) = out.set.add(policy.new_id(id.clone())) {
                found.push(Problem::at(name, &shown(name), line, e.to_string()));
                continue;
            }
            out.texts.insert(id.clone(), (name.clone(), text.clone()));
            out.rules.insert(id, rule);
        }
    }
    if !found.is_empty() {
        return Err(found);
    }
    Ok(out)
}

/// Strict validation against the schema; warnings are errors here.
fn validate(schema: &Schema, parsed: &Parsed, shown: &dyn Fn(&str) -> String) -> Checked<()> {
    let mut found = Vec::new();
    let result = Validator::new(schema.clone()).validate(&parsed.set, ValidationMode::Strict);
    for e in result.validation_errors() {
        let (file, text) = parsed.texts.get(e.policy_id()).cloned().unwrap_or_default();
        found.extend(problems(e, &file, &shown(&file), &text));
    }
    for w in result.validation_warnings() {
        let (file, text) = parsed.texts.get(w.policy_id()).cloned().unwrap_or_default();
        let mut these = problems(w, &file, &shown(&file), &text);
        for p in &mut these {
            p.message.push_str(" (warnings are errors here)");
        }
        if let Some(last) = these.last_mut() {
            last.drawn.push_str(" (warnings are errors here)");
        }
        found.extend(these);
    }
    found.extend(first_stage_reads_aggregates(parsed));
    if found.is_empty() {
        Ok(())
    } else {
        Err(found)
    }
}

/// A policy that can apply to a first-stage action must not read what is
/// aggregated from first-stage answers: at that stage those attributes are
/// still empty, so such a policy would judge on nothing.
fn first_stage_reads_aggregates(parsed: &Parsed) -> Vec<Problem> {
    use cedar_policy::ActionConstraint;
    use cedar_policy_core::ast::{ExprKind, Var};
    let first_stage = |uid: &cedar_policy::EntityUid| {
        entities::FIRST_STAGE_ACTIONS.contains(&uid.id().unescaped())
    };
    let mut found = Vec::new();
    for policy in parsed.set.policies() {
        let applies = match policy.action_constraint() {
            ActionConstraint::Any => true,
            ActionConstraint::Eq(uid) => first_stage(&uid),
            ActionConstraint::In(uids) => uids.iter().any(first_stage),
        };
        if !applies {
            continue;
        }
        let ast: &cedar_policy_core::ast::Policy = policy.as_ref();
        let condition = ast.condition();
        for e in condition.subexpressions() {
            if let ExprKind::GetAttr { expr, attr } | ExprKind::HasAttr { expr, attr } =
                e.expr_kind()
            {
                if matches!(expr.expr_kind(), ExprKind::Var(Var::Resource))
                    && entities::AGGREGATE_ATTRIBUTES.contains(&attr.as_str())
                {
                    let (file, _) = parsed.texts.get(policy.id()).cloned().unwrap_or_default();
                    let message = format!(
                        "policy {} can apply to a first-stage action \
                         (hold_<kind>, claim_instance_slot, occupy_instance_slot) and reads \
                         resource.{attr}, which is collected from those actions' answers; \
                         limit it to action == FleetRetire::Action::\"retire\"",
                        policy.id()
                    );
                    found.push(Problem {
                        line: parsed.rules.get(policy.id()).map_or(1, |r| r.line),
                        column: 1,
                        drawn: format!("{file}: {message}"),
                        file,
                        message,
                    });
                }
            }
        }
    }
    found
}

/// sha256 over `(file name, text)` pairs, sorted by name, as `sha256:<hex>`.
fn fingerprint_of<'a>(files: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut sorted: Vec<(&str, &str)> = files.collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut hasher = Sha256::new();
    for (name, text) in sorted {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(text.len().to_string().as_bytes());
        hasher.update([0]);
        hasher.update(text.as_bytes());
    }
    format!("sha256:{}", hex(&hasher.finalize()))
}

/// The fingerprint of the policy set built into this binary.
pub fn builtin_fingerprint() -> &'static str {
    static FP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FP.get_or_init(|| fingerprint_of(EMBEDDED.iter().copied()))
}

/// The largest policy, schema or property file read from a folder (1 MiB;
/// the built-in set's largest file is 12 KiB).
pub const MAX_POLICY_FILE_BYTES: u64 = 1 << 20;

/// The text of one file of a policy folder. It must be the file itself: a
/// regular file of at most [`MAX_POLICY_FILE_BYTES`], opened without
/// following a symbolic link and without blocking, so a link to a secret
/// or a device, or a FIFO, is refused before a byte of it is read.
pub fn read_folder_file(path: &Path) -> Result<String> {
    crate::jsonfile::read_regular_in_place(path, MAX_POLICY_FILE_BYTES)
        .map(|bytes| bytes.text)
        .map_err(|problem| {
            Error::policy(
                About::File(path.to_path_buf()),
                format!(
                "{}: {problem}. A policy folder holds {SCHEMA_FILE}, {} and properties/*.cedar \
                 as regular files of at most {} MiB (no symbolic links, FIFOs or devices)",
                crate::text::esc(&path.display().to_string()),
                POLICY_FILES.join(", "),
                MAX_POLICY_FILE_BYTES >> 20
            ),
            )
        })
}

/// A digest of what `Policies::load(source)` would read now: each file's
/// name and its text, or why it cannot be read (so a file going missing or
/// turning into a link changes it too). The built-in set never changes.
/// Read as the load reads (regular files only, never blocking), so a
/// controller can poll it cheaply and reload when it moves.
pub fn source_digest(source: &PolicySource) -> Vec<u8> {
    let PolicySource::Dir(dir) = source else {
        return Vec::new();
    };
    digest_reads(|name| read_folder_file(&dir.join(name)).map_err(|e| e.to_string()))
}

/// [`source_digest`] of the very texts `policies` was loaded from (not of
/// a second read, which a write under way could make differ): what a poll
/// compares with to know whether the files still hold the set judged by.
pub fn loaded_digest(source: &PolicySource, policies: &Policies) -> Vec<u8> {
    if matches!(source, PolicySource::Embedded) {
        return Vec::new();
    }
    digest_reads(|name| {
        let text = if name == SCHEMA_FILE {
            Some(&policies.schema_text)
        } else {
            policies.texts.get(name)
        };
        text.cloned()
            .ok_or_else(|| format!("{name} was not loaded"))
    })
}

/// Each file's name, whether it was read, and its text (or why not).
fn digest_reads(read: impl Fn(&str) -> std::result::Result<String, String>) -> Vec<u8> {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    for name in std::iter::once(SCHEMA_FILE).chain(POLICY_FILES.iter().copied()) {
        let read = read(name);
        let (tag, text) = match &read {
            Ok(text) => (b"ok", text),
            Err(why) => (b"no", why),
        };
        for part in [
            name.as_bytes(),
            tag,
            &(text.len() as u64).to_be_bytes(),
            text.as_bytes(),
        ] {
            hash.update(part);
        }
    }
    hash.finalize().to_vec()
}

fn read_dir_files(dir: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for name in std::iter::once(SCHEMA_FILE).chain(POLICY_FILES.iter().copied()) {
        out.push((name.to_string(), read_folder_file(&dir.join(name))?));
    }
    Ok(out)
}

/// The lines a policy starts and ends on, from the location Cedar's parser
/// gave it; (1, 1) when it has none.
pub fn policy_lines(policy: &Policy, text: &str) -> (usize, usize) {
    let ast: &cedar_policy_core::ast::Policy = policy.as_ref();
    ast.loc().map_or((1, 1), |loc| {
        let start = diagnostics::place(text, loc.start()).0;
        let end = diagnostics::place(text, loc.end().saturating_sub(1).max(loc.start())).0;
        (start, end.max(start))
    })
}

fn rule_of(policy: &Policy, file: &str, line: usize) -> std::result::Result<Rule, String> {
    let id = policy
        .annotation("id")
        .filter(|s| !s.trim().is_empty())
        .ok_or("policy has no @id(\"...\") annotation; every policy needs a stable id")?
        .to_string();
    let description = policy.annotation("description").unwrap_or("").to_string();
    let effect = policy.effect();
    let (reason, order) = match effect {
        Effect::Forbid if file == ELIGIBILITY_FILE => {
            let code = policy.annotation("reason").ok_or_else(|| {
                format!(
                    "forbid @id(\"{id}\") has no @reason(\"...\"); name the reason code it reports"
                )
            })?;
            let reason = Reason::from_code(code)
                .filter(|r| r.is_policy_reason())
                .ok_or_else(|| {
                    format!("forbid @id(\"{id}\") has @reason(\"{code}\"), which is not an eligibility reason code")
                })?;
            let order = policy
                .annotation("order")
                .and_then(|o| o.parse::<u32>().ok())
                .ok_or_else(|| {
                    format!("forbid @id(\"{id}\") needs @order(\"N\") with a whole number N")
                })?;
            (Some(reason), order)
        }
        _ => (None, 0),
    };
    Ok(Rule {
        id,
        effect,
        reason,
        order,
        description,
        file: file.to_string(),
        line,
        end_line: line,
    })
}
