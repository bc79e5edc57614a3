//! The pieces the scoped differential tests share (`tests/scoped_differential.rs`
//! on SQLite, `tests/postgres_scoped_differential.rs` on PostgreSQL): the
//! random fleet with rows of another host among this host's, the scoped
//! plan's request, the writes of the window with more of them aimed at peer
//! rows, and the oracle (the whole plan of the registry after the writes).

use super::interleave::{identity, one_write, rows, text, ts, Rng, World, Write};
use fleet_retire::apply::{Outcome, Request, Tokens};
use serde_json::{json, Value};
use std::path::Path;

/// The other host's name: rows written with it are not this host's.
pub const OTHER_HOST: &str = "another-host";

/// The fleet of `common::interleave::rows`, a third of its rows on
/// another host: they share instance slots and sessions with this host's
/// rows, so many of them are peers.
pub fn scoped_rows(rng: &mut Rng, world: &World) -> Vec<Value> {
    let mut rows = rows(rng, world);
    for row in rows.iter_mut() {
        if rng.chance(33) {
            row["host_id"] = json!(OTHER_HOST);
        }
    }
    rows
}

/// The controller's profile, allowed to apply, in `path`.
pub fn write_profiles(path: &Path) {
    std::fs::write(
        path,
        json!({"profiles": {"controller-prgs": {"role": "controller",
            "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}})
        .to_string(),
    )
    .unwrap();
}

/// The scoped plan (`plan --scope host`) of the stores at `registry` and
/// `leases` (paths or PostgreSQL URLs), saved and read back as `apply
/// PLAN.json` reads it: its request (all candidates, or the first).
/// `None` when it has no candidate.
pub fn scoped_request(
    registry: &Path,
    leases: &Path,
    world: &World,
    rng: &mut Rng,
) -> Option<Request> {
    let plan = fleet_retire::plan::scoped::plan_scope_from_files(
        registry,
        leases,
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

/// The identities the whole plan of the stores at `registry` and `leases`
/// makes candidates: the oracle, read after the window's writes.
pub fn whole_candidates(registry: &Path, leases: &Path, world: &World) -> Vec<String> {
    let plan = fleet_retire::plan::plan_from_files(
        registry,
        leases,
        Path::new("/proc"),
        "prgs/gitea-tools".into(),
        &world.policies,
    )
    .unwrap();
    plan.candidates().map(|e| plan.identity(e)).collect()
}

/// The writes of one window: none to four, each the fast path's random
/// write (`interleave::one_write`: any row, this host's or the other's,
/// any column, inserts, deletes, the lease store) or, one in three, a
/// write aimed at peers ([`peer_write`]).
pub fn window_writes(rng: &mut Rng, rows: &[Value], world: &World) -> Vec<Write> {
    (0..rng.below(5))
        .map(|_| {
            if rng.chance(35) {
                peer_write(rng, rows)
            } else {
                one_write(rng, rows, world)
            }
        })
        .collect()
}

/// The columns a new peer copies from the row it shares keys with.
const KEYS: &str = "client_name, client_instance_id, instance_id_source, session_id, \
                    generation_id, process_identity, pid, boot_id, process_start_time, role, \
                    profile, namespace, remote, repository_binding, started_at, \
                    heartbeat_ttl_seconds, fencing_epoch";

/// A write that makes, changes or ends a peer: a row of another host
/// registered with the keys of a row (its identity evidence, slot and
/// pid); a row of another host given a key of a row; a row of another
/// host retired or made active again.
pub fn peer_write(rng: &mut Rng, rows: &[Value]) -> Write {
    let who = identity(rng, rows);
    let others: Vec<Value> = rows
        .iter()
        .filter(|r| r["host_id"] == json!(OTHER_HOST))
        .cloned()
        .collect();
    let other = if others.is_empty() {
        identity(rng, rows)
    } else {
        identity(rng, &others)
    };
    match rng.below(3) {
        0 => Write::registry(
            &format!(
                "INSERT INTO worker_registrations (worker_identity, {KEYS}, status, host_id, \
                 last_heartbeat_at) SELECT ?1, {KEYS}, 'active', '{OTHER_HOST}', ?2 \
                 FROM worker_registrations WHERE worker_identity = ?3"
            ),
            vec![
                text(&format!("w-peer-{}", rng.below(1000))),
                text(&ts(rng.pick(&[-86_400, 0]))),
                text(&who),
            ],
        ),
        1 => {
            let column = rng.pick(&[
                "session_id",
                "generation_id",
                "client_instance_id",
                "pid",
                "process_identity",
            ]);
            Write::registry(
                &format!(
                    "UPDATE worker_registrations SET {column} = (SELECT {column} FROM \
                     worker_registrations WHERE worker_identity = ?1) WHERE worker_identity = ?2"
                ),
                vec![text(&who), text(&other)],
            )
        }
        _ => Write::registry(
            "UPDATE worker_registrations SET status = ?1 WHERE worker_identity = ?2",
            vec![text(rng.pick(&["retired", "active"])), text(&other)],
        ),
    }
}

/// Every row's identity and status, sorted.
pub type Statuses = Vec<(String, Option<String>)>;

/// The rows `after` shows retired that `before` did not, sorted.
pub fn retired(after: &Statuses, before: &Statuses) -> Vec<String> {
    after
        .iter()
        .filter(|(w, s)| {
            s.as_deref() == Some("retired")
                && !before
                    .iter()
                    .any(|(b, t)| b == w && t.as_deref() == Some("retired"))
        })
        .map(|(w, _)| w.clone())
        .collect()
}

/// What both routes of a scoped interleaving are held to besides their
/// equality: the rows retired (`done`, sorted) are all candidates of the
/// whole plan after the writes (`allowed`), and with no write at all the
/// apply retired exactly what it asked.
pub fn hold_to_oracle(
    replay: &str,
    req: &Request,
    no_writes: bool,
    (outcome, done): (Outcome, &[String]),
    allowed: &[String],
) {
    for w in done {
        assert!(
            allowed.contains(w),
            "{replay}: the scoped apply retired {w}, which the whole plan after the writes \
             keeps (candidates {allowed:?})"
        );
    }
    if no_writes {
        let mut asked = req.workers.clone();
        asked.truncate(req.first.unwrap_or(asked.len()));
        asked.sort();
        assert_eq!(outcome, Outcome::Applied, "{replay}");
        assert_eq!(done, asked.as_slice(), "{replay}");
    }
}

/// A run's tally: interleavings whose scoped plan had candidates, of them
/// those applied, those whose first route read the scope through its
/// indexes, and those left unjudged because the process table moved.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub planned: u64,
    pub applied: u64,
    pub indexed: u64,
    /// Interleavings not judged: a dead worker's pid was running again at
    /// one of the checks (`World::a_dead_pid_is_reused`).
    pub pid_reused: u64,
}

impl Tally {
    pub fn add(self, other: Tally) -> Tally {
        Tally {
            planned: self.planned + other.planned,
            applied: self.applied + other.applied,
            indexed: self.indexed + other.indexed,
            pid_reused: self.pid_reused + other.pid_reused,
        }
    }

    /// The differential means something only if scoped plans had
    /// candidates, many applies went through and the first route read
    /// through the indexes.
    pub fn check(&self, runs: u64) {
        eprintln!(
            "{runs} interleavings: {} scoped plans with candidates, {} applied, {} read \
             through the indexes on the first route; {} not judged, a dead worker's pid \
             reused meanwhile",
            self.planned, self.applied, self.indexed, self.pid_reused
        );
        assert!(self.planned * 2 >= runs, "{self:?}");
        assert!(self.applied * 3 >= self.planned, "{self:?}");
        assert!(self.indexed * 2 >= self.planned, "{self:?}");
        assert!(self.pid_reused * 10 <= self.planned, "{self:?}");
    }
}
