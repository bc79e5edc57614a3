//! Simulated hosts, as the tests make them (`tests/common/hosts.rs`): a
//! command runs in a UTS namespace whose kernel node name is the host's.
//! No flag or variable names a host; the boot id is this machine's.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_fleet-retire");

/// The stores and profiles every command of the bench uses.
pub struct Stores<'a> {
    pub url: &'a str,
    pub profiles: &'a Path,
}

/// fleet-retire `args` as host `host`, with the stores and the
/// controller's profile (not started yet).
pub fn command(host: &str, args: &[&str], s: &Stores) -> Command {
    let script = format!(
        "hostname {host} && exec \"$BIN\" \"$@\" --registry \"$R\" --leases \"$R\" \
         --profiles \"$P\" --profile controller-prgs"
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--uts", "sh", "-c", &script, "sh"])
        .args(args)
        .env("BIN", BIN)
        .env("R", s.url)
        .env("P", s.profiles);
    cmd
}

/// A plan of `host`, scoped or whole, output discarded: wall time and
/// peak RSS (KiB).
pub fn measure_plan(host: &str, s: &Stores, scoped: bool) -> (Duration, i64) {
    let mut args = vec![
        "plan",
        "--format",
        "json",
        "--canonical-repository",
        "prgs/gitea-tools",
    ];
    if scoped {
        args.extend(["--scope", "host"]);
    }
    let mut cmd = command(host, &args, s);
    cmd.stdout(Stdio::null());
    let (took, rss, ok) = crate::common::measure(&mut cmd);
    assert!(ok, "{cmd:?} failed");
    (took, rss)
}

/// `host`'s scoped plan saved to `out`: its candidates' count.
pub fn save_plan(host: &str, s: &Stores, out: &Path) -> usize {
    let o = command(
        host,
        &[
            "plan",
            "--format",
            "json",
            "--canonical-repository",
            "prgs/gitea-tools",
            "--scope",
            "host",
            "--out",
            out.to_str().unwrap(),
        ],
        s,
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "plan as {host}: {}", text(&o));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    plan["candidate_worker_identities"]
        .as_array()
        .map_or(0, Vec::len)
}

/// `host`'s apply of the saved plan `plan`, all its candidates in one
/// transaction: the JSON report.
pub fn apply(host: &str, s: &Stores, plan: &Path, max: usize) -> serde_json::Value {
    let o = command(
        host,
        &[
            "apply",
            plan.to_str().unwrap(),
            "--format",
            "json",
            "--max-retire",
            &max.to_string(),
        ],
        s,
    )
    .output()
    .unwrap();
    // With FLEET_RETIRE_LOG=debug, the apply's own timings (its log).
    if std::env::var_os("FLEET_RETIRE_LOG").is_some() {
        eprint!("{}", String::from_utf8_lossy(&o.stderr));
    }
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("apply as {host} printed no JSON: {}", text(&o)))
}

/// A command's output, both streams.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
