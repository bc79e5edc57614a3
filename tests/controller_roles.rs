//! `fleet-retire controller` as the least-privilege role docs/multi-host.md
//! documents for it (`fleet_controller`, "The roles, and exactly their
//! grants"), made from that page's own SQL blocks: it leads and retires,
//! and the server refuses every write it was not granted. Needs
//! FLEET_RETIRE_TEST_POSTGRES.

mod common;

use common::{bin, text};
use postgres::error::SqlState;
use std::path::PathBuf;

fn connect(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).unwrap()
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_controller_as_its_documented_role_retires_and_may_do_nothing_else() {
    let Some(db) = common::postgres("ctl_roles") else {
        return;
    };
    let (mut stores, _live) = common::fleet();
    // The owner copies the fleet in and grants (roles-cluster, -database,
    // -grants); `registry versions` as the owner makes the controller's
    // tables; the owner grants them (roles-controller).
    let roles = common::roles::copied_as_documented(&stores, &db.url);
    let out = bin()
        .args(["registry", "versions", "--registry", &roles.owner])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    connect(&roles.owner)
        .batch_execute(&common::roles::block("roles-controller"))
        .unwrap();
    let url = db.url_as("fleet_controller");
    stores.registry = PathBuf::from(&url);
    let out = common::controller::once(&stores, "controller-prgs", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let retired: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM retirement_audit a \
             JOIN fleet_retire_controller_applies c USING (apply_id)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(retired, 3, "{}", text(&out));
    let mut attacker = connect(&url);
    for attack in [
        "UPDATE workflow_leases SET status = 'released'",
        "DELETE FROM worker_registrations",
        "DELETE FROM retirement_audit",
        "DELETE FROM fleet_retire_controller_leases",
        "TRUNCATE fleet_retire_controller_budgets",
        "ALTER TABLE fleet_retire_controller_leases ADD COLUMN planted int",
        "DROP TABLE fleet_retire_controller_applies",
        "CREATE TRIGGER planted BEFORE UPDATE ON fleet_retire_controller_leases \
         FOR EACH ROW EXECUTE FUNCTION fleet_retire_stamp()",
        "CREATE TABLE planted (x int)",
    ] {
        let e = attacker.batch_execute(attack).expect_err(attack);
        assert_eq!(
            e.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{attack}: {e:?}"
        );
    }
    // A hand applier cannot forge a lease.
    let e = connect(&db.url_as("fleet_apply"))
        .batch_execute("UPDATE fleet_retire_controller_leases SET term = term + 1")
        .unwrap_err();
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e:?}");
}
