//! What holds a controller's ticks back (docs/controller.md, "Backoff by
//! reason"), with real processes: a refusal of its capability holds every
//! tick until `profiles.json` or the policy set on disk changes (a set
//! edited on disk is judged by from the next tick, a broken one holds
//! every tick until fixed); an apply whose outcome is unknown
//! (its COMMIT's reply lost by a proxy of ours in front of a real
//! PostgreSQL) holds every apply until the registry's audit rows say
//! whether it committed.

mod common;

use common::controller::*;
use common::pgproxy::{Lose, PgProxy};
use common::KillOnDrop;
use std::path::PathBuf;
use std::time::Duration;

/// Its profile loses `gitea.worker_registry.retire` while it leads: the
/// tick that would retire a dead worker is refused (`permission_denied`),
/// and no tick runs for several intervals, though the worker stays a
/// candidate; `profiles.json` given back, the next poll ticks and retires
/// it.
#[test]
fn a_refused_capability_holds_every_tick_until_profiles_json_changes() {
    let stores = stores();
    let mut w = worker(&stores, 1);
    let c = Controller::start(&stores, "p", &[]);
    wait_for(Duration::from_secs(20), "a first tick", || {
        !c.outcomes().is_empty()
    });
    let granted = std::fs::read_to_string(&stores.profiles).unwrap();
    let revoked = granted.replacen(
        r#""controller-prgs":{"role":"controller","allowed_operations":["gitea.read","gitea.worker_registry.retire"]"#,
        r#""controller-prgs":{"role":"controller","allowed_operations":["gitea.read"]"#,
        1,
    );
    assert_ne!(revoked, granted, "{granted}");
    std::fs::write(&stores.profiles, &revoked).unwrap();
    kill_and_expire(std::slice::from_mut(&mut w));
    wait_for(Duration::from_secs(15), "the refusal", || {
        c.outcomes().iter().any(|o| o == "permission_denied")
    });
    let held = c.outcomes().len();
    // Interval 1 s, retry 0.5 s: four intervals without a tick.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(c.outcomes().len(), held, "{:?}", c.outcomes());
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("active"));
    std::fs::write(&stores.profiles, &granted).unwrap();
    wait_for(Duration::from_secs(15), "the retirement", || {
        status(&stores.registry, "w-1").as_deref() == Some("retired")
    });
    assert!(c.says("profiles.json changed: trying again"));
}

/// The policy set in `dir`: our own files, with `edit` applied to
/// `capabilities.cedar`.
fn write_policies(dir: &std::path::Path, edit: impl Fn(&str) -> String) {
    let ours = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    std::fs::create_dir_all(dir).unwrap();
    for name in [
        "schema.cedarschema",
        "retirement.cedar",
        "capabilities.cedar",
    ] {
        let text = std::fs::read_to_string(ours.join(name)).unwrap();
        let text = if name == "capabilities.cedar" {
            edit(&text)
        } else {
            text
        };
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// It runs with a policy folder (our own set) and the folder is edited
/// while it leads: the edit is loaded, and the tick that would retire a
/// dead worker is refused by it (`permission_denied`: apply now needs a
/// permission no profile has; the operator pinned the edited set); no tick
/// runs while held. Then half an edit (a file that does not parse): still
/// held, `/readyz` says why. Then the folder put back: loaded, the hold
/// ends, the worker is retired.
#[test]
fn a_policy_set_edited_on_disk_is_judged_by_and_its_refusal_held_until_it_changes() {
    let stores = stores();
    let dir = stores.dir.path().join("policies");
    let ours = |t: &str| t.to_string();
    let denying = |t: &str| {
        let edited = t.replace(
            r#"principal.allowed_operations.contains("gitea.worker_registry.retire") &&"#,
            r#"principal.allowed_operations.contains("gitea.worker_registry.retire.by_hand") &&"#,
        );
        assert_ne!(edited, t);
        edited
    };
    write_policies(&dir, denying);
    let pinned =
        fleet_retire::policy::Policies::load(&fleet_retire::policy::PolicySource::Dir(dir.clone()))
            .unwrap()
            .fingerprint;
    write_policies(&dir, ours);
    let profiles = std::fs::read_to_string(&stores.profiles).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&profiles).unwrap();
    doc["policy_pins"] = serde_json::json!([pinned]);
    std::fs::write(&stores.profiles, doc.to_string()).unwrap();
    let mut w = worker(&stores, 1);
    let folder = dir.to_str().unwrap();
    let (c, port) = start_listening_with(&stores, "p", &["--policies", folder]);
    wait_for(Duration::from_secs(20), "a first tick", || {
        !c.outcomes().is_empty()
    });
    write_policies(&dir, denying);
    wait_for(Duration::from_secs(10), "the edit loaded", || {
        c.lines()
            .iter()
            .any(|l| l["fields"]["fingerprint"] == serde_json::json!(pinned))
    });
    kill_and_expire(std::slice::from_mut(&mut w));
    wait_for(Duration::from_secs(15), "the refusal", || {
        c.outcomes().iter().any(|o| o == "permission_denied")
    });
    let held = c.outcomes().len();
    write_policies(&dir, |_| "permit (principal, action, resource".into());
    wait_for(Duration::from_secs(10), "the broken set seen", || {
        get(port, "/readyz", None)
            .1
            .contains("the policy set on disk cannot be used")
    });
    // Interval 1 s, retry 0.5 s: four intervals without a tick.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(c.outcomes().len(), held, "{:?}", c.outcomes());
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("active"));
    write_policies(&dir, ours);
    wait_for(Duration::from_secs(15), "the retirement", || {
        status(&stores.registry, "w-1").as_deref() == Some("retired")
    });
    assert!(c.says("the policy set changed: trying again"));
    assert_eq!(get(port, "/readyz", None).0, 200);
}

/// The COMMIT of the controller's apply reaches the server (it commits)
/// and its reply is lost: the tick ends `outcome_unknown` with the apply's
/// id; the next thing the controller does is resolve it from the audit
/// rows (committed), before any other tick; the workers were retired once.
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn an_unknown_outcome_holds_every_apply_until_the_audit_rows_say() {
    let Some((mut stores, db)) = pg_stores("ctl_unknown") else {
        return;
    };
    let mut workers: Vec<KillOnDrop> = (1..=2).map(|n| worker(&stores, n)).collect();
    install_versions(&stores);
    let proxy = PgProxy::start(db.host_port(), Lose::Reply);
    stores.registry = PathBuf::from(db.at_port(proxy.port, ""));
    let c = Controller::start(&stores, "u", &[]);
    wait_for(Duration::from_secs(20), "a first tick", || {
        !c.outcomes().is_empty()
    });
    kill_and_expire(&mut workers);
    wait_for(Duration::from_secs(30), "the resolution", || {
        c.says("an apply whose outcome was unknown is resolved")
    });
    assert!(proxy.fired.load(std::sync::atomic::Ordering::SeqCst));
    let lines = c.lines();
    let unknown = lines
        .iter()
        .position(|l| l["fields"]["outcome"] == "outcome_unknown")
        .unwrap_or_else(|| panic!("{lines:#?}"));
    let resolved = lines
        .iter()
        .position(|l| l["fields"]["message"] == "an apply whose outcome was unknown is resolved")
        .unwrap();
    assert!(unknown < resolved, "{lines:#?}");
    assert!(
        lines[unknown + 1..resolved]
            .iter()
            .all(|l| l["fields"]["outcome"].is_null()),
        "a tick ran before the unknown outcome was resolved: {lines:#?}"
    );
    assert_eq!(lines[resolved]["fields"]["committed"], true, "{lines:#?}");
    assert_eq!(
        lines[unknown]["fields"]["retired"], 0,
        "an unknown outcome counts nothing retired"
    );
    let audited: i64 = db
        .client()
        .query_one("SELECT count(*) FROM retirement_audit", &[])
        .unwrap()
        .get(0);
    assert_eq!(audited, 2);
    for n in 1..=2 {
        assert_eq!(
            status(&PathBuf::from(&db.url), &format!("w-{n}")).as_deref(),
            Some("retired")
        );
    }
}
