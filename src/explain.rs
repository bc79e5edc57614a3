//! `explain`: for one worker, the evidence and every eligibility policy's
//! verdict (satisfied, not, or errored), so a reviewer sees why a row was
//! kept or would be retired. It asks Cedar policy by policy; it never
//! decides anything itself.

use crate::plan::{Entry, Plan};
use crate::policy::engine::Engine;
use crate::policy::entities::{
    first_stage_actions, retire_action, run_entity, run_uid, worker_attrs, worker_entity,
    worker_uid, FIRST_STAGE_ACTIONS,
};
use crate::policy::{Policies, ELIGIBILITY_FILE};
use cedar_policy_core::entities::{Entities, NoEntitiesSchema, TCComputation};
use cedar_policy_core::extensions::Extensions;
use serde_json::{json, Value as Json};

/// Explain one entry of a plan.
pub fn explain_entry(plan: &Plan, entry: &Entry, policies: &Policies) -> Json {
    let row = &plan.rows[entry.index];
    let entities = Entities::from_entities(
        [
            run_entity(&plan.facts),
            worker_entity(entry.index, row, plan.observation(entry), plan.facts.now),
        ],
        None::<&NoEntitiesSchema>,
        TCComputation::AssumeAlreadyComputed,
        Extensions::all_available(),
    );
    let cedar = entities
        .as_ref()
        .map(|e| cedar_request(e, entry.index, policies))
        .unwrap_or(Json::Null);
    let verdicts: Vec<Json> = match entities {
        Err(e) => vec![json!({"error": format!("building entities: {e}")})],
        Ok(entities) => {
            let each = Engine::new(policies).each(
                &entities,
                &run_uid(),
                &retire_action(),
                &worker_uid(entry.index),
            );
            let mut rows: Vec<(u32, Json)> = each
                .into_iter()
                .filter_map(|(id, result)| {
                    let rule = policies.rules.get(&id)?;
                    if rule.file != ELIGIBILITY_FILE || !about_retire(policies, &id) {
                        return None;
                    }
                    let effect = if rule.effect == cedar_policy::Effect::Permit {
                        "permit"
                    } else {
                        "forbid"
                    };
                    let verdict = match &result {
                        Ok(true) => "satisfied",
                        Ok(false) => "not satisfied",
                        Err(_) => "errored",
                    };
                    Some((
                        rule.order,
                        json!({
                            "policy_id": rule.id,
                            "effect": effect,
                            "reason": rule.reason.map(|r| r.code()),
                            "order": rule.reason.map(|_| rule.order),
                            "verdict": verdict,
                            "error": result.err(),
                            "description": rule.description,
                        }),
                    ))
                })
                .collect();
            rows.sort_by_key(|(o, _)| *o);
            rows.into_iter().map(|(_, j)| j).collect()
        }
    };
    json!({
        "worker_identity": row.get(crate::row::Col::WorkerIdentity).to_json(),
        "row": entry.index + 1,
        "decision": if entry.is_candidate() { "retire" } else { "keep" },
        "reason_code": entry.reason().code(),
        "reason_codes": entry.reason_codes().iter().map(|r| r.code()).collect::<Vec<_>>(),
        "policies": verdicts,
        "cedar_request": cedar,
        "first_stage": first_stage(plan, entry.index, policies),
        "evidence": plan.evidence(entry),
        "protecting_leases": protecting_leases(row, &plan.facts.active_leases),
    })
}

/// The active leases that protect `row`, each with its id, role and target
/// and the values of the row it names ("session_id=…"), matched exactly as
/// the plan matched them (one lease at a time through the same index).
fn protecting_leases(row: &crate::row::Row, leases: &[crate::evidence::leases::Lease]) -> Json {
    use crate::evidence::leases::{LeaseCol, Protections};
    let named: Vec<Json> = leases
        .iter()
        .filter_map(|lease| {
            let one = Protections::from_leases(std::iter::once(lease));
            let hits =
                crate::observe::protection_hits(row, &crate::observe::ProtectionIndex::of(&one));
            (!hits.is_empty()).then(|| {
                json!({
                    "lease_id": lease.get(LeaseCol::LeaseId).to_json(),
                    "role": lease.get(LeaseCol::Role).to_json(),
                    "target": lease.get(LeaseCol::Target).to_json(),
                    "names": hits,
                })
            })
        })
        .collect();
    Json::Array(named)
}

/// A uid as Cedar writes it (`Type::"id"`), the form `cedar authorize
/// --request-json` reads.
fn uid_json(uid: &cedar_policy_core::ast::EntityUID) -> Json {
    Json::from(cedar_policy::EntityUid::from(uid.clone()).to_string())
}

/// The retire request exactly as evaluated, in Cedar's own JSON forms:
/// principal, action and resource, the (empty) context (together a file
/// for `cedar authorize --request-json`), and the entities
/// (the run, and the row with the first stage's answers already collected
/// into shared_identity_evidence and the slot counts). `decision` is Cedar's
/// answer for the whole policy set, read back from that JSON under the
/// schema, so `cedar authorize` on the same files gives the same one.
fn cedar_request(entities: &Entities, index: usize, policies: &Policies) -> Json {
    let principal = run_uid();
    let resource = worker_uid(index);
    let action = retire_action();
    let json = match entities.to_json_value() {
        Ok(j) => j,
        Err(e) => return json!({"error": format!("writing the entities as JSON: {e}")}),
    };
    let decision = cedar_policy::Entities::from_json_value(json.clone(), Some(&policies.schema))
        .map_err(|e| e.to_string())
        .and_then(|parsed| {
            let request = cedar_policy::Request::new(
                principal.clone().into(),
                action.clone().into(),
                resource.clone().into(),
                cedar_policy::Context::empty(),
                Some(&policies.schema),
            )
            .map_err(|e| e.to_string())?;
            let answer =
                cedar_policy::Authorizer::new().is_authorized(&request, &policies.set, &parsed);
            Ok(if answer.decision() == cedar_policy::Decision::Allow {
                "allow"
            } else {
                "deny"
            })
        });
    json!({
        "principal": uid_json(&principal),
        "action": uid_json(&action),
        "resource": uid_json(&resource),
        "context": {},
        "entities": json,
        "decision": match decision {
            Ok(d) => json!(d),
            Err(e) => json!({"error": e}),
        },
    })
}

/// Whether a policy can apply to the retire action (the first-stage
/// permits are shown on their own).
fn about_retire(policies: &Policies, id: &cedar_policy::PolicyId) -> bool {
    match policies.set.policy(id).map(|p| p.action_constraint()) {
        Some(cedar_policy::ActionConstraint::Eq(a)) => a.id().unescaped() == "retire",
        Some(cedar_policy::ActionConstraint::In(list)) => {
            list.iter().any(|a| a.id().unescaped() == "retire")
        }
        _ => true,
    }
}

/// Cedar's first-stage answers for the row and every row that bears on it
/// (sharing identity evidence or its slot): what its
/// shared_identity_evidence and slot counts were collected from.
fn first_stage(plan: &Plan, index: usize, policies: &Policies) -> Json {
    let engine = Engine::new(policies);
    let run = run_entity(&plan.facts);
    let answer = |i: usize| -> Json {
        let row = &plan.rows[i];
        let attrs = worker_attrs(row, &plan.observations[i], plan.facts.now);
        let one = |action: &cedar_policy_core::ast::EntityUID| -> Json {
            let v =
                crate::plan::judge_entity(&engine, policies, &run, &run_uid(), action, i, &attrs);
            if !v.errors.is_empty() {
                json!("errored (counts as yes)")
            } else {
                json!(v.allowed)
            }
        };
        let mut out = json!({
            "worker_identity": row.get(crate::row::Col::WorkerIdentity).to_json(),
            "row": i + 1,
        });
        for (name, action) in FIRST_STAGE_ACTIONS.iter().zip(first_stage_actions()) {
            out[*name] = one(&action);
        }
        out
    };
    let peers: Vec<Json> = crate::observe::peers_of(&plan.rows, &plan.observations, index)
        .into_iter()
        .map(answer)
        .collect();
    json!({ "row": answer(index), "peers": peers })
}

/// Human rendering of one explanation.
pub fn render(e: &Json) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "worker {} (row {}): {} — {}",
        e["worker_identity"],
        e["row"],
        e["decision"].as_str().unwrap_or(""),
        e["reason_code"].as_str().unwrap_or("")
    );
    for p in e["policies"].as_array().into_iter().flatten() {
        let mark = match p["verdict"].as_str() {
            Some("satisfied") if p["effect"] == "forbid" => "FORBIDS",
            Some("satisfied") => "permits",
            Some("errored") => "ERRORED",
            _ => "-",
        };
        let _ = writeln!(
            out,
            "  {:>4} {:<8} {:<38} {}",
            p["order"]
                .as_u64()
                .map(|o| o.to_string())
                .unwrap_or_default(),
            mark,
            p["policy_id"].as_str().unwrap_or(""),
            p["reason"].as_str().unwrap_or("")
        );
    }
    let stage = &e["first_stage"];
    for (label, r) in std::iter::once(("this row", &stage["row"])).chain(
        stage["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| ("peer", p)),
    ) {
        let held: Vec<&str> = crate::observe::EVIDENCE_KINDS
            .iter()
            .filter(|k| r[format!("hold_{k}")] != false)
            .copied()
            .collect();
        let _ = writeln!(
            out,
            "  first stage, {label} {} (row {}): holds identity evidence: {}; claims its slot: {}; occupies it: {}",
            crate::text::esc(&r["worker_identity"].to_string()),
            r["row"],
            if held.is_empty() { "none".to_string() } else { held.join(", ") },
            r["claim_instance_slot"],
            r["occupy_instance_slot"]
        );
    }
    if let Some(leases) = e["protecting_leases"].as_array().filter(|l| !l.is_empty()) {
        let _ = writeln!(out, "  protected by active leases:");
        for l in leases {
            let names: Vec<&str> = l["names"]
                .as_array()
                .map(|n| n.iter().filter_map(Json::as_str).collect())
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "    lease {} (role {}, target {}) names {}",
                crate::text::esc(&l["lease_id"].to_string()),
                crate::text::esc(&l["role"].to_string()),
                crate::text::esc(&l["target"].to_string()),
                crate::text::esc(&names.join(", "))
            );
        }
    }
    // One field a line, as a person reads it (`--format json` has the
    // same object whole).
    let _ = writeln!(out, "  evidence:");
    if let Some(fields) = e["evidence"].as_object() {
        let width = fields.keys().map(String::len).max().unwrap_or(0);
        for (name, value) in fields {
            // As JSON: a text "null" and a NULL stay apart.
            let _ = writeln!(
                out,
                "    {name:<width$}  {}",
                crate::text::esc(&value.to_string())
            );
        }
    }
    out
}
