//! A row changed since a plan was made, judged again on its own: what apply
//! needs under its lock to show that a change left every verdict of the
//! plan as it was (docs/apply.md, "The write lock held for what changed").
//!
//! A row reaches the others only through its first-stage answers and the
//! keys they are joined on (its identity evidence, its slot), and reaches
//! its own verdict through its attributes and its peer facts. So when a
//! row's new version has the same keys, the same first-stage answers and
//! the same verdict as the version the plan judged, with the peer facts
//! the plan gave it, no verdict of the plan moved.

use super::{judge_entity, Plan};
use crate::evidence::probe::ProcessProbe;
use crate::observe::{FirstStage, Observation};
use crate::policy::engine::Engine;
use crate::policy::entities::{
    entity, first_stage_actions, retire_action, run_attrs, run_uid, worker_attrs,
};
use crate::policy::eval::Verdict;
use crate::policy::Policies;
use crate::row::Row;

/// A changed row judged now.
#[derive(Debug)]
pub struct Rejudged {
    /// Its observation now (peer facts as the plan gave the old version).
    pub observation: Observation,
    /// Its first-stage answers now.
    pub first_stage: FirstStage,
    /// Its retire verdict now.
    pub verdict: Verdict,
}

impl Rejudged {
    /// Whether the plan's verdicts all stand with this version of row
    /// `index` in place of the one judged: the same first-stage answers,
    /// the same process identity (a key of the join), the same decision and
    /// reason codes.
    pub fn leaves_plan_as_it_was(&self, plan: &Plan, index: usize) -> bool {
        let entry = &plan.entries[index];
        let old = &plan.observations[index];
        plan.first_stage[index] == self.first_stage
            && old.process_identity == self.observation.process_identity
            && entry.verdict.allowed == self.verdict.allowed
            && entry.verdict.reason_codes() == self.verdict.reason_codes()
    }
}

impl Plan {
    /// Judge `row`, a newer version of row `index`, on its own now: observed
    /// with a fresh probe at the current clock, asked the first stage, then
    /// retire with the peer facts the plan gave row `index`. Every row
    /// evaluated on its own (no situations shared), as the plan's check
    /// against its memo does.
    pub fn rejudge_changed(
        &self,
        index: usize,
        row: &Row,
        probe: &dyn ProcessProbe,
        policies: &Policies,
    ) -> Rejudged {
        let mut facts = self.facts.clone();
        facts.now = crate::time::now();
        let old = &self.observations[index];
        let mut observation =
            crate::observe::observe_one(row, &facts, probe, old.identity_row_count);
        let run_attrs = run_attrs(&facts);
        let run = entity(run_uid(), &run_attrs);
        let engine = Engine::new(policies);
        let ask = |obs: &Observation, action: &cedar_policy_core::ast::EntityUID| {
            let attrs = worker_attrs(row, obs, facts.now);
            judge_entity(&engine, policies, &run, &run_uid(), action, index, &attrs)
        };
        let yes = |v: &Verdict| v.allowed || !v.errors.is_empty();
        let actions = first_stage_actions();
        let first: Vec<bool> = actions
            .iter()
            .map(|action| yes(&ask(&observation, action)))
            .collect();
        let first_stage = FirstStage {
            holds: [first[0], first[1], first[2], first[3]],
            claims: first[4],
            occupies: first[5],
        };
        observation.peers = old.peers.clone();
        let verdict = ask(&observation, &retire_action());
        Rejudged {
            observation,
            first_stage,
            verdict,
        }
    }
}
