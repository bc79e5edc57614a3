//! The scoped apply's differential (`tests/scoped_differential.rs`) on
//! PostgreSQL: the same random fleets, a third of their rows on another
//! host, and the same random writes in the window (in PostgreSQL's
//! dialect, `common::pgside`), more of them aimed at peer rows.
//!
//! Each interleaving copies the fleet into two PostgreSQL databases (with
//! the scope's indexes and the change record), plans this host's scope on
//! the first (`plan --scope host`), and applies that plan on both with the
//! same writes committed by an ordinary client in the window. On the first
//! the scope is read under the lock through its indexes; on the second the
//! window also drops one of the indexes or replaces it with one of another
//! shape (no condition, other columns, an expression), so apply takes the
//! scope from a read of every row. The two must end alike: the same
//! outcome and every row's status the same. Each is also held to the whole
//! plan of the registry after the writes (planned in the first window):
//! it never retires a row that plan keeps, and with no write it retires
//! exactly what it asked.
//!
//! The process table is the one thing the writes do not fix: on a busy
//! machine the pid space wraps within minutes, and a dead worker's pid
//! taken by another process moves verdicts by time alone. An interleaving
//! during which that is seen is counted, not judged, and the processes are
//! made again.
//!
//! `FLEET_RETIRE_PG_SCOPED_DIFF_RUNS=N` runs N interleavings (default
//! 30, about a minute in debug on a loaded machine);
//! `FLEET_RETIRE_PG_SCOPED_DIFF_SEED=S` replays one. Needs a PostgreSQL
//! cluster (FLEET_RETIRE_TEST_POSTGRES), as tests/postgres.rs.

mod common;

use common::interleave::*;
use common::pgside::{in_postgres, Side};
use common::scoped::*;
use common::*;
use fleet_retire::apply::Outcome;
use serde_json::json;

/// DDL that leaves the scope's indexes untrusted: one missing, or one
/// under our name that is not ours. (An index over a function of the
/// user's is refused for every apply, scoped or not, as code a write can
/// run: `registry_untrusted`; not a route to compare.)
const UNTRUSTED: [&str; 4] = [
    "DROP INDEX fleet_retire_scope_session",
    "DROP INDEX fleet_retire_scope_pid; \
     CREATE INDEX fleet_retire_scope_pid ON worker_registrations (pid)",
    "DROP INDEX fleet_retire_scope_host; \
     CREATE INDEX fleet_retire_scope_host ON worker_registrations (status, host_id)",
    "DROP INDEX fleet_retire_scope_instance; \
     CREATE INDEX fleet_retire_scope_instance ON worker_registrations \
     (pg_catalog.lower(client_instance_id)) WHERE status = 'active'",
];

/// One interleaving, or `None` when the scoped plan had no candidate.
fn interleaving(seed: u64, world: &World, sides: &[Side; 2]) -> Option<Tally> {
    let mut rng = Rng(seed);
    let rows = scoped_rows(&mut rng, world);
    let base = tempfile::tempdir().unwrap();
    registry(&base.path().join("registry.sqlite"), &rows);
    let leased = if rng.chance(20) {
        vec![json!({"lease_id": "l-0", "status": "active", "owner_worker_identity": "w-dead-0"})]
    } else {
        vec![]
    };
    leases(&base.path().join("leases.sqlite"), &leased);
    for side in sides {
        side.load(base.path());
    }
    let url = sides[0].url();
    let req = scoped_request(&url, &url, world, &mut rng)?;
    let writes: Vec<String> = window_writes(&mut rng, &rows, world)
        .iter()
        .map(in_postgres)
        .collect();
    let ddl = rng.pick(&UNTRUSTED);
    let (mut allowed, mut before) = (Vec::new(), Vec::new());
    let mut reused = world.a_dead_pid_is_reused();
    let mut oracle = || {
        before = sides[0].statuses();
        allowed = whole_candidates(&url, &url, world);
        reused |= world.a_dead_pid_is_reused();
    };
    let (outcome, how) = sides[0].route(world, &req, (&writes, None), &mut oracle);
    let ended = sides[0].statuses();
    let (whole_outcome, whole_how) = sides[1].route(world, &req, (&writes, Some(ddl)), &mut || {});
    let replay = format!(
        "seed {seed} (replay with FLEET_RETIRE_PG_SCOPED_DIFF_SEED={seed}); indexed read: \
         {how}; whole read: {whole_how}; DDL: {ddl}; writes: {writes:#?}"
    );
    if reused || world.a_dead_pid_is_reused() {
        // The process table moved under the interleaving: a verdict may
        // differ by when it was judged. Not a difference of the reads.
        return Some(Tally {
            planned: 1,
            pid_reused: 1,
            ..Tally::default()
        });
    }
    let indexed_read = how.contains("\"host_scope\"");
    if indexed_read {
        assert!(
            whole_how.contains("\"whole_registry\""),
            "{replay}: the DDL did not send the scoped apply to the whole read"
        );
    }
    assert_eq!(
        (outcome, &ended),
        (whole_outcome, &sides[1].statuses()),
        "{replay}: the scope read through its indexes ended otherwise than the scope taken \
         from the whole read"
    );
    let done = retired(&ended, &before);
    hold_to_oracle(&replay, &req, writes.is_empty(), (outcome, &done), &allowed);
    Some(Tally {
        planned: 1,
        applied: u64::from(outcome == Outcome::Applied),
        indexed: u64::from(indexed_read),
        pid_reused: 0,
    })
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_scoped_apply_on_postgres_ends_alike_through_its_indexes_and_from_the_whole_read() {
    let (Some(a), Some(b)) = (postgres("sdiff_indexed"), postgres("sdiff_whole")) else {
        return;
    };
    let mut world = World::new();
    let dir = tempfile::tempdir().unwrap();
    let profiles = dir.path().join("profiles.json");
    write_profiles(&profiles);
    let sides = [
        Side {
            db: a,
            profiles: profiles.clone(),
        },
        Side { db: b, profiles },
    ];
    let env = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().unwrap());
    if let Some(seed) = env("FLEET_RETIRE_PG_SCOPED_DIFF_SEED") {
        interleaving(seed, &world, &sides);
        return;
    }
    let runs = env("FLEET_RETIRE_PG_SCOPED_DIFF_RUNS").unwrap_or(30);
    let first = env("FLEET_RETIRE_PG_SCOPED_DIFF_FIRST").unwrap_or(20_261_205);
    let tally = (first..first + runs)
        .filter_map(|seed| {
            // Its processes made again when a dead worker's pid is taken.
            if world.a_dead_pid_is_reused() {
                eprintln!("seed {seed}: a dead worker's pid runs again; new processes");
                world = World::new();
            }
            interleaving(seed, &world, &sides)
        })
        .fold(Tally::default(), Tally::add);
    tally.check(runs);
}
