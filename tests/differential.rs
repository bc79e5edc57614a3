//! Differential check against the seed itself: random registries are judged
//! by the seed's own planner (run with Python from ../shared/seed) and the
//! resulting fixtures must pass `fleet-retire test`, tokens included.
//! Skipped, saying so, where Python or the seed is not available.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Run a generator under `tests/differential/` against the seed with
/// `args`; `None` (after saying why) where the seed or Python is missing.
fn generate(script: &str, args: &[&std::ffi::OsStr]) -> Option<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let seed: PathBuf = root.join("../shared/seed");
    if !seed.join("mcp_fleet_retirement.py").is_file() {
        eprintln!("skipped: ../shared/seed is not here");
        return None;
    }
    if !Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("skipped: python3 is not installed");
        return None;
    }
    let gen = Command::new("python3")
        .arg(root.join("tests/differential").join(script))
        .arg(&seed)
        .args(args)
        .args(["20261129", "300"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    assert!(
        gen.status.success(),
        "generator failed: {}",
        String::from_utf8_lossy(&gen.stderr)
    );
    Some(())
}

#[test]
fn random_registries_get_the_seeds_verdicts_and_tokens() {
    let out = tempfile::tempdir().unwrap();
    if generate("generate.py", &[out.path().as_os_str()]).is_none() {
        return;
    }
    let run = Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .arg("test")
        .arg(out.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        text.lines()
            .filter(|l| !l.starts_with("PASS"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(text.lines().any(|l| l == "300 passed, 0 failed"), "{text}");
}

/// The snapshot's findings, counts and consistency token against the seed's
/// `snapshot_instance_fleet`, except session collisions, where semantics §11
/// deliberately differs.
#[test]
fn random_fleets_get_the_seeds_snapshot_findings() {
    use fleet_retire::evidence::probe::{GivenProbe, PidObservation};
    use fleet_retire::row::Row;
    use fleet_retire::snapshot::{snapshot, Options};
    use serde_json::Value;

    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("cases.json");
    if generate("snapshot_cases.py", &[file.as_os_str()]).is_none() {
        return;
    }
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let name = |x: &Value| match x {
        Value::String(s) => s.clone(),
        Value::Null => "None".into(),
        o => o.to_string(),
    };
    let key = |cls: &Value, ws: &Value, is: &Value| {
        let mut w: Vec<String> = ws.as_array().unwrap().iter().map(name).collect();
        w.sort();
        let mut i: Vec<String> = is.as_array().unwrap().iter().map(name).collect();
        i.sort();
        (cls.as_str().unwrap().to_string(), w, i)
    };
    for (n, c) in cases.iter().enumerate() {
        let rows: Vec<Row> = c["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| Row::from_json(r.as_object().unwrap()).unwrap())
            .collect();
        let mut probe = GivenProbe::default();
        for (pid, alive) in c["alive"].as_object().unwrap() {
            probe.processes.insert(
                pid.parse().unwrap(),
                PidObservation {
                    alive: alive.as_bool(),
                    start_time: None,
                },
            );
        }
        let opts = Options {
            now: fleet_retire::time::parse_ts("2026-07-30T12:00:00Z").unwrap(),
            canonical_repository: Some("o/r".into()),
            expected_live_revision: Some("r1".into()),
            manifest: c["manifest"].as_array().cloned(),
        };
        let s = snapshot(&rows, &opts, &probe);
        let mut ours: Vec<_> = s["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                key(
                    &f["classification"],
                    &f["worker_identities"],
                    &f["client_instance_ids"],
                )
            })
            .filter(|k| k.0 != "session_identity_collision")
            .collect();
        let mut theirs: Vec<_> = c["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| key(&f[0], &f[1], &f[2]))
            .filter(|k| k.0 != "session_identity_collision")
            .collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "case {n}: {}", c["rows"]);
        assert_eq!(s["live_worker_count"], c["live"], "case {n}");
        assert_eq!(s["stale_worker_count"], c["stale"], "case {n}");
        assert_eq!(s["historical_worker_count"], c["hist"], "case {n}");
        assert_eq!(s["consistency_token"], c["token"], "case {n}");
    }
}
