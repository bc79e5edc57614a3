//! Random fleets and random writes for the differential tests of apply's
//! fast path (`tests/fast_path_differential.rs` on SQLite,
//! `tests/postgres_differential.rs` on PostgreSQL): small real fleets of
//! dead and live processes, and writes in SQLite's dialect that an
//! ordinary client could commit in the window between apply's judgement
//! and its lock.

use super::{dead_process, spawn_sleeper, stale_row, start_time, KillOnDrop};
use rusqlite::types::Value as Sql;
use serde_json::{json, Value};

/// splitmix64: small, seedable, good enough to pick writes.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    pub fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())].clone()
    }
}

/// What every interleaving shares: real processes and the loaded policies.
pub struct World {
    pub live: Vec<KillOnDrop>,
    pub dead: Vec<(i64, String)>,
    pub policies: fleet_retire::policy::Policies,
    pub probe: fleet_retire::evidence::probe::SystemProbe,
}

impl World {
    pub fn new() -> World {
        World {
            live: (0..2).map(|_| KillOnDrop(spawn_sleeper())).collect(),
            dead: (0..6).map(|_| dead_process()).collect(),
            policies: fleet_retire::policy::Policies::load(
                &fleet_retire::policy::PolicySource::Embedded,
            )
            .unwrap(),
            probe: fleet_retire::evidence::probe::SystemProbe::new("/proc"),
        }
    }
    /// Whether a pid of the world's dead workers names a running process
    /// now: taken again by an unrelated process (the pid space wraps within
    /// minutes on a busy machine), which moves verdicts through the process
    /// table, not through the writes a differential compares.
    pub fn a_dead_pid_is_reused(&self) -> bool {
        self.dead
            .iter()
            .any(|(pid, _)| std::path::Path::new(&format!("/proc/{pid}")).exists())
    }

    pub fn live(&self, i: usize) -> (i64, String) {
        let pid = self.live[i].id();
        (pid as i64, start_time(pid))
    }
}

pub fn ts(offset_s: i64) -> String {
    fleet_retire::time::format_ts(fleet_retire::time::now() + offset_s * 1_000_000)
}

pub const INSTANCES: [&str; 3] = [
    "inst-codex-20260730T100000Z-abc123def456",
    "inst-codex-20260730T100000Z-000000000001",
    "inst-claude-20260730T100000Z-000000000002",
];

/// Four to seven rows: dead workers (candidates, unless a peer keeps
/// them), live ones heartbeating, sometimes a retired one; instance slots
/// and sessions drawn from small sets so that rows share them.
pub fn rows(rng: &mut Rng, world: &World) -> Vec<Value> {
    let mut rows = Vec::new();
    for i in 0..3 + rng.below(3) {
        let (pid, start) = world.dead[i].clone();
        let mut row = stale_row(&format!("w-dead-{i}"), pid, &start);
        row["client_instance_id"] = json!(rng.pick(&INSTANCES[..2]));
        if rng.chance(20) {
            row["session_id"] = json!("sess-shared");
        }
        rows.push(row);
    }
    for i in 0..1 + rng.below(2) {
        let (pid, start) = world.live(i);
        let mut row = stale_row(&format!("w-live-{i}"), pid, &start);
        row["last_heartbeat_at"] = json!(ts(0));
        row["client_instance_id"] = json!(rng.pick(&INSTANCES[1..]));
        rows.push(row);
    }
    if rng.chance(30) {
        let (pid, start) = world.dead[5].clone();
        let mut row = stale_row("w-retired", pid, &start);
        row["status"] = json!("retired");
        rows.push(row);
    }
    rows
}

/// One write of the window: SQL for the registry or the lease store.
#[derive(Debug, Clone)]
pub struct Write {
    pub leases: bool,
    pub sql: String,
    pub params: Vec<Sql>,
}

impl Write {
    pub fn registry(sql: &str, params: Vec<Sql>) -> Write {
        Write {
            leases: false,
            sql: sql.into(),
            params,
        }
    }
}

pub fn text(s: &str) -> Sql {
    Sql::Text(s.into())
}

/// A value for `column`, from the small set that moves verdicts.
pub fn value_for(rng: &mut Rng, column: &str, world: &World) -> Sql {
    let texts: &[&str] = match column {
        "instance_id_source" => &["launcher", "pid_fallback", "env"],
        "pid_namespace" => &["pid:[4026531836]", "pid:[4026532999]"],
        "session_id" => &["sess-shared", "sess-w-dead-0", "sess-w-live-0"],
        "client_instance_id" => &INSTANCES,
        "status" => &["active", "retired", "Active"],
        "host_id" => &["another-host"],
        "fencing_epoch" | "pid" => &[],
        "last_heartbeat_at" => &[],
        _ => &["x", "rev-2", ""],
    };
    match column {
        "pid" => Sql::Integer(match rng.below(3) {
            0 => world.live(0).0,
            1 => world.dead[rng.below(5)].0,
            _ => 1,
        }),
        "fencing_epoch" => Sql::Integer(rng.below(3) as i64),
        "last_heartbeat_at" => text(&ts(rng.pick(&[-86_400, 1, 2, 3]))),
        "heartbeat_ttl_seconds" => Sql::Real(rng.pick(&[900.0, 0.0, -0.0, 5.0])),
        _ if rng.chance(15) => Sql::Null,
        _ => text(rng.pick(texts)),
    }
}

/// Columns a write may change: every column the program reads, and one
/// it does not know.
pub const WRITABLE: [&str; 16] = [
    "instance_id_source",
    "pid_namespace",
    "session_id",
    "client_instance_id",
    "status",
    "host_id",
    "pid",
    "fencing_epoch",
    "heartbeat_ttl_seconds",
    "token_fingerprint",
    "startup_revision",
    "live_revision",
    "generation_id",
    "process_start_time",
    "retired_at",
    "note",
];

pub fn identity(rng: &mut Rng, rows: &[Value]) -> String {
    rng.pick(rows)["worker_identity"]
        .as_str()
        .unwrap()
        .to_string()
}

/// One random write of the window.
pub fn one_write(rng: &mut Rng, rows: &[Value], world: &World) -> Write {
    let who = identity(rng, rows);
    match rng.below(10) {
        // A heartbeat of a live worker: what the fast path confirms.
        0..=2 => Write::registry(
            "UPDATE worker_registrations SET last_heartbeat_at = ?1 WHERE worker_identity = ?2",
            vec![
                text(&ts(rng.pick(&[1, 2, 3]))),
                text(&format!("w-live-{}", rng.below(2))),
            ],
        ),
        3 | 4 => {
            let column = rng.pick(&WRITABLE);
            Write::registry(
                &format!(
                    "UPDATE worker_registrations SET {column} = ?1 WHERE worker_identity = ?2"
                ),
                vec![value_for(rng, column, world), text(&who)],
            )
        }
        5 => Write::registry(
            "INSERT INTO worker_registrations (worker_identity, client_name, client_instance_id, \
             session_id, status, pid, host_id, boot_id, process_start_time, last_heartbeat_at, \
             heartbeat_ttl_seconds) SELECT ?3, client_name, client_instance_id, session_id, \
             'active', pid, host_id, boot_id, process_start_time, ?1, heartbeat_ttl_seconds \
             FROM worker_registrations WHERE worker_identity = ?2",
            vec![
                text(&ts(0)),
                text(&who),
                text(&format!("w-new-{}", rng.below(1000))),
            ],
        ),
        6 => Write::registry(
            "DELETE FROM worker_registrations WHERE worker_identity = ?1",
            vec![text(&who)],
        ),
        // REPLACE: the row deleted and written again, at a new rowid.
        7 => Write::registry(
            "INSERT OR REPLACE INTO worker_registrations SELECT * FROM worker_registrations \
             WHERE worker_identity = ?1",
            vec![text(&who)],
        ),
        // UPSERT through the key: an UPDATE in place.
        8 => {
            let column = rng.pick(&WRITABLE);
            Write::registry(
                &format!(
                    "INSERT INTO worker_registrations (worker_identity, {column}) VALUES (?1, ?2) \
                     ON CONFLICT (worker_identity) DO UPDATE SET {column} = excluded.{column}"
                ),
                vec![text(&who), value_for(rng, column, world)],
            )
        }
        _ => Write {
            leases: true,
            sql: if rng.chance(50) {
                "INSERT OR REPLACE INTO workflow_leases (lease_id, status, owner_worker_identity) \
                 VALUES ('l-' || ?1, 'active', ?1)"
                    .into()
            } else {
                "UPDATE workflow_leases SET status = 'released' WHERE owner_worker_identity = ?1"
                    .into()
            },
            params: vec![text(&who)],
        },
    }
}

/// Plan the stores as `plan --out` would and request its candidates: all
/// of them or the first one; by the tokens alone (no planned rows) in
/// `tokens_only` percent of the draws. `None` when there is no candidate.
pub fn planned_request(
    registry: &std::path::Path,
    leases: &std::path::Path,
    world: &World,
    rng: &mut Rng,
    tokens_only: u64,
) -> Option<fleet_retire::apply::Request> {
    let plan = fleet_retire::plan::plan_from_files(
        registry,
        leases,
        std::path::Path::new("/proc"),
        "prgs/gitea-tools".into(),
        &world.policies,
    )
    .unwrap();
    let mut saved = Vec::new();
    plan.write_saved(&mut saved).unwrap();
    let doc: Value = serde_json::from_slice(&saved).unwrap();
    let workers: Vec<String> = doc["candidate_worker_identities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    if workers.is_empty() {
        return None;
    }
    let req = fleet_retire::apply::Request {
        registry_fingerprint: doc["registry_fingerprint"].as_str().unwrap().into(),
        candidate_fingerprint: doc["candidate_fingerprint"].as_str().unwrap().into(),
        policy_fingerprint: doc["policy_fingerprint"].as_str().unwrap().into(),
        workers,
        canonical_repository: Some("prgs/gitea-tools".into()),
        max_retire: 100,
        planned: None,
        first: rng.chance(30).then_some(1),
        scope: None,
        skip_fleet_summary: false,
        controller: None,
    };
    if rng.chance(tokens_only) {
        return Some(req);
    }
    let planned = serde_json::from_value(doc["planned_rows"].clone()).unwrap();
    Some(
        req.with_planned(Some(std::sync::Arc::new(planned)))
            .unwrap(),
    )
}

/// Apply `req` on the stores at `registry` and `leases` as the controller
/// of `profiles`, with `window` run between the judgement outside the lock
/// (or transaction) and the lock itself; the outcome, and how the lock
/// read the registry with the report's detail.
pub fn apply_with_window(
    (registry, leases, profiles): (&std::path::Path, &std::path::Path, &std::path::Path),
    world: &World,
    req: &fleet_retire::apply::Request,
    window: &mut dyn FnMut(),
) -> (fleet_retire::apply::Outcome, String) {
    let ctx = fleet_retire::apply::Context {
        registry,
        leases,
        profiles,
        profile: "controller-prgs",
        proc_root: std::path::Path::new("/proc"),
        policies: &world.policies,
        probe: &world.probe,
        busy_timeout: std::time::Duration::from_secs(5),
    };
    let hooks = fleet_retire::apply::Hooks {
        after_prejudge: Some(window),
        ..Default::default()
    };
    let report = fleet_retire::apply::apply(req, &ctx, hooks).unwrap();
    let scope = serde_json::to_value(&report.read_under_lock).unwrap();
    (report.outcome, format!("{scope} {}", report.detail))
}
