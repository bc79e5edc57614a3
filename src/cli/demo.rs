//! `fleet-retire demo`: a small real fleet, end to end, in a temporary
//! directory. Two launches of one client type (five workers each, real
//! child processes) and one legacy worker register; one launch dies; its
//! heartbeats lapse; then snapshot → plan → apply. Everything started is
//! stopped and everything written is removed, whatever happens.
//!
//! It lives in the command line, not the library: it is a story told with
//! the library's parts, and nothing else calls it.

use crate::apply::{apply, Context, Hooks, Request};
use crate::cli::Cli;
use crate::error::{About, Error, ExitCode, Result};
use crate::evidence::probe::SystemProbe;
use crate::evidence::registry;
use crate::launcher::{launch, LaunchRequest, NAMESPACES};
use crate::plan::Plan;
use crate::policy::Policies;
use crate::worker::{heartbeat, register, Registration};
use clap::Args;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Arguments of `demo` (none).
#[derive(Debug, Args)]
pub struct DemoArgs {}

/// Run `demo`.
pub fn run(cli: &Cli, _args: &DemoArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    demo(&policies)?;
    Ok(ExitCode::Ok)
}

const REPO: &str = "prgs/gitea-tools";
const TTL: f64 = 2.0;

/// Children and files the demo owns; dropped on every exit path.
struct Scratch {
    dir: PathBuf,
    children: Vec<Child>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Set by SIGINT or SIGTERM: the demo stops at its next step, and its
/// guard stops the workers and removes the directory.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        let _ = unsafe { sigaction(signal, &action) };
    }
}

fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err(Error::input(
            About::Machine,
            "demo interrupted by a signal; its workers are stopped and its directory removed",
        ));
    }
    Ok(())
}

/// Sleep, but wake for a signal.
fn pause(d: Duration) -> Result<()> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        check_interrupted()?;
        std::thread::sleep(Duration::from_millis(25).min(until - Instant::now()));
    }
    check_interrupted()
}

/// The environment variable that marks the demo's worker processes (its
/// value is the demo's pid), so a test can find any that outlived it.
pub const WORKER_MARK: &str = "FLEET_RETIRE_DEMO_WORKER";

fn spawn_worker(scratch: &mut Scratch) -> Result<u32> {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new("sleep");
    command
        .arg("300")
        .env(WORKER_MARK, std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: between fork and exec only prctl(PR_SET_PDEATHSIG) runs, a
    // single async-signal-safe system call: a worker dies with the demo even
    // when the demo itself is killed with -9.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let child = command.spawn().map_err(|e| {
        Error::input(
            About::Machine,
            format!("demo: cannot start a worker process (`sleep`): {e}"),
        )
    })?;
    let pid = child.id();
    scratch.children.push(child);
    Ok(pid)
}

/// Print a line of the transcript. A closed stdout or a signal stops the
/// demo here, and the guard cleans up on the way out.
fn say(out: &mut String, line: impl AsRef<str>) -> Result<()> {
    check_interrupted()?;
    crate::outln!("{}", line.as_ref())?;
    out.push_str(line.as_ref());
    out.push('\n');
    Ok(())
}

/// The demo's state: its scratch directory and children, the stores in it,
/// and the transcript so far.
struct Demo<'p> {
    scratch: Scratch,
    registry: PathBuf,
    leases: PathBuf,
    profiles: PathBuf,
    policies: &'p Policies,
    probe: SystemProbe,
    out: String,
    /// Each registered worker with its launch (0, 1; 2 is the legacy one).
    workers: Vec<(String, usize)>,
}

/// Run the demo; returns the transcript it printed.
fn demo(policies: &Policies) -> Result<String> {
    catch_signals();
    let started = Instant::now();
    let mut d = Demo::new(policies)?;
    d.register_fleet()?;
    d.kill_second_launch()?;
    d.snapshot()?;
    let planned = d.plan()?;
    d.apply(&planned)?;
    d.say(
        "\nRetiring stale rows does not make the fleet safe by itself: the live legacy worker still \
         needs a relaunch through `fleet-retire launch`.",
    )?;
    let dir = d.scratch.dir.clone();
    let mut out = std::mem::take(&mut d.out);
    drop(d);
    say(
        &mut out,
        format!(
            "(demo finished in {:.1} s; its processes are stopped and {} is removed)",
            started.elapsed().as_secs_f64(),
            dir.display()
        ),
    )?;
    Ok(out)
}

impl<'p> Demo<'p> {
    fn new(policies: &'p Policies) -> Result<Demo<'p>> {
        let dir = std::env::temp_dir().join(format!(
            "fleet-retire-demo-{}-{}",
            std::process::id(),
            crate::evidence::random_hex(4)?
        ));
        std::fs::create_dir_all(&dir).map_err(Error::io(&dir, "demo: cannot create its folder"))?;
        let d = Demo {
            registry: dir.join("registry.sqlite"),
            leases: dir.join("leases.sqlite"),
            profiles: dir.join("profiles.json"),
            scratch: Scratch {
                dir,
                children: Vec::new(),
            },
            policies,
            probe: SystemProbe::new("/proc"),
            out: String::new(),
            workers: Vec::new(),
        };
        std::fs::write(
            &d.profiles,
            r#"{"profiles": {"demo-controller": {"role": "controller", "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]}}}"#,
        )
        .map_err(Error::io(&d.profiles, "demo: cannot write"))?;
        // The registry is created once, as `registry create` does: workers
        // only open an existing one.
        drop(crate::worker::open(&d.registry)?);
        Ok(d)
    }

    fn say(&mut self, line: impl AsRef<str>) -> Result<()> {
        say(&mut self.out, line)
    }

    /// Step 1: two launches of five workers, one legacy worker, one lease.
    fn register_fleet(&mut self) -> Result<()> {
        self.say("== 1. Two codex launches and one legacy worker register (real processes, heartbeat TTL 2 s)")?;
        let profiles: std::collections::BTreeMap<String, String> = NAMESPACES
            .iter()
            .map(|ns| (ns.to_string(), format!("{ns}-prgs")))
            .collect();
        for li in 0..2 {
            let doc = launch(&LaunchRequest {
                client: Some("codex".into()),
                profiles: profiles.clone(),
                command: "sleep".into(),
                now: crate::time::now(),
                ..Default::default()
            })?;
            self.say(format!(
                "   launch {}: {}",
                li + 1,
                doc["client_instance_id"].as_str().unwrap_or("")
            ))?;
            for ns in NAMESPACES {
                let env: HashMap<String, String> = doc["mcpServers"][format!("gitea-{ns}")]["env"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect();
                let identity = format!("w-{}-{ns}", li + 1);
                self.register(&identity, ns, env)?;
                self.workers.push((identity, li));
            }
        }
        let mut legacy_env = HashMap::new();
        legacy_env.insert("GITEA_MCP_CLIENT".to_string(), "claude".to_string());
        legacy_env.insert(
            "GITEA_MCP_CLIENT_SESSION".to_string(),
            "sess-legacy".to_string(),
        );
        let legacy_pid = self.register("w-legacy-author", "author", legacy_env)?;
        self.workers.push(("w-legacy-author".into(), 2));
        self.say(format!("   legacy worker w-legacy-author (pid {legacy_pid}) has no launcher-minted instance id"))?;
        // An active lease held by one worker of the launch that is about to die.
        crate::store::sqlite::leases::create_with_one_active(&self.leases, "w-2-merger")?;
        self.say("   an active workflow lease is held by w-2-merger")
    }

    /// Start a worker process and register it; returns its pid.
    fn register(&mut self, identity: &str, ns: &str, env: HashMap<String, String>) -> Result<u32> {
        let pid = spawn_worker(&mut self.scratch)?;
        register(
            &self.registry,
            Path::new("/proc"),
            &Registration {
                worker_identity: Some(identity.to_string()),
                namespace: ns.to_string(),
                pid: i64::from(pid),
                ttl_seconds: TTL,
                repository_binding: Some(REPO.into()),
                // The legacy worker predates the remote binding.
                remote: (!identity.starts_with("w-legacy")).then(|| "prgs".into()),
                env,
                ..Default::default()
            },
        )?;
        Ok(pid)
    }

    /// Step 2: launch 2's processes die; the others heartbeat past the TTL.
    fn kill_second_launch(&mut self) -> Result<()> {
        self.say("\n== 2. Launch 2 dies; launch 1 and the legacy worker keep heartbeating")?;
        for child in self.scratch.children.iter_mut().skip(5).take(5) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let until = Instant::now() + Duration::from_millis((TTL * 1000.0) as u64 + 1200);
        while Instant::now() < until {
            for (w, li) in &self.workers {
                if *li != 1 {
                    heartbeat(&self.registry, w, crate::worker::Writer::Owner)?;
                }
            }
            pause(Duration::from_millis(400))?;
        }
        self.say("   launch 2's heartbeats have lapsed")
    }

    /// Step 3: the fleet snapshot.
    fn snapshot(&mut self) -> Result<()> {
        let rows = registry::load(&self.registry)?;
        let snap = crate::snapshot::snapshot(
            &rows,
            &crate::snapshot::Options {
                now: crate::time::now(),
                canonical_repository: Some(REPO.into()),
                ..Default::default()
            },
            &self.probe,
        );
        self.say("\n== 3. Snapshot")?;
        for line in crate::report::snapshot_summary(
            &snap,
            None,
            &crate::report::PlanWords::Not(String::new()),
        )
        .lines()
        {
            self.say(format!("   {line}"))?;
        }
        Ok(())
    }

    /// Step 4: the dry run.
    fn plan(&mut self) -> Result<Plan> {
        self.say("\n== 4. Plan (dry run, decided by policies/retirement.cedar)")?;
        let planned = crate::plan::plan_from_files(
            &self.registry,
            &self.leases,
            Path::new("/proc"),
            REPO.into(),
            self.policies,
        )?;
        let table = crate::report::plan_table(&planned, &self.policies.source_label(), None, None);
        for line in table.lines() {
            self.say(format!("   {line}"))?;
        }
        Ok(planned)
    }

    /// Step 5: apply what the plan approved.
    fn apply(&mut self, planned: &Plan) -> Result<()> {
        self.say("\n== 5. Apply as demo-controller (one guarded transaction)")?;
        let req = Request {
            registry_fingerprint: planned.registry_fingerprint.clone(),
            candidate_fingerprint: planned.candidate_fingerprint.clone(),
            policy_fingerprint: planned.policy_fingerprint.clone(),
            workers: planned.candidates().map(|e| planned.identity(e)).collect(),
            canonical_repository: Some(REPO.into()),
            max_retire: 100,
            planned: None,
            first: None,
            scope: None,
            skip_fleet_summary: false,
            controller: None,
        };
        let report = apply(
            &req,
            &Context {
                registry: &self.registry,
                leases: &self.leases,
                profiles: &self.profiles,
                profile: "demo-controller",
                proc_root: Path::new("/proc"),
                policies: self.policies,
                probe: &self.probe,
                busy_timeout: Duration::from_secs(5),
            },
            Hooks::default(),
        )?;
        for line in crate::report::apply_summary(&report, None).lines() {
            self.say(format!("   {line}"))?;
        }
        Ok(())
    }
}
