//! The fast path under apply's lock against the whole read, on random
//! concurrent writes (docs/apply.md, "The write lock held for what
//! changed"; docs/security.md, "the class, not just the instances").
//!
//! Each interleaving builds a small real fleet (a SQLite registry with row
//! versions, a lease store, real dead and live processes), plans it, and
//! copies the stores twice. On both copies apply runs with the same random
//! writes committed by an ordinary SQLite client in the window between its
//! judgement outside the lock and the lock itself (any column, unknown
//! columns, REPLACE and UPSERT, inserts and deletes, the lease store too).
//! On the second copy the window also changes the schema, which sends
//! apply to read and judge the whole registry under its lock. The two must
//! end alike: the same outcome and the same rows retired, row for row.
//!
//! `FLEET_RETIRE_DIFF_RUNS=N` runs N interleavings (default 1,000);
//! `FLEET_RETIRE_DIFF_SEED=S` replays one. A failure prints its seed and
//! its writes. The pids of dead and live workers are real and so differ
//! between runs; what a seed fixes is everything else.

mod common;

use common::interleave::*;
use common::*;
use fleet_retire::apply::{Outcome, Request};
use rusqlite::Connection;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The stores of one interleaving.
struct Stores3 {
    registry: PathBuf,
    leases: PathBuf,
    profiles: PathBuf,
}

/// Build the fleet in `dir`: registry (with an unknown column, and
/// sometimes a column that takes the rowid's name), its row versions, a
/// lease store with maybe a lease, profiles.
fn build(dir: &Path, rng: &mut Rng, rows: &[Value]) -> Stores3 {
    let s = Stores3 {
        registry: dir.join("registry.sqlite"),
        leases: dir.join("leases.sqlite"),
        profiles: dir.join("profiles.json"),
    };
    registry(&s.registry, rows);
    let conn = Connection::open(&s.registry).unwrap();
    conn.execute_batch("ALTER TABLE worker_registrations ADD COLUMN note TEXT")
        .unwrap();
    if rng.chance(5) {
        conn.execute_batch(
            "ALTER TABLE worker_registrations ADD COLUMN rowid INTEGER; \
             UPDATE worker_registrations SET rowid = 7",
        )
        .unwrap();
    }
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    fleet_retire::store::registry::add_missing_columns(&conn, &s.registry).unwrap();
    fleet_retire::store::sqlite::versions::install(&conn).unwrap();
    conn.execute_batch("COMMIT").unwrap();
    let leased: Vec<Value> = if rng.chance(20) {
        vec![json!({"lease_id": "l-0", "status": "active", "owner_worker_identity": "w-dead-0"})]
    } else {
        vec![]
    };
    leases(&s.leases, &leased);
    std::fs::write(
        &s.profiles,
        json!({"profiles": {"controller-prgs": {"role": "controller",
            "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}})
        .to_string(),
    )
    .unwrap();
    s
}

/// Plan the stores as `plan --out` would and request its candidates: all
/// of them, the first one, or by tokens alone (no planned rows).
fn request(s: &Stores3, world: &World, rng: &mut Rng) -> Option<Request> {
    planned_request(&s.registry, &s.leases, world, rng, 10)
}

/// How one route ended: the outcome, the scope of its read under the lock,
/// and every row's status afterwards.
#[derive(Debug, PartialEq)]
struct Ending {
    outcome: Outcome,
    statuses: Vec<(String, Option<String>)>,
}

fn statuses(registry: &Path) -> Vec<(String, Option<String>)> {
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

fn commit(s: &Stores3, w: &Write) {
    let conn = Connection::open(if w.leases { &s.leases } else { &s.registry }).unwrap();
    // A write SQLite refuses (a NOT NULL, a key) is a write that did not
    // happen, on both routes alike.
    let _ = conn.execute(&w.sql, rusqlite::params_from_iter(w.params.iter()));
}

/// Apply on the stores in `dir` with `writes` in the window; `whole`
/// also changes the schema there, so the lock reads the whole registry.
fn route(
    s: &Stores3,
    world: &World,
    req: &Request,
    writes: &[Write],
    whole: bool,
) -> (Ending, String) {
    let mut hook = || {
        for w in writes {
            commit(s, w);
        }
        if whole {
            Connection::open(&s.registry)
                .unwrap()
                .execute_batch("CREATE TABLE fr_whole (x); DROP TABLE fr_whole;")
                .unwrap();
        }
    };
    let stores = (
        s.registry.as_path(),
        s.leases.as_path(),
        s.profiles.as_path(),
    );
    let (outcome, how) = apply_with_window(stores, world, req, &mut hook);
    (
        Ending {
            outcome,
            statuses: statuses(&s.registry),
        },
        how,
    )
}

/// One interleaving; whether the fast path decided it (`Some(true)`), or
/// `None` when the plan had no candidate.
fn interleaving(seed: u64, world: &World) -> Option<bool> {
    let mut rng = Rng(seed);
    let rows = rows(&mut rng, world);
    let base = tempfile::tempdir().unwrap();
    let stores = build(base.path(), &mut rng, &rows);
    let req = request(&stores, world, &mut rng)?;
    let writes: Vec<Write> = (0..rng.below(4))
        .map(|_| one_write(&mut rng, &rows, world))
        .collect();
    let copy = |name: &str| {
        let dir = base.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for f in ["registry.sqlite", "leases.sqlite", "profiles.json"] {
            std::fs::copy(base.path().join(f), dir.join(f)).unwrap();
        }
        Stores3 {
            registry: dir.join("registry.sqlite"),
            leases: dir.join("leases.sqlite"),
            profiles: dir.join("profiles.json"),
        }
    };
    let (fast, slow) = (copy("fast"), copy("whole"));
    let (fast_end, fast_how) = route(&fast, world, &req, &writes, false);
    let (whole_end, whole_how) = route(&slow, world, &req, &writes, true);
    assert!(
        whole_how.contains("whole_registry"),
        "seed {seed}: the schema change did not force the whole read: {whole_how}"
    );
    assert_eq!(
        fast_end, whole_end,
        "seed {seed} (replay with FLEET_RETIRE_DIFF_SEED={seed}): the fast path ({fast_how}) \
         ended otherwise than the whole read ({whole_how}); writes in the window: {writes:#?}"
    );
    Some(fast_how.contains("changed_rows"))
}

#[test]
fn the_fast_path_retires_exactly_what_the_whole_read_does() {
    let world = World::new();
    let env = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().unwrap());
    if let Some(seed) = env("FLEET_RETIRE_DIFF_SEED") {
        interleaving(seed, &world);
        return;
    }
    let runs = env("FLEET_RETIRE_DIFF_RUNS").unwrap_or(1_000);
    let first = env("FLEET_RETIRE_DIFF_FIRST").unwrap_or(20_261_204);
    // Two threads, each its own seeds: the interleavings share nothing
    // but the world's processes and policies.
    let count = |seeds: Vec<u64>| {
        let (mut planned, mut fast) = (0u64, 0u64);
        for seed in seeds {
            match interleaving(seed, &world) {
                Some(true) => (planned, fast) = (planned + 1, fast + 1),
                Some(false) => planned += 1,
                None => {}
            }
        }
        (planned, fast)
    };
    let (planned, fast) = std::thread::scope(|scope| {
        let other = scope.spawn(|| count((first..first + runs).step_by(2).collect()));
        let (p, f) = count((first + 1..first + runs).step_by(2).collect());
        let (q, g) = other
            .join()
            .expect("the other thread's interleavings failed");
        (p + q, f + g)
    });
    eprintln!(
        "{runs} interleavings from seed {first}: {planned} with candidates, {fast} decided \
         by the fast path under the lock"
    );
    // The test means something only if the fast path is taken often.
    assert!(
        planned * 10 >= runs * 8,
        "too few plans had candidates: {planned}"
    );
    assert!(
        fast * 5 >= planned,
        "the fast path was taken too rarely: {fast} of {planned}"
    );
}
