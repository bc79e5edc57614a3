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

/// `fleet-retire test DIR` passes every one of the 300 generated cases.
fn all_300_pass(dir: &Path) {
    let run = Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
        .arg("test")
        .arg(dir)
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
    assert!(
        text.lines().any(|l| l == "300 passed, 0 failed, 0 errors"),
        "{text}"
    );
}

#[test]
fn random_registries_get_the_seeds_verdicts_and_tokens() {
    let out = tempfile::tempdir().unwrap();
    if generate("generate.py", &[out.path().as_os_str()]).is_none() {
        return;
    }
    all_300_pass(out.path());
}

/// The snapshot against the seed's own `snapshot_instance_fleet`, with our
/// session rule (docs/fixtures.md, "Snapshot cases") applied to its output: random registries
/// (edge values included) become snapshot fixtures, which must pass
/// `fleet-retire test`, consistency tokens included.
#[test]
fn random_fleets_get_the_seeds_snapshot() {
    let out = tempfile::tempdir().unwrap();
    if generate(
        "snapshot_fixtures.py",
        &[out.path().as_os_str(), std::ffi::OsStr::new("random")],
    )
    .is_none()
    {
        return;
    }
    all_300_pass(out.path());
}
