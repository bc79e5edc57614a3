//! `plan --scope host` at a fleet's size (issue 54): a registry of 100,000
//! rows written by 100 hosts, where every host's scoped plan is the plan of
//! the whole registry restricted to that host's active rows, entry by entry
//! (verdict, every reason code, the evidence shown), with the count of its
//! other rows. On PostgreSQL and on SQLite.
//!
//! Each host plans in a thread of its own that first leaves the test's UTS
//! namespace (`unshare(CLONE_NEWUTS)`) and names it (`sethostname`), so the
//! program reads the host's identity from the kernel (`uname`), as
//! `tests/host_scope.rs` does with `unshare --uts` for whole processes: no
//! flag or variable names a host. The whole registry is read once per
//! store; each host judges it whole (as `plan` on that host does) and reads
//! and judges its own scope (`plan_scope_from_files`, what `plan --scope
//! host` runs).
//!
//! Two hundred plans of 100,000 rows take minutes in a debug build, so a
//! debug build passes these tests over and `.ci/run` runs them optimised
//! (`cargo test --release --test host_scope_fleet`), after its release
//! build.
//!
//! The rows have a long-running fleet's shape (as
//! `/work/shared/bench/gen_registry.py` makes them, for many hosts):
//! launches of five namespace workers, each restarted several times, so
//! most rows are historical; among the latest, stale (mostly eligible),
//! live and preserved ones (legacy or missing instance ids, an earlier
//! boot, blank fencing columns, a foreign repository, lease owners). Keys
//! are shared across hosts as a real fleet shares them: pids collide, some
//! sessions, generations and instance ids are reused by another host's
//! launch, and a few rows name a host with spaces, in capitals, or none.

mod common;

use fleet_retire::evidence::leases::Lease;
use fleet_retire::observe::RunFacts;
use fleet_retire::plan::Plan;
use fleet_retire::policy::{Policies, PolicySource};
use fleet_retire::row::{Col, Row};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const HOSTS: usize = 100;
const ROWS: usize = 100_000;
const CANON: &str = "prgs/gitea-tools";
const NAMESPACES: [&str; 5] = ["author", "reviewer", "merger", "controller", "reconciler"];
const CLIENTS: [&str; 5] = ["codex", "claude_code", "gemini", "grok", "cursor"];

fn host(h: usize) -> String {
    format!("fleet-{h:03}")
}

/// A small generator, so a failure names the seed that made its registry.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// Below `n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `percent` / 100.
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Clone>(&mut self, of: &[T]) -> T {
        of[self.below(of.len())].clone()
    }
}

/// One launch: a client's instance with a session, on a host.
struct Launch {
    host: Value,
    client: &'static str,
    instance: String,
    session: String,
}

/// The fleet's rows, and the sessions the active leases hold.
fn fleet(seed: u64) -> (Vec<Value>, Vec<String>) {
    let (_, boot) = common::host_and_boot();
    let live = (
        i64::from(std::process::id()),
        common::start_time(std::process::id()),
    );
    let mut g = Lcg(seed);
    let mut rows = Vec::with_capacity(ROWS);
    let mut launches: Vec<Launch> = Vec::new();
    let mut leased = Vec::new();
    while rows.len() < ROWS {
        let launch = next_launch(&mut g, &launches);
        if g.chance(3) {
            leased.push(launch.session.clone());
        }
        for ns in NAMESPACES {
            let restarts = 1 + g.below(7);
            for restart in 0..restarts {
                let latest = restart + 1 == restarts;
                let row = worker_row(&mut g, &launch, ns, latest, (&boot, &live));
                let n = rows.len();
                rows.push(row);
                rows[n]["worker_identity"] = json!(format!("w-{n:06}"));
                rows[n]["generation_id"] = json!(if g.chance(2) && n > 0 {
                    // A generation another launch's worker had.
                    rows[g.below(n)]["generation_id"].clone()
                } else {
                    json!(format!("g-{}-{ns}-{restart}", launches.len()))
                });
            }
        }
        launches.push(launch);
    }
    rows.truncate(ROWS);
    (rows, leased)
}

/// The next launch: mostly a host's own instance and session; some reuse
/// another launch's (any host's), as a copied environment does.
fn next_launch(g: &mut Lcg, earlier: &[Launch]) -> Launch {
    let n = earlier.len();
    let h = g.below(HOSTS);
    let host = match g.below(200) {
        0 => Value::Null,
        1 => json!(format!(" {}", host(h))),
        2 => json!(host(h).to_uppercase()),
        _ => json!(host(h)),
    };
    let client = g.pick(&CLIENTS);
    let instance = match g.below(100) {
        0..=4 => format!("proc-{}", 2_000_000_000 + g.below(20_000)),
        5..=7 => String::new(),
        8 | 9 if n > 0 => earlier[g.below(n)].instance.clone(),
        _ => format!("inst-{client}-20260730T100000Z-{:012x}", n * 7919 + 1),
    };
    let session = if g.chance(3) && n > 0 {
        earlier[g.below(n)].session.clone()
    } else {
        format!("s-{n}")
    };
    Launch {
        host,
        client,
        instance,
        session,
    }
}

/// One registration of `launch`'s worker in `ns`: historical unless it is
/// the latest restart, and then of one of the kinds a fleet holds.
fn worker_row(
    g: &mut Lcg,
    launch: &Launch,
    ns: &str,
    latest: bool,
    (boot, live): (&str, &(i64, String)),
) -> Value {
    // Pids above any pid_max, so no process holds one; few enough that
    // hosts share them, as machines do.
    let dead = 2_000_000_000 + g.below(20_000) as i64;
    let mut row = json!({
        "client_name": launch.client,
        "client_instance_id": launch.instance,
        "instance_id_source": "launcher",
        "session_id": launch.session,
        "process_identity": match g.below(10) {
            0..=4 => Value::Null,
            5 => json!(format!("pid-{}", 2_000_000_000 + g.below(20_000))),
            _ => json!(format!("proc-{}", g.next())),
        },
        "role": "author", "profile": format!("{ns}-prgs"), "namespace": ns,
        "remote": "prgs", "repository_binding": CANON,
        "pid": dead,
        "started_at": "2026-01-01T00:00:00Z",
        "last_heartbeat_at": "2026-01-01T00:10:00Z",
        "heartbeat_ttl_seconds": 900.0,
        "fencing_epoch": 1,
        "status": "active",
        "host_id": launch.host, "boot_id": boot, "process_start_time": "ticks-5",
    });
    if !latest {
        row["status"] = json!(g.pick(&[
            "retired",
            "retired",
            "released",
            "superseded",
            " active",
            "ACTIVE"
        ]));
        return row;
    }
    match g.below(20) {
        0 | 1 => row["status"] = json!("released"),
        2..=4 => {
            row["pid"] = json!(live.0);
            row["process_start_time"] = json!(live.1);
            row["last_heartbeat_at"] = json!("2126-01-01T00:10:00Z");
        }
        5 => row["last_heartbeat_at"] = json!("2126-01-01T00:10:00Z"),
        6 => row["boot_id"] = json!("0b000001-0000-4000-8000-000000000001"),
        7 => row["process_start_time"] = Value::Null,
        8 => row["repository_binding"] = json!("other/repository"),
        _ => {}
    }
    row
}

/// The SQLite registry and lease store of the fleet, with the scope's
/// indexes made by the operator's step (`registry versions`).
fn write_stores(dir: &Path, seed: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    let (rows, leased) = fleet(seed);
    let registry = dir.join("registry.sqlite");
    common::registry_with_columns(&registry, None, &[]);
    let mut conn = rusqlite::Connection::open(&registry).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let names: Vec<&str> = common::COLUMNS.iter().map(|(n, _)| *n).collect();
        let marks: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
        let mut insert = tx
            .prepare(&format!(
                "INSERT INTO worker_registrations ({}) VALUES ({})",
                names.join(", "),
                marks.join(", ")
            ))
            .unwrap();
        for row in &rows {
            let values = names
                .iter()
                .map(|n| common::sql_value(row.get(*n).unwrap_or(&Value::Null)));
            insert.execute(rusqlite::params_from_iter(values)).unwrap();
        }
    }
    tx.commit().unwrap();
    let out = common::run(&[
        "registry",
        "versions",
        "--registry",
        registry.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::text(&out));
    let leases = dir.join("leases.sqlite");
    let leases_rows: Vec<Value> = leased
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"lease_id": format!("l-{i}"), "status": "active", "session_id": s}))
        .collect();
    common::leases(&leases, &leases_rows);
    (registry, leases)
}

/// Run `f` as host `name`: in this thread's own UTS namespace, named so.
fn as_host<T>(name: &str, f: impl FnOnce() -> T) -> T {
    // SAFETY: unshare(2) with CLONE_NEWUTS moves only the calling thread
    // into a new UTS namespace; no memory is passed.
    let rc = unsafe { nix::libc::unshare(nix::libc::CLONE_NEWUTS) };
    assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
    // SAFETY: the pointer and length are those of `name`'s bytes, which
    // outlive the call.
    let rc = unsafe { nix::libc::sethostname(name.as_ptr().cast(), name.len()) };
    assert_eq!(rc, 0, "sethostname: {}", std::io::Error::last_os_error());
    let read = nix::sys::utsname::uname().unwrap();
    assert_eq!(read.nodename().to_str(), Some(name));
    f()
}

/// Each of `plan`'s entries for which `keep` holds of its row, as its
/// document shows it (but the heartbeat's age at the plan's clock), by
/// worker identity.
fn entries(plan: &Plan, keep: impl Fn(&Row) -> bool) -> BTreeMap<String, Value> {
    plan.entries
        .iter()
        .filter(|e| keep(&plan.rows[e.index]))
        .map(|e| {
            let mut doc = serde_json::to_value(plan.entry_json(e)).unwrap();
            // The one member that is the planning clock's, not the row's.
            doc["evidence"]["heartbeat_age_seconds"].take();
            (plan.identity(e), doc)
        })
        .collect()
}

fn is_text(row: &Row, col: Col, text: &str) -> bool {
    matches!(row.get(col), fleet_retire::value::Val::Text(t) if t == text)
}

/// What one host's comparison found, for the fleet-wide checks.
#[derive(Default)]
struct Seen {
    own: usize,
    peers: usize,
    candidates: usize,
    reasons: BTreeSet<String>,
}

/// Host `name` plans the whole registry (`rows`, `leases`) and its own
/// scope at `store`; the scoped plan must be the whole plan restricted.
fn compare_one(
    name: &str,
    (store, lease_store): (&Path, &Path),
    (whole_rows, leases): (&[Row], &[Lease]),
    policies: &Policies,
) -> Seen {
    let proc_root = Path::new("/proc");
    let probe = fleet_retire::evidence::probe::SystemProbe::new(proc_root);
    let facts = RunFacts::of_this_host(proc_root, Some(CANON.into()), leases);
    let whole = fleet_retire::plan::plan(whole_rows.to_vec(), facts, &probe, policies).unwrap();
    let scoped = fleet_retire::plan::scoped::plan_scope_from_files(
        store,
        lease_store,
        proc_root,
        CANON.into(),
        policies,
    )
    .unwrap_or_else(|e| panic!("host {name}: {e}"));
    let expected = entries(&whole, |r| {
        is_text(r, Col::HostId, name) && is_text(r, Col::Status, "active")
    });
    let terminal = whole
        .rows
        .iter()
        .filter(|r| is_text(r, Col::HostId, name) && !is_text(r, Col::Status, "active"))
        .count();
    let got = entries(&scoped, |_| true);
    let differ: Vec<_> = got
        .keys()
        .chain(expected.keys())
        .filter(|k| got.get(*k) != expected.get(*k))
        .take(3)
        .map(|k| (k, got.get(k), expected.get(k)))
        .collect();
    assert!(
        differ.is_empty(),
        "host {name}, {}: {differ:?}",
        store.display()
    );
    let head = scoped.scope.as_ref().unwrap();
    assert_eq!(head.host_id, name);
    assert_eq!(head.terminal_rows as usize, terminal, "host {name}");
    assert!(scoped.registry_fingerprint.starts_with("host-scope:"));
    assert!(scoped.candidate_fingerprint.starts_with("host-scope:"));
    assert!(
        head.own_rows + head.peer_rows < ROWS / 10,
        "host {name} read {} rows",
        head.own_rows + head.peer_rows
    );
    Seen {
        own: head.own_rows,
        peers: head.peer_rows,
        candidates: scoped.candidates().count(),
        reasons: got
            .values()
            .flat_map(|e| e["reason_codes"].as_array().cloned().unwrap_or_default())
            .map(|c| c.as_str().unwrap().to_string())
            .collect(),
    }
}

/// Every host compares its scoped plan with the whole plan of `store`,
/// two hosts at a time (this machine's two cores); then the fleet-wide
/// checks: the comparisons had candidates, peers on other hosts, and
/// verdicts resting on every kind of peer fact.
fn every_host_compares(store: &Path, lease_store: &Path, seed: u64) {
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let rows = fleet_retire::evidence::registry::load(store).unwrap();
    let leases = fleet_retire::evidence::leases::load(lease_store).unwrap();
    assert_eq!(rows.len(), ROWS);
    let started = std::time::Instant::now();
    let seen: Vec<Seen> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let (rows, leases, policies) = (&rows, &leases, &policies);
                s.spawn(move || {
                    (t..HOSTS)
                        .step_by(2)
                        .map(|h| {
                            let name = host(h);
                            as_host(&name, || {
                                compare_one(&name, (store, lease_store), (rows, leases), policies)
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    eprintln!(
        "{} hosts compared on {} in {:.1} s",
        seen.len(),
        store.display(),
        started.elapsed().as_secs_f64()
    );
    let own: usize = seen.iter().map(|s| s.own).sum();
    let candidates: usize = seen.iter().map(|s| s.candidates).sum();
    let reasons: BTreeSet<String> = seen.iter().flat_map(|s| s.reasons.clone()).collect();
    assert!(own > ROWS / 10, "seed {seed}: {own} own rows in all");
    assert!(
        candidates > HOSTS * 2,
        "seed {seed}: {candidates} candidates"
    );
    assert!(
        seen.iter().filter(|s| s.peers > 0).count() > HOSTS * 9 / 10,
        "seed {seed}: most hosts' verdicts rest on peer rows"
    );
    for code in [
        "conflicting_identity_evidence",
        "client_instance_conflict",
        "protected_active_workflow_owner",
        "worker_live",
        "repository_binding_ambiguous",
    ] {
        assert!(reasons.contains(code), "seed {seed}: {code} in {reasons:?}");
    }
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "200 plans of 100,000 rows: .ci/run runs it optimised (cargo test --release)"
)]
#[cfg_attr(
    all(not(debug_assertions), not(fr_postgres)),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_hundred_hosts_each_plan_their_scope_as_the_whole_plan_does_on_postgres() {
    if !common::hosts::can_make_hosts() {
        return;
    }
    let Some(db) = common::postgres("host_scope_fleet") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let seed = common::hosts::seed();
    let (registry, leases) = write_stores(dir.path(), seed);
    let roles = db.documented_roles();
    fleet_retire::copy::copy(&registry, Some(&leases), &roles.owner).unwrap();
    db.grant_documented(&roles);
    let url = Path::new(&roles.apply);
    every_host_compares(url, url, seed);
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "200 plans of 100,000 rows: .ci/run runs it optimised (cargo test --release)"
)]
fn a_hundred_hosts_each_plan_their_scope_as_the_whole_plan_does_on_sqlite() {
    if !common::hosts::can_make_hosts() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let seed = common::hosts::seed();
    let (registry, leases) = write_stores(dir.path(), seed);
    every_host_compares(&registry, &leases, seed);
}
