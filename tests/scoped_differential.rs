//! The scoped apply (`plan --scope host`, issue 54) on the random writes of
//! `tests/fast_path_differential.rs`, with rows of another host among the
//! rows (peers of this host's, sharing instance slots and sessions): the
//! writes land between apply's judgement outside the lock and the lock,
//! on this host's rows, on the other host's, on peers and on the lease
//! store.
//!
//! A scoped apply reads less than the whole registry, so it may refuse
//! where an apply of the whole plan goes on; it must never retire more. The
//! oracle is the whole plan of the registry as it stands after the writes
//! (a copy given the same writes, planned whole): every row the scoped
//! apply retires is a candidate there. With no write at all, the scoped
//! apply retires exactly what it asked.
//!
//! This host is the machine's own (the kernel's node name): no namespace is
//! needed, the other host's rows are those written with another name.
//! `FLEET_RETIRE_SCOPED_DIFF_RUNS=N` runs N interleavings (default 150);
//! `FLEET_RETIRE_SCOPED_DIFF_SEED=S` replays one.

mod common;

use common::interleave::*;
use common::*;
use fleet_retire::apply::{Outcome, Request, Tokens};
use rusqlite::Connection;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The stores of one interleaving, in `dir`.
fn stores_in(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join("registry.sqlite"),
        dir.join("leases.sqlite"),
        dir.join("profiles.json"),
    )
}

/// The fleet in `dir`: the rows, a third of them on another host; the
/// scope's indexes; maybe a lease; the controller's profile.
fn build(dir: &Path, rng: &mut Rng, rows: &[Value]) {
    let (registry, lease_store, profiles) = stores_in(dir);
    common::registry(&registry, rows);
    fleet_retire::store::sqlite::scope::install_indexes(&registry).unwrap();
    let leased: Vec<Value> = if rng.chance(20) {
        vec![json!({"lease_id": "l-0", "status": "active", "owner_worker_identity": "w-dead-0"})]
    } else {
        vec![]
    };
    leases(&lease_store, &leased);
    std::fs::write(
        &profiles,
        json!({"profiles": {"controller-prgs": {"role": "controller",
            "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}})
        .to_string(),
    )
    .unwrap();
}

/// The scoped plan of the stores in `dir`, saved and read back as `apply
/// PLAN.json` reads it: its request (all candidates, or the first).
fn scoped_request(dir: &Path, world: &World, rng: &mut Rng) -> Option<Request> {
    let (registry, lease_store, _) = stores_in(dir);
    let plan = fleet_retire::plan::scoped::plan_scope_from_files(
        &registry,
        &lease_store,
        Path::new("/proc"),
        "prgs/gitea-tools".into(),
        &world.policies,
    )
    .unwrap();
    let mut saved = Vec::new();
    plan.write_saved(&mut saved).unwrap();
    let doc: Value = serde_json::from_slice(&saved).unwrap();
    let workers: Vec<String> =
        serde_json::from_value(doc["candidate_worker_identities"].clone()).unwrap();
    if workers.is_empty() {
        return None;
    }
    let tokens = Tokens {
        registry_fingerprint: doc["registry_fingerprint"].as_str().unwrap().into(),
        candidate_fingerprint: doc["candidate_fingerprint"].as_str().unwrap().into(),
        policy_fingerprint: doc["policy_fingerprint"].as_str().unwrap().into(),
    };
    let planned = serde_json::from_value(doc["planned_rows"].clone()).unwrap();
    let mut req = Request::new(tokens, workers)
        .with_planned(Some(std::sync::Arc::new(planned)))
        .unwrap();
    req.canonical_repository = Some("prgs/gitea-tools".into());
    req.scope = Some(doc["scope"]["host_id"].as_str().unwrap().into());
    req.first = rng.chance(30).then_some(1);
    req.max_retire = 100;
    Some(req)
}

fn commit(dir: &Path, w: &Write) {
    let (registry, lease_store, _) = stores_in(dir);
    let conn = Connection::open(if w.leases { lease_store } else { registry }).unwrap();
    // A write SQLite refuses is a write that did not happen, everywhere.
    let _ = conn.execute(&w.sql, rusqlite::params_from_iter(w.params.iter()));
}

/// The identities the whole plan of the stores in `dir` makes candidates.
fn whole_candidates(dir: &Path, world: &World) -> Vec<String> {
    let (registry, lease_store, _) = stores_in(dir);
    let plan = fleet_retire::plan::plan_from_files(
        &registry,
        &lease_store,
        Path::new("/proc"),
        "prgs/gitea-tools".into(),
        &world.policies,
    )
    .unwrap();
    plan.candidates().map(|e| plan.identity(e)).collect()
}

fn retired(registry: &Path) -> Vec<String> {
    let conn = Connection::open(registry).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT worker_identity FROM worker_registrations \
             WHERE retired_by = 'controller-prgs' ORDER BY 1",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    rows
}

/// One interleaving: the scoped apply's outcome, or `None` when the
/// scoped plan had no candidate.
fn interleaving(seed: u64, world: &World) -> Option<Outcome> {
    let mut rng = Rng(seed);
    let mut rows = rows(&mut rng, world);
    for row in rows.iter_mut() {
        if rng.chance(33) {
            row["host_id"] = json!("another-host");
        }
    }
    let base = tempfile::tempdir().unwrap();
    build(base.path(), &mut rng, &rows);
    let req = scoped_request(base.path(), world, &mut rng)?;
    let writes: Vec<Write> = (0..rng.below(4))
        .map(|_| one_write(&mut rng, &rows, world))
        .collect();
    let copy = |name: &str| {
        let dir = base.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for f in ["registry.sqlite", "leases.sqlite", "profiles.json"] {
            std::fs::copy(base.path().join(f), dir.join(f)).unwrap();
        }
        dir
    };
    let (scoped, oracle) = (copy("scoped"), copy("oracle"));
    let mut window = || {
        for w in &writes {
            commit(&scoped, w);
        }
    };
    let (registry, lease_store, profiles) = stores_in(&scoped);
    let (outcome, how) = apply_with_window(
        (&registry, &lease_store, &profiles),
        world,
        &req,
        &mut window,
    );
    for w in &writes {
        commit(&oracle, w);
    }
    let allowed = whole_candidates(&oracle, world);
    let done = retired(&registry);
    let replay = format!("replay with FLEET_RETIRE_SCOPED_DIFF_SEED={seed}; {how}");
    for w in &done {
        assert!(
            allowed.contains(w),
            "{replay}: the scoped apply retired {w}, which the whole plan after the writes \
             keeps (candidates {allowed:?}); writes: {writes:#?}"
        );
    }
    if writes.is_empty() {
        let mut asked = req.workers.clone();
        asked.truncate(req.first.unwrap_or(asked.len()));
        asked.sort();
        assert_eq!(outcome, Outcome::Applied, "{replay}");
        assert_eq!(done, asked, "{replay}");
    }
    Some(outcome)
}

#[test]
fn a_scoped_apply_never_retires_what_the_whole_plan_keeps() {
    let world = World::new();
    let env = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().unwrap());
    if let Some(seed) = env("FLEET_RETIRE_SCOPED_DIFF_SEED") {
        interleaving(seed, &world);
        return;
    }
    let runs = env("FLEET_RETIRE_SCOPED_DIFF_RUNS").unwrap_or(150);
    let first = 20_261_205;
    let outcomes: Vec<Outcome> = (first..first + runs)
        .filter_map(|seed| interleaving(seed, &world))
        .collect();
    let applied = outcomes.iter().filter(|o| **o == Outcome::Applied).count();
    eprintln!(
        "{runs} interleavings: {} scoped plans with candidates, {applied} applied",
        outcomes.len()
    );
    // The oracle means something only if scoped plans had candidates and
    // many applies went through.
    assert!(outcomes.len() as u64 * 2 >= runs, "{}", outcomes.len());
    assert!(applied * 3 >= outcomes.len(), "{applied}");
}
