//! The saved plan file (issue 52 §1): what apply needs and nothing more
//! (the candidates whole; of each preserved row its digests and verdict),
//! written in at most the plan's own time again; plans saved in the older
//! form still applied, a malformed one refused saying what to do; and a
//! realistic registry's plan retired batch after batch.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The fastest of two runs of `plan` with these extra arguments.
fn plan_time(stores: &Stores, extra: &[&str]) -> Duration {
    (0..2)
        .map(|_| {
            let started = Instant::now();
            let out = bin()
                .args(stores.plan_args("controller-prgs"))
                .args(extra)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", text(&out));
            started.elapsed()
        })
        .min()
        .unwrap()
}

/// 20,000 realistic rows: the saved plan holds at most 200 bytes per
/// preserved row (beside its candidates, kept whole), each preserved row's
/// line at most 200 bytes, and writing it takes at most the plan's own
/// time again. (The 200,000-row figures, measured with a release build,
/// are in docs/performance.md.)
#[test]
fn a_saved_plan_keeps_what_apply_needs_and_is_written_in_the_plans_time() {
    let stores = realistic_stores(20_000);
    let out = stores.dir.path().join("plan.json");
    let plain = plan_time(&stores, &[]);
    let saving = plan_time(&stores, &["--out", out.to_str().unwrap()]);
    let raw = std::fs::read(&out).unwrap();
    let doc: Value = serde_json::from_slice(&raw).unwrap();
    let preserved = doc["preserved_count"].as_u64().unwrap() as usize;
    let text = String::from_utf8_lossy(&raw);
    let from = text.find("\"candidates\": [").unwrap();
    let to = text.find("\"planned_rows\": ").unwrap();
    let per_row = (raw.len() - (to - from)) as f64 / preserved as f64;
    let longest = text[to..]
        .lines()
        .filter(|l| l.starts_with("{\"worker_identity\"") && !l.contains("\"peers\""))
        .map(str::len)
        .max()
        .unwrap();
    let write = saving.saturating_sub(plain);
    eprintln!(
        "{} bytes for {preserved} preserved rows and {} candidates: {per_row:.1} bytes per \
         preserved row beside the candidates, longest row {longest}; plan {plain:?}, with the \
         file {saving:?}",
        raw.len(),
        doc["candidate_count"]
    );
    assert!(preserved > 10_000, "{preserved}");
    assert!(per_row <= 200.0, "{per_row} bytes per preserved row");
    assert!(longest <= 200, "{longest}");
    assert!(doc.get("preserved").is_none());
    assert!(doc["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c.get("evidence").is_some()));
    assert!(doc["planned_rows"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["digests"].as_str().unwrap().len() == 64 && r.get("verdict").is_some()));
    // Timing holds in a release build; a debug build's digests are slow.
    if !cfg!(debug_assertions) {
        assert!(write <= plain, "writing took {write:?}, the plan {plain:?}");
    }
}

/// A plan saved before the compact form (each row's full sha256 digests
/// and reason codes, the preserved rows listed) is still applied; a
/// `planned_rows` row without digests is refused, naming it and what to do.
#[test]
fn an_older_saved_plan_is_applied_and_a_malformed_one_refused() {
    let (stores, live) = fleet();
    let (path, plan) = save_plan(&stores);
    let mut older = plan.clone();
    let verdicts = plan["planned_rows"]["verdicts"].clone();
    for row in older["planned_rows"]["rows"].as_array_mut().unwrap() {
        let digests = row["digests"].as_str().unwrap().to_string();
        let o = row.as_object_mut().unwrap();
        o.remove("digests");
        let codes = verdicts[o.remove("verdict").unwrap().as_u64().unwrap() as usize].clone();
        let pad = "0".repeat(32);
        o.insert(
            "row_digest".into(),
            json!(format!("sha256:{}{pad}", &digests[..32])),
        );
        o.insert(
            "digest_without_heartbeat".into(),
            json!(format!("sha256:{}{pad}", &digests[32..])),
        );
        o.entry("live").or_insert(json!(false));
        o.insert("reason_codes".into(), codes);
    }
    let o = older.as_object_mut().unwrap();
    o["planned_rows"]
        .as_object_mut()
        .unwrap()
        .remove("verdicts");
    o.insert(
        "preserved".into(),
        json!([{"worker_identity": "w-running"}]),
    );
    let older_path = stores.dir.path().join("older.json");
    std::fs::write(&older_path, serde_json::to_vec(&older).unwrap()).unwrap();

    let mut malformed = plan.clone();
    malformed["planned_rows"]["rows"][2]
        .as_object_mut()
        .unwrap()
        .remove("digests");
    let malformed_path = stores.dir.path().join("malformed.json");
    std::fs::write(&malformed_path, serde_json::to_vec(&malformed).unwrap()).unwrap();
    let out = bin()
        .args(&stores.apply_args("controller-prgs")[2..])
        .arg(&malformed_path)
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("`planned_rows`: rows[2]: needs `digests`") && said.contains("plan again"),
        "{said}"
    );

    let (code, report) = apply_cli(&stores, &older_path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["retired_count"], 3, "{report}");
    let (code, report) = apply_cli(&stores, &path, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["outcome"], "already_retired", "{report}");
    drop(live);
}

/// A realistic registry's plan, every batch of it: each within the blast
/// radius, every candidate of the plan retired or said to be left, and the
/// fleet after it in the plan's words.
#[test]
fn a_realistic_plan_is_retired_batch_after_batch() {
    let stores = realistic_stores(4_000);
    let (plan, doc) = save_plan(&stores);
    let candidates = doc["candidate_count"].as_u64().unwrap() as usize;
    assert!(candidates > 100, "{candidates} candidates");
    let out = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(&plan)
        .args(["--all-batches", "--max-retire", "100"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let batches = report["batches"].as_array().unwrap();
    assert!(batches.len() >= candidates.div_ceil(100), "{report}");
    assert!(batches
        .iter()
        .all(|b| b["retired_count"].as_u64().unwrap() <= 100));
    let retired = report["retired_count"].as_u64().unwrap() as usize;
    assert_eq!(
        retired + report["left"].as_u64().unwrap() as usize,
        candidates
    );
    assert!(
        report["post_apply"]["stale_worker_count"].is_u64(),
        "{report}"
    );
    assert!(report["residual"]["stale_by_reason"].is_array(), "{report}");
}
