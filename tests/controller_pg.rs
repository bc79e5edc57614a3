//! `fleet-retire controller` on a PostgreSQL registry (issue 53 §2), with
//! real processes: the lease on the server's clock, taken over after a
//! SIGKILL within ttl + retry period, and a deposed leader frozen while its
//! apply waits for the registry's lock commits nothing. Each test makes a
//! database of its own in the cluster FLEET_RETIRE_TEST_POSTGRES names.

mod common;

use common::controller::*;
use common::KillOnDrop;
use nix::sys::signal::Signal;
use std::time::Duration;

/// Two controllers on one PostgreSQL registry: one leads; SIGKILL of it
/// hands the lease to the other within ttl + retry period under a higher
/// term; the dead workers are retired, each apply recorded under a term
/// one of them took.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn on_postgres_a_killed_leader_is_replaced_within_ttl_and_a_retry() {
    let Some((stores, db)) = pg_stores("ctl_kill") else {
        return;
    };
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(&stores, n)).collect();
    install_versions(&stores);
    let mut cs = vec![
        Controller::start(&stores, "a", &[]),
        Controller::start(&stores, "b", &[]),
    ];
    let (_, term) = wait_for_leader(&stores);
    kill_and_expire(&mut workers);
    wait_for(Duration::from_secs(20), "the workers to be retired", || {
        (1..=2).all(|n| status(&stores.registry, &format!("w-{n}")).as_deref() == Some("retired"))
    });
    let took = kill_the_leader(&stores, &mut cs);
    assert!(took <= TTL + RETRY + Duration::from_secs(1), "{took:?}");
    assert!(leader(&stores.registry).unwrap().1 > term);
    let terms: Vec<i64> = db
        .client()
        .query(
            "SELECT c.controller_term FROM retirement_audit a \
             JOIN fleet_retire_controller_applies c USING (apply_id)",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        terms,
        vec![term, term],
        "both retired under the first leader's term"
    );
}

/// The deposed leader on PostgreSQL: its apply waits for the registry's
/// lock (a session holds `SHARE` on the registry table, which apply's
/// `ROW EXCLUSIVE` waits for); it is frozen past its ttl while a dry-run
/// controller takes the lease; thawed, its transaction is refused
/// (`leadership_lost`, or a serialization failure on the lease row) and
/// commits nothing.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn on_postgres_a_deposed_leader_frozen_at_the_lock_commits_nothing() {
    let trials: usize = std::env::var("FLEET_RETIRE_CONTROLLER_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for trial in 0..trials {
        if !deposed_once(trial) {
            return;
        }
    }
}

/// One trial; `false` when no cluster is configured.
fn deposed_once(trial: usize) -> bool {
    let Some((stores, db)) = pg_stores(&format!("ctl_deposed_{trial}")) else {
        return false;
    };
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(&stores, n)).collect();
    install_versions(&stores);
    let a = Controller::start(&stores, "a", &["--busy-timeout-ms", "60000"]);
    wait_for(Duration::from_secs(20), "a to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == a.pid())
    });
    let b = Controller::start(&stores, "b", &["--dry-run"]);
    let mut locker = db.client();
    let mut lock = locker.transaction().unwrap();
    lock.batch_execute("LOCK TABLE worker_registrations IN SHARE MODE")
        .unwrap();
    kill_and_expire(&mut workers);
    wait_for(Duration::from_secs(10), "a's apply to start", || {
        a.says("applying")
    });
    std::thread::sleep(Duration::from_millis(500));
    a.signal(Signal::SIGSTOP);
    wait_for(Duration::from_secs(20), "b to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == b.pid())
    });
    wait_for(Duration::from_secs(10), "b's dry run", || {
        b.outcomes().iter().any(|o| o == "dry_run")
    });
    lock.rollback().unwrap();
    a.signal(Signal::SIGCONT);
    wait_for(Duration::from_secs(30), "a's apply to end", || {
        a.outcomes()
            .iter()
            .any(|o| !matches!(o.as_str(), "idle" | "unchanged"))
    });
    let ended: Vec<String> = a
        .outcomes()
        .into_iter()
        .filter(|o| !matches!(o.as_str(), "idle" | "unchanged"))
        .collect();
    eprintln!("trial {trial}: the deposed leader's apply ended: {ended:?}");
    assert!(
        ["leadership_lost", "registry_revision_moved"].contains(&ended[0].as_str()),
        "{ended:?}"
    );
    for n in 1..=2 {
        assert_eq!(
            status(&stores.registry, &format!("w-{n}")).as_deref(),
            Some("active")
        );
    }
    let applies: i64 = db
        .client()
        .query_one("SELECT count(*) FROM fleet_retire_controller_applies", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        applies, 0,
        "trial {trial}: a deposed leader recorded an apply"
    );
    true
}

/// A SQLite registry a controller ran on (its tables there) is copied to
/// PostgreSQL by `registry copy` (which accepts the controller's tables
/// and leaves them behind), and a controller then creates its tables there
/// and retires on it.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_registry_with_the_controllers_tables_copies_to_postgres_and_a_controller_runs_there() {
    let Some((mut stores, db)) = pg_stores("ctl_copy") else {
        return;
    };
    let sqlite = stores.dir.path().join("controlled.sqlite");
    stores.registry = sqlite.clone();
    let out = common::bin()
        .args(["registry", "create", "--registry"])
        .arg(&sqlite)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(&stores, n)).collect();
    let dry = once(&stores, "controller-prgs", &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", common::text(&dry));
    let copied = common::bin()
        .args(["registry", "copy", "--from"])
        .arg(&sqlite)
        .args(["--to", &db.url])
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", common::text(&copied));
    stores.registry = std::path::PathBuf::from(&db.url);
    kill_and_expire(&mut workers);
    let run = once(&stores, "controller-prgs", &[]);
    assert_eq!(run.status.code(), Some(0), "{}", common::text(&run));
    for n in 1..=2 {
        assert_eq!(
            status(&stores.registry, &format!("w-{n}")).as_deref(),
            Some("retired")
        );
    }
}

/// Attack (review of issue 53): a role that may create tables in the
/// registry's schema, but owns nothing of the fleet's, plants
/// `fleet_retire_controller_leases` with exactly our columns and a
/// trigger, before the first controller starts. Unchecked, the trigger
/// runs as the controller's role at every renewal (here it records
/// `current_user` in a table of the attacker's). The controller refuses
/// to start, naming the foreign owner and the trigger, and the trigger
/// never fires.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_planted_lease_table_with_a_trigger_is_refused_and_never_fires() {
    let Some((stores, db)) = pg_stores("ctl_planted") else {
        return;
    };
    let _workers: Vec<KillOnDrop> = (1..=1).map(|n| worker(&stores, n)).collect();
    let role = format!("mallory_{}", std::process::id());
    let mut c = db.client();
    c.batch_execute(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} NOLOGIN; \
         GRANT CREATE ON SCHEMA public TO {role}; SET ROLE {role}; \
         CREATE TABLE pwned (who text); GRANT INSERT ON pwned TO PUBLIC; \
         CREATE TABLE fleet_retire_controller_leases (scope TEXT PRIMARY KEY, \
           holder TEXT NOT NULL, term BIGINT NOT NULL, acquired_at_ms BIGINT NOT NULL, \
           renewed_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL); \
         GRANT SELECT, INSERT, UPDATE ON fleet_retire_controller_leases TO PUBLIC; \
         CREATE FUNCTION public.steal() RETURNS trigger LANGUAGE plpgsql AS \
           $$BEGIN INSERT INTO public.pwned VALUES (current_user); RETURN NEW; END$$; \
         CREATE TRIGGER steal AFTER INSERT OR UPDATE ON fleet_retire_controller_leases \
           FOR EACH ROW EXECUTE FUNCTION public.steal(); RESET ROLE"
    ))
    .unwrap();
    let out = once(&stores, "controller-prgs", &["--dry-run"]);
    let said = common::text(&out);
    let pwned: i64 = c
        .query_one("SELECT count(*) FROM pwned", &[])
        .unwrap()
        .get(0);
    // As the fleet's owner would: drop the attacker's objects, then the role.
    c.batch_execute(&format!("DROP OWNED BY {role} CASCADE; DROP ROLE {role}"))
        .unwrap();
    assert_eq!(
        pwned, 0,
        "the planted trigger ran as the controller: {said}"
    );
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains(&format!("is owned by {role}")), "{said}");
    assert!(said.contains("trigger steal"), "{said}");
}

/// Attack (review of issue 53): the deposed leader frozen *between its
/// last write and COMMIT* on PostgreSQL. Its apply has spent the budget
/// (the budget row is locked to COMMIT) and waits to retire a row another
/// session holds `FOR UPDATE`; it is frozen, the row is let go, so its
/// write completes and the server waits on the frozen client, idle in
/// transaction. The server must end that session after the lease's ttl
/// (`idle_in_transaction_session_timeout`), so a dry-run controller takes
/// the lease; thawed, the old leader commits nothing and says so
/// (`transaction_failed`, or `outcome_unknown` then resolved as not
/// committed), never `applied`.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn on_postgres_a_leader_frozen_before_commit_is_ended_by_the_server_and_commits_nothing() {
    let Some((stores, db)) = pg_stores("ctl_precommit") else {
        return;
    };
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(&stores, n)).collect();
    install_versions(&stores);
    let a = Controller::start(&stores, "a", &["--busy-timeout-ms", "60000"]);
    wait_for(Duration::from_secs(20), "a to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == a.pid())
    });
    let mut locker = db.client();
    let mut lock = locker.transaction().unwrap();
    lock.batch_execute("SELECT 1 FROM worker_registrations FOR UPDATE")
        .unwrap();
    kill_and_expire(&mut workers);
    let mut probe = db.client();
    wait_for(
        Duration::from_secs(20),
        "a's apply to spend its budget and wait",
        || {
            let spent: i64 = probe
                .query_one(
                    "SELECT count(*) FROM pg_catalog.pg_locks \
                 WHERE locktype = 'transactionid' AND NOT granted",
                    &[],
                )
                .unwrap()
                .get(0);
            spent > 0
        },
    );
    a.signal(Signal::SIGSTOP);
    lock.rollback().unwrap();
    let b = Controller::start(&stores, "b", &["--dry-run"]);
    wait_for(Duration::from_secs(30), "b to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == b.pid())
    });
    a.signal(Signal::SIGCONT);
    wait_for(Duration::from_secs(30), "a's apply to end", || {
        a.outcomes()
            .iter()
            .any(|o| !matches!(o.as_str(), "idle" | "unchanged"))
    });
    let ended: Vec<String> = a
        .outcomes()
        .into_iter()
        .filter(|o| !matches!(o.as_str(), "idle" | "unchanged"))
        .collect();
    let said: Vec<String> = a
        .lines()
        .iter()
        .filter(|l| {
            l["fields"]["outcome"]
                .as_str()
                .is_some_and(|o| !matches!(o, "idle" | "unchanged"))
        })
        .map(|l| l["fields"]["message"].to_string())
        .collect();
    eprintln!("the leader frozen before COMMIT ended: {ended:?} {said:?}");
    assert!(
        ["transaction_failed", "outcome_unknown"].contains(&ended[0].as_str()),
        "{ended:?}"
    );
    for n in 1..=2 {
        assert_eq!(
            status(&stores.registry, &format!("w-{n}")).as_deref(),
            Some("active")
        );
    }
    let applies: i64 = db
        .client()
        .query_one("SELECT count(*) FROM fleet_retire_controller_applies", &[])
        .unwrap()
        .get(0);
    assert_eq!(applies, 0, "a deposed leader recorded an apply");
}

/// Attack (review of issue 53): a controller frozen (SIGSTOP) inside its
/// lease renewal's transaction, after the upsert has locked the lease row
/// and before COMMIT (the window widened here by holding the budget table,
/// which the renewal's second statement waits for). Before the fix the
/// frozen session kept the lease row locked for as long as the process
/// stayed frozen, so no other controller of the host could ever lead; and
/// a controller whose connection the server had closed never led again.
/// Now the server ends the idle renewal after the ttl, another leads, and
/// the thawed one connects again and leads once that one is gone.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn on_postgres_a_leader_frozen_inside_its_renewal_does_not_hold_the_lease_for_ever() {
    let Some((stores, db)) = pg_stores("ctl_renewal") else {
        return;
    };
    let _workers: Vec<KillOnDrop> = (1..=1).map(|n| worker(&stores, n)).collect();
    install_versions(&stores);
    let a = Controller::start(&stores, "a", &[]);
    wait_for(Duration::from_secs(20), "a to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == a.pid())
    });
    let mut locker = db.client();
    let mut lock = locker.transaction().unwrap();
    lock.batch_execute("LOCK TABLE fleet_retire_controller_budgets IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let mut probe = db.client();
    wait_for(Duration::from_secs(10), "a's renewal to wait", || {
        probe
            .query_one(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' \
                 AND query LIKE '%FROM fleet_retire_controller_budgets WHERE%'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            > 0
    });
    a.signal(Signal::SIGSTOP);
    lock.rollback().unwrap();
    let b = Controller::start(&stores, "b", &["--dry-run"]);
    let took = wait_for(Duration::from_secs(20), "b to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == b.pid())
    });
    eprintln!("b led {took:?} after a froze inside its renewal");
    a.signal(Signal::SIGCONT);
    let mut cs = vec![b, a];
    // b killed: the thawed a, its connection closed by the server while
    // it was frozen, leads again.
    kill_the_leader(&stores, &mut cs);
}

/// Attack (review of issue 53): a controller's own apply that holds the
/// budget row (spent, to COMMIT) for longer than the renew deadline, here
/// waiting 4 s for a worker row another session holds `FOR UPDATE`. Its
/// renewals must go on meanwhile ("renewals never conflict with its
/// applies"). Before the fix every renewal's budget upsert waited for that
/// row and failed, so the controller cancelled its own apply.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn on_postgres_renewals_go_on_while_the_leaders_own_apply_holds_the_budget() {
    let Some((stores, db)) = pg_stores("ctl_renew_apply") else {
        return;
    };
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(&stores, n)).collect();
    install_versions(&stores);
    let a = Controller::start(&stores, "a", &["--busy-timeout-ms", "60000"]);
    wait_for(Duration::from_secs(20), "a to lead", || {
        leader(&stores.registry).is_some_and(|(p, _)| p == a.pid())
    });
    let mut locker = db.client();
    let mut lock = locker.transaction().unwrap();
    lock.batch_execute("SELECT 1 FROM worker_registrations FOR UPDATE")
        .unwrap();
    kill_and_expire(&mut workers);
    let mut probe = db.client();
    wait_for(
        Duration::from_secs(20),
        "a's apply to wait for a row",
        || {
            probe
                .query_one(
                    "SELECT count(*) FROM pg_catalog.pg_locks \
                 WHERE locktype = 'transactionid' AND NOT granted",
                    &[],
                )
                .unwrap()
                .get::<_, i64>(0)
                > 0
        },
    );
    std::thread::sleep(Duration::from_secs(4));
    lock.rollback().unwrap();
    wait_for(Duration::from_secs(20), "a's apply to end", || {
        a.outcomes()
            .iter()
            .any(|o| !matches!(o.as_str(), "idle" | "unchanged"))
    });
    let ended: Vec<String> = a
        .outcomes()
        .into_iter()
        .filter(|o| !matches!(o.as_str(), "idle" | "unchanged"))
        .collect();
    assert_eq!(ended[0], "applied", "{ended:?}");
    assert!(!a.lines().iter().any(|l| l["fields"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("cannot reach the controller lease"))));
}
