//! Capabilities (docs/semantics.md §7): who may snapshot, plan and apply, decided by
//! `policies/capabilities.cedar` over the operator's `profiles.json` entry.
//!
//! Rust only reads the entry as written (never normalising case, trimming or
//! expanding wildcards) and renders the denial; Cedar decides.

pub mod known;

use crate::error::{About, Error, Result};
use crate::policy::eval::judge;
use crate::policy::Policies;
use cedar_policy::{
    Authorizer, Entities, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression,
};
use serde_json::Value as Json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The operations a capability is asked for. Their names (`snapshot`,
/// `plan`, `apply`) are read only at the edges: profiles, fixtures and
/// tool names are parsed into this, and it is written back as its
/// [`Operation::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    /// Look at the fleet.
    Snapshot,
    /// Plan a retirement (a dry run).
    Plan,
    /// Retire what a plan approved.
    Apply,
}

impl Operation {
    /// Every operation, in the order they are listed.
    pub const ALL: [Operation; 3] = [Operation::Snapshot, Operation::Plan, Operation::Apply];

    /// Its name, as profiles, fixtures and the Cedar action use it.
    pub fn code(self) -> &'static str {
        match self {
            Operation::Snapshot => "snapshot",
            Operation::Plan => "plan",
            Operation::Apply => "apply",
        }
    }

    /// The operation of that name, if it is one.
    pub fn from_code(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.code() == name)
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

/// One `profiles.json` entry as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// `role`, when it is a string.
    pub role: Option<String>,
    /// `allowed_operations`, when it is a list: its strings as written
    /// (anything else in it is a problem below).
    pub allowed_operations: Option<Vec<String>>,
    /// What is wrong with the entry, if anything.
    pub problems: Vec<String>,
}

/// The parsed `profiles.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profiles {
    /// Profiles by name.
    pub profiles: BTreeMap<String, Profile>,
    /// `policy_pins`: fingerprints of policy sets other than the built-in
    /// one that the operator allows apply to run under.
    pub policy_pins: Vec<String>,
    /// `sha256:<hex>` of the file's bytes (empty when not read from a file).
    pub sha256: String,
}

impl Profiles {
    /// Parse a `profiles.json` document. A document that is not an object
    /// with a `profiles` object is an error; a malformed entry is kept, with
    /// its problems, and will be denied.
    pub fn from_json(doc: &Json) -> std::result::Result<Profiles, String> {
        let map = doc
            .as_object()
            .and_then(|o| o.get("profiles"))
            .and_then(Json::as_object)
            .ok_or("expected a JSON object with a \"profiles\" object: {\"profiles\": {\"NAME\": {\"role\": ..., \"allowed_operations\": [...]}}}")?;
        let profiles = map
            .iter()
            .map(|(name, entry)| (name.clone(), parse_profile(entry)))
            .collect();
        let policy_pins = match doc.get("policy_pins") {
            None => Vec::new(),
            Some(Json::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or(
                    "\"policy_pins\" must be a list of policy fingerprint strings (\"sha256:...\")",
                )?,
            Some(_) => {
                return Err(
                    "\"policy_pins\" must be a list of policy fingerprint strings (\"sha256:...\")"
                        .into(),
                )
            }
        };
        Ok(Profiles {
            profiles,
            policy_pins,
            sha256: String::new(),
        })
    }

    /// Read and parse a `profiles.json` file.
    pub fn load(path: &Path) -> Result<Profiles> {
        let err = |message: String| Error::Profiles {
            path: path.to_path_buf(),
            message,
        };
        // Read without blocking and bounded, so a FIFO or /dev/zero named as
        // profiles.json can neither hang nor exhaust an apply. Where the
        // file comes from is worth saying only when it could not be read;
        // a parse error says where in it and what to do.
        let bytes =
            crate::jsonfile::read_regular(path, crate::jsonfile::MAX_INPUT_BYTES).map_err(|e| {
                err(format!(
                    "{e}; pass profiles.json with --profiles or GITEA_MCP_CONFIG"
                ))
            })?;
        let doc = crate::jsonfile::parse_strict(&bytes.text).map_err(err)?;
        let mut profiles = Profiles::from_json(&doc).map_err(err)?;
        profiles.sha256 = bytes.sha256;
        Ok(profiles)
    }

    /// Why apply must refuse to run under `policies`, if it must: only the
    /// built-in policy set, or one whose fingerprint the operator pinned in
    /// `policy_pins`, may decide what is retired.
    pub fn pin_refusal(&self, policies: &Policies, path: &Path) -> Option<String> {
        if policies.is_builtin() || self.policy_pins.contains(&policies.fingerprint) {
            return None;
        }
        Some(format!(
            "the policy set from {} ({}) is not the built-in one and {} does not pin it; \
             apply runs only the built-in policies or a set the operator pinned. Review that set, \
             then add \"policy_pins\": [\"{}\"] at the top level of {}, or apply without \
             --policies / FLEET_RETIRE_POLICIES",
            policies.origin,
            policies.fingerprint,
            path.display(),
            policies.fingerprint,
            path.display()
        ))
    }
}

fn parse_profile(entry: &Json) -> Profile {
    let Some(obj) = entry.as_object() else {
        return Profile {
            role: None,
            allowed_operations: None,
            problems: vec![format!("the entry is {entry}, not an object")],
        };
    };
    let mut problems = Vec::new();
    let role = match obj.get("role") {
        Some(Json::String(s)) => Some(s.clone()),
        Some(other) => {
            problems.push(format!("role is {other}, not a string"));
            None
        }
        None => {
            problems.push("it has no role".to_string());
            None
        }
    };
    let allowed_operations = match obj.get("allowed_operations") {
        Some(Json::Array(items)) => {
            // The strings as written; anything else makes the entry
            // malformed, which the capability policies deny (Rust does not
            // empty the list: the forbid in capabilities.cedar decides).
            let strings: Vec<String> = items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_string))
                .collect();
            if strings.len() != items.len() {
                problems
                    .push("allowed_operations holds something that is not a string".to_string());
            }
            Some(strings)
        }
        Some(other) => {
            problems.push(format!(
                "allowed_operations is {other}, not a list of strings"
            ));
            None
        }
        None => {
            problems.push("it has no allowed_operations list".to_string());
            None
        }
    };
    Profile {
        role,
        allowed_operations,
        problems,
    }
}

fn uid(ty: &str, id: &str) -> EntityUid {
    EntityUid::from_type_name_and_id(
        EntityTypeName::from_str(ty).expect("valid entity type"),
        EntityId::new(id),
    )
}

/// The operator entity for a profile (as the capability policies see it):
/// the role and operations as written, even for a malformed entry;
/// `exists` and `well_formed` say what is wrong, and the policies deny.
pub fn operator_entity(name: &str, profile: Option<&Profile>) -> Result<Entity> {
    let ops: Vec<RestrictedExpression> = profile
        .and_then(|p| p.allowed_operations.clone())
        .unwrap_or_default()
        .into_iter()
        .map(RestrictedExpression::new_string)
        .collect();
    let attrs: HashMap<String, RestrictedExpression> = [
        ("exists", RestrictedExpression::new_bool(profile.is_some())),
        (
            "well_formed",
            RestrictedExpression::new_bool(profile.is_some_and(|p| p.problems.is_empty())),
        ),
        (
            "role",
            RestrictedExpression::new_string(
                profile.and_then(|p| p.role.clone()).unwrap_or_default(),
            ),
        ),
        ("allowed_operations", RestrictedExpression::new_set(ops)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Entity::new(uid("FleetRetire::Operator", name), attrs, HashSet::new()).map_err(|e| {
        Error::input(
            About::PolicySet,
            format!("building the operator entity: {e}"),
        )
    })
}

/// The answer to "may this profile do this operation?".
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Allowed by the capability policies.
    pub allowed: bool,
    /// Why not, in words an operator can act on.
    pub explanation: String,
}

/// The entities and the principal, action and resource of the request
/// "may `profile` do `operation`?".
pub fn request_parts(
    policies: &Policies,
    profiles: &Profiles,
    profile: &str,
    operation: Operation,
) -> Result<(Entities, EntityUid, EntityUid, EntityUid)> {
    let operator = operator_entity(profile, profiles.profiles.get(profile))?;
    let registry = Entity::new_no_attrs(uid("FleetRetire::Registry", "registry"), HashSet::new());
    let entities =
        Entities::from_entities([operator, registry], Some(&policies.schema)).map_err(|e| {
            Error::policy(
                About::PolicySet,
                format!("operator entity does not fit the schema: {e}"),
            )
        })?;
    Ok((
        entities,
        uid("FleetRetire::Operator", profile),
        uid("FleetRetire::Action", operation.code()),
        uid("FleetRetire::Registry", "registry"),
    ))
}

/// Ask the capability policies.
pub fn check(
    policies: &Policies,
    profiles: &Profiles,
    profile: &str,
    operation: Operation,
) -> Result<Decision> {
    let entry = profiles.profiles.get(profile);
    let (entities, principal, action, resource) =
        request_parts(policies, profiles, profile, operation)?;
    let verdict = judge(
        policies,
        &Authorizer::new(),
        &entities,
        &principal,
        &action,
        &resource,
    );
    if verdict.allowed {
        return Ok(Decision {
            allowed: true,
            explanation: format!("profile {profile:?} may {operation}"),
        });
    }
    Ok(Decision {
        allowed: false,
        explanation: match entry {
            None => no_such_profile(profiles, profile, operation),
            Some(_) => explain_denial(policies, profile, entry, operation, &verdict.errors),
        },
    })
}

/// [`check`] for an operation named in a fixture or a file: a name that is
/// no operation is denied, saying so.
pub fn check_named(
    policies: &Policies,
    profiles: &Profiles,
    profile: &str,
    operation: &str,
) -> Result<Decision> {
    match Operation::from_code(operation) {
        Some(op) => check(policies, profiles, profile, op),
        None => Ok(Decision {
            allowed: false,
            explanation: format!("{operation:?} is not an operation (snapshot, plan, apply)"),
        }),
    }
}

/// The denial of a profile that is not in profiles.json, naming the one
/// probably meant (within two edits, letter case aside).
fn no_such_profile(profiles: &Profiles, profile: &str, operation: Operation) -> String {
    let folded = profile.to_lowercase();
    let near = profiles
        .profiles
        .keys()
        .map(|k| (strsim::damerau_levenshtein(&folded, &k.to_lowercase()), k))
        .filter(|(d, _)| *d <= 2)
        .min();
    let hint = near.map_or(String::new(), |(_, k)| {
        format!("; did you mean {:?}?", crate::text::esc(k))
    });
    format!(
        "profile {profile:?} may not {operation}: there is no such profile in profiles.json{hint}"
    )
}

fn explain_denial(
    policies: &Policies,
    profile: &str,
    entry: Option<&Profile>,
    operation: Operation,
    errors: &[String],
) -> String {
    let head = format!("profile {profile:?} may not {operation}");
    if !errors.is_empty() {
        return format!(
            "{head}: a capability policy failed to evaluate ({})",
            errors.join("; ")
        );
    }
    let Some(entry) = entry else {
        return format!("{head}: there is no such profile in profiles.json");
    };
    if !entry.problems.is_empty() {
        return format!(
            "{head}: its profiles.json entry is malformed: {}",
            entry.problems.join("; ")
        );
    }
    // What the permit for this action asks for, read from its annotations.
    let permit = policies.rules.values().find(|r| {
        r.effect == cedar_policy::Effect::Permit
            && r.file == "capabilities.cedar"
            && r.id.starts_with(operation.code())
    });
    let (permission, roles) = permit
        .and_then(|r| policies.set.policy(&cedar_policy::PolicyId::new(&r.id)))
        .map(|p| {
            (
                p.annotation("permission").unwrap_or("").to_string(),
                p.annotation("roles").unwrap_or("").to_string(),
            )
        })
        .unwrap_or_default();
    let has_permission = entry
        .allowed_operations
        .as_ref()
        .is_some_and(|o| o.contains(&permission));
    let role = entry.role.clone().unwrap_or_default();
    let has_role = roles.split(',').any(|r| r == role);
    let missing = match (has_permission, has_role) {
        (false, false) => format!("it lacks the permission {permission:?} and its role {role:?} is not one of {roles}"),
        (false, true) => format!("it lacks the permission {permission:?} (an operator grants it by adding it to allowed_operations)"),
        (true, false) => format!("its role {role:?} is not one of {roles}"),
        (true, true) => "no capability policy allows it".to_string(),
    };
    format!("{head}: {missing}")
}

/// A capability fixture: profiles and the requests to check.
#[derive(Debug, Clone)]
pub struct CapabilityCase {
    /// The case's name.
    pub name: String,
    /// The fixture file.
    pub path: PathBuf,
    /// The profiles document.
    pub profiles: Profiles,
    /// (profile, operation, expect allow).
    pub requests: Vec<(String, String, bool)>,
}

/// One request of a capability case, as a fixture writes it.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRequest {
    /// The profile asking.
    pub profile: String,
    /// `snapshot`, `plan` or `apply`.
    pub operation: String,
    /// What Cedar must answer.
    pub expect: Expected,
}

/// A capability case's expected answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expected {
    /// Allowed.
    Allow,
    /// Denied.
    Deny,
}

/// Check the capability form of a fixture: its profiles document and its
/// requests, as serde read them.
pub fn parse_case(
    path: &Path,
    name: String,
    profiles: Option<&Json>,
    requests: Vec<CaseRequest>,
) -> Result<CapabilityCase> {
    let profiles =
        Profiles::from_json(profiles.unwrap_or(&Json::Null)).map_err(|e| Error::Fixture {
            path: path.to_path_buf(),
            message: format!("field `profiles`: {e}"),
        })?;
    Ok(CapabilityCase {
        name,
        path: path.to_path_buf(),
        profiles,
        requests: requests
            .into_iter()
            .map(|r| (r.profile, r.operation, r.expect == Expected::Allow))
            .collect(),
    })
}

impl CapabilityCase {
    /// Check every request; one line per mismatch.
    pub fn differences(&self, policies: &Policies) -> Result<Vec<crate::difference::Difference>> {
        let mut diffs = Vec::new();
        for (profile, operation, expect) in &self.requests {
            let d = check_named(policies, &self.profiles, profile, operation)?;
            if d.allowed != *expect {
                diffs.push(crate::difference::Difference::new(
                    format!("{profile} {operation}"),
                    if *expect { "allow" } else { "deny" },
                    format!(
                        "{} ({})",
                        if d.allowed { "allow" } else { "deny" },
                        d.explanation
                    ),
                ));
            }
        }
        Ok(diffs)
    }
}

/// The Unicode script of a letter, by its full name (`Latin`,
/// `Cyrillic`, ...); `None` for characters every script shares (digits,
/// punctuation) and for combining marks.
fn script(c: char) -> Option<&'static str> {
    use unicode_script::{Script, UnicodeScript};
    match c.script() {
        Script::Common | Script::Inherited | Script::Unknown => None,
        s => Some(s.full_name()),
    }
}

/// A name reduced to what a person sees: the confusables skeleton of
/// Unicode's UTS #39 (`о` Cyrillic, `ο` Greek and `o` Latin alike; `1` and
/// `l`; full-width forms), with case folded, so two names with the same
/// skeleton look alike in a table.
fn skeleton(name: &str) -> String {
    // White space of any kind (a trailing space, a no-break space, an
    // ideographic space) is invisible at the end of a table cell.
    let visible: String = name.chars().filter(|c| !c.is_whitespace()).collect();
    let once: String = unicode_security::skeleton(&visible).collect();
    unicode_security::skeleton(&once.to_lowercase()).collect()
}

/// What an operator should look at in `profiles.json` before trusting a
/// grants table: malformed entries (always denied), names that mix scripts,
/// names that look alike, and roles or operations the policies do not read
/// ([`known::Known`]: a typo is denied without a word otherwise).
pub fn warnings(profiles: &Profiles, known: &known::Known) -> Vec<String> {
    warnings_by_profile(profiles, known)
        .into_iter()
        .map(|(_, w)| w)
        .collect()
}

/// The same, each with the profile it is about (the first of two that look
/// alike), names quoted for a terminal (escaped, as `{:?}` quotes them).
pub fn warnings_by_profile(profiles: &Profiles, known: &known::Known) -> Vec<(String, String)> {
    warnings_quoted(profiles, known, &|s: &str| {
        format!("{:?}", crate::text::esc(s).into_owned())
    })
}

/// The same, names quoted by `quote` (the reviewer's page quotes them as
/// they are: it escapes only what hides or reorders text).
pub fn warnings_quoted(
    profiles: &Profiles,
    known: &known::Known,
    quote: &dyn Fn(&str) -> String,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, p) in &profiles.profiles {
        let mut about: Vec<String> = typos(name, p, known, quote);
        if !p.problems.is_empty() {
            about.push(format!(
                "profile {} is malformed and is denied everything: {}",
                quote(name),
                p.problems.join("; ")
            ));
        }
        if name.chars().any(char::is_whitespace) {
            about.push(format!(
                "profile {} holds white space, which a table does not show: it may be posing \
                 as another name",
                quote(name)
            ));
        }
        let mut scripts: Vec<&str> = name.chars().filter_map(script).collect();
        scripts.sort();
        scripts.dedup();
        if scripts.len() > 1 {
            about.push(format!(
                "profile {} mixes scripts ({}): it may be posing as another name",
                quote(name),
                scripts.join(" + ")
            ));
        }
        out.extend(about.into_iter().map(|w| (name.clone(), w)));
    }
    let names: Vec<&String> = profiles.profiles.keys().collect();
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            if skeleton(a) == skeleton(b) {
                out.push(((*a).clone(), format!(
                    "profiles {} and {} look alike; a person reading the table cannot tell them apart",
                    quote(a),
                    quote(b)
                )));
            }
        }
    }
    out
}

/// A profile's role that no policy reads and is no fleet role, and its
/// operations a letter or two off one the policies read.
fn typos(
    name: &str,
    p: &Profile,
    known: &known::Known,
    quote: &dyn Fn(&str) -> String,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(role) = &p.role {
        if let Some(near) = known.role_near(role) {
            let roles: Vec<&str> = known.roles.iter().map(String::as_str).collect();
            let hint = near.map_or(String::new(), |n| format!("; did you mean {n:?}?"));
            out.push(format!(
                "profile {}: role {} is no role the capability policies read nor a fleet \
                 role ({}), so no policy grants it anything by role{hint}",
                quote(name),
                quote(role),
                roles.join(", ")
            ));
        }
    }
    for op in p.allowed_operations.iter().flatten() {
        if let Some(near) = known.operation_near(op) {
            out.push(format!(
                "profile {}: allowed_operations holds {}, which no capability policy reads; \
                 did you mean {near:?}?",
                quote(name),
                quote(op)
            ));
        }
    }
    out
}

/// profile → operation → allowed.
pub type Grants = std::collections::BTreeMap<String, std::collections::BTreeMap<String, bool>>;

/// Ask the capability policies about every profile and operation.
pub fn grants(policies: &Policies, profiles: &Profiles) -> Result<Grants> {
    let mut out = Grants::new();
    for name in profiles.profiles.keys() {
        let mut ops = std::collections::BTreeMap::new();
        for op in Operation::ALL {
            ops.insert(op.to_string(), check(policies, profiles, name, op)?.allowed);
        }
        out.insert(name.clone(), ops);
    }
    Ok(out)
}

/// What changes from `old` to `new`: (profile, operation, now allowed).
pub fn changes(old: &Grants, new: &Grants) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    let names: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for name in names {
        for op in Operation::ALL.map(Operation::code) {
            let before = old
                .get(name)
                .and_then(|m| m.get(op))
                .copied()
                .unwrap_or(false);
            let after = new
                .get(name)
                .and_then(|m| m.get(op))
                .copied()
                .unwrap_or(false);
            if before != after {
                out.push((name.clone(), op.to_string(), after));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet_known() -> known::Known {
        let policies = Policies::load(&crate::policy::PolicySource::Embedded).unwrap();
        known::Known::of(
            &policies,
            &["author", "reviewer", "merger", "controller", "reconciler"],
        )
    }

    #[test]
    fn names_differing_by_white_space_alone_are_flagged() {
        for trailing in [" ", "\u{a0}", "\u{3000}", "\t"] {
            let doc = serde_json::json!({"profiles": {
                "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]},
                format!("controller-prgs{trailing}"): {"role": "controller",
                    "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
            }});
            let w = warnings(&Profiles::from_json(&doc).unwrap(), &fleet_known());
            assert!(
                w.iter().any(|l| l.contains("look alike")),
                "{trailing:?}: {w:?}"
            );
            assert!(
                w.iter().any(|l| l.contains("white space")),
                "{trailing:?}: {w:?}"
            );
        }
    }

    #[test]
    fn look_alike_and_mixed_script_names_are_flagged() {
        let doc = serde_json::json!({"profiles": {
            "controller-prgs": {"role": "controller", "allowed_operations": ["gitea.read"]},
            "contr\u{43e}ller-prgs": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
            "author-prgs": {"role": "author", "allowed_operations": "gitea.read"},
        }});
        let w = warnings(&Profiles::from_json(&doc).unwrap(), &fleet_known());
        assert!(
            w.iter()
                .any(|l| l.contains("mixes scripts (Cyrillic + Latin)")),
            "{w:?}"
        );
        assert!(w.iter().any(|l| l.contains("look alike")), "{w:?}");
        assert!(
            w.iter().any(|l| l.contains("\"author-prgs\" is malformed")),
            "{w:?}"
        );
        // Confusables beyond Cyrillic: a digit one for an l, a Greek
        // omicron, full-width letters; each pairs with the real name.
        for fake in [
            "contro1ler-prgs",
            "contr\u{3bf}ller-prgs",
            "\u{ff43}ontroller-prgs",
        ] {
            let doc = serde_json::json!({"profiles": {
                "controller-prgs": {"role": "controller", "allowed_operations": []},
                fake: {"role": "controller", "allowed_operations": []},
            }});
            let w = warnings(&Profiles::from_json(&doc).unwrap(), &fleet_known());
            assert!(w.iter().any(|l| l.contains("look alike")), "{fake}: {w:?}");
        }
        let clean = serde_json::json!({"profiles": {
            "controller-prgs": {"role": "controller", "allowed_operations": []},
            "reconciler-prgs": {"role": "reconciler", "allowed_operations": []},
        }});
        assert!(warnings(&Profiles::from_json(&clean).unwrap(), &fleet_known()).is_empty());
    }

    /// A malformed entry reaches Cedar with its role and operations as
    /// written; the forbid `unknown-or-malformed-profile` is what denies
    /// it: without that forbid the same entry would plan and apply.
    #[test]
    fn a_malformed_profile_is_denied_by_the_policy_not_by_rust() {
        let doc = serde_json::json!({"profiles": {
            "odd": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire", 7]},
        }});
        let profiles = Profiles::from_json(&doc).unwrap();
        let builtin =
            crate::policy::Policies::load(&crate::policy::PolicySource::Embedded).unwrap();
        let without = builtin
            .with_replaced("unknown-or-malformed-profile", None)
            .unwrap();
        for op in [Operation::Snapshot, Operation::Plan, Operation::Apply] {
            assert!(
                !check(&builtin, &profiles, "odd", op).unwrap().allowed,
                "{op}"
            );
            assert!(
                check(&without, &profiles, "odd", op).unwrap().allowed,
                "{op}"
            );
        }
    }
}
