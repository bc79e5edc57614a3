//! `fleet-retire serve`: the MCP server a launcher starts for a namespace.
//!
//! The capability policies protect something only where the caller cannot
//! choose who it is. Here everything that decides that is bound when the
//! server starts, from its command line and environment: the registry, the
//! lease store, `profiles.json`, the profile, the policy set and the
//! canonical repository. No tool argument can name any of them (each tool's
//! input schema, and the parser behind it, refuse unknown fields), except
//! that a tool may restate the bound repository for the seed's callers; a
//! call naming another is refused (`repository_not_bound`). The raw request
//! lines are checked before rmcp parses them (`strict`): a key given twice
//! in one object is refused rather than read as its last value. The
//! capability is decided by `capabilities.cedar` at every call, from a fresh
//! read of `profiles.json`, and apply re-reads it before every write.
//!
//! The server is itself a worker: it registers its own row on start,
//! heartbeats it on a timer well inside its TTL, and releases it when its
//! stdin closes or it receives SIGTERM or SIGINT. Killed with -9, it leaves
//! an active row whose heartbeat lapses, which a later plan judges.
//!
//! It keeps the rows of the last few plans it issued, so an apply made a
//! minute later in a heartbeating fleet is judged row by row
//! (`crate::plan::planned`) rather than refused for every heartbeat.
//!
//! The folder, in the order a call meets it: `strict` (the request lines,
//! checked before rmcp parses them), `handler` (rmcp's side: list and
//! dispatch), `schemas` (the tools as `tools/list` shows them), `args` (a
//! call's arguments, parsed with unknown fields refused), `tools` (what
//! each tool does, on a blocking thread), `results` (tool results and
//! refusals with their reason codes); `lifecycle` is the server as a
//! worker: register, heartbeat, release.

mod args;
mod as_text;
mod cursor;
mod handler;
mod kept;
mod lifecycle;
mod pages;
pub mod plan_dir;
mod plan_tool;
mod results;
mod schemas;
mod snapshot_tool;
mod strict;
mod tools;

pub use lifecycle::run;
pub use pages::RESULT_BOUND;
pub use schemas::tools;
pub use tools::FleetServer;

use crate::policy::Policies;
use std::path::PathBuf;
use std::time::Duration;

/// What a server is bound to at launch.
#[derive(Debug)]
pub struct Binding {
    /// The worker registry.
    pub registry: PathBuf,
    /// The lease store.
    pub leases: PathBuf,
    /// `profiles.json`, read afresh at every call.
    pub profiles: PathBuf,
    /// The operator profile this server acts as.
    pub profile: String,
    /// The policy set (built-in, or a folder; apply needs it pinned).
    pub policies: Policies,
    /// The canonical repository. A tool may restate it, never name
    /// another; without one, plan and apply refuse to run.
    pub canonical_repository: Option<String>,
    /// `/proc`.
    pub proc_root: PathBuf,
    /// How long apply waits for a locked registry.
    pub busy_timeout: Duration,
    /// Apply's blast-radius limit.
    pub max_retire: usize,
    /// Where the rows of the plans issued are kept for the servers after
    /// this one (a client that starts a server per call); `None`: in
    /// memory only.
    pub plan_dir: Option<plan_dir::PlanDir>,
}

/// How the server lives as a worker.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    /// Its namespace (author, reviewer, merger, controller, reconciler).
    pub namespace: String,
    /// The heartbeat TTL it registers with, in seconds.
    pub ttl_seconds: f64,
    /// How often it heartbeats.
    pub interval: Duration,
}

/// How many issued plans a server remembers (by registry token).
pub const KEEP_PLANS: usize = 8;
