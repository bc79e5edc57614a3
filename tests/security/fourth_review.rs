//! The fourth security review (issue 50): the change record handed the
//! owner's rights to whoever could reach its stamp, `registry copy` and
//! `registry versions` adopted tables others made, leases were read on a
//! standby, and the documented apply role could not apply. Each test
//! performs the attack as the documented roles (docs/multi-host.md, "The
//! roles, and exactly their grants"); docs/security.md lists them.

use super::{apply_cli, save_plan};
use crate::common::*;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;

/// A connection to `db` as `role` (trust authentication in the test cluster).
fn as_role(db: &PgDb, role: &str) -> ::postgres::Client {
    ::postgres::Client::connect(&db.url_as(role), ::postgres::NoTls).unwrap()
}

fn superuser(db: &PgDb, role: &str) -> bool {
    db.client()
        .query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&role])
        .unwrap()
        .get(0)
}

fn lease_count(db: &PgDb) -> i64 {
    db.client()
        .query_one("SELECT count(*) FROM workflow_leases", &[])
        .unwrap()
        .get(0)
}

fn candidates(stores: &Stores) -> serde_json::Value {
    let (_, plan) = save_plan(stores, &[]);
    plan["candidate_worker_identities"].clone()
}

/// A worker's own enum with a cast to `json` whose function, run with the
/// owner's rights, would delete every lease (and, were the owner a
/// superuser, make the worker one). The stamp must never run it.
const HOSTILE_CAST: &str = "\
    CREATE TYPE pg_temp.fr_evil AS ENUM ('w-dead-1'); \
    CREATE FUNCTION pg_temp.fr_evil_json(pg_temp.fr_evil) RETURNS json LANGUAGE plpgsql AS \
      $$ BEGIN DELETE FROM public.workflow_leases; \
         BEGIN EXECUTE 'ALTER ROLE fleet_workers SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END; \
         RETURN '\"w-dead-1\"'; END $$; \
    CREATE CAST (pg_temp.fr_evil AS json) WITH FUNCTION pg_temp.fr_evil_json(pg_temp.fr_evil); \
    CREATE TEMP TABLE fr_mine (worker_identity pg_temp.fr_evil);";

// Finding 1: where the owner's grants (here `GRANT EXECUTE ON ALL
// FUNCTIONS`) reach the workers, a worker attaches the stamp to a table
// of its own whose column is its own type with a cast to json. The stamp
// refuses any table but ours, reads only the key column, and runs with the
// writer's rights; the lease stays, the leased worker is kept, and a record
// whose functions others may execute vouches for nothing.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_worker_cannot_run_its_code_as_the_owner_through_the_stamp() {
    let Some((stores, live, db)) = pg_fleet("r4_stamp") else {
        return;
    };
    db.client()
        .batch_execute(
            "INSERT INTO workflow_leases (lease_id, status, owner_worker_identity) \
             VALUES ('L-held', 'active', 'w-dead-1')",
        )
        .unwrap();
    as_role(&db, "fleet_owner")
        .batch_execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO fleet_workers")
        .unwrap();
    let mut worker = as_role(&db, "fleet_workers");
    worker.batch_execute(HOSTILE_CAST).unwrap();
    for args in ["'i', 'worker_identity'", ""] {
        worker
            .batch_execute(&format!(
                "CREATE OR REPLACE TRIGGER fr_attach AFTER INSERT ON fr_mine FOR EACH ROW \
                 EXECUTE FUNCTION public.fleet_retire_stamp({args})"
            ))
            .unwrap();
        let refused = worker
            .batch_execute("INSERT INTO fr_mine VALUES ('w-dead-1')")
            .unwrap_err();
        assert!(
            refused.to_string().contains("fleet-retire")
                || format!("{refused:?}").contains("own tables only"),
            "{refused:?}"
        );
    }
    assert!(!superuser(&db, "fleet_workers"));
    assert_eq!(lease_count(&db), 1, "the worker deleted a lease");
    assert_eq!(candidates(&stores), json!(["w-dead-2", "w-dead-3"]));
    // The grant itself makes the record vouch for nothing.
    let why = fleet_retire::store::postgres::versions::vouches(&mut db.client(), "t")
        .unwrap()
        .expect("a record whose functions others may execute vouches");
    assert!(why.contains("execute"), "{why}");
    drop(live);
}

// Finding 1, the same attack on the guard: it refuses any table but the
// record.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn the_record_guard_refuses_any_table_but_the_record() {
    let Some((_stores, live, db)) = pg_fleet("r4_guard") else {
        return;
    };
    as_role(&db, "fleet_owner")
        .batch_execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO fleet_workers")
        .unwrap();
    let mut worker = as_role(&db, "fleet_workers");
    worker
        .batch_execute(
            "CREATE TEMP TABLE fr_keys (key text, xid xid8); \
             CREATE TRIGGER fr_g BEFORE INSERT ON fr_keys FOR EACH ROW \
             EXECUTE FUNCTION public.fleet_retire_changes_guard()",
        )
        .unwrap();
    let refused = worker
        .batch_execute("INSERT INTO fr_keys VALUES ('k', '1')")
        .unwrap_err();
    assert!(
        format!("{refused:?}").contains("own tables only"),
        "{refused:?}"
    );
    drop(live);
}

/// `fleet-retire registry ARGS…`.
fn registry(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .arg("registry")
        .args(args)
        .output()
        .unwrap()
}

fn tables_owned_by(db: &PgDb) -> Vec<(String, String)> {
    db.client()
        .query(
            "SELECT relname::text, relowner::regrole::text FROM pg_class \
             WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

// Finding 2: where the workers may create tables in the schema (the
// default on `public` up to PostgreSQL 14, or a grant), a worker makes an
// empty `worker_registrations` first; `registry copy` as the owner refuses
// it, naming the table and its owner, and writes nothing.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn registry_copy_never_adopts_a_table_a_worker_made() {
    let Some(db) = postgres("r4_copy") else {
        return;
    };
    let roles = db.documented_roles();
    db.client()
        .batch_execute("GRANT CREATE ON SCHEMA public TO fleet_workers")
        .unwrap();
    as_role(&db, "fleet_workers")
        .batch_execute("CREATE TABLE worker_registrations (worker_identity text)")
        .unwrap();
    let (stores, live) = fleet();
    let before = tables_owned_by(&db);
    // As the owner, and as a superuser (who could alter the worker's table).
    for to in [&roles.owner, &db.url] {
        let out = registry(&[
            "copy",
            "--from",
            stores.registry.to_str().unwrap(),
            "--leases",
            stores.leases.to_str().unwrap(),
            "--to",
            to,
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let said = text(&out);
        assert!(
            said.contains("table worker_registrations is owned by fleet_workers")
                && said.contains("never adopts"),
            "{said}"
        );
        assert_eq!(tables_owned_by(&db), before, "the refused copy wrote");
    }
    drop(live);
}

// Finding 3: `registry versions` by a superuser on tables another role
// owns would put the superuser's functions on them. It refuses, naming
// the owner; as the owner it installs.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn registry_versions_refuses_tables_the_connected_role_does_not_own() {
    let Some((_stores, live, db)) = pg_fleet("r4_versions") else {
        return;
    };
    as_role(&db, "fleet_owner")
        .batch_execute("DROP TABLE fleet_retire_changes CASCADE; DROP FUNCTION fleet_retire_stamp() CASCADE; DROP FUNCTION fleet_retire_changes_guard() CASCADE")
        .unwrap();
    let out = registry(&["versions", "--registry", &db.url]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("table worker_registrations is owned by fleet_owner"),
        "{}",
        text(&out)
    );
    assert!(!tables_owned_by(&db)
        .iter()
        .any(|(t, _)| t == "fleet_retire_changes"));
    let out = registry(&["versions", "--registry", &db.url_as("fleet_owner")]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        fleet_retire::store::postgres::versions::vouches(&mut db.client(), "t")
            .unwrap()
            .is_none()
    );
    // A table of ours given to another role: the record vouches no more.
    db.client()
        .batch_execute("ALTER TABLE retirement_audit OWNER TO fleet_workers")
        .unwrap();
    let why = fleet_retire::store::postgres::versions::vouches(&mut db.client(), "t").unwrap();
    assert!(why.is_some_and(|w| w.contains("owned by another role")));
    drop(live);
}

// Finding 5: the apply role the docs prescribe applies on a registry with
// the change record, judged outside its transaction, and answers
// `apply-status`; without the record (the owner dropped it) it reads the
// whole registry and applies too.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn the_documented_apply_role_applies_with_and_without_the_record() {
    for with_record in [true, false] {
        let Some((stores, live, db)) = pg_fleet(&format!("r4_apply_{with_record}")) else {
            return;
        };
        assert!(stores.registry.to_str().unwrap().contains("fleet_apply@"));
        if !with_record {
            as_role(&db, "fleet_owner")
                .batch_execute("DROP TABLE fleet_retire_changes CASCADE; DROP FUNCTION fleet_retire_stamp() CASCADE; DROP FUNCTION fleet_retire_changes_guard() CASCADE")
                .unwrap();
        }
        let (plan, _) = save_plan(&stores, &[]);
        let (code, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
        assert_eq!(code, Some(0), "{report}");
        assert_eq!(report["outcome"], "applied", "{report}");
        let scope = &report["read_under_lock"]["scope"];
        assert_eq!(scope == "whole_registry", !with_record, "{report}");
        let id = report["apply_id"].as_str().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
            .args([
                "apply-status",
                id,
                "--registry",
                stores.registry.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("COMMITTED"), "{}", text(&out));
        drop(live);
    }
}

// The workers' role registers and heartbeats through the stamp, with the
// documented grants only.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn the_documented_workers_role_registers_and_heartbeats() {
    let Some((mut stores, live, db)) = pg_fleet("r4_workers") else {
        return;
    };
    stores.registry = PathBuf::from(db.url_as("fleet_workers"));
    let registry = stores.registry.to_str().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .args([
            "register",
            "--registry",
            &registry,
            "--namespace",
            "author",
            "--ttl",
            "60",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let row: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = row["worker_identity"].as_str().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .args(["heartbeat", "--registry", &registry])
        .env("GITEA_MCP_WORKER_IDENTITY", &id)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stamped: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM fleet_retire_changes WHERE key = 'i:' || $1",
            &[&id],
        )
        .unwrap()
        .get(0);
    assert_eq!(stamped, 1);
    drop(live);
}

/// A hot standby of the test cluster, streaming from it (`pg_basebackup
/// -R`), on a port of its own; stopped on drop.
struct Standby {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    port: u16,
}

/// `program` of the server's bin folder, as the `postgres` user when run
/// as root (the server refuses to run as root).
fn pg_tool(bindir: &std::path::Path, program: &str) -> Command {
    let exe = bindir.join(program);
    if nix::unistd::getuid().is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(exe);
        c
    } else {
        Command::new(exe)
    }
}

impl Standby {
    fn start(primary: &PgDb) -> Standby {
        let bindir = std::fs::read_dir("/usr/lib/postgresql")
            .unwrap()
            .map(|e| e.unwrap().path().join("bin"))
            .find(|p| p.join("pg_basebackup").exists())
            .expect("PostgreSQL's server tools are installed");
        let dir = tempfile::tempdir().unwrap();
        if nix::unistd::getuid().is_root() {
            let status = Command::new("chown")
                .args(["postgres:"])
                .arg(dir.path())
                .status();
            assert!(status.unwrap().success());
        }
        let (host, port) = primary
            .host_port()
            .rsplit_once(':')
            .map(|(h, p)| (h.to_string(), p.to_string()))
            .unwrap();
        let data = dir.path().join("data");
        let out = pg_tool(&bindir, "pg_basebackup")
            .arg("-d")
            .arg(format!("host={host} port={port} user=fleet"))
            .arg("-D")
            .arg(&data)
            .args(["-R", "-X", "stream", "--checkpoint=fast"])
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_basebackup: {}", text(&out));
        // A hot standby needs at least the primary's connection slots.
        let slots: String = primary
            .client()
            .query_one("SHOW max_connections", &[])
            .unwrap()
            .get(0);
        let standby = Standby {
            port: free_port(),
            bindir,
            dir,
        };
        let out = pg_tool(&standby.bindir, "pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(standby.dir.path().join("log"))
            .arg("-w")
            .arg("-o")
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c hot_standby=on -c max_connections={slots}",
                standby.port,
                standby.dir.path().display()
            ))
            .arg("start")
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl start: {}", text(&out));
        standby
    }

    /// `url` (of the primary) pointed at this standby.
    fn url(&self, url: &str) -> String {
        let (user, rest) = url.split_once('@').unwrap();
        let db = rest.split_once('/').unwrap().1;
        format!("{user}@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let _ = pg_tool(&self.bindir, "pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

// Finding 4: a lease store on a hot standby whose replay lags does not
// have a lease just taken on the primary. Plan through it listed the
// leased worker and apply retired it. Every read of a PostgreSQL lease
// store now refuses a server in recovery, naming it.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn leases_are_never_read_on_a_standby() {
    let Some((mut stores, live, db)) = pg_fleet("r4_standby") else {
        return;
    };
    let (plan, body) = save_plan(&stores, &[]);
    assert_eq!(body["candidate_worker_identities"][0], "w-dead-1");
    let standby = Standby::start(&db);
    let primary_leases = stores.leases.clone();
    let on_standby = standby.url(stores.leases.to_str().unwrap());
    let mut replica =
        ::postgres::Client::connect(&standby.url(&db.url), ::postgres::NoTls).unwrap();
    replica
        .batch_execute("SELECT pg_wal_replay_pause()")
        .unwrap();
    db.client()
        .batch_execute(
            "INSERT INTO workflow_leases (lease_id, status, owner_worker_identity) \
             VALUES ('L-new', 'active', 'w-dead-1')",
        )
        .unwrap();
    stores.leases = PathBuf::from(&on_standby);
    let mut args = stores.plan_args("controller-prgs");
    args.insert(0, "json".into());
    args.insert(0, "--format".into());
    let out = bin().args(&args).output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("standby in recovery"), "{}", text(&out));
    let before = pg_dump(&db);
    let (code, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_eq!(report["outcome"], "lease_store_unavailable", "{report}");
    assert_ne!(code, Some(0));
    assert!(
        report["detail"].as_str().unwrap().contains("standby"),
        "{report}"
    );
    assert_eq!(pg_dump(&db), before, "the refused apply wrote");
    // Pointed back at the primary, the lease is seen and its worker kept.
    stores.leases = primary_leases;
    let (_, body) = save_plan(&stores, &[]);
    assert_eq!(
        body["candidate_worker_identities"],
        json!(["w-dead-2", "w-dead-3"])
    );
    drop(live);
}

// Finding 1, at install: default privileges that hand every new function
// and table of the owner to the workers leave them no right on the record
// beyond a writer's, and no `EXECUTE` on its functions.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn default_privileges_give_nobody_the_record_or_its_functions() {
    let Some(db) = postgres("r4_defaults") else {
        return;
    };
    let roles = db.documented_roles();
    db.client()
        .batch_execute(
            "ALTER DEFAULT PRIVILEGES FOR ROLE fleet_owner GRANT EXECUTE ON FUNCTIONS TO fleet_workers; \
             ALTER DEFAULT PRIVILEGES FOR ROLE fleet_owner GRANT ALL ON TABLES TO fleet_workers",
        )
        .unwrap();
    let (stores, live) = fleet();
    fleet_retire::copy::copy(&stores.registry, Some(&stores.leases), &roles.owner).unwrap();
    db.grant_documented(&roles);
    let rights: Vec<bool> = db
        .client()
        .query_one(
            "SELECT has_function_privilege('fleet_workers', 'fleet_retire_stamp()', 'EXECUTE'), \
             has_function_privilege('fleet_workers', 'fleet_retire_changes_guard()', 'EXECUTE'), \
             has_table_privilege('fleet_workers', 'fleet_retire_changes', 'DELETE'), \
             has_table_privilege('fleet_workers', 'fleet_retire_changes', 'TRIGGER'), \
             has_table_privilege('fleet_workers', 'fleet_retire_changes', 'INSERT')",
            &[],
        )
        .map(|r| (0..5).map(|i| r.get(i)).collect())
        .unwrap();
    assert_eq!(rights, [false, false, false, false, true]);
    assert_eq!(
        fleet_retire::store::postgres::versions::vouches(&mut db.client(), "t").unwrap(),
        None
    );
    drop(live);
}
