//! Proofs about the policies, for all requests and entity stores the schema
//! allows, with Cedar's symbolic compiler and the cvc5 solver.
//!
//! Two kinds of proof:
//! * every eligibility policy never errors (Cedar skips a policy that
//!   errors, so an erroring forbid would let rows through);
//! * every property in `policies/properties/` (a permit with
//!   `@subject` and `@proof`) is implied by its subject policy set
//!   (`subject_implies_property`: a ceiling), or implies it
//!   (`property_implies_subject`: a floor).
//!
//! A failed proof carries the counterexample request and entities.

use crate::error::{About, Error, Result};
use crate::policy::{Policies, ELIGIBILITY_FILE};
use cedar_policy::{ActionConstraint, Policy, PolicySet, RequestEnv};
use cedar_policy_symcc::solver::LocalSolver;
use cedar_policy_symcc::{CedarSymCompiler, CompiledPolicy, CompiledPolicySet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

const EMBEDDED: &[(&str, &str)] = &[
    (
        "properties/retirement.cedar",
        include_str!("../policies/properties/retirement.cedar"),
    ),
    (
        "properties/capabilities.cedar",
        include_str!("../policies/properties/capabilities.cedar"),
    ),
];

/// One property to prove.
#[derive(Debug, Clone)]
pub struct Property {
    /// `@id`.
    pub id: String,
    /// `@description`.
    pub description: String,
    /// The policy file whose policies are the subject.
    pub subject: String,
    /// `subject_implies_property` or `property_implies_subject`.
    pub proof: String,
    /// The property as a one-policy set.
    pub policy: Policy,
    /// The property file it was read from (`properties/NAME.cedar`).
    pub file: String,
    /// The line it starts on in that file.
    pub line: usize,
}

/// The outcome of one proof obligation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Proof {
    /// What was proved (a property id, or `never-errors:<policy id>`).
    pub id: String,
    /// In words.
    pub description: String,
    /// The request environment (principal, action, resource types).
    pub request_env: String,
    /// Whether it holds.
    pub holds: bool,
    /// When it does not: the request and entities that break it, in a
    /// sentence and as a fixture case ([`crate::counterexample`]).
    pub counterexample: Option<String>,
    /// The same, as its parts.
    pub witness: Option<crate::counterexample::Plain>,
    /// Where it comes from: its property file, or the policy file whose
    /// policies must never error (for JUnit's suites).
    #[serde(skip)]
    pub file: String,
    /// How long the solver took, in seconds.
    #[serde(skip)]
    pub seconds: f64,
    /// The line of `file` where the property (or the policy) starts.
    #[serde(skip)]
    pub line: usize,
}

/// The property files as written: (name, text, path when on disk), the
/// built-in ones or a folder's `properties/*.cedar` (none when it has no
/// such folder), for `policy validate`'s layout check.
pub fn property_files(dir: Option<&Path>) -> Result<Vec<(String, String, Option<PathBuf>)>> {
    let Some(d) = dir else {
        return Ok(EMBEDDED
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string(), None))
            .collect());
    };
    let pd = d.join("properties");
    if !pd.is_dir() {
        return Ok(Vec::new());
    }
    let mut names: Vec<PathBuf> = std::fs::read_dir(&pd)
        .map_err(|e| {
            Error::policy(
                About::PolicySet,
                format!("{}: cannot list ({e})", pd.display()),
            )
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cedar"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|p| {
            let name = format!(
                "properties/{}",
                p.file_name().unwrap_or_default().to_string_lossy()
            );
            crate::policy::read_folder_file(&p).map(|t| (name, t, Some(p)))
        })
        .collect()
}

/// Read the properties to prove: the built-in ones (always, when
/// `with_builtin`: a folder of policies must satisfy what ours promise, so a
/// permit-all folder with no properties of its own proves nothing away),
/// plus `DIR/properties/*.cedar` of a policy folder. A folder property whose
/// `@id` is also a built-in one is listed as `DIR:id`.
pub fn load_properties(
    dir: Option<&Path>,
    policies: &Policies,
    with_builtin: bool,
) -> Result<Vec<Property>> {
    let mut out = Vec::new();
    if with_builtin || dir.is_none() {
        let files = EMBEDDED
            .iter()
            .map(|(n, t)| (format!("built-in {n}"), t.to_string()))
            .collect();
        out = parse_properties(files, policies)?;
    }
    if let Some(d) = dir {
        let pd = d.join("properties");
        if !pd.is_dir() {
            if with_builtin {
                return Ok(out);
            }
            return Err(Error::policy(
                About::PolicySet,
                format!(
                    "{}: no such folder; a policy folder holds its properties in \
                     properties/*.cedar (copy policies/properties/ to start from ours)",
                    pd.display()
                ),
            ));
        }
        let files: Vec<(String, String)> = property_files(dir)?
            .into_iter()
            .map(|(name, text, _)| (name, text))
            .collect();
        for mut p in parse_properties(files, policies)? {
            match out.iter().find(|b: &&Property| b.id == p.id) {
                // The folder's copy of a built-in property: proved once.
                Some(b) if b.policy.to_string() == p.policy.to_string() => continue,
                Some(_) => p.id = format!("{}:{}", d.display(), p.id),
                None => {}
            }
            out.push(p);
        }
    }
    Ok(out)
}

fn parse_properties(files: Vec<(String, String)>, policies: &Policies) -> Result<Vec<Property>> {
    let mut out = Vec::new();
    for (name, text) in files {
        let set = PolicySet::from_str(&text).map_err(|e| {
            Error::policy(
                About::Policy(name.to_string()),
                crate::policy::diagnostics::describe(&e, &name, &text),
            )
        })?;
        let validation = cedar_policy::Validator::new(policies.schema.clone())
            .validate(&set, cedar_policy::ValidationMode::Strict);
        if let Some(e) = validation.validation_errors().next() {
            return Err(Error::policy(
                About::Policy(name.to_string()),
                format!("{name}: {e}"),
            ));
        }
        // Cedar's set gives its policies in no fixed order: by id, so that
        // proofs are listed the same way every run.
        let mut in_file: Vec<&Policy> = set.policies().collect();
        in_file.sort_by_key(|p| p.annotation("id").unwrap_or_default().to_string());
        for p in in_file {
            let get = |k: &str| p.annotation(k).map(str::to_string);
            let id = get("id").ok_or_else(|| {
                Error::policy(
                    About::Policy(name.to_string()),
                    format!("{name}: a property has no @id"),
                )
            })?;
            let subject = get("subject").ok_or_else(|| {
                Error::policy(
                    About::Policy(id.clone()),
                    format!("{name}: property {id} has no @subject"),
                )
            })?;
            let proof = get("proof").unwrap_or_default();
            if !["subject_implies_property", "property_implies_subject"].contains(&proof.as_str()) {
                return Err(Error::policy(About::Policy(id.clone()), format!(
                    "{name}: property {id} needs @proof(\"subject_implies_property\") or @proof(\"property_implies_subject\")"
                )));
            }
            if !["retirement", "capabilities"].contains(&subject.as_str()) {
                return Err(Error::policy(
                    About::Policy(id.clone()),
                    format!("{name}: property {id}: @subject must be retirement or capabilities"),
                ));
            }
            out.push(Property {
                file: name.to_string(),
                line: crate::policy::policy_lines(p, &text).0,
                description: get("description").unwrap_or_default(),
                subject: format!("{subject}.cedar"),
                proof,
                policy: p.new_id(cedar_policy::PolicyId::new(&id)),
                id,
            });
        }
    }
    Ok(out)
}

/// The policies of `set` in the order their files list them.
fn in_file_order<'a>(set: &'a PolicySet, policies: &Policies) -> Vec<&'a Policy> {
    let mut listed: Vec<&Policy> = set.policies().collect();
    listed.sort_by_key(|p| {
        let at = policies.rules.get(p.id()).map(|r| (r.file.clone(), r.line));
        (at, p.id().to_string())
    });
    listed
}

fn subset(policies: &Policies, file: &str) -> Result<PolicySet> {
    let mut set = PolicySet::new();
    for rule in policies.rules.values().filter(|r| r.file == file) {
        let p = policies
            .set
            .policy(&cedar_policy::PolicyId::new(&rule.id))
            .expect("every rule is in the set")
            .clone();
        set.add(p)
            .map_err(|e| Error::policy(About::PolicySet, e.to_string()))?;
    }
    Ok(set)
}

/// The order actions are reported in: retirement first, then what decides
/// its peers (the first stage, in its own order), then the operator's
/// capabilities.
fn action_rank(action: &str) -> usize {
    let first_stage = &crate::policy::entities::FIRST_STAGE_ACTIONS;
    let capabilities = ["snapshot", "plan", "apply"];
    if action == "retire" {
        return 0;
    }
    if let Some(i) = first_stage.iter().position(|a| *a == action) {
        return 1 + i;
    }
    capabilities
        .iter()
        .position(|a| *a == action)
        .map_or(usize::MAX, |i| 1 + first_stage.len() + i)
}

/// The schema's request environments, in [`action_rank`] order (other actions
/// after those, by name).
pub fn ordered_envs(schema: &cedar_policy::Schema) -> Vec<RequestEnv> {
    let mut envs: Vec<RequestEnv> = schema.request_envs().collect();
    envs.sort_by_key(|e| {
        let a = e.action().id().unescaped().to_string();
        (action_rank(&a), a)
    });
    envs
}

pub(crate) fn applies(policy: &Policy, env: &RequestEnv) -> bool {
    match policy.action_constraint() {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(a) => &a == env.action(),
        ActionConstraint::In(list) => list.contains(env.action()),
    }
}

fn env_text(env: &RequestEnv) -> String {
    format!("{} {} {}", env.principal(), env.action(), env.resource())
}

/// Run `work` with a symbolic compiler backed by cvc5, on a one-thread
/// runtime (every proof of the program goes through here).
pub fn with_solver<T>(
    work: impl AsyncFnOnce(&mut CedarSymCompiler<LocalSolver>) -> Result<T>,
) -> Result<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Internal {
            doing: "cannot start the async runtime".into(),
            source: Box::new(e),
        })?;
    runtime.block_on(async {
        // A minute for each query, not for the process (`cvc5()` gives the
        // process one minute in all, which a long run of queries outlives);
        // extended string terms, which a `like` pattern starting with `*` needs.
        let solver = LocalSolver::cvc5_with_args(["--tlimit-per=60000", "--strings-exp"])
            .map_err(sym_err)?;
        let mut compiler = CedarSymCompiler::new(solver).map_err(sym_err)?;
        work(&mut compiler).await
    })
}

/// A failure of the solver itself, with what to install.
pub fn sym_err(e: impl std::fmt::Display) -> Error {
    Error::input(
        About::Machine,
        format!(
            "the symbolic check failed to run: {e}. The proofs need the cvc5 solver: \
         install the Debian package cvc5, or set CVC5 to its path"
        ),
    )
}

/// What deleting one eligibility forbid would do.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ForbidRole {
    /// The forbid's `@id`.
    pub forbid: String,
    /// Its reason code.
    pub reason: String,
    /// The set without it decides every retire request alike: it only
    /// names a reason code (other forbids already keep every row it keeps).
    pub shadowed: bool,
    /// When it is not shadowed: a request the set without it allows.
    pub counterexample: Option<String>,
}

/// Everything `policy verify` establishes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Verification {
    /// One result per proof obligation; every one must hold.
    pub proofs: Vec<Proof>,
    /// Per eligibility forbid: does it decide anything on its own (then a
    /// property must guard it), or is it shadowed (proved).
    pub forbids: Vec<ForbidRole>,
}

/// Run every proof, and find which forbids are shadowed.
pub fn verify(policies: &Policies, properties: &[Property]) -> Result<Verification> {
    with_solver(async |compiler| {
        let schema = &policies.schema;
        let mut proofs = Vec::new();
        // In one order every run (Cedar's schema and set keep none): the
        // actions as `policy diff` lists them, each policy in file order.
        let envs = ordered_envs(schema);

        // 1. No eligibility policy can ever error.
        let eligibility = subset(policies, ELIGIBILITY_FILE)?;
        let eligibility = in_file_order(&eligibility, policies);
        for env in &envs {
            for p in eligibility.iter().copied().filter(|p| applies(p, env)) {
                let started = std::time::Instant::now();
                let compiled = CompiledPolicy::compile(p, env, schema).map_err(sym_err)?;
                let cex = compiler
                    .check_never_errors_with_counterexample_opt(&compiled)
                    .await
                    .map_err(sym_err)?;
                let witness = cex
                    .map(|c| crate::counterexample::proofs::erring(&c, p, schema))
                    .transpose()?;
                proofs.push(Proof {
                    id: format!("never-errors:{}", p.id()),
                    description: format!("policy {} never errors", p.id()),
                    request_env: env_text(env),
                    holds: witness.is_none(),
                    counterexample: witness.as_ref().map(crate::counterexample::Plain::text),
                    witness,
                    file: ELIGIBILITY_FILE.to_string(),
                    seconds: started.elapsed().as_secs_f64(),
                    line: policies.rules.get(p.id()).map_or(1, |r| r.line),
                });
            }
        }

        // 2. Properties.
        proofs.extend(prove_with(compiler, policies, properties).await?);

        // 3. Each forbid: does the set without it allow more?
        let forbids = forbid_roles_with(compiler, policies).await?;
        Ok(Verification { proofs, forbids })
    })
}

async fn forbid_roles_with(
    compiler: &mut CedarSymCompiler<LocalSolver>,
    policies: &Policies,
) -> Result<Vec<ForbidRole>> {
    let schema = &policies.schema;
    let envs: Vec<RequestEnv> = schema.request_envs().collect();
    let eligibility = subset(policies, ELIGIBILITY_FILE)?;
    let mut forbids = Vec::new();
    let retire = envs
        .iter()
        .find(|e| e.action().id().unescaped() == "retire");
    if let Some(env) = retire {
        let whole = CompiledPolicySet::compile(&eligibility, env, schema).map_err(sym_err)?;
        let mut rules: Vec<&crate::policy::Rule> = policies
            .rules
            .values()
            .filter(|r| r.file == ELIGIBILITY_FILE && r.reason.is_some())
            .collect();
        rules.sort_by(|a, b| (a.order, &a.id).cmp(&(b.order, &b.id)));
        for rule in rules {
            let mut without = PolicySet::new();
            for p in eligibility
                .policies()
                .filter(|p| p.id().as_ref() != rule.id)
            {
                without
                    .add(p.clone())
                    .map_err(|e| Error::policy(About::PolicySet, e.to_string()))?;
            }
            let less = CompiledPolicySet::compile(&without, env, schema).map_err(sym_err)?;
            let cex = compiler
                .check_implies_with_counterexample_opt(&less, &whole)
                .await
                .map_err(sym_err)?;
            let decides = cex
                .map(|c| {
                    crate::counterexample::proofs::deciding(
                        &c,
                        &eligibility,
                        &without,
                        &rule.id,
                        schema,
                    )
                })
                .transpose()?;
            forbids.push(ForbidRole {
                forbid: rule.id.clone(),
                reason: rule
                    .reason
                    .map(|r| r.code())
                    .unwrap_or_default()
                    .to_string(),
                shadowed: decides.is_none(),
                counterexample: decides.as_ref().map(crate::counterexample::Plain::text),
            });
        }
    }
    Ok(forbids)
}

/// Which eligibility forbids are shadowed (the set without one decides
/// every retire request alike), by forbid id; needs cvc5.
pub fn shadowed_forbids(policies: &Policies) -> Result<std::collections::BTreeMap<String, bool>> {
    with_solver(async |compiler| {
        Ok(forbid_roles_with(compiler, policies)
            .await?
            .into_iter()
            .map(|f| (f.forbid, f.shadowed))
            .collect())
    })
}

/// The same policy with the effect `permit`: its condition as an allow, so
/// that "this forbid matches" can be compared by policy-set implication.
pub(crate) fn as_permit(policy: &Policy) -> Result<Policy> {
    let mut json = policy.to_json().map_err(|e| {
        Error::policy(
            About::Policy(policy.id().to_string()),
            format!("{}: {e}", policy.id()),
        )
    })?;
    json["effect"] = serde_json::Value::from("permit");
    Policy::from_json(Some(policy.id().clone()), json).map_err(|e| {
        Error::policy(
            About::Policy(policy.id().to_string()),
            format!("{}: {e}", policy.id()),
        )
    })
}

/// Per forbid, whether it can never be the deciding one: proved that for
/// every request it matches, a forbid of lower `@order` (same file) also
/// matches. Such a forbid only ever adds a reason code after the primary
/// one, so no case can show it deciding. Needs cvc5.
pub fn never_primary_forbids(
    policies: &Policies,
) -> Result<std::collections::BTreeMap<String, bool>> {
    with_solver(async |compiler| {
        let schema = &policies.schema;
        let envs: Vec<RequestEnv> = schema.request_envs().collect();
        let forbids: Vec<&crate::policy::Rule> = policies
            .ordered_rules()
            .into_iter()
            .filter(|r| r.effect == cedar_policy::Effect::Forbid)
            .collect();
        let policy = |r: &crate::policy::Rule| {
            policies
                .set
                .policy(&cedar_policy::PolicyId::new(&r.id))
                .expect("every rule is in the set")
                .clone()
        };
        let mut out = std::collections::BTreeMap::new();
        for rule in &forbids {
            let p = policy(rule);
            let mut alone = PolicySet::new();
            alone
                .add(as_permit(&p)?)
                .map_err(|e| Error::policy(About::PolicySet, e.to_string()))?;
            let mut earlier = PolicySet::new();
            for q in forbids
                .iter()
                .filter(|q| q.file == rule.file && (q.order, &q.id) < (rule.order, &rule.id))
            {
                earlier
                    .add(as_permit(&policy(q))?)
                    .map_err(|e| Error::policy(About::PolicySet, e.to_string()))?;
            }
            let mut never = true;
            for env in envs.iter().filter(|e| applies(&p, e)) {
                let a = CompiledPolicySet::compile(&alone, env, schema).map_err(sym_err)?;
                let b = CompiledPolicySet::compile(&earlier, env, schema).map_err(sym_err)?;
                if !compiler.check_implies_opt(&a, &b).await.map_err(sym_err)? {
                    never = false;
                    break;
                }
            }
            out.insert(rule.id.clone(), never);
        }
        Ok(out)
    })
}

async fn prove_with(
    compiler: &mut CedarSymCompiler<LocalSolver>,
    policies: &Policies,
    properties: &[Property],
) -> Result<Vec<Proof>> {
    let schema = &policies.schema;
    let envs = ordered_envs(schema);
    let mut proofs = Vec::new();
    for prop in properties {
        // Proved of the whole set, as the program evaluates it: a permit of
        // another file that names this action is part of the subject
        // (`@subject` names the file the property speaks of).
        let subject = policies.set.clone();
        let mut prop_set = PolicySet::new();
        prop_set
            .add(prop.policy.clone())
            .map_err(|e| Error::policy(About::PolicySet, e.to_string()))?;
        for env in envs.iter().filter(|e| applies(&prop.policy, e)) {
            let started = std::time::Instant::now();
            let s = CompiledPolicySet::compile(&subject, env, schema).map_err(sym_err)?;
            let p = CompiledPolicySet::compile(&prop_set, env, schema).map_err(sym_err)?;
            let (a, b) = if prop.proof == "subject_implies_property" {
                (&s, &p)
            } else {
                (&p, &s)
            };
            let cex = compiler
                .check_implies_with_counterexample_opt(a, b)
                .await
                .map_err(sym_err)?;
            let ceiling = prop.proof == "subject_implies_property";
            let witness = cex
                .map(|c| {
                    crate::counterexample::proofs::breaking(
                        &c,
                        &subject,
                        &prop.policy,
                        ceiling,
                        schema,
                    )
                })
                .transpose()?;
            proofs.push(Proof {
                id: prop.id.clone(),
                description: prop.description.clone(),
                request_env: env_text(env),
                holds: witness.is_none(),
                counterexample: witness.as_ref().map(crate::counterexample::Plain::text),
                witness,
                file: prop.file.clone(),
                seconds: started.elapsed().as_secs_f64(),
                line: prop.line,
            });
        }
    }

    Ok(proofs)
}

/// Prove only the given properties (no never-errors or shadowing checks).
pub fn prove(policies: &Policies, properties: &[Property]) -> Result<Vec<Proof>> {
    with_solver(async |compiler| prove_with(compiler, policies, properties).await)
}
