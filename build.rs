//! Decides, when the tests are built, which of their outside dependencies
//! this machine has, so that a test that cannot run here is compiled as
//! `#[ignore]` with the reason (`cargo test` ends with "N ignored", and
//! `cargo test -- --ignored --list` names them) instead of passing having
//! run nothing. Under `CI=true` every dependency counts as present: the
//! tests run and fail when one is missing, since `.ci/run` installs them.
//!
//! The checks are cheap and rerun only when what they read changes: the
//! environment variables below, `PATH`, and the MCP client folder (where
//! `npm ci` installs the TypeScript SDK) and the validators' folder. After installing Python's `mcp`
//! package, `touch build.rs` to have it found.

use std::path::Path;
use std::process::{Command, Stdio};

/// The cfg names the tests use, and whether each holds here.
fn checks(ci: bool) -> [(&'static str, bool); 10] {
    [
        (
            "fr_postgres",
            ci || std::env::var_os("FLEET_RETIRE_TEST_POSTGRES").is_some(),
        ),
        (
            "fr_patroni",
            ci || ["patroni", "etcd", "curl"].iter().all(|t| on_path(t)),
        ),
        ("fr_python_mcp", ci || python_mcp()),
        (
            "fr_node_sdk",
            ci || Path::new("tests/mcp_client/node_modules/@modelcontextprotocol/sdk").is_dir(),
        ),
        ("fr_cvc5", ci || on_path("cvc5")),
        ("fr_promtool", ci || on_path("promtool")),
        ("fr_prometheus", ci || on_path("prometheus")),
        ("fr_systemd_analyze", ci || on_path("systemd-analyze")),
        // Debian's `faketime` package (with `libfaketime`, which the clock
        // test preloads into a controller).
        ("fr_faketime", ci || on_path("faketime")),
        (
            "fr_chromium",
            ci || (Path::new("tests/validators/node_modules/puppeteer-core").is_dir()
                && std::env::var_os("CHROMIUM")
                    .map_or(Path::new("/usr/bin/chromium").is_file(), |c| {
                        Path::new(&c).is_file()
                    })),
        ),
    ]
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

fn python_mcp() -> bool {
    Command::new("python3")
        .args(["-c", "import mcp.client.stdio"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    for var in ["CI", "FLEET_RETIRE_TEST_POSTGRES", "PATH", "CHROMIUM"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    println!("cargo::rerun-if-changed=build.rs");
    // The folder as a whole: `npm ci` adding `node_modules` changes it.
    println!("cargo::rerun-if-changed=tests/mcp_client");
    println!("cargo::rerun-if-changed=tests/validators");
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    for (name, present) in checks(ci) {
        println!("cargo::rustc-check-cfg=cfg({name})");
        if present {
            println!("cargo::rustc-cfg={name}");
        }
    }
}
