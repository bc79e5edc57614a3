//! Apply judges outside the write lock and, under it, reads only the rows
//! changed since (docs/apply.md, "The write lock held for what changed").
//! These tests put a writer between the judgement and the lock
//! (`Hooks::after_prejudge`) on a real SQLite registry with its row
//! versions, and show which writes the lock confirms and which send it back
//! to reading the whole registry: a heartbeat of a live worker is
//! confirmed; a plain SQL writer that knows nothing of versions (the seed's
//! Python, a hand edit) is stamped by the triggers and caught; a writer
//! that drops the triggers to write unseen is caught by the schema version.
//! SQLite here; tests/postgres_versions.rs shows the same on PostgreSQL,
//! whose change record is kept otherwise.

mod common;

use common::*;
use fleet_retire::apply::{Hooks, Outcome, Report};
use rusqlite::Connection;
use serde_json::Value;
use std::path::Path;

/// The fleet of `fleet()` with row versions, its running worker live by
/// its heartbeat too, and a saved plan of it (three candidates).
fn versioned_fleet() -> (Lib, KillOnDrop, fleet_retire::apply::Request) {
    let (stores, live) = fleet();
    let conn = Connection::open(&stores.registry).unwrap();
    // As a registry is once an apply has migrated it: every column, and
    // row versions.
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    fleet_retire::store::registry::add_missing_columns(&conn, &stores.registry).unwrap();
    fleet_retire::store::sqlite::versions::install(&conn).unwrap();
    conn.execute_batch("COMMIT").unwrap();
    // Live by its heartbeat too, in an instance slot of its own (a live
    // worker in the dead ones' slot would keep them all).
    plain_update(&stores.registry, "last_heartbeat_at", &now(0), "w-running");
    plain_update(
        &stores.registry,
        "client_instance_id",
        "inst-codex-20260730T100000Z-000000000001",
        "w-running",
    );
    let (_, plan) = save_plan(&stores);
    let lib = Lib::new(stores);
    let mut req = lib.request();
    let planned: fleet_retire::plan::planned::PlannedRows =
        serde_json::from_value(plan["planned_rows"].clone()).unwrap();
    req = req
        .with_planned(Some(std::sync::Arc::new(planned)))
        .unwrap();
    assert_eq!(req.workers.len(), 3, "{plan}");
    (lib, live, req)
}

fn now(offset_s: i64) -> String {
    fleet_retire::time::format_ts(fleet_retire::time::now() + offset_s * 1_000_000)
}

/// An UPDATE as any program that knows nothing of row versions writes it.
fn plain_update(registry: &Path, column: &str, value: &str, worker: &str) {
    Connection::open(registry)
        .unwrap()
        .execute(
            &format!("UPDATE worker_registrations SET {column} = ?1 WHERE worker_identity = ?2"),
            [value, worker],
        )
        .unwrap();
}

fn session_of(registry: &Path, worker: &str) -> String {
    Connection::open(registry)
        .unwrap()
        .query_row(
            "SELECT session_id FROM worker_registrations WHERE worker_identity = ?1",
            [worker],
            |r| r.get(0),
        )
        .unwrap()
}

fn read_under_lock(report: &Report) -> Value {
    serde_json::to_value(&report.read_under_lock).unwrap()
}

#[test]
fn a_live_workers_heartbeat_while_apply_judges_is_confirmed_alone() {
    let (lib, live, req) = versioned_fleet();
    let registry = lib.stores.registry.clone();
    let report = lib.run_with_writer(&req, || {
        plain_update(&registry, "last_heartbeat_at", &now(1), "w-running")
    });
    assert_eq!(report.outcome, Outcome::Applied, "{}", report.detail);
    assert_eq!(report.retired_count, 3);
    assert_eq!(
        read_under_lock(&report),
        serde_json::json!({"scope": "changed_rows", "rows": 1})
    );
    assert_eq!(report.heartbeats_tolerated_workers, ["w-running"]);
    assert_eq!(status_of(&registry, "w-running"), "active");
    // The retirements are stamped: the next apply sees them as changes.
    let stamped: i64 = Connection::open(&registry)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM fleet_retire_changes WHERE version = \
             (SELECT version FROM fleet_retire_clock)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stamped, 3);
    drop(live);
}

/// The attack the versions exist to catch: between the judgement and the
/// lock, a writer that knows nothing of versions gives the live worker the
/// session of a candidate. That candidate now shares identity evidence
/// with a live row and must be kept: the triggers stamped the row, the
/// change is more than a heartbeat, so the lock reads the whole registry
/// and refuses: the candidate's own verdict moved.
#[test]
fn a_plain_sql_writer_between_judging_and_the_lock_is_caught() {
    let (lib, live, req) = versioned_fleet();
    let registry = lib.stores.registry.clone();
    let shared = session_of(&registry, "w-dead-1");
    let before = dump(&registry);
    let mut after_write = String::new();
    let report = lib.run_with_writer(&req, || {
        plain_update(&registry, "session_id", &shared, "w-running");
        after_write = dump(&registry);
    });
    assert_eq!(
        report.outcome,
        Outcome::CandidateSetMoved,
        "{}",
        report.detail
    );
    assert!(
        report
            .detail
            .contains("w-dead-1 eligible_stale_orphan -> conflicting_identity_evidence"),
        "{}",
        report.detail
    );
    let read = read_under_lock(&report);
    assert_eq!(read["scope"], "whole_registry", "{read}");
    assert!(
        read["why"]
            .as_str()
            .unwrap()
            .contains("beyond its heartbeat"),
        "{read}"
    );
    assert_ne!(after_write, before);
    assert_eq!(dump(&registry), after_write, "nothing retired");
    drop(live);
}

/// A writer that drops the stamping trigger, writes and puts the trigger
/// back exactly as it was leaves no stamp, but moves the schema version:
/// the lock reads the whole registry and the change is judged there.
#[test]
fn a_writer_that_drops_the_triggers_to_write_unseen_is_caught() {
    let (lib, live, req) = versioned_fleet();
    let registry = lib.stores.registry.clone();
    let shared = session_of(&registry, "w-dead-2");
    let (_, _, update_trigger) = fleet_retire::store::sqlite::versions::triggers()
        .into_iter()
        .find(|(name, _, _)| *name == "fleet_retire_stamp_update")
        .unwrap();
    let report = lib.run_with_writer(&req, || {
        let conn = Connection::open(&registry).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE; DROP TRIGGER fleet_retire_stamp_update;")
            .unwrap();
        conn.execute(
            "UPDATE worker_registrations SET session_id = ?1 WHERE worker_identity = 'w-running'",
            [&shared],
        )
        .unwrap();
        conn.execute_batch(&format!("{update_trigger}; COMMIT;"))
            .unwrap();
    });
    assert_eq!(
        report.outcome,
        Outcome::CandidateSetMoved,
        "{}",
        report.detail
    );
    assert!(
        report
            .detail
            .contains("w-dead-2 eligible_stale_orphan -> conflicting_identity_evidence"),
        "{}",
        report.detail
    );
    let read = read_under_lock(&report);
    assert_eq!(read["scope"], "whole_registry", "{read}");
    assert!(read["why"].as_str().unwrap().contains("schema"), "{read}");
    drop(live);
}

/// A writer with triggers switched off on its connection is the one the
/// versions cannot see (docs/apply.md says so). What still holds for the
/// rows apply writes: a target changed that way fails its guarded UPDATE
/// and is kept.
#[test]
fn a_target_changed_with_triggers_off_is_still_kept_by_the_guarded_update() {
    let (lib, live, req) = versioned_fleet();
    let registry = lib.stores.registry.clone();
    let report = lib.run_with_writer(&req, || {
        let conn = Connection::open(&registry).unwrap();
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER,
            false,
        )
        .unwrap();
        conn.execute(
            "UPDATE worker_registrations SET last_heartbeat_at = '2026-01-01T00:11:00Z' \
             WHERE worker_identity = 'w-dead-3'",
            [],
        )
        .unwrap();
    });
    assert_eq!(report.outcome, Outcome::Applied, "{}", report.detail);
    assert_eq!(read_under_lock(&report)["scope"], "changed_rows");
    assert_eq!(report.retired_count, 2);
    assert!(
        report
            .preserved
            .iter()
            .any(|k| k.worker_identity == "w-dead-3" && k.reason_code == "row_changed_since_plan"),
        "{:?}",
        report.preserved
    );
    assert_eq!(status_of(&registry, "w-dead-3"), "active");
    drop(live);
}

/// A registry without row versions (one the seed made) gains them in a
/// short transaction of their own before its first apply judges, so even
/// that apply reads only the rows changed since under its lock; a refused
/// first apply leaves them in place, and nothing else (docs/apply.md, "The
/// first apply").
#[test]
fn the_first_apply_installs_row_versions_before_it_judges() {
    let (stores, live) = fleet();
    let registry = stores.registry.clone();
    let lib = Lib::new(stores);
    let before = dump(&registry);
    let mut refused = lib.request();
    refused.candidate_fingerprint = "candidatefp-not-this-plan".into();
    let report = lib.run(&refused, Hooks::default());
    assert_eq!(
        report.outcome,
        Outcome::CandidateSetMoved,
        "{}",
        report.detail
    );
    assert_eq!(read_under_lock(&report)["scope"], "nothing");
    assert!(report.versions_install_lock_ms.is_some(), "{report:?}");
    assert_eq!(dump(&registry), before, "only the bookkeeping, untouched");
    assert!(
        fleet_retire::store::sqlite::versions::installed(&Connection::open(&registry).unwrap())
            .unwrap(),
        "the bookkeeping survives the refusal"
    );
    let mut req = lib.request();
    req.workers.truncate(1);
    let first = lib.run(&req, Hooks::default());
    assert_eq!(first.outcome, Outcome::Applied, "{}", first.detail);
    assert_eq!(
        read_under_lock(&first),
        serde_json::json!({"scope": "changed_rows", "rows": 0})
    );
    assert_eq!(first.versions_install_lock_ms, None, "installed once");
    assert_eq!(first.retired_count, 1);
    drop(live);
}

/// A write racing the install is never lost to the fast path: whether it
/// lands after the install and before the judgement (the judgement reads
/// it), or after the judgement (the triggers stamp it, the lock sees the
/// stamp), and even from a connection opened, with its statement compiled,
/// before the triggers existed.
#[test]
fn a_write_racing_the_install_is_still_seen() {
    for after in ["install", "prejudge"] {
        let (stores, live) = fleet();
        let registry = stores.registry.clone();
        let lib = Lib::new(stores);
        let writer = Connection::open(&registry).unwrap();
        let sql = "UPDATE worker_registrations SET session_id = ?1 WHERE worker_identity = ?2";
        writer
            .prepare_cached(sql)
            .unwrap()
            .execute(["x", "nobody"])
            .unwrap();
        let write = || {
            writer
                .prepare_cached(sql)
                .unwrap()
                .execute(["sess-moved", "w-dead-1"])
                .unwrap();
        };
        let mut hook = write;
        let hooks = if after == "install" {
            Hooks {
                after_install: Some(&mut hook),
                ..Default::default()
            }
        } else {
            Hooks {
                after_prejudge: Some(&mut hook),
                ..Default::default()
            }
        };
        let report = lib.run(&lib.request(), hooks);
        assert_eq!(
            report.outcome,
            Outcome::RegistryRevisionMoved,
            "a write after the {after}: {}",
            report.detail
        );
        assert_eq!(report.retired_count, 0);
        assert_eq!(session_of(&registry, "w-dead-1"), "sess-moved");
        let scope = read_under_lock(&report)["scope"].clone();
        let expected = if after == "install" {
            "nothing"
        } else {
            "whole_registry"
        };
        assert_eq!(scope, expected, "a write after the {after}: {report:?}");
        drop(live);
    }
}

/// The bookkeeping defends itself against a writer that would hide a
/// change by turning it back: the clock cannot go back, jump, change type,
/// be deleted or be replaced; a stamp cannot be lowered, deleted or
/// written with anything but the current clock.
#[test]
fn the_row_versions_cannot_be_turned_back() {
    let (lib, live, _) = versioned_fleet();
    let conn = Connection::open(&lib.stores.registry).unwrap();
    plain_update(
        &lib.stores.registry,
        "last_heartbeat_at",
        &now(1),
        "w-running",
    );
    for attack in [
        "UPDATE fleet_retire_clock SET version = 0",
        "DELETE FROM fleet_retire_clock",
        // A REPLACE deletes without a DELETE trigger: the INSERT refuses it.
        "REPLACE INTO fleet_retire_clock (id, version) VALUES (1, 0)",
        "INSERT OR REPLACE INTO fleet_retire_clock (id, version) VALUES (1, -1000)",
        // A jump to the end would overflow into a REAL; text sorts above
        // every number: one step at a time, integers only.
        "UPDATE fleet_retire_clock SET version = 9223372036854775807",
        "UPDATE fleet_retire_clock SET version = 'zzz'",
        "UPDATE fleet_retire_clock SET version = version + 2",
        "UPDATE fleet_retire_changes SET version = 0",
        "DELETE FROM fleet_retire_changes",
        "INSERT INTO fleet_retire_changes (row_id, version) VALUES (999, 0)",
    ] {
        let refused = conn.execute_batch(attack).unwrap_err().to_string();
        assert!(refused.contains("fleet-retire:"), "{attack}: {refused}");
    }
    drop(live);
}

/// A trigger that carries one of our names but not our text is refused
/// like any other: apply accepts ours by their exact SQL only.
#[test]
fn a_trigger_under_our_name_with_other_text_is_refused() {
    let (lib, live, req) = versioned_fleet();
    let conn = Connection::open(&lib.stores.registry).unwrap();
    conn.execute_batch(
        "DROP TRIGGER fleet_retire_stamp_update;
         CREATE TRIGGER fleet_retire_stamp_update AFTER UPDATE ON worker_registrations BEGIN
           UPDATE worker_registrations SET status = 'retired' WHERE worker_identity = 'w-running';
         END;",
    )
    .unwrap();
    let before = dump(&lib.stores.registry);
    let report = lib.run(&req, Hooks::default());
    assert_eq!(
        report.outcome,
        Outcome::RegistryUntrusted,
        "{}",
        report.detail
    );
    assert!(
        report.detail.contains("fleet_retire_stamp_update"),
        "{}",
        report.detail
    );
    assert_eq!(dump(&lib.stores.registry), before);
    drop(live);
}

/// A unique index besides the key lets `UPDATE OR REPLACE` delete a row
/// through it without any trigger: with one, the versions cannot vouch
/// for the rows, and the lock reads the whole registry.
#[test]
fn a_unique_index_besides_the_key_sends_apply_to_the_whole_read() {
    let (lib, live, req) = versioned_fleet();
    let registry = lib.stores.registry.clone();
    Connection::open(&registry)
        .unwrap()
        .execute_batch("CREATE UNIQUE INDEX one_session ON worker_registrations (session_id)")
        .unwrap();
    // Planned again: the index is there before the judgement.
    let (_, plan) = save_plan(&lib.stores);
    let planned: fleet_retire::plan::planned::PlannedRows =
        serde_json::from_value(plan["planned_rows"].clone()).unwrap();
    let mut req = req;
    req.registry_fingerprint = plan["registry_fingerprint"].as_str().unwrap().into();
    req = req
        .with_planned(Some(std::sync::Arc::new(planned)))
        .unwrap();
    let report = lib.run_with_writer(&req, || {
        plain_update(&registry, "last_heartbeat_at", &now(1), "w-running")
    });
    assert_eq!(report.outcome, Outcome::Applied, "{}", report.detail);
    let read = read_under_lock(&report);
    assert_eq!(read["scope"], "whole_registry", "{read}");
    assert!(
        read["why"].as_str().unwrap().contains("unique index"),
        "{read}"
    );
    drop(live);
}

/// In WAL mode another connection of the same process holds a lock on the
/// registry for as long as it reads, so SQLite keeps the descriptors of
/// connections closed meanwhile and hands them to the next open of that
/// file (a `serve` that heartbeats while it applies; the bench's writer
/// threads). Apply still tells which file its connections opened, from the
/// connection itself, and applies batch after batch.
#[test]
fn applies_in_one_process_beside_a_wal_reader_tell_their_file() {
    let (stores, live) = fleet();
    let registry = stores.registry.clone();
    let wal: String = Connection::open(&registry)
        .unwrap()
        .query_row("PRAGMA journal_mode = wal", [], |r| r.get(0))
        .unwrap();
    assert_eq!(wal, "wal");
    let holder = Connection::open(&registry).unwrap();
    holder.execute_batch("BEGIN").unwrap();
    let _: i64 = holder
        .query_row("SELECT count(*) FROM worker_registrations", [], |r| {
            r.get(0)
        })
        .unwrap();
    let lib = Lib::new(stores);
    for batch in 0..3 {
        let mut req = lib.request();
        req.workers = vec![format!("w-dead-{}", batch + 1)];
        let report = lib.run(&req, Hooks::default());
        assert_eq!(
            report.outcome,
            Outcome::Applied,
            "batch {batch}: {}",
            report.detail
        );
        assert_eq!(report.retired_count, 1, "batch {batch}");
        if batch > 0 {
            assert_eq!(
                read_under_lock(&report)["scope"],
                "changed_rows",
                "batch {batch}: {report:?}"
            );
        }
    }
    holder.execute_batch("COMMIT").unwrap();
    drop(live);
}

/// `already_retired` is a success (exit 0): found outside the lock, it is
/// answered so only while no requested row changed since; a requested row
/// made active again meanwhile sends the lock to read and judge again.
#[test]
fn an_already_retired_found_outside_stands_only_while_the_requested_rows_are_untouched() {
    let (stores, live) = fleet();
    let registry = stores.registry.clone();
    let lib = Lib::new(stores);
    let req = lib.request();
    let first = lib.run(&req, Hooks::default());
    assert_eq!(first.outcome, Outcome::Applied, "{}", first.detail);
    let replay = lib.run(&req, Hooks::default());
    assert_eq!(replay.outcome, Outcome::AlreadyRetired, "{}", replay.detail);
    assert_eq!(read_under_lock(&replay)["scope"], "nothing");
    let mut revive = || plain_update(&registry, "status", "active", "w-dead-2");
    let raced = lib.run(
        &req,
        Hooks {
            after_prejudge: Some(&mut revive),
            ..Default::default()
        },
    );
    assert_ne!(raced.outcome, Outcome::AlreadyRetired, "{raced:?}");
    assert_eq!(
        read_under_lock(&raced)["scope"],
        "whole_registry",
        "{raced:?}"
    );
    drop(live);
}

/// A refusal read from another file than the one apply holds (a copy
/// renamed over the path for the judgement alone, the real file put back
/// before the lock) is not answered: the lock reads and judges the real
/// file, and applies.
#[test]
fn a_refusal_read_from_a_swapped_file_is_not_answered_outside() {
    let (stores, live) = fleet();
    let registry = stores.registry.clone();
    let dir = stores.dir.path().to_path_buf();
    let lib = Lib::new(stores);
    let req = lib.request();
    // Installed now, so the apply below opens no transaction of its own
    // for it.
    let conn = Connection::open(&registry).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    fleet_retire::store::sqlite::versions::install(&conn).unwrap();
    conn.execute_batch("COMMIT").unwrap();
    drop(conn);
    let fork = dir.join("fork.sqlite");
    std::fs::copy(&registry, &fork).unwrap();
    Connection::open(&fork)
        .unwrap()
        .execute_batch("UPDATE worker_registrations SET status = 'retired'")
        .unwrap();
    let real = dir.join("real.keep");
    let mut swap_in = || {
        std::fs::hard_link(&registry, &real).unwrap();
        std::fs::rename(&fork, &registry).unwrap();
    };
    let mut swap_back = || std::fs::rename(&real, &registry).unwrap();
    let report = lib.run(
        &req,
        Hooks {
            after_install: Some(&mut swap_in),
            after_prejudge: Some(&mut swap_back),
            ..Default::default()
        },
    );
    assert_eq!(report.outcome, Outcome::Applied, "{}", report.detail);
    assert_eq!(report.retired_count, 3);
    let read = read_under_lock(&report);
    assert_eq!(read["scope"], "whole_registry", "{report:?}");
    assert!(
        read["why"].as_str().unwrap().contains("cannot tell"),
        "{read}"
    );
    drop(live);
}
