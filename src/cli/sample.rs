//! `fleet-retire registry sample --out DIR`: a small registry to try `plan`
//! on, made for this machine.
//!
//! A static sample cannot show a candidate anywhere: the tool proves a
//! worker dead only on the host, boot and pid namespace that registered it
//! (docs/semantics.md §3, §12, §15), and a file in the repository names
//! somebody else's. So the sample is written here and now: its rows carry
//! this host's name, this boot's id and this process's pid namespace, and
//! pids above the kernel's hard limit (2^22), which no process can hold
//! (`kill(pid, 0)` answers ESRCH: dead, wherever it runs). Two are
//! candidates; each other row is kept for one reason a reader can look up.

use crate::error::{About, Error, ExitCode, Result};
use crate::evidence::probe::HostFacts;
use clap::Args;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

/// Arguments of `registry sample`.
#[derive(Debug, Args)]
pub struct SampleArgs {
    /// The folder to write registry.sqlite, leases.sqlite and profiles.json
    /// into (made if missing; files of those names must not exist yet).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// PID_MAX_LIMIT on 64-bit Linux: no pid is this large or larger.
const NO_PID: i64 = 4_194_304;
const REPO: &str = "prgs/gitea-tools";

/// Each sample row: identity, namespace, then what makes it what it is.
fn rows(host: &HostFacts, now: crate::time::Micros) -> Vec<Json> {
    let ts = |ago_s: i64| crate::time::format_ts(now - ago_s * 1_000_000);
    let instance = crate::launcher::generate_client_instance_id(
        Some("codex"),
        now - 7200 * 1_000_000,
        "sample",
    );
    let row = |n: i64, identity: &str, namespace: &str, heartbeat_ago: i64| {
        json!({
            "worker_identity": identity, "client_name": "codex",
            "client_instance_id": instance, "instance_id_source": "launcher",
            "instance_id_provenance": "trusted_launcher", "session_id": "sess-sample",
            "generation_id": format!("gen-sample-{n}"), "role": namespace,
            "profile": format!("{namespace}-prgs"), "namespace": namespace, "remote": "prgs",
            "repository_binding": REPO, "transport": "stdio", "pid": NO_PID + n,
            "started_at": ts(7200), "last_heartbeat_at": ts(heartbeat_ago),
            "heartbeat_ttl_seconds": 900, "fencing_epoch": 1, "status": "active",
            "host_id": host.host_id, "boot_id": host.boot_id,
            "process_start_time": format!("ticks-{}", 1000 + n),
            "pid_namespace": host.pid_namespace,
        })
    };
    let mut released = row(3, "w-sample-merger-old", "merger", 5400);
    released["status"] = json!("released");
    let mut legacy = row(4, "w-sample-legacy", "reviewer", 3600);
    legacy["client_instance_id"] = json!(format!("legacy-pid-{}", NO_PID + 4));
    legacy["instance_id_source"] = json!("pid_fallback");
    legacy["instance_id_provenance"] = json!("legacy_incomplete");
    let mut foreign = row(5, "w-sample-foreign", "merger", 3600);
    foreign["repository_binding"] = json!("someone/else");
    let mut elsewhere = row(7, "w-sample-elsewhere", "controller", 3600);
    elsewhere["host_id"] = json!("another-host.example");
    vec![
        row(1, "w-sample-author", "author", 3600),
        row(2, "w-sample-reviewer", "reviewer", 3600),
        released,
        legacy,
        foreign,
        row(6, "w-sample-leased", "reconciler", 3600),
        elsewhere,
        row(8, "w-sample-fresh", "controller", 60),
    ]
}

const PROFILES: &str = r#"{"profiles": {
  "controller-prgs": {"role": "controller",
                      "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
  "reconciler-prgs": {"role": "reconciler", "allowed_operations": ["gitea.read"]},
  "author-prgs": {"role": "author", "allowed_operations": ["gitea.read", "gitea.write"]}
}}
"#;

/// Run `registry sample`.
pub fn run(args: &SampleArgs) -> Result<ExitCode> {
    let host = HostFacts::observe(Path::new("/proc"));
    if host.host_id.is_none() || host.boot_id.is_none() {
        return Err(Error::input(
            About::Machine,
            "this machine's host name or boot id cannot be read (/proc/sys/kernel/random/boot_id), \
             so no row can be proven dead here and the sample would show no candidate",
        ));
    }
    let dir = &args.out;
    std::fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create the sample's folder"))?;
    let (registry, leases, profiles) = (
        dir.join("registry.sqlite"),
        dir.join("leases.sqlite"),
        dir.join("profiles.json"),
    );
    for path in [&registry, &leases, &profiles] {
        if std::fs::symlink_metadata(path).is_ok() {
            return Err(Error::input(
                About::File(path.clone()),
                format!(
                    "{} exists already; `registry sample` writes new files only: name another \
                     folder",
                    crate::text::esc(&path.display().to_string())
                ),
            ));
        }
    }
    drop(crate::worker::open(&registry)?);
    let mut store = crate::store::open::engine(&registry)?.worker_rows()?;
    let written = rows(&host, crate::time::now());
    for row in &written {
        if let Json::Object(columns) = row {
            store.insert(columns)?;
        }
    }
    crate::store::sqlite::leases::create_with_one_active(&leases, "w-sample-leased")?;
    std::fs::write(&profiles, PROFILES).map_err(Error::io(&profiles, "cannot write"))?;
    crate::outln!("{}", note(dir, &host, written.len()))?;
    Ok(ExitCode::Ok)
}

/// What was written, and the plan to try.
fn note(dir: &Path, host: &HostFacts, rows: usize) -> String {
    let at = |name: &str| {
        crate::text::shell_word(&crate::text::esc(&dir.join(name).display().to_string()))
            .into_owned()
    };
    format!(
        "wrote a sample fleet of {rows} rows for this host ({}, boot {}) into {}: two of its \
         workers are stale and provably dead here, the others are kept for one reason each.\n\
         Plan it (a dry run, it writes nothing):\n  fleet-retire plan --registry {} --leases {} \
         --canonical-repository {REPO} --profiles {} --profile controller-prgs --limit 10",
        crate::text::esc(host.host_id.as_deref().unwrap_or("")),
        crate::text::esc(host.boot_id.as_deref().unwrap_or("")),
        crate::text::esc(&dir.display().to_string()),
        at("registry.sqlite"),
        at("leases.sqlite"),
        at("profiles.json"),
    )
}
