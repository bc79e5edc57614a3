//! The scoped apply (`plan --scope host`, issue 54) on the random writes of
//! `tests/fast_path_differential.rs`, with rows of another host among the
//! rows (peers of this host's, sharing instance slots and sessions): the
//! writes land between apply's judgement outside the lock and the lock,
//! on this host's rows, on the other host's, on peers (more of them aimed
//! at peers: `common::scoped::peer_write`) and on the lease store.
//!
//! The same scoped plan is applied twice, on two copies of the stores,
//! with the same writes in the window. The first time, the scope is read
//! under the lock as shipped, through its indexes. The second time the
//! window also replaces one of the scope's indexes with one of another
//! shape (no condition, another condition or columns, an expression), so
//! the indexes cannot be trusted under the lock and apply takes the scope
//! from a read of every row (`store::scope::from_whole_read`). The two
//! must end alike: the same outcome and every row's status the same.
//!
//! Each is also held to an oracle: the whole plan of the registry as it
//! stands after the writes (planned in the first route's window, before
//! its lock). A scoped apply reads less than the whole registry, so it may
//! refuse where an apply of the whole plan goes on; it must never retire a
//! row the whole plan keeps. With no write at all, the scoped apply
//! retires exactly what it asked.
//!
//! The process table is the one thing the writes do not fix: on a busy
//! machine the pid space wraps within minutes, and a dead worker's pid
//! taken by another process moves verdicts by time alone. An interleaving
//! during which that is seen is counted, not judged, and the processes are
//! made again.
//!
//! This host is the machine's own (the kernel's node name): no namespace is
//! needed, the other host's rows are those written with another name.
//! `FLEET_RETIRE_SCOPED_DIFF_RUNS=N` runs N interleavings (default 250,
//! about 70 s in debug on a loaded machine);
//! `FLEET_RETIRE_SCOPED_DIFF_SEED=S` replays one. A failure prints its
//! seed, both reads and the writes.

mod common;

use common::interleave::*;
use common::scoped::*;
use common::*;
use fleet_retire::apply::{Outcome, Request};
use rusqlite::Connection;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// DDL that leaves one of the scope's indexes under our name but not ours.
/// (An index merely dropped is made again by apply's own bookkeeping under
/// the lock, and read through then, rightly: it was built in that
/// transaction.)
const UNTRUSTED: [&str; 4] = [
    "DROP INDEX fleet_retire_scope_session; \
     CREATE INDEX fleet_retire_scope_session ON worker_registrations (session_id)",
    "DROP INDEX fleet_retire_scope_pid; \
     CREATE INDEX fleet_retire_scope_pid ON worker_registrations (pid) WHERE status = 'retired'",
    "DROP INDEX fleet_retire_scope_host; \
     CREATE INDEX fleet_retire_scope_host ON worker_registrations (status, host_id)",
    "DROP INDEX fleet_retire_scope_instance; \
     CREATE INDEX fleet_retire_scope_instance ON worker_registrations (lower(client_instance_id)) \
     WHERE status = 'active'",
];

/// The stores of one interleaving, in `dir`.
fn stores_in(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join("registry.sqlite"),
        dir.join("leases.sqlite"),
        dir.join("profiles.json"),
    )
}

/// The fleet in `dir`: the rows, the scope's indexes, maybe a lease, the
/// controller's profile.
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
    write_profiles(&profiles);
}

fn commit(dir: &Path, w: &Write) {
    let (registry, lease_store, _) = stores_in(dir);
    let conn = Connection::open(if w.leases { lease_store } else { registry }).unwrap();
    // A write SQLite refuses is a write that did not happen, everywhere.
    let _ = conn.execute(&w.sql, rusqlite::params_from_iter(w.params.iter()));
}

fn statuses(registry: &Path) -> Statuses {
    let conn = Connection::open(registry).unwrap();
    let mut stmt = conn
        .prepare("SELECT worker_identity, status FROM worker_registrations ORDER BY 1, 2")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    rows
}

/// Apply `req` on the stores in `dir` with `writes` in the window, then
/// `ddl` there too, then `after`; the outcome, how the lock read, and
/// every row's status after it (and before the apply, after the window).
fn route(
    dir: &Path,
    world: &World,
    req: &Request,
    (writes, ddl): (&[Write], Option<&str>),
    after: &mut dyn FnMut(),
) -> (Outcome, String, Statuses, Statuses) {
    let (registry, lease_store, profiles) = stores_in(dir);
    let mut before = Vec::new();
    let mut window = || {
        for w in writes {
            commit(dir, w);
        }
        if let Some(ddl) = ddl {
            Connection::open(&registry)
                .unwrap()
                .execute_batch(ddl)
                .unwrap();
        }
        before = statuses(&registry);
        after();
    };
    let (outcome, how) = apply_with_window(
        (&registry, &lease_store, &profiles),
        world,
        req,
        &mut window,
    );
    (outcome, how, statuses(&registry), before)
}

/// One interleaving, or `None` when the scoped plan had no candidate.
fn interleaving(seed: u64, world: &World) -> Option<Tally> {
    let mut rng = Rng(seed);
    let rows = scoped_rows(&mut rng, world);
    let base = tempfile::tempdir().unwrap();
    build(base.path(), &mut rng, &rows);
    let (registry, lease_store, _) = stores_in(base.path());
    let req = scoped_request(&registry, &lease_store, world, &mut rng)?;
    let writes = window_writes(&mut rng, &rows, world);
    let ddl = rng.pick(&UNTRUSTED);
    let copy = |name: &str| {
        let dir = base.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for f in ["registry.sqlite", "leases.sqlite", "profiles.json"] {
            std::fs::copy(base.path().join(f), dir.join(f)).unwrap();
        }
        dir
    };
    let (indexed, whole) = (copy("indexed"), copy("whole"));
    let (mut allowed, mut reused) = (Vec::new(), world.a_dead_pid_is_reused());
    let mut oracle = || {
        let (registry, lease_store, _) = stores_in(&indexed);
        allowed = whole_candidates(&registry, &lease_store, world);
        reused |= world.a_dead_pid_is_reused();
    };
    let (outcome, how, ended, before) = route(&indexed, world, &req, (&writes, None), &mut oracle);
    let (whole_outcome, whole_how, whole_ended, _) =
        route(&whole, world, &req, (&writes, Some(ddl)), &mut || {});
    let replay = format!(
        "seed {seed} (replay with FLEET_RETIRE_SCOPED_DIFF_SEED={seed}); indexed read: {how}; \
         whole read: {whole_how}; DDL: {ddl}; writes: {writes:#?}"
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
        (whole_outcome, &whole_ended),
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
fn a_scoped_apply_ends_alike_through_its_indexes_and_from_the_whole_read() {
    let env = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().unwrap());
    if let Some(seed) = env("FLEET_RETIRE_SCOPED_DIFF_SEED") {
        interleaving(seed, &World::new());
        return;
    }
    let runs = env("FLEET_RETIRE_SCOPED_DIFF_RUNS").unwrap_or(250);
    let first = env("FLEET_RETIRE_SCOPED_DIFF_FIRST").unwrap_or(20_261_205);
    // Two threads, each its own seeds and its own processes (made again
    // when a dead worker's pid is taken by another process).
    let count = |seeds: Vec<u64>| {
        let mut world = World::new();
        seeds
            .into_iter()
            .filter_map(|seed| {
                if world.a_dead_pid_is_reused() {
                    eprintln!("seed {seed}: a dead worker's pid runs again; new processes");
                    world = World::new();
                }
                interleaving(seed, &world)
            })
            .fold(Tally::default(), Tally::add)
    };
    let tally = std::thread::scope(|scope| {
        let other = scope.spawn(|| count((first..first + runs).step_by(2).collect()));
        let mine = count((first + 1..first + runs).step_by(2).collect());
        mine.add(
            other
                .join()
                .expect("the other thread's interleavings failed"),
        )
    });
    tally.check(runs);
}
