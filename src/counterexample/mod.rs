//! Counterexamples a person can read and reuse.
//!
//! The solver's model of a difference (`policy diff`), a broken property
//! (`policy verify`) or a surviving mutant (`policy mutate`) sets every
//! attribute, most of them to whatever satisfied it first: counts of -1,
//! the largest Long, one attribute's text in another's. Here it becomes a
//! case a person can read: start from a realistic row ([`base`]: a worker
//! dead and stale on this host), take from the model only the attributes
//! the difference needs (delta debugging over attributes, [`ddmin`]), then
//! give each of those the most ordinary value that keeps it (a text from
//! the attribute's usual values, a Long as close to the realistic one as
//! the difference allows). Every step is checked with Cedar's evaluator,
//! so the case shows exactly the difference the solver proved; one the
//! evaluator does not confirm is left as the solver gave it.

pub mod base;
mod ddmin;
mod plausible;
pub mod proofs;
mod sentence;

pub use sentence::{say, say_error};

/// `case` made plain ([`minimise`]) and said in one sentence, which also
/// opens its description: `first` and `second` are the two sides, each
/// with whether it allows the request.
pub fn plain(
    case: &Json,
    schema: &Schema,
    shows: &Shows,
    first: (&str, bool),
    second: (&str, bool),
) -> Plain {
    let (mut case, deciding) = minimise(case, schema, shows);
    let sentence = say(&case, &deciding, first, second);
    described(&mut case, &sentence);
    Plain {
        sentence,
        deciding,
        case,
    }
}

/// The case's description opened by its sentence.
pub fn described(case: &mut Json, sentence: &str) {
    let mut opening: Vec<char> = sentence.chars().collect();
    if let Some(first) = opening.first_mut() {
        *first = first.to_ascii_uppercase();
    }
    let opening: String = opening.into_iter().collect();
    let rest = case["description"].as_str().unwrap_or("").to_string();
    case["description"] = Json::from(format!("{opening}. {rest}").trim_end().to_string());
}

use crate::error::{Error, Result};
use cedar_policy::{Authorizer, Context, Decision, Entities, EntityUid, PolicySet, Schema};
use serde_json::{json, Value as Json};

/// One request, by its principal, action and resource.
pub struct Request {
    /// The principal.
    pub principal: EntityUid,
    /// The action.
    pub action: EntityUid,
    /// The resource.
    pub resource: EntityUid,
}

/// Whether the difference still shows on a request and its entities.
pub type Shows<'a> = dyn Fn(&Entities, &Request) -> bool + 'a;

/// A counterexample made plain.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plain {
    /// What it is, in one sentence.
    pub sentence: String,
    /// The attributes the difference needs (`Worker.heartbeat_age_us`),
    /// each holding another value than the realistic row's.
    pub deciding: Vec<String>,
    /// The fixture case: request, entities and the expected decision.
    pub case: Json,
}

impl Plain {
    /// The sentence, the deciding attributes and the case, as a terminal
    /// or a log shows it (the case still parses: see
    /// [`crate::text::json_for_terminal`]).
    pub fn text(&self) -> String {
        format!(
            "{}\ndeciding attributes: {}\nas a fixture case:\n{}",
            crate::text::esc(&self.sentence),
            deciding_text(&self.deciding),
            crate::text::json_for_terminal(&self.case)
        )
    }
}

/// The deciding attributes as a line says them.
pub fn deciding_text(deciding: &[String]) -> String {
    if deciding.is_empty() {
        "none: the realistic row shows it as it is".to_string()
    } else {
        deciding.join(", ")
    }
}

/// Whether `set` allows the request with no evaluation error (an error
/// denies, as in a plan and a fixture case).
pub fn allows(set: &PolicySet, entities: &Entities, r: &Request) -> bool {
    let Ok(request) = cedar_policy::Request::new(
        r.principal.clone(),
        r.action.clone(),
        r.resource.clone(),
        Context::empty(),
        None,
    ) else {
        return false;
    };
    let answer = Authorizer::new().is_authorized(&request, set, entities);
    answer.decision() == Decision::Allow && answer.diagnostics().errors().next().is_none()
}

/// Whether evaluating `set` on the request errors.
pub fn errors(set: &PolicySet, entities: &Entities, r: &Request) -> bool {
    let Ok(request) = cedar_policy::Request::new(
        r.principal.clone(),
        r.action.clone(),
        r.resource.clone(),
        Context::empty(),
        None,
    ) else {
        return true;
    };
    let answer = Authorizer::new().is_authorized(&request, set, entities);
    let erred = answer.diagnostics().errors().next().is_some();
    erred
}

fn uid_json(uid: &EntityUid) -> Json {
    json!({"type": uid.type_name().to_string(), "id": uid.id().unescaped()})
}

/// The solver's model as a Cedar-level fixture case (`docs/fixtures.md`)
/// expecting `expect_allow`: the request, and the entities without the
/// schema's actions (the schema declares them).
pub fn case_of(
    env: &cedar_policy_symcc::Env,
    name: &str,
    description: &str,
    expect_allow: bool,
) -> Result<Json> {
    let req = &env.request;
    let (Some(principal), Some(action), Some(resource)) =
        (req.principal(), req.action(), req.resource())
    else {
        return Err(Error::Internal {
            doing: "the solver's counterexample has an unknown request variable".into(),
            source: "incomplete request".into(),
        });
    };
    let mut entities = env.entities.to_json_value().map_err(|e| Error::Internal {
        doing: "writing the counterexample's entities".into(),
        source: Box::new(e),
    })?;
    if let Json::Array(list) = &mut entities {
        list.retain(|e| base::short(e["uid"]["type"].as_str().unwrap_or("")) != "Action");
    }
    Ok(json!({
        "name": name,
        "description": description,
        "request": {
            "principal": uid_json(principal),
            "action": uid_json(action),
            "resource": uid_json(resource),
        },
        "entities": entities,
        "expect": {"decision": if expect_allow { "allow" } else { "deny" }},
    }))
}

/// `case` made plain: its entities as the realistic row but for the
/// attributes `shows` needs from the solver's model, each as ordinary as
/// `shows` allows, and the entities' ids as a plan names them. Returns the
/// case and its deciding attributes; a case `shows` does not hold of is
/// returned as it is, with none.
pub fn minimise(case: &Json, schema: &Schema, shows: &Shows) -> (Json, Vec<String>) {
    let Some(mut search) = Search::new(case, schema, shows) else {
        return (case.clone(), Vec::new());
    };
    if !search.check(&search.all_taken()) {
        return (case.clone(), Vec::new());
    }
    let all = search.all_taken();
    let needed = ddmin::ddmin(all, &mut |t: &[Taken]| search.check(t));
    let needed = search.without_pairs(needed);
    let taken = search.plausible(needed);
    let taken = search.consistent(taken);
    search.drop_other_entities(&taken);
    search.rename_ids(&taken);
    let deciding = search.deciding(&taken);
    let mut out = case.clone();
    out["request"] = search.request.clone();
    out["entities"] = Json::Array(search.compose(&taken));
    (out, deciding)
}

/// One attribute taken from the model (or made plausible) rather than
/// left as the realistic row has it.
#[derive(Debug, Clone)]
struct Taken {
    /// The entity's index in [`Search::model`].
    entity: usize,
    attr: String,
    value: Json,
    /// Set only to agree with a deciding attribute ([`base::implied`]):
    /// not deciding itself.
    implied: bool,
}

/// The state of one minimisation.
struct Search<'a> {
    schema: &'a Schema,
    shows: &'a Shows<'a>,
    /// The case's request (`principal`, `action`, `resource` as uids).
    request: Json,
    /// The model's entities: the principal, the resource, then any other.
    model: Vec<Json>,
}

/// Whether two JSON values are of one kind (as an attribute's type).
fn same_kind(a: &Json, b: &Json) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// A set's elements as a sorted list, for comparing sets.
fn as_set(v: &Json) -> Json {
    match v {
        Json::Array(items) => {
            let mut sorted = items.clone();
            sorted.sort_by_key(|x| x.to_string());
            sorted.dedup();
            Json::Array(sorted)
        }
        other => other.clone(),
    }
}

impl<'a> Search<'a> {
    fn new(case: &Json, schema: &'a Schema, shows: &'a Shows<'a>) -> Option<Search<'a>> {
        let request = case.get("request")?.clone();
        let entities = case.get("entities")?.as_array()?;
        let is = |e: &Json, role: &str| e["uid"] == request[role];
        let mut model: Vec<Json> = Vec::new();
        for role in ["principal", "resource"] {
            model.push(entities.iter().find(|e| is(e, role))?.clone());
        }
        model.extend(
            entities
                .iter()
                .filter(|e| !is(e, "principal") && !is(e, "resource"))
                .cloned(),
        );
        Some(Search {
            schema,
            shows,
            request,
            model,
        })
    }

    /// The realistic value of entity `i`'s attribute, when there is one
    /// of the model's kind.
    fn realistic(&self, i: usize, attr: &str) -> Option<Json> {
        let type_name = self.model[i]["uid"]["type"].as_str()?;
        let (_, attrs) = base::realistic(type_name)?;
        let value = attrs.get(attr)?;
        same_kind(value, &self.model[i]["attrs"][attr]).then(|| value.clone())
    }

    fn type_of(&self, i: usize) -> &str {
        self.model[i]["uid"]["type"].as_str().unwrap_or("")
    }

    /// Every attribute where the model differs from the realistic row.
    fn all_taken(&self) -> Vec<Taken> {
        let mut out = Vec::new();
        for (i, e) in self.model.iter().enumerate() {
            let Some(attrs) = e["attrs"].as_object() else {
                continue;
            };
            for (attr, value) in attrs {
                match self.realistic(i, attr) {
                    Some(r) if as_set(&r) == as_set(value) => {}
                    Some(_) => out.push(Taken {
                        entity: i,
                        attr: attr.clone(),
                        value: value.clone(),
                        implied: false,
                    }),
                    None => {}
                }
            }
        }
        out
    }

    /// The entities: the realistic row, with the `taken` attributes.
    fn compose(&self, taken: &[Taken]) -> Vec<Json> {
        let mut out = self.model.clone();
        for (i, e) in out.iter_mut().enumerate() {
            let Some(attrs) = e["attrs"].as_object_mut() else {
                continue;
            };
            for (attr, value) in attrs.iter_mut() {
                if let Some(t) = taken.iter().find(|t| t.entity == i && &t.attr == attr) {
                    *value = t.value.clone();
                } else if let Some(r) = self.realistic(i, attr) {
                    *value = r;
                }
            }
        }
        out
    }

    /// Whether the difference shows with the `taken` attributes.
    fn check(&self, taken: &[Taken]) -> bool {
        self.holds(&self.request, self.compose(taken))
    }

    fn holds(&self, request: &Json, entities: Vec<Json>) -> bool {
        let uid = |role: &str| -> Option<EntityUid> {
            let type_name = request[role]["type"].as_str()?.parse().ok()?;
            let id = cedar_policy::EntityId::new(request[role]["id"].as_str()?);
            Some(EntityUid::from_type_name_and_id(type_name, id))
        };
        let (Some(principal), Some(action), Some(resource)) =
            (uid("principal"), uid("action"), uid("resource"))
        else {
            return false;
        };
        let Ok(entities) = Entities::from_json_value(Json::Array(entities), Some(self.schema))
        else {
            return false;
        };
        (self.shows)(
            &entities,
            &Request {
                principal,
                action,
                resource,
            },
        )
    }

    /// `taken` without every pair of attributes the difference needs only
    /// together: two that must be equal (a worker's host and the run's)
    /// are each needed while the other holds the model's value, and
    /// return to the realistic row together (so the result is 2-minimal).
    fn without_pairs(&self, mut taken: Vec<Taken>) -> Vec<Taken> {
        'again: loop {
            for i in 0..taken.len() {
                for j in i + 1..taken.len() {
                    let rest: Vec<Taken> = taken
                        .iter()
                        .enumerate()
                        .filter(|(k, _)| *k != i && *k != j)
                        .map(|(_, t)| t.clone())
                        .collect();
                    if self.check(&rest) {
                        taken = rest;
                        continue 'again;
                    }
                }
            }
            return taken;
        }
    }

    /// `taken` with `edit` made, when the difference still shows.
    fn attempt(&self, taken: &mut Vec<Taken>, edit: impl FnOnce(&mut Vec<Taken>)) -> bool {
        let mut trial = taken.clone();
        edit(&mut trial);
        let kept = self.check(&trial);
        if kept {
            *taken = trial;
        }
        kept
    }

    /// The deciding attributes: those still other than the realistic row.
    fn deciding(&self, taken: &[Taken]) -> Vec<String> {
        taken
            .iter()
            .filter(|t| !t.implied)
            .filter(|t| {
                self.realistic(t.entity, &t.attr).map(|r| as_set(&r)) != Some(as_set(&t.value))
            })
            .map(|t| format!("{}.{}", base::short(self.type_of(t.entity)), t.attr))
            .collect()
    }
}
