//! Process and host probes (docs/semantics.md §3).
//!
//! `pid_alive` is `kill(pid, 0)`: success or `EPERM` → alive, `ESRCH` → dead,
//! anything else → unknown. Only a positive SQLite/JSON integer is a pid;
//! text `"4242"` and real `4242.0` are unknown, and so is their start time.

use crate::value::Val;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What a probe says about one pid.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PidObservation {
    /// `Some(true)` alive, `Some(false)` gone, `None` unknown.
    pub alive: Option<bool>,
    /// Start time of whatever holds the number now (`ticks-<n>`), if known.
    pub start_time: Option<String>,
}

/// Something that can answer for pids: the live system, or a fixture's
/// given answers.
pub trait ProcessProbe: Sync {
    /// Probe one positive pid.
    fn observe(&self, pid: i64) -> PidObservation;
}

/// Probe a registry pid value; non-integers and non-positive integers are
/// unknown without asking.
pub fn observe_pid(value: Val<'_>, probe: &dyn ProcessProbe) -> PidObservation {
    match value {
        Val::Int(pid) if pid > 0 => probe.observe(pid),
        _ => PidObservation::default(),
    }
}

/// The live process table, read through `kill(2)` and a `/proc` root.
#[derive(Debug, Clone)]
pub struct SystemProbe {
    proc_root: PathBuf,
}

impl SystemProbe {
    /// Probe with the given `/proc` root (normally `/proc`).
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        SystemProbe {
            proc_root: proc_root.into(),
        }
    }
}

impl ProcessProbe for SystemProbe {
    fn observe(&self, pid: i64) -> PidObservation {
        let alive = pid_alive(pid);
        let start_time = match alive {
            Some(true) => process_start_time(&self.proc_root, pid),
            _ => None,
        };
        PidObservation { alive, start_time }
    }
}

/// `kill(pid, 0)` as docs/semantics.md §3 reads it.
pub fn pid_alive(pid: i64) -> Option<bool> {
    use nix::errno::Errno;
    let Ok(raw) = i32::try_from(pid) else {
        return None;
    };
    if raw <= 0 {
        return None;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Ok(()) => Some(true),
        Err(Errno::ESRCH) => Some(false),
        Err(Errno::EPERM) => Some(true),
        Err(_) => None,
    }
}

/// Field 22 of `<proc_root>/<pid>/stat`, as `ticks-<n>`; `None` when it
/// cannot be read. The command name may hold spaces and parentheses, so
/// fields are counted from the last `)`.
pub fn process_start_time(proc_root: &Path, pid: i64) -> Option<String> {
    if pid <= 0 {
        return None;
    }
    let raw = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let close = raw.rfind(')')?;
    let value = raw[close + 1..].split_whitespace().nth(19)?;
    Some(format!("ticks-{value}"))
}

/// The host's own fencing facts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostFacts {
    /// Kernel node name, if known.
    pub host_id: Option<String>,
    /// Current boot id, if known.
    pub boot_id: Option<String>,
    /// The prober's pid namespace (`pid:[<inode>]`, the target of
    /// `/proc/self/ns/pid`), if known. `kill(2)` and `/proc` see only the
    /// processes of this namespace and its descendants.
    pub pid_namespace: Option<String>,
    /// Whether process start times can be read here (this process's own
    /// `<proc_root>/<pid>/stat`); reported, never decided on.
    pub start_time_probe_available: bool,
}

/// The kernel's fixed inode for the initial pid namespace: a prober there
/// sees every pid of the host.
pub const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// The target of `<proc_root>/self/ns/pid` (`pid:[4026531836]`), if readable.
pub fn own_pid_namespace(proc_root: &Path) -> Option<String> {
    std::fs::read_link(proc_root.join("self/ns/pid"))
        .ok()
        .and_then(|t| t.to_str().map(|s| s.trim().to_string()))
        .filter(|s| !s.is_empty())
}

impl HostFacts {
    /// Observe this machine: `uname().nodename`,
    /// `<proc_root>/sys/kernel/random/boot_id` and `<proc_root>/self/ns/pid`.
    pub fn observe(proc_root: &Path) -> HostFacts {
        let host_id = nix::sys::utsname::uname()
            .ok()
            .and_then(|u| u.nodename().to_str().map(|s| s.trim().to_string()))
            .filter(|s| !s.is_empty());
        let boot_id = std::fs::read_to_string(proc_root.join("sys/kernel/random/boot_id"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        HostFacts {
            host_id,
            boot_id,
            pid_namespace: own_pid_namespace(proc_root),
            start_time_probe_available: process_start_time(
                proc_root,
                i64::from(std::process::id()),
            )
            .is_some(),
        }
    }
}

/// Given answers (fixtures): a pid that is not listed is dead.
#[derive(Debug, Clone, Default)]
pub struct GivenProbe {
    /// pid → observation.
    pub processes: HashMap<i64, PidObservation>,
}

impl ProcessProbe for GivenProbe {
    fn observe(&self, pid: i64) -> PidObservation {
        self.processes.get(&pid).cloned().unwrap_or(PidObservation {
            alive: Some(false),
            start_time: None,
        })
    }
}

/// A probe that remembers every answer it gave, so the same answers can be
/// given again (`policy diff` judges one registry under two policy sets on
/// one set of probes; `fixture capture` writes them into the case).
pub struct RecordingProbe<'a> {
    inner: &'a dyn ProcessProbe,
    seen: std::sync::Mutex<HashMap<i64, PidObservation>>,
}

impl<'a> RecordingProbe<'a> {
    /// Record what `inner` answers.
    pub fn new(inner: &'a dyn ProcessProbe) -> Self {
        RecordingProbe {
            inner,
            seen: Default::default(),
        }
    }

    /// The answers given so far, as a probe that gives them again.
    pub fn given(&self) -> GivenProbe {
        GivenProbe {
            processes: self.seen.lock().map(|m| m.clone()).unwrap_or_default(),
        }
    }
}

impl ProcessProbe for RecordingProbe<'_> {
    fn observe(&self, pid: i64) -> PidObservation {
        if let Some(known) = self.seen.lock().ok().and_then(|m| m.get(&pid).cloned()) {
            return known;
        }
        let answer = self.inner.observe(pid);
        if let Ok(mut m) = self.seen.lock() {
            m.insert(pid, answer.clone());
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_with_a_start_time() {
        let me = std::process::id() as i64;
        assert_eq!(pid_alive(me), Some(true));
        let st = process_start_time(Path::new("/proc"), me).expect("own start time");
        assert!(st.starts_with("ticks-") && st.len() > 6, "{st}");
    }

    #[test]
    fn non_integer_pids_are_unknown_without_probing() {
        let probe = GivenProbe::default();
        assert_eq!(observe_pid(Val::Text("1"), &probe).alive, None);
        assert_eq!(observe_pid(Val::Real(1.0), &probe).alive, None);
        assert_eq!(observe_pid(Val::Int(0), &probe).alive, None);
        assert_eq!(observe_pid(Val::Int(-5), &probe).alive, None);
        assert_eq!(observe_pid(Val::Int(77), &probe).alive, Some(false));
    }

    #[test]
    fn start_time_is_read_after_the_last_parenthesis() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("42")).unwrap();
        let stat = "42 (a) b (c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 20 21";
        std::fs::write(dir.path().join("42/stat"), stat).unwrap();
        assert_eq!(
            process_start_time(dir.path(), 42).as_deref(),
            Some("ticks-777")
        );
        assert_eq!(process_start_time(dir.path(), 43), None);
    }
}
