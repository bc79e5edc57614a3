//! `explain`: for one worker, the evidence and every eligibility policy's
//! verdict (satisfied, not, or errored), so a reviewer sees why a row was
//! kept or would be retired. It asks Cedar policy by policy; it never
//! decides anything itself.

use crate::plan::{Entry, Plan};
use crate::policy::engine::Engine;
use crate::policy::entities::{retire_action, run_entity, run_uid, worker_entity, worker_uid};
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
            worker_entity(entry.index, row, plan.observation(entry)),
        ],
        None::<&NoEntitiesSchema>,
        TCComputation::AssumeAlreadyComputed,
        Extensions::all_available(),
    );
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
                    if rule.file != ELIGIBILITY_FILE {
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
        "evidence": plan.evidence(entry),
    })
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
    let _ = writeln!(out, "  evidence: {}", e["evidence"]);
    out
}
