//! `policy diff`: what a change of the policy files does, proved for every
//! request and entity store the schema allows (Cedar's symbolic compiler
//! and cvc5), and observed on fixtures.
//!
//! Per action, two implications are checked: every request NEW allows, OLD
//! allows (NEW is no more permissive), and the converse. Whether "more
//! permissive" is the dangerous direction depends on the action:
//!
//! * `retire`, `snapshot`, `plan`, `apply`: allowing more is a loosening
//!   (a row retired, an operator granted, that OLD refused);
//! * the first-stage actions (`hold_<kind>`, `claim_instance_slot`,
//!   `occupy_instance_slot`): allowing *fewer* is
//!   the loosening. These first-stage answers say a row may be live; a row
//!   that no longer counts as may-be-live stops protecting the rows that
//!   share its evidence or its slot, so they can be retired.
//!
//! Every direction that fails comes with a counterexample, written as a
//! Cedar-level fixture case (`request` + `entities`, docs/fixtures.md)
//! that expects OLD's decision: saved and run with NEW's policies, it
//! fails until the change is reverted or the case is flipped on purpose.

use crate::error::{About, Error, Result};
use crate::policy::{Policies, PolicySource, POLICY_FILES, SCHEMA_FILE};
use crate::verify::sym_err;
use cedar_policy::{ActionConstraint, Effect, Policy, PolicySet, RequestEnv};
use cedar_policy_symcc::solver::LocalSolver;
use cedar_policy_symcc::{CedarSymCompiler, CompiledPolicy, CompiledPolicySet};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// The first-stage actions, where allowing fewer requests is the loosening.
pub const MAY_BE_LIVE_ACTIONS: &[&str] = &crate::policy::entities::FIRST_STAGE_ACTIONS;

/// How an action's decisions moved from OLD to NEW, in safety terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Every request is decided alike.
    Equivalent,
    /// NEW refuses something OLD allowed (or, for a may-be-live action,
    /// counts more rows as may-be-live), and loosens nothing.
    Tightened,
    /// NEW allows something OLD refused (or, for a may-be-live action,
    /// counts fewer rows as may-be-live), and tightens nothing.
    Loosened,
    /// Some of each.
    Both,
}

impl Change {
    /// The word printed and used in JSON.
    pub fn word(self) -> &'static str {
        match self {
            Change::Equivalent => "equivalent",
            Change::Tightened => "tightened",
            Change::Loosened => "loosened",
            Change::Both => "both",
        }
    }

    /// Whether the change lets something through that OLD stopped.
    pub fn loosens(self) -> bool {
        matches!(self, Change::Loosened | Change::Both)
    }

    fn of(loosened: bool, tightened: bool) -> Change {
        match (loosened, tightened) {
            (false, false) => Change::Equivalent,
            (false, true) => Change::Tightened,
            (true, false) => Change::Loosened,
            (true, true) => Change::Both,
        }
    }
}

/// One request on which OLD and NEW decide differently.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Counterexample {
    /// `loosening` or `tightening`.
    pub direction: &'static str,
    /// OLD allows the request.
    pub old_allows: bool,
    /// NEW allows the request.
    pub new_allows: bool,
    /// What it is, in one sentence.
    pub sentence: String,
    /// The attributes the difference needs, each other than a realistic
    /// row's (`Worker.ttl_us`).
    pub deciding: Vec<String>,
    /// The request and entities as a fixture case, ready to save: a
    /// realistic row with only the deciding attributes from the solver.
    pub case: Json,
}

/// One action's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionDiff {
    /// The action's id (`retire`, `apply`, ...).
    pub action: String,
    /// Principal, action and resource types.
    pub request_env: String,
    /// NEW allows some request OLD refuses.
    pub allows_more: bool,
    /// NEW refuses some request OLD allows.
    pub allows_fewer: bool,
    /// What that means for safety.
    pub change: Change,
    /// One request per direction that moved.
    pub counterexamples: Vec<Counterexample>,
}

/// What is known about one policy of NEW.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyNote {
    /// `@id`.
    pub id: String,
    /// `permit` or `forbid`.
    pub effect: &'static str,
    /// Its reason code (forbids of retirement.cedar).
    pub reason: Option<String>,
    /// `added`, `removed`, `changed` or `unchanged` against OLD (by `@id`
    /// and the policy's text).
    pub status: &'static str,
    /// Proved: it matches no request at all of any action it names.
    pub never_matches: bool,
    /// Proved: it matches every request of every action it names (a forbid
    /// that always matches refuses all of them).
    pub always_matches: bool,
    /// Proved: the set without it decides every request alike (other
    /// policies already decide everything it decides; a forbid may still
    /// name a reason code).
    pub redundant: bool,
}

/// Everything `policy diff` establishes by proof.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyDiff {
    /// Where OLD came from.
    pub old: String,
    /// Where NEW came from.
    pub new: String,
    /// OLD's and NEW's fingerprints.
    pub old_fingerprint: String,
    /// NEW's fingerprint.
    pub new_fingerprint: String,
    /// The schema text differs (both sets were compared under NEW's).
    pub schema_changed: bool,
    /// Per action.
    pub actions: Vec<ActionDiff>,
    /// Per policy of NEW, then the policies OLD had and NEW dropped.
    pub policies: Vec<PolicyNote>,
}

impl PolicyDiff {
    /// The change over all actions.
    pub fn overall(&self) -> Change {
        let loosened = self.actions.iter().any(|a| a.change.loosens());
        let tightened = self
            .actions
            .iter()
            .any(|a| matches!(a.change, Change::Tightened | Change::Both));
        Change::of(loosened, tightened)
    }
}

/// Load a policy set named on the command line: an existing folder, or a
/// git revision (`REV` reads `REV:policies/`, `REV:PATH` reads that folder
/// of the revision), read with `git show` in the current directory's
/// repository.
///
/// A revision is never an option to git: one starting with `-` is refused
/// (`--output=FILE` would make git write files), and `--end-of-options`
/// goes before it all the same.
pub fn load_named(arg: &str) -> Result<Policies> {
    let path = Path::new(arg);
    if path.is_dir() {
        return Policies::load(&PolicySource::Dir(path.to_path_buf()));
    }
    if arg.starts_with('-') {
        return Err(Error::input(
            About::Option("policy diff"),
            format!(
                "{arg:?} is not a policy folder, and as a git revision it starts with '-', which \
             git would take as an option; name a folder (./{arg} if one is meant) or a revision \
             such as HEAD~1 or main:policies"
            ),
        ));
    }
    let (rev, dir) = rev_and_dir(arg);
    let mut files = Vec::new();
    for name in std::iter::once(SCHEMA_FILE).chain(POLICY_FILES.iter().copied()) {
        files.push((name.to_string(), git_show(arg, &spec(arg, name))?));
    }
    Policies::from_texts(&files, format!("git {rev}:{dir}"))
}

/// A revision argument's revision and folder: `REV` is `REV:policies`.
fn rev_and_dir(arg: &str) -> (&str, &str) {
    match arg.split_once(':') {
        Some((rev, dir)) => (rev, dir.trim_end_matches('/')),
        None => (arg, "policies"),
    }
}

/// `git show`'s name of the file `name` of a revision's policy folder.
fn spec(arg: &str, name: &str) -> String {
    match rev_and_dir(arg) {
        (rev, "") => format!("{rev}:{name}"),
        (rev, dir) => format!("{rev}:{dir}/{name}"),
    }
}

/// The text of another file of a set named as [`load_named`] names one
/// (`properties/retirement.cedar` of a folder or of a revision's folder),
/// when it has one.
pub fn named_file(arg: &str, name: &str) -> Option<String> {
    let path = Path::new(arg);
    if path.is_dir() {
        return crate::policy::read_folder_file(&path.join(name)).ok();
    }
    if arg.starts_with('-') {
        return None;
    }
    git_show(arg, &spec(arg, name)).ok()
}

/// The text of one file of a revision, `git show --end-of-options SPEC`,
/// bounded as a folder's policy file is.
fn git_show(arg: &str, spec: &str) -> Result<String> {
    let out = std::process::Command::new("git")
        .args(["show", "--end-of-options", spec])
        .output()
        .map_err(|e| {
            Error::input(
                About::Option("policy diff"),
                format!(
                "{arg:?} is not a folder, and git could not be run to read it as a revision ({e})"
            ),
            )
        })?;
    if !out.status.success() {
        return Err(Error::input(
            About::Option("policy diff"),
            format!(
                "{arg:?} is neither a policy folder nor a git revision holding {spec}: \
             `git show {spec}` said: {}. Name a folder with {SCHEMA_FILE} and {}, or a \
             revision such as HEAD~1 (its policies/) or main:policies",
                String::from_utf8_lossy(&out.stderr).trim(),
                POLICY_FILES.join(", ")
            ),
        ));
    }
    if out.stdout.len() as u64 > crate::policy::MAX_POLICY_FILE_BYTES {
        return Err(Error::policy(
            About::PolicySet,
            format!(
                "`git show {spec}`: the file is larger than {} bytes, which no policy file is",
                crate::policy::MAX_POLICY_FILE_BYTES
            ),
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| {
        Error::input(
            About::Option("policy diff"),
            format!("`git show {spec}`: the file is not valid UTF-8"),
        )
    })
}

/// A set with no policy, or whose schema declares no action, is not a
/// policy set to compare: against it any change would look equivalent (or
/// compare nothing at all). `side` is `OLD` or `NEW`.
fn refuse_empty(side: &str, set: &Policies) -> Result<()> {
    let problem = if set.set.policies().next().is_none() {
        "holds no policies"
    } else if set.schema.request_envs().next().is_none() {
        "has a schema that declares no action"
    } else {
        return Ok(());
    };
    Err(Error::policy(
        About::PolicySet,
        format!(
        "{side} ({}) {problem}: an empty policy set is never compared, since every change would \
         look equivalent against it. Name a folder or git revision whose {SCHEMA_FILE} and {} \
         hold the policies",
        crate::text::esc(&set.origin),
        POLICY_FILES.join(", ")
    ),
    ))
}

/// Whether `policy` can apply to the action with id `action` (`retire`).
pub fn names_action(policy: &Policy, action: &str) -> bool {
    let is = |uid: &cedar_policy::EntityUid| uid.id().unescaped() == action;
    match policy.action_constraint() {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(a) => is(&a),
        ActionConstraint::In(list) => list.iter().any(is),
    }
}

fn applies(policy: &Policy, env: &RequestEnv) -> bool {
    match policy.action_constraint() {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(a) => &a == env.action(),
        ActionConstraint::In(list) => list.contains(env.action()),
    }
}

/// A counterexample as a Cedar-level fixture case that expects OLD's
/// decision (as the solver gave it; [`crate::counterexample`] makes it
/// plain).
pub(crate) fn case_of(
    env: &cedar_policy_symcc::Env,
    action: &str,
    old_allows: bool,
    new_allows: bool,
) -> Result<Json> {
    let word = |a: bool| if a { "allows" } else { "refuses" };
    crate::counterexample::case_of(
        env,
        &format!(
            "policy diff: OLD {} and NEW {} this {action} request",
            word(old_allows),
            word(new_allows)
        ),
        &format!(
            "Found by `fleet-retire policy diff`. It expects OLD's decision ({}): with NEW's \
             policies it fails. If the change is intended, flip expect.decision.",
            if old_allows { "allow" } else { "deny" }
        ),
        old_allows,
    )
}

/// Prove how NEW's decisions differ from OLD's, action by action, and what
/// each policy of NEW contributes. Both sets are compiled under NEW's
/// schema; an OLD set that does not type-check under it is an error.
pub fn diff(old: &Policies, new: &Policies) -> Result<PolicyDiff> {
    refuse_empty("OLD", old)?;
    refuse_empty("NEW", new)?;
    crate::verify::with_solver(async |compiler| {
        let envs = crate::verify::ordered_envs(&new.schema);
        let mut actions = Vec::new();
        for env in &envs {
            actions.push(action_diff(compiler, old, new, env).await?);
        }
        let mut policies = Vec::new();
        for rule in in_file_order(new.ordered_rules()) {
            policies.push(policy_note(compiler, old, new, &envs, rule).await?);
        }
        policies.extend(dropped_notes(old, new));
        Ok(PolicyDiff {
            old: old.origin.clone(),
            new: new.origin.clone(),
            old_fingerprint: old.fingerprint.clone(),
            new_fingerprint: new.fingerprint.clone(),
            schema_changed: old.schema_text != new.schema_text,
            actions,
            policies,
        })
    })
}

/// Rules sorted by file and line.
fn in_file_order(mut rules: Vec<&crate::policy::Rule>) -> Vec<&crate::policy::Rule> {
    rules.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    rules
}

/// Prove both implications between OLD and NEW for one action, with a
/// counterexample for each that fails.
async fn action_diff(
    compiler: &mut CedarSymCompiler<LocalSolver>,
    old: &Policies,
    new: &Policies,
    env: &RequestEnv,
) -> Result<ActionDiff> {
    let schema = &new.schema;
    let action = env.action().id().unescaped().to_string();
    let n = CompiledPolicySet::compile(&new.set, env, schema).map_err(sym_err)?;
    let o = CompiledPolicySet::compile(&old.set, env, schema).map_err(|e| {
        Error::policy(
            About::PolicySet,
            format!(
                "OLD's policies do not type-check under NEW's schema for {action} ({e}); \
             policy diff compares both sets under one schema"
            ),
        )
    })?;
    // NEW allows ⇒ OLD allows; a counterexample: NEW allows, OLD refuses.
    let more = compiler
        .check_implies_with_counterexample_opt(&n, &o)
        .await
        .map_err(sym_err)?;
    let fewer = compiler
        .check_implies_with_counterexample_opt(&o, &n)
        .await
        .map_err(sym_err)?;
    let reversed = MAY_BE_LIVE_ACTIONS.contains(&action.as_str());
    let (loosened, tightened) = if reversed {
        (fewer.is_some(), more.is_some())
    } else {
        (more.is_some(), fewer.is_some())
    };
    let counterexamples =
        counterexamples((old, new), more.as_ref(), fewer.as_ref(), &action, reversed)?;
    Ok(ActionDiff {
        request_env: format!("{} {} {}", env.principal(), env.action(), env.resource()),
        action,
        allows_more: more.is_some(),
        allows_fewer: fewer.is_some(),
        change: Change::of(loosened, tightened),
        counterexamples,
    })
}

/// The counterexamples of one action as fixture cases: a request NEW
/// allows and OLD refuses (`more`), then one OLD allows and NEW refuses
/// (`fewer`), each named by its direction (`reversed` for the
/// may-be-live actions) and made plain.
fn counterexamples(
    (old, new): (&Policies, &Policies),
    more: Option<&cedar_policy_symcc::Env>,
    fewer: Option<&cedar_policy_symcc::Env>,
    action: &str,
    reversed: bool,
) -> Result<Vec<Counterexample>> {
    let mut out = Vec::new();
    let found = [(more, false, true), (fewer, true, false)];
    for (cex, old_allows, new_allows) in found {
        let Some(cex) = cex else {
            continue;
        };
        let raw = case_of(cex, action, old_allows, new_allows)?;
        let shows = |e: &cedar_policy::Entities, r: &crate::counterexample::Request| {
            crate::counterexample::allows(&old.set, e, r) == old_allows
                && crate::counterexample::allows(&new.set, e, r) == new_allows
        };
        let plain = crate::counterexample::plain(
            &raw,
            &new.schema,
            &shows,
            ("NEW", new_allows),
            ("OLD", old_allows),
        );
        let loosening = new_allows != reversed;
        out.push(Counterexample {
            direction: if loosening { "loosening" } else { "tightening" },
            old_allows,
            new_allows,
            sentence: plain.sentence,
            deciding: plain.deciding,
            case: plain.case,
        });
    }
    Ok(out)
}

/// What is known about one rule of NEW: its status against OLD, and what
/// is proved of it on every request environment it applies to.
async fn policy_note(
    compiler: &mut CedarSymCompiler<LocalSolver>,
    old: &Policies,
    new: &Policies,
    envs: &[RequestEnv],
    rule: &crate::policy::Rule,
) -> Result<PolicyNote> {
    let id = cedar_policy::PolicyId::new(&rule.id);
    let policy = new.set.policy(&id).expect("every rule is in the set");
    let status = match old.set.policy(&id) {
        None => "added",
        Some(p) if p.to_string() == policy.to_string() => "unchanged",
        Some(_) => "changed",
    };
    let without = set_without(&new.set, &id)?;
    let (mut never, mut always, mut redundant) = (true, true, true);
    for env in envs.iter().filter(|e| applies(policy, e)) {
        let schema = &new.schema;
        let compiled = CompiledPolicy::compile(policy, env, schema).map_err(sym_err)?;
        if !compiler
            .check_never_matches_opt(&compiled)
            .await
            .map_err(sym_err)?
        {
            never = false;
        }
        if !compiler
            .check_always_matches_opt(&compiled)
            .await
            .map_err(sym_err)?
        {
            always = false;
        }
        let whole = CompiledPolicySet::compile(&new.set, env, schema).map_err(sym_err)?;
        let less = CompiledPolicySet::compile(&without, env, schema).map_err(sym_err)?;
        if !compiler
            .check_equivalent_opt(&whole, &less)
            .await
            .map_err(sym_err)?
        {
            redundant = false;
        }
    }
    Ok(PolicyNote {
        id: rule.id.clone(),
        effect: effect_word(rule.effect),
        reason: rule.reason.map(|r| r.code().to_string()),
        status,
        never_matches: never,
        always_matches: always,
        redundant,
    })
}

/// `set` without the policy `id`.
fn set_without(set: &PolicySet, id: &cedar_policy::PolicyId) -> Result<PolicySet> {
    let mut without = PolicySet::new();
    for p in set.policies().filter(|p| p.id() != id) {
        without
            .add(p.clone())
            .map_err(|e| Error::policy(About::PolicySet, e.to_string()))?;
    }
    Ok(without)
}

/// The rules OLD had and NEW dropped, in file order, as `removed` notes.
fn dropped_notes(old: &Policies, new: &Policies) -> Vec<PolicyNote> {
    let dropped: Vec<&crate::policy::Rule> = old
        .rules
        .values()
        .filter(|r| new.rules.keys().all(|k| k.as_ref() != r.id))
        .collect();
    in_file_order(dropped)
        .into_iter()
        .map(|rule| PolicyNote {
            id: rule.id.clone(),
            effect: effect_word(rule.effect),
            reason: rule.reason.map(|r| r.code().to_string()),
            status: "removed",
            never_matches: false,
            always_matches: false,
            redundant: false,
        })
        .collect()
}

/// One row or request whose decision differs between OLD and NEW.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Observed {
    /// The fixture file.
    pub file: PathBuf,
    /// The case's name.
    pub case: String,
    /// The worker identity, or `profile operation` for a capability case,
    /// or the request's action for a Cedar-level case.
    pub subject: String,
    /// OLD's verdict: `candidate` / a reason code / `allow` / `deny`.
    pub old: String,
    /// NEW's verdict.
    pub new: String,
    /// NEW lets through what OLD stopped.
    pub loosens: bool,
}

/// Run every fixture under both sets, and list every verdict that moved.
pub fn observe_fixtures(
    old: &Policies,
    new: &Policies,
    files: &[PathBuf],
) -> Result<Vec<Observed>> {
    use crate::fixture::Case;
    let mut out = Vec::new();
    for file in files {
        match crate::fixture::load(file)? {
            Case::Plan(c) => {
                let (a, b) = (c.plan(old)?, c.plan(new)?);
                out.extend(compare_plans(&a, &b, file, &c.name));
            }
            Case::Capability(c) => {
                for (profile, operation, _) in &c.requests {
                    let Some(operation) = crate::capability::Operation::from_code(operation) else {
                        continue;
                    };
                    let ask = |p: &Policies| {
                        crate::capability::check(p, &c.profiles, profile, operation)
                            .map(|d| d.allowed)
                    };
                    let (before, after) = (ask(old)?, ask(new)?);
                    if before != after {
                        out.push(Observed {
                            file: file.clone(),
                            case: c.name.clone(),
                            subject: format!("{profile} {operation}"),
                            old: word(before),
                            new: word(after),
                            loosens: after,
                        });
                    }
                }
            }
            Case::Entity(c) => {
                let (before, after) =
                    (c.verdict(old, file)?.allowed, c.verdict(new, file)?.allowed);
                if before != after {
                    let action = c.action.id().unescaped().to_string();
                    let reversed = MAY_BE_LIVE_ACTIONS.contains(&action.as_str());
                    out.push(Observed {
                        file: file.clone(),
                        case: c.name.clone(),
                        subject: action,
                        old: word(before),
                        new: word(after),
                        loosens: after != reversed,
                    });
                }
            }
            Case::Snapshot(_) => {}
        }
    }
    Ok(out)
}

/// Every row whose verdict differs between two plans of the same rows.
pub fn compare_plans(
    a: &crate::plan::Plan,
    b: &crate::plan::Plan,
    file: &Path,
    case: &str,
) -> Vec<Observed> {
    // The primary reason, then any others: a change of a secondary reason
    // code is a change too.
    let verdict = |e: &crate::plan::Entry| {
        if e.is_candidate() {
            return "candidate".to_string();
        }
        let codes: Vec<&str> = e.reason_codes().iter().map(|r| r.code()).collect();
        match codes.split_first() {
            Some((first, [])) => first.to_string(),
            Some((first, rest)) => format!("{first} (+{})", rest.join(", ")),
            None => e.reason().code().to_string(),
        }
    };
    a.entries
        .iter()
        .zip(&b.entries)
        .filter_map(|(x, y)| {
            let (before, after) = (verdict(x), verdict(y));
            (before != after).then(|| Observed {
                file: file.to_path_buf(),
                case: case.to_string(),
                subject: a.identity(x),
                loosens: after == "candidate" && before != "candidate",
                old: before,
                new: after,
            })
        })
        .collect()
}

/// Plan a real registry under both sets, on one reading of the rows and
/// one set of probe answers, and list every verdict that moved.
pub fn observe_registry(
    old: &Policies,
    new: &Policies,
    registry: &Path,
    leases: &Path,
    proc_root: &Path,
    canonical_repository: String,
) -> Result<(usize, Vec<Observed>)> {
    let rows = crate::evidence::registry::load(registry)?;
    let lease_rows = crate::evidence::leases::load(leases)?;
    let facts =
        crate::observe::RunFacts::of_this_host(proc_root, Some(canonical_repository), &lease_rows);
    let system = crate::evidence::probe::SystemProbe::new(proc_root);
    let recording = crate::evidence::probe::RecordingProbe::new(&system);
    let a = crate::plan::plan(rows.clone(), facts.clone(), &recording, old)?;
    let b = crate::plan::plan(rows, facts, &recording.given(), new)?;
    Ok((a.entries.len(), compare_plans(&a, &b, registry, "registry")))
}

fn effect_word(effect: Effect) -> &'static str {
    match effect {
        Effect::Permit => "permit",
        Effect::Forbid => "forbid",
    }
}

fn word(allow: bool) -> String {
    if allow { "allow" } else { "deny" }.to_string()
}
