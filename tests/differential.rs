//! Differential check against the seed itself: random registries are judged
//! by the seed's own planner (run with Python from ../shared/seed) and the
//! resulting fixtures must pass `fleet-retire test`, tokens included.
//! Skipped, saying so, where Python or the seed is not available.

use std::path::Path;
use std::process::Command;

#[test]
fn random_registries_get_the_seeds_verdicts_and_tokens() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let seed = root.join("../shared/seed");
    if !seed.join("mcp_fleet_retirement.py").is_file() {
        eprintln!("skipped: ../shared/seed is not here");
        return;
    }
    if !Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let gen = Command::new("python3")
        .arg(root.join("tests/differential/generate.py"))
        .arg(&seed)
        .arg(out.path())
        .args(["20261129", "300"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    assert!(
        gen.status.success(),
        "generator failed: {}",
        String::from_utf8_lossy(&gen.stderr)
    );
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
