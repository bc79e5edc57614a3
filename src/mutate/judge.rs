//! Judging mutants: equivalence and witness by the solver, then the
//! fixture cases, then the properties.

use super::generate::Mutant;
use super::Outcome;
use crate::diff::MAY_BE_LIVE_ACTIONS;
use crate::error::Result;
use crate::fixture::Case;
use crate::policy::Policies;
use crate::verify::{applies, as_permit, sym_err, Property};
use cedar_policy::{Effect, Policy, PolicyId, PolicySet, RequestEnv};
use cedar_policy_symcc::solver::LocalSolver;
use cedar_policy_symcc::{CedarSymCompiler, CompiledPolicySet};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::PathBuf;

type Compiler = CedarSymCompiler<LocalSolver>;

/// What one thread compiles once: the original set and every property,
/// per request environment.
struct Cache {
    envs: Vec<RequestEnv>,
    original: Vec<CompiledPolicySet>,
    /// Per property: (env index, the property compiled for it).
    properties: Vec<Vec<(usize, CompiledPolicySet)>>,
    /// Per property: the property as a one-policy set.
    sets: Vec<PolicySet>,
}

impl Cache {
    fn new(policies: &Policies, properties: &[Property]) -> Result<Cache> {
        let schema = &policies.schema;
        // The actions in one order every run, so that a mutant's first
        // witness and first killing property are the same each time.
        let envs: Vec<RequestEnv> = crate::verify::ordered_envs(schema);
        let original = envs
            .iter()
            .map(|env| CompiledPolicySet::compile(&policies.set, env, schema).map_err(sym_err))
            .collect::<Result<_>>()?;
        let mut compiled = Vec::new();
        let mut sets = Vec::new();
        for prop in properties {
            let set = one(prop.policy.clone())?;
            sets.push(set.clone());
            let mut per_env = Vec::new();
            for (i, env) in envs
                .iter()
                .enumerate()
                .filter(|(_, e)| applies(&prop.policy, e))
            {
                per_env.push((
                    i,
                    CompiledPolicySet::compile(&set, env, schema).map_err(sym_err)?,
                ));
            }
            compiled.push(per_env);
        }
        Ok(Cache {
            envs,
            original,
            properties: compiled,
            sets,
        })
    }
}

fn one(policy: Policy) -> Result<PolicySet> {
    PolicySet::from_policies([policy]).map_err(|e| crate::error::Error::Internal {
        doing: "making a one-policy set".into(),
        source: Box::new(e),
    })
}

/// Judge a share of the mutants on this thread's own solver.
pub(super) fn judge_all(
    policies: &Policies,
    properties: &[Property],
    cases: &[(PathBuf, Case)],
    share: Vec<(usize, &Mutant)>,
    progress: &dyn super::Progress,
) -> Result<Vec<(usize, Outcome)>> {
    let cache = Cache::new(policies, properties)?;
    let mut pool = Pool::new(cache.envs.len());
    let mut out = Vec::new();
    // A fresh solver process per batch: one process answering thousands of
    // queries grows slower with each (measured: 262 s for the built-in set
    // on one process; 42 s with a process per 64 mutants).
    for batch in share.chunks(SOLVER_BATCH) {
        crate::verify::with_solver(async |compiler| {
            for &(i, m) in batch {
                let judged =
                    judge(compiler, &cache, &mut pool, policies, properties, cases, m).await;
                out.push((i, judged.map_err(|e| unjudged(m, e))?));
                progress.judged();
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// Mutants judged by one solver process.
const SOLVER_BATCH: usize = 64;

/// A failure while judging one mutant, naming it.
fn unjudged(m: &Mutant, e: crate::error::Error) -> crate::error::Error {
    crate::error::Error::Internal {
        doing: format!(
            "judging the mutant of {} ({}: `{}` -> `{}`)",
            m.policy, m.operator, m.before, m.after
        ),
        source: Box::new(e),
    }
}

fn outcome(m: &Mutant, status: &'static str) -> Outcome {
    Outcome {
        policy: m.policy.clone(),
        operator: m.operator,
        before: m.before.clone(),
        after: m.after.clone(),
        location: m.at,
        status,
        shadowed: false,
        killed_by_property: None,
        killed_by_fixture: None,
        moved: Vec::new(),
        witness: None,
        sentence: None,
        deciding: Vec::new(),
        invalid: None,
    }
}

/// One mutant, start to end.
async fn judge(
    compiler: &mut Compiler,
    cache: &Cache,
    pool: &mut Pool,
    policies: &Policies,
    properties: &[Property],
    cases: &[(PathBuf, Case)],
    m: &Mutant,
) -> Result<Outcome> {
    let (mutant, replacement) = match build(policies, m) {
        Ok(x) => x,
        Err(why) => {
            return Ok(Outcome {
                invalid: Some(why),
                ..outcome(m, "invalid")
            })
        }
    };
    let original = policies
        .set
        .policy(&PolicyId::new(&m.policy))
        .expect("a mutant names a policy of the set");
    let touched: Vec<usize> = (0..cache.envs.len())
        .filter(|&i| {
            applies(original, &cache.envs[i])
                || replacement
                    .as_ref()
                    .is_some_and(|r| applies(r, &cache.envs[i]))
        })
        .collect();
    let moved = match pool.find(cache, &mutant, &touched)? {
        Some(seen) => vec![seen],
        None => {
            let found = compare(compiler, cache, &mutant, &touched).await?;
            pool.keep(policies, &found);
            found
        }
    };
    if moved.is_empty() {
        let shadowed = original.effect() == Effect::Forbid
            && own_matches_moved(
                compiler,
                cache,
                policies,
                original,
                replacement.as_ref(),
                &touched,
            )
            .await?;
        return Ok(Outcome {
            shadowed,
            ..outcome(m, "equivalent")
        });
    }
    let killed_by_fixture = fixture_kill(&mutant, cases);
    let killed_by_property = match witnessed_kill(cache, properties, &moved) {
        Some(id) => Some(id),
        None => property_kill(compiler, cache, &mutant, properties, &touched).await?,
    };
    let killed = killed_by_fixture.is_some() || killed_by_property.is_some();
    let witness = (!killed).then(|| witness(&moved[0], m, policies, &mutant));
    Ok(Outcome {
        killed_by_property,
        killed_by_fixture,
        sentence: witness.as_ref().map(|w| w.sentence.clone()),
        deciding: witness
            .as_ref()
            .map_or_else(Vec::new, |w| w.deciding.clone()),
        witness: witness.map(|w| w.case),
        moved: moved
            .iter()
            .map(|d| format!("{}: {}", d.action, d.direction))
            .collect(),
        ..outcome(m, if killed { "killed" } else { "survived" })
    })
}

/// The mutant as a policy set (the loader's checks included) and its
/// replacement policy; Err says why it is not a valid policy set.
fn build(
    policies: &Policies,
    m: &Mutant,
) -> std::result::Result<(Policies, Option<Policy>), String> {
    let replacement = match &m.replacement {
        Some(json) => Some(
            Policy::from_json(Some(PolicyId::new(&m.policy)), json.clone())
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    Ok((
        policies.with_replaced(&m.policy, replacement.clone())?,
        replacement,
    ))
}

/// The solver's earlier witnesses, per request environment, with the
/// original's decision on each: a mutant that decides one of them
/// otherwise is shown non-equivalent without a solver call (most mutants
/// of one place are told apart by the same request).
struct Pool {
    seen: Vec<Vec<(cedar_policy_symcc::Env, bool)>>,
}

/// Witnesses kept per environment (the newest; older ones are dropped).
const POOL_SIZE: usize = 256;

impl Pool {
    fn new(envs: usize) -> Pool {
        Pool {
            seen: (0..envs).map(|_| Vec::new()).collect(),
        }
    }

    fn allows(set: &PolicySet, w: &cedar_policy_symcc::Env) -> bool {
        cedar_policy::Authorizer::new()
            .is_authorized(&w.request, set, &w.entities)
            .decision()
            == cedar_policy::Decision::Allow
    }

    /// A kept witness the mutant decides otherwise than the original.
    fn find(&self, cache: &Cache, mutant: &Policies, touched: &[usize]) -> Result<Option<Moved>> {
        for &i in touched {
            for (w, original_allows) in self.seen[i].iter().rev() {
                let mutant_allows = Self::allows(&mutant.set, w);
                if mutant_allows != *original_allows {
                    return Moved::of(cache, i, w.clone(), mutant_allows).map(Some);
                }
            }
        }
        Ok(None)
    }

    /// Keep the solver's new witnesses.
    fn keep(&mut self, policies: &Policies, found: &[Moved]) {
        for m in found {
            let original_allows = Self::allows(&policies.set, &m.env);
            let list = &mut self.seen[m.at];
            if list.len() == POOL_SIZE {
                list.remove(0);
            }
            list.push((m.env.clone(), original_allows));
        }
    }
}

/// One action whose decisions moved, with a request showing it.
struct Moved {
    /// The request environment's index in the cache.
    at: usize,
    action: String,
    direction: &'static str,
    case: Json,
    /// Whether the mutant allows the request.
    mutant_allows: bool,
    /// The request and entities, to evaluate properties on.
    env: cedar_policy_symcc::Env,
}

impl Moved {
    /// A request of `env` on which the mutant decides `mutant_allows` and
    /// the original the opposite.
    fn of(
        cache: &Cache,
        at: usize,
        cex: cedar_policy_symcc::Env,
        mutant_allows: bool,
    ) -> Result<Moved> {
        let action = cache.envs[at].action().id().unescaped().to_string();
        let loosening = mutant_allows != MAY_BE_LIVE_ACTIONS.contains(&action.as_str());
        Ok(Moved {
            at,
            direction: if loosening { "loosening" } else { "tightening" },
            case: crate::diff::case_of(&cex, &action, !mutant_allows, mutant_allows)?,
            action,
            mutant_allows,
            env: cex,
        })
    }
}

/// Per touched environment, both implications between the original and
/// the mutant; every direction that fails, with its request.
async fn compare(
    compiler: &mut Compiler,
    cache: &Cache,
    mutant: &Policies,
    touched: &[usize],
) -> Result<Vec<Moved>> {
    let mut out = Vec::new();
    for &i in touched {
        let env = &cache.envs[i];
        let n = CompiledPolicySet::compile(&mutant.set, env, &mutant.schema).map_err(sym_err)?;
        let o = &cache.original[i];
        let more = compiler
            .check_implies_with_counterexample_opt(&n, o)
            .await
            .map_err(sym_err)?;
        let fewer = compiler
            .check_implies_with_counterexample_opt(o, &n)
            .await
            .map_err(sym_err)?;
        for (cex, mutant_allows) in [(more, true), (fewer, false)] {
            if let Some(cex) = cex {
                out.push(Moved::of(cache, i, cex, mutant_allows)?);
            }
        }
    }
    Ok(out)
}

/// Whether a forbid's own matches moved (as a permit, alone) although the
/// set's decisions did not: the forbid is shadowed.
async fn own_matches_moved(
    compiler: &mut Compiler,
    cache: &Cache,
    policies: &Policies,
    original: &Policy,
    replacement: Option<&Policy>,
    touched: &[usize],
) -> Result<bool> {
    let before = one(as_permit(original)?)?;
    let after = match replacement {
        Some(r) => one(as_permit(r)?)?,
        None => PolicySet::new(),
    };
    for &i in touched {
        let env = &cache.envs[i];
        let a = CompiledPolicySet::compile(&before, env, &policies.schema).map_err(sym_err)?;
        let b = CompiledPolicySet::compile(&after, env, &policies.schema).map_err(sym_err)?;
        if !compiler
            .check_equivalent_opt(&a, &b)
            .await
            .map_err(sym_err)?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The first fixture case that fails (or cannot run) under the mutant.
fn fixture_kill(mutant: &Policies, cases: &[(PathBuf, Case)]) -> Option<String> {
    cases.iter().find_map(|(path, case)| {
        let (name, diffs) = match case {
            Case::Plan(c) => (&c.name, c.plan(mutant).map(|p| c.differences(&p))),
            Case::Capability(c) => (&c.name, c.differences(mutant)),
            Case::Entity(c) => (&c.name, c.differences(mutant, path)),
            Case::Snapshot(_) => return None,
        };
        match diffs {
            Ok(d) if d.is_empty() => None,
            _ => Some(name.clone()),
        }
    })
}

/// A property that the solver's own witnesses already break: a request the
/// mutant allows and a ceiling refuses, or one a floor allows and the
/// mutant refuses. No solver call: most killed mutants end here.
fn witnessed_kill(cache: &Cache, properties: &[Property], moved: &[Moved]) -> Option<String> {
    let authorizer = cedar_policy::Authorizer::new();
    for m in moved {
        for (prop, set) in properties.iter().zip(&cache.sets) {
            if !applies(&prop.policy, &cache.envs[m.at]) {
                continue;
            }
            let answer = authorizer.is_authorized(&m.env.request, set, &m.env.entities);
            let allows = answer.decision() == cedar_policy::Decision::Allow;
            let broken = if prop.proof == "subject_implies_property" {
                m.mutant_allows && !allows
            } else {
                allows && !m.mutant_allows
            };
            if broken {
                return Some(prop.id.clone());
            }
        }
    }
    None
}

/// The first property that fails under the mutant, on the environments
/// the mutant touches (on the others it decides as the original, which
/// satisfies every property).
async fn property_kill(
    compiler: &mut Compiler,
    cache: &Cache,
    mutant: &Policies,
    properties: &[Property],
    touched: &[usize],
) -> Result<Option<String>> {
    let mut compiled: HashMap<usize, CompiledPolicySet> = HashMap::new();
    for (prop, per_env) in properties.iter().zip(&cache.properties) {
        for (i, p) in per_env.iter().filter(|(i, _)| touched.contains(i)) {
            if !compiled.contains_key(i) {
                let set = CompiledPolicySet::compile(&mutant.set, &cache.envs[*i], &mutant.schema)
                    .map_err(sym_err)?;
                compiled.insert(*i, set);
            }
            let s = &compiled[i];
            let (a, b) = if prop.proof == "subject_implies_property" {
                (s, p)
            } else {
                (p, s)
            };
            if !compiler.check_implies_opt(a, b).await.map_err(sym_err)? {
                return Ok(Some(prop.id.clone()));
            }
        }
    }
    Ok(None)
}

/// A survivor's witness: the solver's request, as a fixture case named
/// after the mutant, made plain.
fn witness(
    moved: &Moved,
    m: &Mutant,
    policies: &Policies,
    mutant: &Policies,
) -> crate::counterexample::Plain {
    let mut case = moved.case.clone();
    case["name"] = Json::from(format!(
        "policy mutate: {} {} ({} of {})",
        m.policy, m.operator, moved.direction, moved.action
    ));
    case["description"] = Json::from(format!(
        "Found by `fleet-retire policy mutate`: in policy {}, {} changed `{}` to `{}`, and no \
         property or fixture noticed. This request is decided otherwise by that mutant; the \
         case expects the policies' own decision, so saved it kills the mutant.",
        m.policy, m.operator, m.before, m.after
    ));
    let mutant_allows = moved.mutant_allows;
    let shows = |e: &cedar_policy::Entities, r: &crate::counterexample::Request| {
        crate::counterexample::allows(&mutant.set, e, r) == mutant_allows
            && crate::counterexample::allows(&policies.set, e, r) != mutant_allows
    };
    crate::counterexample::plain(
        &case,
        &policies.schema,
        &shows,
        ("the mutant", mutant_allows),
        ("the policies", !mutant_allows),
    )
}
