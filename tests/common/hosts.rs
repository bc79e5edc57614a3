//! Simulated hosts for the host-scope tests (`tests/host_scope*.rs`), as
//! `tests/multi_host.rs` makes them: each command runs in a UTS namespace
//! whose kernel node name is the host's (no flag or variable names a
//! host), over a registry whose rows share every kind of key across hosts.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// The simulated hosts.
pub const HOSTS: [&str; 3] = ["scope-a", "scope-b", "scope-c"];

/// Key values: a few shared by many rows, most by a few.
pub const SOME: [u32; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

/// A small generator, so a failure names the seed that made its registry.
pub struct Lcg(u64);

impl Lcg {
    /// One of `of`.
    pub fn pick<T: Clone>(&mut self, of: &[T]) -> T {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        of[(self.0 >> 33) as usize % of.len()].clone()
    }
}

/// A registry whose rows share every kind of key across hosts and
/// statuses: sessions, generations, pids (alive, dead), given and derived
/// process identities, instance slots; some stale, some live, some of
/// other statuses, some on no host or on a host written with a space.
pub fn rows(seed: u64) -> Vec<Value> {
    let (_, boot) = super::host_and_boot();
    // Pids no process can hold (above any pid_max), so no process this
    // test starts between two plans takes one.
    let (dead, dead_start) = (2_000_000_001_i64, "ticks-5".to_string());
    let alive = i64::from(std::process::id());
    let alive_start = super::start_time(std::process::id());
    let mut g = Lcg(seed);
    (0..600)
        .map(|i| {
            let host = g.pick(&[
                Value::from(HOSTS[0]),
                Value::from(HOSTS[1]),
                Value::from(HOSTS[2]),
                Value::from(HOSTS[0]),
                Value::Null,
                Value::from(" scope-a"),
            ]);
            let (pid, start) = g.pick(&[
                (json!(dead), dead_start.clone()),
                (json!(dead), dead_start.clone()),
                (json!(alive), alive_start.clone()),
                (json!(dead + 1), "ticks-1".into()),
            ]);
            json!({
                "worker_identity": format!("w-{i:04}"),
                "client_name": "codex",
                "client_instance_id": g.pick(&["inst-codex-20260730T100000Z-abc123def456",
                    "inst-codex-20260730T100000Z-0000000000aa", "", "inst-codex-20260730T100000Z-0000000000bb"]),
                "instance_id_source": "launcher",
                "session_id": format!("s-{}-{}", g.pick(&SOME), g.pick(&SOME)),
                "generation_id": format!("g-{}-{}", g.pick(&SOME), g.pick(&SOME)),
                "process_identity": g.pick(&[Value::Null, json!(format!("pid-{dead}")),
                    json!("proc-1"), json!(format!("proc-{i}")), json!(format!("proc-{i}"))]),
                "role": "author", "profile": "author-prgs",
                "namespace": g.pick(&["author", "reviewer"]),
                "remote": "prgs", "repository_binding": "prgs/gitea-tools",
                "pid": pid,
                "started_at": "2026-01-01T00:00:00Z",
                "last_heartbeat_at": g.pick(&["2026-01-01T00:10:00Z", "2026-01-01T00:10:00Z",
                    "2126-01-01T00:10:00Z"]),
                "heartbeat_ttl_seconds": 900.0,
                "fencing_epoch": 1,
                "status": g.pick(&["active", "active", "active", "released", "retired", " active"]),
                "host_id": host, "boot_id": boot, "process_start_time": start,
            })
        })
        .collect()
}

pub fn profiles(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("profiles.json");
    std::fs::write(
        &path,
        json!({"profiles": {"controller-prgs": {"role": "controller",
            "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}})
        .to_string(),
    )
    .unwrap();
    path
}

/// fleet-retire with `args` run as host `host` (a UTS namespace named
/// so), with the stores and the controller's profile.
pub fn run_as(host: &str, args: &[&str], stores: (&Path, &Path, &Path)) -> std::process::Output {
    let (registry, leases, profiles) = stores;
    let script = format!(
        "hostname {host} && exec \"$BIN\" \"$@\" --registry \"$R\" --leases \"$L\" \
         --profiles \"$P\" --profile controller-prgs"
    );
    Command::new("unshare")
        .args(["--uts", "sh", "-c", &script, "sh"])
        .args(args)
        .env("BIN", env!("CARGO_BIN_EXE_fleet-retire"))
        .env("R", registry)
        .env("L", leases)
        .env("P", profiles)
        .output()
        .unwrap()
}

/// `plan --scope host --out saved` run as host `host`: the plan it printed
/// and its candidates, in the plan's order.
pub fn save_scoped_plan(
    host: &str,
    stores: (&Path, &Path, &Path),
    saved: &Path,
) -> (Value, Vec<String>) {
    let saved = saved.to_str().unwrap();
    let args = [
        "plan",
        "--format",
        "json",
        "--canonical-repository",
        "prgs/gitea-tools",
        "--scope",
        "host",
        "--out",
        saved,
    ];
    let out = run_as(host, &args, stores);
    assert!(out.status.success(), "{}", super::text(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let candidates = plan["candidate_worker_identities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    (plan, candidates)
}

/// `plan --format json` run as host `host`, scoped or not.
pub fn plan_as(host: &str, registry: &Path, leases: &Path, profiles: &Path, scoped: bool) -> Value {
    let mut args = vec![
        "plan",
        "--format",
        "json",
        "--canonical-repository",
        "prgs/gitea-tools",
    ];
    if scoped {
        args.extend(["--scope", "host"]);
    }
    let out = run_as(host, &args, (registry, leases, profiles));
    assert!(out.status.success(), "{}", super::text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each entry's identity with its reason codes (empty for a candidate)
/// and host, as a plan document lists them.
pub fn entries(plan: &Value) -> BTreeMap<String, (Vec<String>, Value, Value)> {
    let mut out = BTreeMap::new();
    for list in ["candidates", "preserved"] {
        for e in plan[list].as_array().unwrap() {
            let codes = e["reason_codes"]
                .as_array()
                .map(|c| c.iter().map(|c| c.as_str().unwrap().to_string()).collect())
                .unwrap_or_default();
            out.insert(
                e["worker_identity"].as_str().unwrap().to_string(),
                (
                    codes,
                    e["evidence"]["host_id"].clone(),
                    e["evidence"]["status"].clone(),
                ),
            );
        }
    }
    out
}

pub fn can_make_hosts() -> bool {
    let root = nix::unistd::Uid::effective().is_root();
    if !root || Command::new("unshare").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root with unshare"
        );
        eprintln!("skipped: simulated hosts need root and unshare");
        return false;
    }
    true
}

/// The SQLite registry and lease store of `seed`, with the profiles.
pub fn stores(
    dir: &Path,
    seed: u64,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let (registry, leases) = (dir.join("r.sqlite"), dir.join("l.sqlite"));
    super::registry(&registry, &rows(seed));
    // A registry made otherwise gains the scope's indexes from the
    // operator's step (docs/multi-host.md, "One host's scope").
    let out = super::run(&[
        "registry",
        "versions",
        "--registry",
        registry.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", super::text(&out));
    super::leases(
        &leases,
        &SOME.map(|n| {
            json!({"lease_id": format!("l-{n}"), "status": "active",
                   "session_id": format!("s-{n}-5")})
        }),
    );
    (registry, leases, profiles(dir))
}

/// The stores of [`stores`] copied into a fresh PostgreSQL database by its
/// owner, with the documented grants: the database, the folder holding
/// `profiles.json`, and the apply role's URL. `None` when hosts cannot be
/// simulated or no cluster is configured.
pub fn on_postgres(tag: &str) -> Option<(super::PgDb, tempfile::TempDir, String)> {
    if !can_make_hosts() {
        return None;
    }
    let db = super::postgres(tag)?;
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, _) = stores(dir.path(), seed());
    let roles = db.documented_roles();
    fleet_retire::copy::copy(&registry, Some(&leases), &roles.owner).unwrap();
    db.grant_documented(&roles);
    Some((db, dir, roles.apply))
}

/// Run SQL on the SQLite registry at `registry`, as any other program would.
pub fn sqlite_exec(registry: &Path) -> impl Fn(&str) + '_ {
    move |sql| {
        rusqlite::Connection::open(registry)
            .unwrap()
            .execute_batch(sql)
            .unwrap()
    }
}

pub fn seed() -> u64 {
    std::env::var("FLEET_RETIRE_SCOPE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(54)
}
