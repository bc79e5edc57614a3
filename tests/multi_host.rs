//! Three hosts on this machine, one PostgreSQL registry: each host is a
//! process tree in its own UTS and pid namespace (`unshare --uts --pid
//! --fork --mount-proc`, a hostname each) whose workers register and
//! heartbeat every second. Workers die on two hosts; each host's controller
//! plans and applies from inside its own namespaces and retires exactly its
//! own dead workers, two controllers applying at the same moment both end
//! cleanly, and no heartbeat fails throughout.
//!
//! Needs root (namespaces) and a PostgreSQL cluster
//! (FLEET_RETIRE_TEST_POSTGRES); without either it says so and passes,
//! except under `CI=true`, where a missing cluster fails.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fleet-retire");
const TTL: &str = "3";

/// One simulated host: `unshare` and, inside, a shell that names the host
/// and starts its workers. Dropping it kills the namespace's init, and with
/// it every process of the host.
struct Host {
    name: String,
    /// Held for its drop: killing `unshare` kills the namespace's init.
    _unshare: KillOnDrop,
    /// The namespace's init, as this (the root) pid namespace numbers it.
    init: u32,
}

/// The shell one worker runs: register (the row's pid is this shell's),
/// then heartbeat every second, noting any failure in `failures`. `$0` is
/// the worker's marker, so the test can find and kill it.
const WORKER: &str = r#"
out=$("$BIN" register --registry "$URL" --namespace "$NS" --ttl "$TTL" \
      --repository-binding prgs/gitea-tools --remote prgs) || { echo "register $0" >> "$FAILURES"; exit 1; }
export GITEA_MCP_WORKER_IDENTITY=$(printf '%s\n' "$out" | sed -n 's/.*"worker_identity": "\(.*\)".*/\1/p')
touch "$READY/$0"
while :; do
  "$BIN" heartbeat --registry "$URL" >/dev/null 2>>"$FAILURES.log" || echo "heartbeat $0 $(date +%T)" >> "$FAILURES"
  sleep 1
done
"#;

impl Host {
    /// Start host `name` with `launches` launches of two workers each
    /// (author and reviewer), launch `i` sharing one instance and session.
    fn start(name: &str, launches: usize, url: &str, dir: &Path) -> Host {
        let failures = dir.join("failures");
        let ready = dir.join("ready");
        std::fs::create_dir_all(&ready).unwrap();
        let mut script = format!("hostname {name}\n");
        for l in 0..launches {
            for ns in ["author", "reviewer"] {
                script.push_str(&format!(
                    "GITEA_MCP_CLIENT=codex GITEA_MCP_CLIENT_INSTANCE=inst-codex-{name}-{l}-0123456789ab \
                     GITEA_MCP_INSTANCE_PROVENANCE=trusted_launcher \
                     GITEA_MCP_CLIENT_SESSION=sess-{name}-{l} GITEA_MCP_GENERATION_ID=gen-{name}-{l} \
                     GITEA_MCP_PROFILE={ns}-prgs NS={ns} sh -c \"$WORKER\" worker-{name}-{l}-{ns} &\n"
                ));
            }
        }
        script.push_str("wait\n");
        let child = Command::new("unshare")
            .args(["--uts", "--pid", "--fork", "--mount-proc", "--kill-child"])
            .args(["sh", "-c", &script])
            .env("BIN", BIN)
            .env("URL", url)
            .env("TTL", TTL)
            .env("WORKER", WORKER)
            .env("FAILURES", &failures)
            .env("READY", &ready)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let unshare = KillOnDrop(child);
        let init = wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.id()))
                .ok()
                .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
        })
        .expect("unshare forks the namespace's init");
        Host {
            name: name.into(),
            _unshare: unshare,
            init,
        }
    }

    /// Run fleet-retire inside this host's namespaces, as its controller.
    fn controller(&self, args: &[&str]) -> std::process::Output {
        Command::new("nsenter")
            .args([
                "-t",
                &self.init.to_string(),
                "--uts",
                "--pid",
                "--mount",
                "--",
            ])
            .arg(BIN)
            .args(args)
            .output()
            .unwrap()
    }
}

fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Kill (SIGKILL) the worker shell whose marker is `marker`, as a crash:
/// the process with that argument whose parent is its host's init (the
/// shell's own short-lived forks, which share its arguments, are its
/// children, not the init's).
fn kill_workers(host: &Host, marker: &str) -> usize {
    let mut killed = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|st| {
                let after = st[st.rfind(')')? + 1..].to_string();
                after.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
        if parent == Some(host.init) && cmdline.split(|b| *b == 0).any(|a| a == marker.as_bytes()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            killed += 1;
        }
    }
    killed
}

/// (identity, host_id, status) of every row.
fn rows(db: &PgDb) -> Vec<(String, String, String, String)> {
    db.client()
        .query(
            "SELECT worker_identity, host_id, status, namespace FROM worker_registrations ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

fn profiles(dir: &Path) -> PathBuf {
    let p = dir.join("profiles.json");
    std::fs::write(
        &p,
        r#"{"profiles": {"controller-prgs": {"role": "controller",
            "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}}"#,
    )
    .unwrap();
    p
}

/// Plan (saving the plan) and apply on `host`; the apply's JSON report.
fn plan_and_apply(host: &Host, url: &str, profiles: &Path, dir: &Path) -> serde_json::Value {
    let plan = dir.join(format!("plan-{}.json", host.name));
    let p = profiles.to_str().unwrap();
    let out = host.controller(&[
        "plan",
        "--registry",
        url,
        "--leases",
        url,
        "--canonical-repository",
        "prgs/gitea-tools",
        "--profiles",
        p,
        "--profile",
        "controller-prgs",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "plan on {}: {}",
        host.name,
        text(&out)
    );
    // The fleet's live workers heartbeat between the plan and the apply.
    std::thread::sleep(Duration::from_millis(2100));
    apply(host, url, p, &plan)
}

fn apply(host: &Host, url: &str, profiles: &str, plan: &Path) -> serde_json::Value {
    let out = host.controller(&[
        "--format",
        "json",
        "apply",
        "--registry",
        url,
        "--leases",
        url,
        "--profiles",
        profiles,
        "--profile",
        "controller-prgs",
        plan.to_str().unwrap(),
    ]);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("apply on {} printed no JSON: {}", host.name, text(&out)))
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn three_hosts_one_postgres_registry_each_host_retires_only_its_own_dead() {
    if !can_make_hosts() {
        return;
    }
    let Some(db) = postgres("hosts") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // As docs/multi-host.md sets it up: the owner makes the tables and the
    // change record, the workers and the controllers own nothing.
    let roles = db.documented_roles();
    let mut owner = ::postgres::Client::connect(&roles.owner, ::postgres::NoTls).unwrap();
    fleet_retire::store::postgres::create_or_migrate_registry(&mut owner, "test").unwrap();
    fleet_retire::store::postgres::create_leases(&mut owner, "test").unwrap();
    assert!(fleet_retire::store::open::install_versions(Path::new(&roles.owner)).unwrap());
    db.grant_documented(&roles);
    let db = AsRoles { db, roles };
    let profiles = profiles(dir.path());
    let hosts = start_hosts(&db, dir.path());

    // Crashes: host A's launch 1 (both workers) and host B's launch 1.
    kill_launch(&hosts[0], 1);
    kill_launch(&hosts[1], 1);
    // Past the TTL, with the survivors heartbeating all along.
    std::thread::sleep(Duration::from_secs(5));
    host_retires_only_its_own_dead(&hosts[0], &db, &profiles, dir.path());
    snapshot_sees_every_host(&hosts[2], &db, &profiles);

    // A second crash on A (a whole launch: a dead worker sharing its
    // session with a live one is kept); then A and B apply at the same moment.
    kill_launch(&hosts[0], 2);
    std::thread::sleep(Duration::from_secs(5));
    two_hosts_apply_at_once(&hosts[..2], &db, &profiles, dir.path());
    assert_no_heartbeat_failed(&hosts, dir.path());
    drop(hosts);
}

/// The test's database and the documented roles' URLs of it: workers
/// connect as `fleet_workers`, the controllers as `fleet_apply`.
struct AsRoles {
    db: PgDb,
    roles: common::roles::Roles,
}

impl std::ops::Deref for AsRoles {
    type Target = PgDb;
    fn deref(&self) -> &PgDb {
        &self.db
    }
}

/// Whether this machine can simulate hosts (root, and `unshare`); when it
/// cannot, say so (a failure under `CI=true`).
fn can_make_hosts() -> bool {
    if !nix::unistd::geteuid().is_root()
        || Command::new("unshare").arg("--version").output().is_err()
    {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root with unshare"
        );
        eprintln!("skipped: the multi-host test needs root and unshare");
        return false;
    }
    true
}

/// Start hosts A, B and C (three, two and one launches) and wait until
/// every worker has registered as its host and is heartbeating.
fn start_hosts(db: &AsRoles, dir: &Path) -> Vec<Host> {
    let hosts: Vec<Host> = [("host-a", 3), ("host-b", 2), ("host-c", 1)]
        .iter()
        .map(|(name, launches)| {
            let d = dir.join(name);
            Host::start(name, *launches, &db.roles.workers, &d)
        })
        .collect();
    let all = 2 * (3 + 2 + 1);
    let registered = wait_for(Duration::from_secs(30), || {
        let n = rows(db).len();
        (n == all).then_some(n)
    });
    assert_eq!(registered, Some(all), "rows: {:?}", rows(db));
    // Every worker is past its registration (its identity exported) and
    // heartbeating.
    let ready = wait_for(Duration::from_secs(30), || {
        let n: usize = hosts
            .iter()
            .map(|h| std::fs::read_dir(dir.join(&h.name).join("ready")).map_or(0, |d| d.count()))
            .sum();
        (n == all).then_some(n)
    });
    assert_eq!(ready, Some(all));
    for (name, _, _) in [("host-a", 0, 0), ("host-b", 0, 0), ("host-c", 0, 0)] {
        let n = rows(db).iter().filter(|r| r.1 == name).count();
        assert!(n > 0, "{name} registered as itself");
    }
    hosts
}

/// Kill both workers (author and reviewer) of one launch of `host`.
fn kill_launch(host: &Host, launch: usize) {
    let marker = |ns: &str| format!("worker-{}-{launch}-{ns}", host.name);
    assert_eq!(
        kill_workers(host, &marker("author")) + kill_workers(host, &marker("reviewer")),
        2
    );
}

/// Host A plans and applies: it retires exactly its own two dead workers,
/// audits them as itself, and the other hosts' heartbeats between plan
/// and apply do not stop it.
fn host_retires_only_its_own_dead(host: &Host, db: &AsRoles, profiles: &Path, dir: &Path) {
    let report = plan_and_apply(host, &db.roles.apply, profiles, dir);
    assert_eq!(report["outcome"], "applied", "{report}");
    let retired: Vec<String> = report["retired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["worker_identity"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(retired.len(), 2, "{report}");
    let state = rows(db);
    for (id, host, status, _) in &state {
        let expected = if retired.contains(id) {
            "retired"
        } else {
            "active"
        };
        assert_eq!(status, expected, "{id} on {host}");
        if retired.contains(id) {
            assert_eq!(host, "host-a");
        }
    }
    let audit_hosts: Vec<String> = db
        .client()
        .query("SELECT host_id FROM retirement_audit", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(audit_hosts, vec!["host-a".to_string(); 2]);
    // The live workers of all three hosts heartbeat between plan and
    // apply; that did not stop it (8 live rows after the crashes).
    assert!(
        report["heartbeats_tolerated"].as_u64().unwrap() >= 1,
        "{report}"
    );
    let blockers = report["post_apply"]["residual_blockers"].to_string();
    assert!(!blockers.contains("pid_collision"), "{blockers}");
}

/// A fleet-wide snapshot from host C: every host's live workers are live
/// (by their heartbeats), and pids alike across namespaces collide with
/// nothing.
fn snapshot_sees_every_host(host: &Host, db: &AsRoles, profiles: &Path) {
    let out = host.controller(&[
        "--format",
        "json",
        "snapshot",
        "--registry",
        &db.roles.apply,
        "--profiles",
        profiles.to_str().unwrap(),
        "--profile",
        "controller-prgs",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(snap["live_worker_count"], 8, "{}", snap["findings"]);
    assert_eq!(snap["other_host_worker_count"], 2 * (3 + 2));
    assert_eq!(snap["stale_worker_count"], 2, "host B's dead launch");
    let findings = snap["findings"].to_string();
    assert!(!findings.contains("pid_collision"), "{findings}");
}

/// Hosts A and B plan and apply at the same moment, each retrying up to
/// three times: each ends applied (a refusal only for a moved registry),
/// and between them the dead of both are retired and nothing of host C.
fn two_hosts_apply_at_once(hosts: &[Host], db: &AsRoles, profiles: &Path, dir: &Path) {
    let outcomes: Vec<(String, serde_json::Value)> = std::thread::scope(|s| {
        let runs: Vec<_> = hosts
            .iter()
            .map(|h| {
                let url = &db.roles.apply;
                s.spawn(move || {
                    let mut tries = Vec::new();
                    for _ in 0..3 {
                        let r = plan_and_apply(h, url, profiles, dir);
                        let done = r["outcome"] == "applied";
                        tries.push(r);
                        if done {
                            break;
                        }
                    }
                    (h.name.clone(), serde_json::Value::Array(tries))
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (host, tries) in &outcomes {
        let tries = tries.as_array().unwrap();
        let last = tries.last().unwrap();
        assert_eq!(last["outcome"], "applied", "{host}: {tries:?}");
        for refused in &tries[..tries.len() - 1] {
            assert_eq!(
                refused["outcome"], "registry_revision_moved",
                "{host}: {refused}"
            );
            assert_eq!(refused["retired_count"], 0);
        }
    }
    let state = rows(db);
    let retired: Vec<&(String, String, String, String)> =
        state.iter().filter(|r| r.2 == "retired").collect();
    assert_eq!(retired.len(), 6, "{state:?}");
    assert_eq!(retired.iter().filter(|r| r.1 == "host-a").count(), 4);
    assert_eq!(retired.iter().filter(|r| r.1 == "host-b").count(), 2);
    assert!(state
        .iter()
        .filter(|r| r.1 == "host-c")
        .all(|r| r.2 == "active"));
}

/// No heartbeat failed on any host throughout.
fn assert_no_heartbeat_failed(hosts: &[Host], dir: &Path) {
    for h in hosts {
        let failures = dir.join(&h.name).join("failures");
        let log = std::fs::read_to_string(failures.with_extension("log")).unwrap_or_default();
        assert!(
            !failures.exists(),
            "{}: {}\n{log}",
            h.name,
            std::fs::read_to_string(&failures).unwrap()
        );
    }
}
