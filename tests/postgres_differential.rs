//! The fast path inside apply's PostgreSQL transaction against the whole
//! read, on random concurrent writes (docs/apply.md, "A million rows on
//! PostgreSQL"), as `tests/fast_path_differential.rs` does for SQLite.
//!
//! Each interleaving builds a small real fleet (`common::interleave`),
//! copies it into two PostgreSQL databases with the change record
//! installed, and applies the same plan on both with the same random
//! writes committed by an ordinary client in the window between the
//! judgement outside the transaction and the transaction itself (any
//! column, an unknown column, a row deleted and written again, upserts,
//! inserts, deletes, lease writes). On the second database the window also
//! runs harmless DDL on the registry, which sends apply to read and judge
//! the whole registry. The two must end alike: the same outcome and the
//! same rows retired.
//!
//! `FLEET_RETIRE_PG_DIFF_RUNS=N` runs N interleavings (default 150);
//! `FLEET_RETIRE_DIFF_SEED=S` replays one. Needs a PostgreSQL cluster
//! (FLEET_RETIRE_TEST_POSTGRES), as tests/postgres.rs.

mod common;

use common::interleave::*;
use common::pgside::{in_postgres, Side};
use common::*;
use serde_json::json;

/// Harmless DDL on the registry, in the window of the second side: it
/// sends apply to read and judge the whole registry.
const WHOLE: &str = "ALTER TABLE worker_registrations ALTER COLUMN note SET STATISTICS 50";

/// One interleaving; whether the fast path decided it, or `None` when the
/// plan had no candidate.
fn interleaving(seed: u64, world: &World, sides: &[Side; 2]) -> Option<bool> {
    let mut rng = Rng(seed);
    let rows = rows(&mut rng, world);
    let base = tempfile::tempdir().unwrap();
    registry(&base.path().join("registry.sqlite"), &rows);
    let leased = if rng.chance(20) {
        vec![json!({"lease_id": "l-0", "status": "active", "owner_worker_identity": "w-dead-0"})]
    } else {
        vec![]
    };
    leases(&base.path().join("leases.sqlite"), &leased);
    // Planned on the SQLite base: the copies carry the same tokens, as
    // `registry copy` proves.
    let (registry, leases) = (
        base.path().join("registry.sqlite"),
        base.path().join("leases.sqlite"),
    );
    let req = planned_request(&registry, &leases, world, &mut rng, 0)?;
    let writes: Vec<String> = (0..rng.below(4))
        .map(|_| in_postgres(&one_write(&mut rng, &rows, world)))
        .collect();
    let mut ends = Vec::new();
    for (side, whole) in sides.iter().zip([false, true]) {
        side.load(base.path());
        let ddl = whole.then_some(WHOLE);
        let (outcome, how) = side.route(world, &req, (&writes, ddl), &mut || {});
        ends.push(((outcome, side.statuses()), how));
    }
    let (fast, whole) = (&ends[0], &ends[1]);
    assert!(
        whole.1.contains("whole_registry"),
        "seed {seed}: the DDL did not force the whole read: {}",
        whole.1
    );
    assert_eq!(
        fast.0, whole.0,
        "seed {seed} (replay with FLEET_RETIRE_DIFF_SEED={seed}): the fast path ({}) ended \
         otherwise than the whole read ({}); writes in the window: {writes:#?}",
        fast.1, whole.1
    );
    Some(fast.1.contains("changed_rows"))
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn the_fast_path_on_postgres_retires_exactly_what_the_whole_read_does() {
    let (Some(a), Some(b)) = (postgres("diff_fast"), postgres("diff_whole")) else {
        return;
    };
    let world = World::new();
    let dir = tempfile::tempdir().unwrap();
    let profiles = dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        json!({"profiles": {"controller-prgs": {"role": "controller",
            "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}})
        .to_string(),
    )
    .unwrap();
    let sides = [
        Side {
            db: a,
            profiles: profiles.clone(),
        },
        Side { db: b, profiles },
    ];
    let env = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().unwrap());
    if let Some(seed) = env("FLEET_RETIRE_DIFF_SEED") {
        interleaving(seed, &world, &sides);
        return;
    }
    let runs = env("FLEET_RETIRE_PG_DIFF_RUNS").unwrap_or(150);
    let first = env("FLEET_RETIRE_DIFF_FIRST").unwrap_or(20_261_205);
    let (mut planned, mut fast) = (0u64, 0u64);
    for seed in first..first + runs {
        match interleaving(seed, &world, &sides) {
            Some(true) => (planned, fast) = (planned + 1, fast + 1),
            Some(false) => planned += 1,
            None => {}
        }
    }
    eprintln!(
        "{runs} interleavings on PostgreSQL from seed {first}: {planned} with candidates, \
         {fast} decided by the fast path inside the transaction"
    );
    assert!(
        fast * 3 >= planned,
        "the fast path decided only {fast} of {planned} interleavings"
    );
}
