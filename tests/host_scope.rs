//! `plan --scope host` (issue 54): every host's scoped plan is the
//! whole-registry plan restricted to that host's active rows, verdict by
//! verdict, and counts its other rows without reading them. Hosts are
//! simulated as `tests/multi_host.rs` does: each plan runs in a UTS
//! namespace of its own whose kernel node name is that host's (no flag or
//! variable names a host).

mod common;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const HOSTS: [&str; 3] = ["scope-a", "scope-b", "scope-c"];

/// Key values: a few shared by many rows, most by a few.
const SOME: [u32; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

/// A small generator, so a failure names the seed that made its registry.
struct Lcg(u64);

impl Lcg {
    fn pick<T: Clone>(&mut self, of: &[T]) -> T {
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
fn rows(seed: u64) -> Vec<Value> {
    let (_, boot) = common::host_and_boot();
    // Pids no process can hold (above any pid_max), so no process this
    // test starts between two plans takes one.
    let (dead, dead_start) = (2_000_000_001_i64, "ticks-5".to_string());
    let alive = i64::from(std::process::id());
    let alive_start = common::start_time(std::process::id());
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

fn profiles(dir: &Path) -> std::path::PathBuf {
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
fn run_as(host: &str, args: &[&str], stores: (&Path, &Path, &Path)) -> std::process::Output {
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

/// `plan --format json` run as host `host`, scoped or not.
fn plan_as(host: &str, registry: &Path, leases: &Path, profiles: &Path, scoped: bool) -> Value {
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
    assert!(out.status.success(), "{}", common::text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each entry's identity with its reason codes (empty for a candidate)
/// and host, as a plan document lists them.
fn entries(plan: &Value) -> BTreeMap<String, (Vec<String>, Value, Value)> {
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

fn can_make_hosts() -> bool {
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
fn stores(dir: &Path, seed: u64) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let (registry, leases) = (dir.join("r.sqlite"), dir.join("l.sqlite"));
    common::registry(&registry, &rows(seed));
    // A registry made otherwise gains the scope's indexes from the
    // operator's step (docs/multi-host.md, "One host's scope").
    let out = common::run(&[
        "registry",
        "versions",
        "--registry",
        registry.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    common::leases(
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
fn on_postgres(tag: &str) -> Option<(common::PgDb, tempfile::TempDir, String)> {
    if !can_make_hosts() {
        return None;
    }
    let db = common::postgres(tag)?;
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, _) = stores(dir.path(), seed());
    let roles = db.documented_roles();
    fleet_retire::copy::copy(&registry, Some(&leases), &roles.owner).unwrap();
    db.grant_documented(&roles);
    Some((db, dir, roles.apply))
}

/// Run SQL on the SQLite registry at `registry`, as any other program would.
fn sqlite_exec(registry: &Path) -> impl Fn(&str) + '_ {
    move |sql| {
        rusqlite::Connection::open(registry)
            .unwrap()
            .execute_batch(sql)
            .unwrap()
    }
}

fn seed() -> u64 {
    std::env::var("FLEET_RETIRE_SCOPE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(54)
}

/// For every host: its scoped plan's entries are the whole plan's entries
/// of its active rows, verdict by verdict (every reason code); it counts
/// its other rows; its tokens are scoped and the whole plan's are not; and
/// it reads fewer rows than the registry holds. Across the hosts, the
/// verdicts compared have candidates and rest on every kind of peer fact.
fn each_host_plans_its_scope_as_the_whole_plan_does(
    registry: &Path,
    leases: &Path,
    profiles: &Path,
    seed: u64,
) {
    let mut candidates = 0;
    let mut reasons = std::collections::BTreeSet::new();
    for host in HOSTS {
        let whole = plan_as(host, registry, leases, profiles, false);
        let scoped = plan_as(host, registry, leases, profiles, true);
        let expected: BTreeMap<_, _> = entries(&whole)
            .into_iter()
            .filter(|(_, (_, h, s))| h == host && s == "active")
            .collect();
        let terminal = entries(&whole)
            .values()
            .filter(|(_, h, s)| h == host && s != "active")
            .count();
        let got = entries(&scoped);
        let differ: Vec<_> = got
            .keys()
            .chain(expected.keys())
            .filter(|k| got.get(*k) != expected.get(*k))
            .map(|k| (k, got.get(k), expected.get(k)))
            .collect();
        assert!(differ.is_empty(), "host {host}, seed {seed}: {differ:?}");
        assert_eq!(
            scoped["scope"]["terminal_rows"],
            json!(terminal),
            "host {host}"
        );
        assert_eq!(scoped["scope"]["host_id"], json!(host));
        for token in ["registry_fingerprint", "candidate_fingerprint"] {
            assert!(scoped[token].as_str().unwrap().starts_with("host-scope:"));
            assert!(!whole[token].as_str().unwrap().starts_with("host-scope:"));
        }
        candidates += scoped["candidate_count"].as_u64().unwrap();
        reasons.extend(
            entries(&scoped)
                .into_values()
                .flat_map(|(codes, _, _)| codes),
        );
        let read = scoped["scope"]["own_rows"].as_u64().unwrap()
            + scoped["scope"]["peer_rows"].as_u64().unwrap();
        assert!(
            read < whole["assessed_count"].as_u64().unwrap(),
            "host {host}"
        );
    }
    assert!(
        candidates > 0,
        "the registry has candidates to compare (seed {seed}): {reasons:?}"
    );
    for peer_fact in [
        "conflicting_identity_evidence",
        "client_instance_conflict",
        "protected_active_workflow_owner",
    ] {
        assert!(reasons.contains(peer_fact), "{peer_fact} in {reasons:?}");
    }
}

#[test]
fn every_hosts_scoped_plan_is_the_whole_plan_restricted_to_its_rows_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    each_host_plans_its_scope_as_the_whole_plan_does(&registry, &leases, &profiles, seed());
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn every_hosts_scoped_plan_is_the_whole_plan_restricted_to_its_rows_on_postgres() {
    let Some((_db, dir, url)) = on_postgres("host_scope") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    each_host_plans_its_scope_as_the_whole_plan_does(url, url, &profiles, seed());
}

/// A row of host scope-b sharing no key with any other row: outside every
/// other host's scope.
const OUTSIDER: &str = "INSERT INTO worker_registrations (worker_identity, session_id, \
    generation_id, pid, status, host_id, last_heartbeat_at) VALUES ('w-outsider', 's-outsider', \
    'g-outsider', 999999999, 'active', 'scope-b', '2026-01-01T00:00:00Z')";
const OUTSIDER_BEATS: &str = "UPDATE worker_registrations SET last_heartbeat_at = \
    '2026-06-01T00:00:00Z', session_id = 's-outsider-2' WHERE worker_identity = 'w-outsider'";

/// Host scope-a plans its scope and saves it; another host's row outside
/// it is inserted and written; scope-a's scoped tokens do not move, and
/// its apply of the saved plan retires exactly the plan's candidates,
/// reading its scope under the lock; the same apply again is a replay.
fn a_scoped_apply_retires_its_plan_whatever_other_hosts_write(
    stores: (&Path, &Path, &Path),
    dir: &Path,
    write: &dyn Fn(&str),
) {
    let host = HOSTS[0];
    let saved = dir.join("plan.json");
    let saved_arg = saved.to_str().unwrap();
    let args = [
        "plan",
        "--format",
        "json",
        "--canonical-repository",
        "prgs/gitea-tools",
        "--scope",
        "host",
        "--out",
        saved_arg,
    ];
    let out = run_as(host, &args, stores);
    assert!(out.status.success(), "{}", common::text(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let candidates: Vec<String> = plan["candidate_worker_identities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert!(!candidates.is_empty());
    write(OUTSIDER);
    write(OUTSIDER_BEATS);
    let again = plan_as(host, stores.0, stores.1, stores.2, true);
    for token in ["registry_fingerprint", "candidate_fingerprint"] {
        assert_eq!(
            again[token], plan[token],
            "{token} moved by another host's row"
        );
    }
    let apply = [
        "apply",
        saved_arg,
        "--format",
        "json",
        "--max-retire",
        "1000",
    ];
    let out = run_as(host, &apply, stores);
    assert!(out.status.success(), "{}", common::text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "applied", "{report}");
    assert_eq!(report["read_under_lock"]["scope"], "host_scope", "{report}");
    let mut retired: Vec<String> = report["retired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["worker_identity"].as_str().unwrap().to_string())
        .collect();
    retired.sort();
    let mut expected = candidates.clone();
    expected.sort();
    assert_eq!(retired, expected);
    // The same plan again: every requested worker is retired.
    let out = run_as(host, &apply, stores);
    let replay: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        replay["outcome"],
        "already_retired",
        "{}",
        common::text(&out)
    );
    // Another host may not apply scope-a's plan.
    let out = run_as(HOSTS[1], &apply, stores);
    let elsewhere: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(elsewhere["outcome"], "registry_revision_moved");
    assert!(
        common::text(&out).contains("applies only its own scope"),
        "{}",
        common::text(&out)
    );
}

#[test]
fn a_scoped_apply_on_sqlite_retires_its_plan_whatever_other_hosts_write() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let write = sqlite_exec(&registry);
    a_scoped_apply_retires_its_plan_whatever_other_hosts_write(
        (&registry, &leases, &profiles),
        dir.path(),
        &write,
    );
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_scoped_apply_on_postgres_retires_its_plan_whatever_other_hosts_write() {
    let Some((db, dir, url)) = on_postgres("host_scope_apply") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    let write = |sql: &str| db.client().batch_execute(sql).unwrap();
    a_scoped_apply_retires_its_plan_whatever_other_hosts_write(
        (url, url, &profiles),
        dir.path(),
        &write,
    );
}

/// A scoped read trusts no index it did not make: one missing, one of
/// another shape (other columns; over an expression) is named in the error,
/// with the step that makes it; plan without --scope still runs.
fn an_index_not_ours_stops_the_scoped_plan(stores: (&Path, &Path, &Path), ddl: &dyn Fn(&str)) {
    let cases = [
        (
            "DROP INDEX fleet_retire_scope_pid",
            "fleet_retire_scope_pid is missing",
        ),
        (
            "CREATE INDEX fleet_retire_scope_pid ON worker_registrations (pid, status)",
            "fleet_retire_scope_pid is not ours",
        ),
        (
            "DROP INDEX fleet_retire_scope_session",
            "fleet_retire_scope_session is missing",
        ),
        (
            "CREATE INDEX fleet_retire_scope_session ON worker_registrations (lower(session_id)) \
             WHERE status = 'active'",
            "fleet_retire_scope_session is not ours",
        ),
    ];
    let args = [
        "plan",
        "--format",
        "json",
        "--canonical-repository",
        "prgs/gitea-tools",
    ];
    let scoped = [&args[..], &["--scope", "host"]].concat();
    for (sql, named) in cases {
        ddl(sql);
        let out = run_as(HOSTS[0], &scoped, stores);
        assert_eq!(out.status.code(), Some(1), "{sql}: {}", common::text(&out));
        let text = common::text(&out);
        assert!(text.contains(named), "{sql}: {text}");
        assert!(text.contains("registry versions"), "{sql}: {text}");
        let whole = run_as(HOSTS[0], &args, stores);
        assert!(whole.status.success(), "{}", common::text(&whole));
    }
}

#[test]
fn an_index_not_ours_stops_the_scoped_plan_on_sqlite() {
    if !can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (registry, leases, profiles) = stores(dir.path(), seed());
    let ddl = sqlite_exec(&registry);
    an_index_not_ours_stops_the_scoped_plan((&registry, &leases, &profiles), &ddl);
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn an_index_not_ours_stops_the_scoped_plan_on_postgres() {
    let Some((db, dir, url)) = on_postgres("host_scope_index") else {
        return;
    };
    let (url, profiles) = (Path::new(&url), dir.path().join("profiles.json"));
    // As the tables' owner: only it may make or drop their indexes.
    let owner = db.documented_roles().owner;
    let ddl = |sql: &str| {
        ::postgres::Client::connect(&owner, ::postgres::NoTls)
            .unwrap()
            .batch_execute(sql)
            .unwrap()
    };
    an_index_not_ours_stops_the_scoped_plan((url, url, &profiles), &ddl);
}
