//! The dry run: observations → Cedar → one verdict per row, plus the tokens.
//!
//! Pure: it takes rows, run facts and a probe, and never opens a file. Apply
//! calls the same function inside its transaction so plan and apply cannot
//! disagree about what they saw.

pub mod changed;
pub mod head;
pub mod planned;
pub mod render;
pub mod saved;
pub mod scoped;

pub use render::Evidence;

use crate::error::Result;
use crate::evidence::probe::ProcessProbe;
use crate::fingerprint::registry_token;
use crate::observe::{observe_all, Observation, RunFacts};
use crate::policy::engine::Engine;
use crate::policy::entities::{
    check_schema, entity, first_stage_actions, retire_action, run_attrs, run_entity, run_uid,
    worker_attrs, worker_attrs_into, worker_attrs_where, worker_entity, worker_uid, Attr,
    FIRST_STAGE_ACTIONS,
};
use crate::policy::eval::Verdict;
use crate::policy::memo::Abstraction;
use crate::policy::Policies;
use crate::pool::{par_chunks, par_map_costly};
use crate::reasons::Reason;
use crate::row::{Col, Row};
use cedar_policy_core::entities::{Entities, NoEntitiesSchema, TCComputation};
use cedar_policy_core::extensions::Extensions;
use rustc_hash::FxHashMap;
use serde::Serialize;
use serde_json::Value as Json;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;

/// One row's outcome.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Position in the registry (0-based).
    pub index: usize,
    /// Cedar's verdict (shared by rows in the same situation).
    pub verdict: Arc<Verdict>,
}

impl Entry {
    /// Eligible for retirement.
    pub fn is_candidate(&self) -> bool {
        self.verdict.allowed
    }

    /// Every reason code for a preserved row, first = primary.
    pub fn reason_codes(&self) -> Vec<Reason> {
        self.verdict.reason_codes()
    }

    /// The primary reason code.
    pub fn reason(&self) -> Reason {
        if self.is_candidate() {
            Reason::Eligible
        } else {
            self.reason_codes()
                .first()
                .copied()
                .unwrap_or(Reason::PolicyEvaluationError)
        }
    }
}

/// Where a plan's time went, and how often Cedar was asked: measurements
/// for benchmarks and `--log` debugging, never part of the plan document.
#[derive(Debug, Clone, Default)]
pub struct PlanStats {
    /// Reading the registry and the lease store (when the plan read them).
    pub read: std::time::Duration,
    /// Probing and measuring every row.
    pub observe: std::time::Duration,
    /// The first stage (`hold_<kind>`, `claim_instance_slot`,
    /// `occupy_instance_slot`).
    pub first_stage: std::time::Duration,
    /// Collecting the first stage's answers into each row's peer facts.
    pub peers: std::time::Duration,
    /// The retire stage.
    pub retire_stage: std::time::Duration,
    /// The registry token (computed beside observing and judging, so
    /// this overlaps them) and the candidate token after them.
    pub tokens: std::time::Duration,
    /// Cedar evaluations in the first stage (one per situation; each asks
    /// every first-stage action).
    pub first_stage_evaluations: usize,
    /// Cedar evaluations in the retire stage.
    pub retire_evaluations: usize,
}

impl std::fmt::Display for PlanStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        if !self.read.is_zero() {
            write!(f, "read {:.1} ms, ", ms(self.read))?;
        }
        write!(
            f,
            "observe {:.1} ms, first stage {:.1} ms ({} evaluations), peers {:.1} ms, \
             retire stage {:.1} ms ({} evaluations), tokens {:.1} ms",
            ms(self.observe),
            ms(self.first_stage),
            self.first_stage_evaluations,
            ms(self.peers),
            ms(self.retire_stage),
            self.retire_evaluations,
            ms(self.tokens)
        )
    }
}

/// A complete plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The rows the plan judged, in registry order.
    pub rows: Vec<Row>,
    /// What was measured about each row, in registry order (kept beside
    /// the entries rather than in them, so a large plan never holds two
    /// copies while it is built).
    pub observations: Vec<Observation>,
    /// Each row's first-stage answers, in registry order (the facts its
    /// peers were told).
    pub first_stage: Vec<crate::observe::FirstStage>,
    /// One entry per row.
    pub entries: Vec<Entry>,
    /// Token over every row.
    pub registry_fingerprint: String,
    /// Token over the candidate rows.
    pub candidate_fingerprint: String,
    /// sha256 of the policy set that judged.
    pub policy_fingerprint: String,
    /// What the run was told and observed.
    pub facts: RunFacts,
    /// Where the time went.
    pub stats: PlanStats,
    /// Rows registered on another host (counted once, beside the judging).
    other_host_rows: usize,
    /// What a host-scoped plan read (`scoped.rs`); `None` for the whole
    /// registry's.
    pub scope: Option<head::ScopeHead>,
}

/// Ask Cedar about every row, in two stages. First each row on its own:
/// does it hold its identity evidence, does it occupy its instance slot
/// (an evaluation error counts as yes: fail closed). Rust collects those
/// answers into each row's peer facts. Then retire, with them. Rows in the
/// same situation (see `policy::memo`) share one evaluation per stage; the
/// work is split over the cores.
fn judge_all(
    rows: &[Row],
    observations: &mut [Observation],
    facts: &RunFacts,
    policies: &Policies,
    memo: bool,
    stats: &mut PlanStats,
) -> (Vec<Arc<Verdict>>, Vec<crate::observe::FirstStage>) {
    let run_attrs = run_attrs(facts);
    let abstraction = if memo {
        Abstraction::new(policies, &run_attrs)
    } else {
        Abstraction::off("asked to evaluate every row on its own")
    };
    if let Some(why) = abstraction.disabled().filter(|_| memo) {
        tracing::warn!("every row is evaluated on its own: {why}");
    }
    let judge = Judge {
        run: entity(run_uid(), &run_attrs),
        engine: Engine::new(policies),
        policies,
        now: facts.now,
    };
    let first = first_stage_actions();
    let stage1_key = abstraction
        .clone()
        .for_actions(policies, &FIRST_STAGE_ACTIONS);
    let started = std::time::Instant::now();
    let stage1 = judge.rows(rows, observations, &first, &stage1_key);
    stats.first_stage = started.elapsed();
    stats.first_stage_evaluations = stage1.verdicts.len();
    let yes = |v: &Verdict| v.allowed || !v.errors.is_empty();
    let answers: Vec<crate::observe::FirstStage> = stage1
        .of_rows()
        .map(|v| crate::observe::FirstStage {
            holds: [yes(&v[0]), yes(&v[1]), yes(&v[2]), yes(&v[3])],
            claims: yes(&v[4]),
            occupies: yes(&v[5]),
        })
        .collect();
    drop(stage1);
    let started = std::time::Instant::now();
    // (the answers are kept: apply compares a row changed since with them)
    let peers = crate::observe::peer_facts(rows, observations, &answers);
    for (obs, p) in observations.iter_mut().zip(peers) {
        obs.peers = p;
    }
    stats.peers = started.elapsed();
    let retire_key = abstraction.for_actions(policies, &["retire"]);
    let started = std::time::Instant::now();
    let retire = judge.rows(rows, observations, &[retire_action()], &retire_key);
    stats.retire_stage = started.elapsed();
    stats.retire_evaluations = retire.verdicts.len();
    let verdicts = retire.of_rows().map(|v| v[0].clone()).collect();
    (verdicts, answers)
}

/// A stage's answers: one evaluation per situation, and each row's
/// situation.
struct Judged {
    /// Per situation, the verdict on each action asked.
    verdicts: Vec<Vec<Arc<Verdict>>>,
    /// Per row, its situation.
    situation: Vec<u32>,
}

impl Judged {
    /// Each row's verdicts, in row order.
    fn of_rows(&self) -> impl Iterator<Item = &[Arc<Verdict>]> + '_ {
        self.situation
            .iter()
            .map(|s| self.verdicts[*s as usize].as_slice())
    }
}

/// What judging a row needs, built once per run.
struct Judge<'p> {
    run: cedar_policy_core::ast::Entity,
    engine: Engine,
    policies: &'p Policies,
    now: crate::time::Micros,
}

impl Judge<'_> {
    /// For every row, Cedar's verdict on each of `actions`, and how many
    /// evaluations that took.
    fn rows(
        &self,
        rows: &[Row],
        observations: &[Observation],
        actions: &[cedar_policy_core::ast::EntityUID],
        abstraction: &Abstraction,
    ) -> Judged {
        let principal = run_uid();
        let judge_one = |i: usize, attrs: &[(&'static str, Attr<'_>)]| -> Vec<Arc<Verdict>> {
            actions
                .iter()
                .map(|action| {
                    Arc::new(judge_entity(
                        &self.engine,
                        self.policies,
                        &self.run,
                        &principal,
                        action,
                        i,
                        attrs,
                    ))
                })
                .collect()
        };
        let mask = abstraction.attr_mask();
        let attrs_of = |i: usize| worker_attrs_where(&rows[i], &observations[i], self.now, mask);
        if abstraction.disabled().is_some() {
            let indices: Vec<usize> = (0..rows.len()).collect();
            return Judged {
                verdicts: par_map_costly(&indices, |&i| judge_one(i, &attrs_of(i))),
                situation: (0..rows.len() as u32).collect(),
            };
        }
        // 1. Group the rows by situation, each core its share of the rows.
        let indices: Vec<usize> = (0..rows.len()).collect();
        let groups: Vec<(String, Vec<usize>)> = par_chunks(&indices, |chunk| {
            let mut by_key: FxHashMap<String, Vec<usize>> = FxHashMap::default();
            let mut key = String::with_capacity(512);
            let mut attrs = Vec::new();
            for &i in chunk {
                worker_attrs_into(&rows[i], &observations[i], self.now, mask, &mut attrs);
                abstraction.key(&attrs, &mut key);
                match by_key.get_mut(key.as_str()) {
                    Some(members) => members.push(i),
                    None => {
                        by_key.insert(key.clone(), vec![i]);
                    }
                }
            }
            by_key.into_iter().collect()
        });
        // 2. One group per situation across the cores.
        let mut merged: FxHashMap<String, Vec<usize>> =
            FxHashMap::with_capacity_and_hasher(groups.len(), Default::default());
        for (key, members) in groups {
            merged.entry(key).or_default().extend(members);
        }
        let situations: Vec<Vec<usize>> = merged.into_values().collect();
        // 3. Judge one row of each situation, on every core.
        let verdicts = par_map_costly(&situations, |members| {
            judge_one(members[0], &attrs_of(members[0]))
        });
        let mut situation = vec![0u32; rows.len()];
        for (s, members) in situations.iter().enumerate() {
            for &i in members {
                situation[i] = s as u32;
            }
        }
        Judged {
            verdicts,
            situation,
        }
    }
}

/// Ask Cedar about one worker entity (row `index` with `attrs`) next to the
/// run principal. A store that cannot be built keeps the row.
pub fn judge_entity(
    engine: &Engine,
    policies: &Policies,
    run: &cedar_policy_core::ast::Entity,
    principal: &cedar_policy_core::ast::EntityUID,
    action: &cedar_policy_core::ast::EntityUID,
    index: usize,
    attrs: &[(&'static str, Attr<'_>)],
) -> Verdict {
    let entities = Entities::from_entities(
        [run.clone(), entity(worker_uid(index), attrs)],
        None::<&NoEntitiesSchema>,
        TCComputation::AssumeAlreadyComputed,
        Extensions::all_available(),
    );
    match entities {
        Ok(entities) => engine.judge(policies, &entities, principal, action, &worker_uid(index)),
        Err(e) => Verdict {
            allowed: false,
            forbids: Vec::new(),
            errors: vec![format!("building entities: {e}")],
        },
    }
}

/// Judges rows of a plan again with a fresh pid probe (apply's re-probe
/// just before each write): the same policies decide, on the same evidence
/// except the process's state now.
pub struct Rejudge<'a> {
    plan: &'a Plan,
    policies: &'a Policies,
    engine: Engine,
    run: cedar_policy_core::ast::Entity,
    abstraction: Abstraction,
    memo: std::cell::RefCell<HashMap<String, Arc<Verdict>>>,
}

impl<'a> Rejudge<'a> {
    /// Prepare for re-judging rows of `plan`.
    pub fn new(plan: &'a Plan, policies: &'a Policies) -> Rejudge<'a> {
        let attrs = run_attrs(&plan.facts);
        Rejudge {
            plan,
            policies,
            engine: Engine::new(policies),
            run: entity(run_uid(), &attrs),
            abstraction: Abstraction::new(policies, &attrs).for_actions(policies, &["retire"]),
            memo: Default::default(),
        }
    }

    /// Re-judge one entry with the process probed now (rows in the same
    /// situation share one evaluation, as in `plan`).
    pub fn entry(&self, entry: &Entry, probe: &dyn ProcessProbe) -> Arc<Verdict> {
        let row = &self.plan.rows[entry.index];
        let mut obs = self.plan.observation(entry).clone();
        obs.pid = crate::evidence::probe::observe_pid(row.get(Col::Pid), probe);
        let now = crate::time::now();
        obs.liveness = crate::liveness::assess(row, now, obs.pid.alive);
        obs.live = obs.liveness.live && !obs.historical;
        let attrs = worker_attrs(row, &obs, now);
        let judge = || {
            Arc::new(judge_entity(
                &self.engine,
                self.policies,
                &self.run,
                &run_uid(),
                &retire_action(),
                entry.index,
                &attrs,
            ))
        };
        let mut key = String::new();
        if !self.abstraction.key(&attrs, &mut key) {
            return judge();
        }
        if let Some(v) = self.memo.borrow().get(&key) {
            return v.clone();
        }
        let v = judge();
        self.memo.borrow_mut().insert(key, v.clone());
        v
    }
}

/// Judge every row.
pub fn plan(
    rows: Vec<Row>,
    facts: RunFacts,
    probe: &dyn ProcessProbe,
    policies: &Policies,
) -> Result<Plan> {
    plan_with(rows, facts, probe, policies, true)
}

/// Judge every row, sharing evaluations between rows in the same situation
/// (`memo`, see `policy::memo`) or evaluating each on its own: the two must
/// agree, and a test holds them to it.
pub fn plan_with(
    rows: Vec<Row>,
    facts: RunFacts,
    probe: &dyn ProcessProbe,
    policies: &Policies,
    memo: bool,
) -> Result<Plan> {
    // The registry token needs only the rows: it is computed beside the
    // observing and judging, on the time their cores would wait.
    // The count of rows on other hosts (the plan's fencing context) needs
    // only the rows too, and rides along after the token.
    let ((registry, sorted, token_time, other_host_rows), judged) = crate::pool::join(
        || {
            let started = std::time::Instant::now();
            let (registry, sorted) = registry_token(&rows);
            let token_time = started.elapsed();
            let other_hosts = count_other_host_rows(&rows, facts.host.host_id.as_deref());
            (registry, sorted, token_time, other_hosts)
        },
        || -> Result<_> {
            let mut stats = PlanStats::default();
            let started = std::time::Instant::now();
            let mut observations = observe_all(&rows, &facts, probe);
            stats.observe = started.elapsed();
            let run = run_entity(&facts);
            // The builder and the schema must agree; check the shapes once
            // per run.
            let mut sample = vec![run.clone()];
            if let (Some(row), Some(obs)) = (rows.first(), observations.first()) {
                sample.push(worker_entity(0, row, obs, facts.now));
            }
            check_schema(sample, &policies.schema)?;
            let (verdicts, first_stage) =
                judge_all(&rows, &mut observations, &facts, policies, memo, &mut stats);
            Ok((observations, verdicts, first_stage, stats))
        },
    );
    let (observations, verdicts, first_stage, mut stats) = judged?;
    let entries: Vec<Entry> = verdicts
        .into_iter()
        .enumerate()
        .map(|(index, verdict)| Entry { index, verdict })
        .collect();
    let started = std::time::Instant::now();
    let candidate = sorted.candidate_token(&rows, |i| entries[i].is_candidate());
    stats.tokens = token_time + started.elapsed();
    tracing::debug!(rows = rows.len(), "planned: {stats}");
    Ok(Plan {
        rows,
        observations,
        first_stage,
        entries,
        registry_fingerprint: registry,
        candidate_fingerprint: candidate,
        policy_fingerprint: policies.fingerprint.clone(),
        facts,
        stats,
        other_host_rows,
        scope: None,
    })
}

/// Rows registered on another host than `mine` (0 when this host's id is
/// unknown).
fn count_other_host_rows(rows: &[Row], mine: Option<&str>) -> usize {
    match mine {
        Some(mine) => rows
            .iter()
            .filter(|r| crate::observe::of_another_host(r, mine))
            .count(),
        None => 0,
    }
}

impl Plan {
    /// What was observed about an entry's row.
    pub fn observation(&self, entry: &Entry) -> &Observation {
        &self.observations[entry.index]
    }

    /// The candidate entries, in registry order.
    pub fn candidates(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.is_candidate())
    }

    /// The preserved entries, in registry order.
    pub fn preserved(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| !e.is_candidate())
    }

    /// The canonical identity of an entry's row.
    pub fn identity(&self, entry: &Entry) -> String {
        self.rows[entry.index].get(Col::WorkerIdentity).canon()
    }

    /// The evidence block for one entry (the seed's evidence keys).
    pub fn evidence<'a>(&'a self, entry: &'a Entry) -> Evidence<'a> {
        let row = &self.rows[entry.index];
        let obs = self.observation(entry);
        Evidence {
            worker_identity: row.get(Col::WorkerIdentity),
            client_type: crate::identity::normalize_client_name(row.get(Col::ClientName).as_text()),
            client_instance_id: row.get(Col::ClientInstanceId),
            fleet_run_id: row.get(Col::FleetRunId),
            namespace: row.get(Col::Namespace),
            profile: row.get(Col::Profile),
            declared_role: row.get(Col::Role),
            session_id: row.get(Col::SessionId),
            generation_id: row.get(Col::GenerationId),
            fencing_epoch: row.get(Col::FencingEpoch),
            process_identity: obs.process_identity.json(row),
            pid: row.get(Col::Pid),
            pid_alive: obs.pid.alive,
            live_process_start_time: obs.pid.start_time.as_deref(),
            host_id: row.get(Col::HostId),
            boot_id: row.get(Col::BootId),
            process_start_time: row.get(Col::ProcessStartTime),
            repository_binding: row.get(Col::RepositoryBinding),
            foreign_repository: obs.foreign_repository,
            status: row.get(Col::Status),
            started_at: row.get(Col::StartedAt),
            last_heartbeat_at: row.get(Col::LastHeartbeatAt),
            heartbeat_ttl_seconds: row.get(Col::HeartbeatTtlSeconds),
            canonical_heartbeat_ttl_seconds: obs.liveness.heartbeat_ttl_seconds,
            heartbeat_age_seconds: obs.liveness.heartbeat_age_seconds(),
            heartbeat_fresh: obs.liveness.heartbeat_fresh,
            live: obs.live,
            ownership_state: obs.ownership_state,
            instance_id_provenance: obs.identity.provenance,
            instance_identity_trusted: obs.identity.trusted,
            identity_row_count: obs.identity_row_count,
            shared_identity_evidence: &obs.peers.shared_identity_evidence,
            instance_slot_contested: entry
                .verdict
                .forbids
                .iter()
                .any(|r| r.reason == Some(Reason::InstanceConflict)),
            protected_by_active_leases: &obs.protected_hits,
        }
    }

    /// One candidate or preserved entry as JSON.
    pub fn entry_json<'a>(&'a self, entry: &'a Entry) -> EntryJson<'a> {
        EntryJson {
            worker_identity: self.rows[entry.index].get(Col::WorkerIdentity),
            verdict: verdict_json(entry),
            evidence: self.evidence(entry),
        }
    }

    /// Rows registered on another host than this run's (0 when this
    /// host's id is unknown).
    pub fn other_host_rows(&self) -> usize {
        self.other_host_rows
    }

    /// Count of preserved rows by primary reason code. Rows in one
    /// situation share their verdict, and so their reason: each distinct
    /// verdict's reason is found once and counted for all its rows.
    pub fn reason_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut per_verdict: FxHashMap<*const Verdict, (usize, &Entry)> = FxHashMap::default();
        for e in self.preserved() {
            per_verdict
                .entry(Arc::as_ptr(&e.verdict))
                .or_insert((0, e))
                .0 += 1;
        }
        let mut counts = BTreeMap::new();
        for (n, e) in per_verdict.into_values() {
            *counts.entry(e.reason().code()).or_default() += n;
        }
        counts
    }

    /// The plan as the stable JSON document (built in memory; for small
    /// plans and tests; `write_json` streams).
    pub fn to_json(&self) -> Json {
        let mut buf = Vec::new();
        self.write_json(&mut buf)
            .expect("writing to memory cannot fail");
        serde_json::from_slice(&buf).expect("the plan writer emits valid JSON")
    }

    /// Stream the plan as JSON: top-level keys in a fixed order, one entry
    /// per line, so large plans stay small in memory and diff cleanly.
    pub fn write_json(&self, w: &mut dyn Write) -> std::io::Result<()> {
        self.write_json_with(w, None)
    }

    /// The plan's head: every top-level member before the row lists.
    pub fn head(&self) -> head::PlanHead {
        let candidates: Vec<Json> = self
            .candidates()
            .map(|e| self.rows[e.index].get(Col::WorkerIdentity).to_json())
            .collect();
        let p = &self.facts.protections;
        head::PlanHead {
            success: true,
            read_only: true,
            mutation_performed: false,
            outcome: "planned".into(),
            registry_fingerprint: Some(self.registry_fingerprint.clone()),
            candidate_fingerprint: Some(self.candidate_fingerprint.clone()),
            policy_fingerprint: Some(self.policy_fingerprint.clone()),
            assessed_count: self.entries.len(),
            candidate_count: candidates.len(),
            preserved_count: self.entries.len() - candidates.len(),
            preserved_reason_counts: self
                .reason_counts()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            protected_inputs: head::ProtectedInputs {
                worker_identities: p.worker_identities.clone(),
                session_ids: p.session_ids.clone(),
                pids: p.pids.clone(),
            },
            canonical_repository: self.facts.canonical_repository.clone(),
            fencing_context: head::FencingContext {
                current_host_id: self.facts.host.host_id.clone(),
                current_boot_id: self.facts.host.boot_id.clone(),
                start_time_probe_available: self.facts.host.start_time_probe_available,
                other_host_rows: self.other_host_rows(),
            },
            candidate_worker_identities: Some(candidates),
            scope: self.scope.clone(),
        }
    }

    /// Each distinct verdict's members of an entry (`reason_code` through
    /// `policy_ids`, as `EntryJson` writes them), rendered once: rows in the
    /// same situation share their verdict, so a large plan has a few
    /// thousand of these for its hundred thousand rows.
    fn verdict_fragments(&self) -> FxHashMap<usize, Vec<u8>> {
        let mut out: FxHashMap<usize, Vec<u8>> = FxHashMap::default();
        for entry in &self.entries {
            out.entry(Arc::as_ptr(&entry.verdict) as usize)
                .or_insert_with(|| {
                    // `{…}` without its braces: members to splice into an entry.
                    let mut json =
                        serde_json::to_vec(&verdict_json(entry)).expect("verdicts serialise");
                    json.pop();
                    json.remove(0);
                    json
                });
        }
        out
    }

    /// `chunk`'s entries as the lines of a list (`first`: the list's first
    /// chunk, which starts without a comma), byte for byte what serialising
    /// `entry_json` gives.
    fn render_entries(
        &self,
        chunk: &[&Entry],
        first: bool,
        verdicts: &FxHashMap<usize, Vec<u8>>,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(chunk.len() * 1536);
        for (n, entry) in chunk.iter().enumerate() {
            out.extend_from_slice(if first && n == 0 { b"\n" } else { b",\n" });
            out.extend_from_slice(b"{\"worker_identity\":");
            render::value(&mut out, self.rows[entry.index].get(Col::WorkerIdentity));
            out.push(b',');
            out.extend_from_slice(&verdicts[&(Arc::as_ptr(&entry.verdict) as usize)]);
            out.extend_from_slice(b",\"evidence\":");
            render::evidence(&mut out, &self.evidence(entry));
            out.push(b'}');
        }
        out
    }

    /// The document; with `saved` (a saved plan, `saved::write_saved`), the
    /// candidates whole and those rows as `planned_rows` in place of the
    /// preserved rows: apply reads none of their evidence or words, and at
    /// 200,000 rows they were most of a 152 MB file (issues 45 and 52);
    /// `plan --format json` prints it all.
    fn write_json_with(
        &self,
        w: &mut dyn Write,
        saved: Option<&planned::PlannedRows>,
    ) -> std::io::Result<()> {
        w.write_all(b"{\n")?;
        if let Json::Object(map) = serde_json::to_value(self.head())? {
            for (k, v) in map {
                writeln!(w, "{}: {},", Json::String(k), v)?;
            }
        }
        let verdicts = self.verdict_fragments();
        let lists: &[(&str, bool)] = match saved {
            Some(_) => &[("candidates", true)],
            None => &[("candidates", true), ("preserved", false)],
        };
        for (n, (key, candidates)) in lists.iter().enumerate() {
            write!(w, "\"{key}\": [")?;
            let selected: Vec<&Entry> = self
                .entries
                .iter()
                .filter(|e| e.is_candidate() == *candidates)
                .collect();
            // Render chunks on every core and write them in order as they
            // come; only a few chunks of text exist at a time.
            let chunks: Vec<(bool, &[&Entry])> = selected
                .chunks(2048)
                .enumerate()
                .map(|(n, c)| (n == 0, c))
                .collect();
            let mut written = Ok(());
            crate::pool::par_map_ordered(
                &chunks,
                |(first, chunk)| self.render_entries(chunk, *first, &verdicts),
                |text| {
                    if written.is_ok() {
                        written = w.write_all(&text);
                    }
                },
            );
            written?;
            let last = n + 1 == lists.len() && saved.is_none();
            w.write_all(if last { b"\n]\n" } else { b"\n],\n" })?;
        }
        if let Some(rows) = saved {
            w.write_all(b"\"planned_rows\": ")?;
            saved::write_rows(rows, w)?;
            w.write_all(b"\n")?;
        }
        w.write_all(b"}\n")
    }
}

/// What an entry says of its verdict: the same for every row that shares
/// the verdict (rows in one situation), so a plan renders it once per verdict.
fn verdict_json(entry: &Entry) -> VerdictJson<'_> {
    if entry.is_candidate() {
        return VerdictJson {
            reason_code: entry.reason().code(),
            reason_codes: None,
            detail: "no eligibility policy forbids retirement: dead pid, expired heartbeat, \
                     proven identity and host, canonical binding, no active ownership"
                .to_string(),
            policy_ids: None,
        };
    }
    let detail = match entry.verdict.forbids.first() {
        Some(rule) if entry.verdict.errors.is_empty() => {
            format!("{} [policy {}]", rule.description, rule.id)
        }
        _ => format!(
            "policy evaluation failed; the row is kept: {}",
            if entry.verdict.errors.is_empty() {
                "denied with no determining policy".to_string()
            } else {
                entry.verdict.errors.join("; ")
            }
        ),
    };
    VerdictJson {
        reason_code: entry.reason().code(),
        reason_codes: Some(entry.reason_codes().iter().map(|r| r.code()).collect()),
        detail,
        policy_ids: Some(
            entry
                .verdict
                .forbids
                .iter()
                .map(|r| r.id.as_str())
                .collect(),
        ),
    }
}

/// The verdict's members of an entry.
#[derive(Debug, Serialize)]
pub struct VerdictJson<'a> {
    reason_code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason_codes: Option<Vec<&'static str>>,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy_ids: Option<Vec<&'a str>>,
}

/// One entry of a plan's `candidates` or `preserved` list.
#[derive(Debug, Serialize)]
pub struct EntryJson<'a> {
    worker_identity: crate::value::Val<'a>,
    #[serde(flatten)]
    verdict: VerdictJson<'a>,
    evidence: Evidence<'a>,
}

/// Read the registry and the lease store, probe this host, and plan: what
/// `plan`, `explain` and `serve` do with the world.
pub fn plan_from_files(
    registry: &std::path::Path,
    leases: &std::path::Path,
    proc_root: &std::path::Path,
    canonical_repository: String,
    policies: &Policies,
) -> Result<Plan> {
    let started = std::time::Instant::now();
    let rows = crate::evidence::registry::load(registry)?;
    let lease_rows = crate::evidence::leases::load(leases)?;
    let read = started.elapsed();
    tracing::debug!(rows = rows.len(), leases = lease_rows.len(), elapsed = ?read, "read");
    let facts = RunFacts::of_this_host(proc_root, Some(canonical_repository), &lease_rows);
    let mut plan = plan(
        rows,
        facts,
        &crate::evidence::probe::SystemProbe::new(proc_root),
        policies,
    )?;
    plan.stats.read = read;
    Ok(plan)
}
