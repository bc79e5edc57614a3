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

use crate::apply::{apply, parse_workers, Context, Hooks, Outcome, Request};
use crate::capability::{check, Profiles};
use crate::error::{About, Error, ExitCode, Result};
use crate::evidence::probe::SystemProbe;
use crate::plan::planned::PlannedRows;
use crate::policy::Policies;
use crate::worker::{heartbeat, register, release, Registration, Writer};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value as Json};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod strict;

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

struct Issued {
    rows: Arc<PlannedRows>,
}

/// The MCP server handler.
#[derive(Clone)]
pub struct FleetServer {
    binding: Arc<Binding>,
    issued: Arc<Mutex<VecDeque<Issued>>>,
}

/// A tool's operation: the capability operation it asks for.
use crate::capability::Operation as Op;

const TOOL_NAMES: &[(&str, Op)] = &[
    ("snapshot_instance_fleet", Op::Snapshot),
    ("plan_stale_worker_retirement", Op::Plan),
    ("apply_stale_worker_retirement", Op::Apply),
];

fn op_of(name: &str) -> Option<Op> {
    let base = name.strip_prefix("gitea_").unwrap_or(name);
    TOOL_NAMES
        .iter()
        .find(|(n, _)| *n == base)
        .map(|(_, op)| *op)
}

fn audit_properties() -> Json {
    json!({
        "remote": {"type": "string", "description": "Audit context: the remote (e.g. prgs)."},
        "host": {"type": "string", "description": "Audit context: host override."},
        "org": {"type": "string", "description": "Audit context: organisation override."},
        "repo": {"type": "string", "description": "Audit context: repository override."},
    })
}

fn schema(mut props: Json, required: &[&str]) -> Arc<JsonObject> {
    if let (Json::Object(p), Json::Object(audit)) = (&mut props, audit_properties()) {
        p.extend(audit);
    }
    let schema = json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    });
    match schema {
        Json::Object(o) => Arc::new(o),
        _ => unreachable!("a schema is an object"),
    }
}

fn canonical_property() -> Json {
    json!({"type": "string", "minLength": 1,
           "description": "The server's own repository binding (OWNER/REPO), fixed at launch; \
                           may be restated, and any other value is refused (repository_not_bound)."})
}

/// The tools, each under its name and its `gitea_` alias.
pub fn tools() -> Vec<Tool> {
    let snapshot = schema(
        json!({
            "canonical_repository": canonical_property(),
            "expected_revision": {"type": "string", "description": "Workers on another live revision are findings."},
            "expected_manifest": {"type": "array", "description": "The approved fleet manifest.",
                "items": {"type": "object", "required": ["client_instance_id"],
                          "properties": {"client_instance_id": {"type": "string"}}}},
        }),
        &[],
    );
    let plan = schema(json!({"canonical_repository": canonical_property()}), &[]);
    let apply = schema(
        json!({
            "registry_fingerprint": {"type": "string", "description": "The plan's registry_fingerprint."},
            "candidate_fingerprint": {"type": "string", "description": "The plan's candidate_fingerprint."},
            "policy_fingerprint": {"type": "string", "description": "The plan's policy_fingerprint."},
            "worker_identities": {
                "description": "The workers to retire: a list, or a JSON list / comma-separated text.",
                "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]},
            "canonical_repository": canonical_property(),
        }),
        &[
            "registry_fingerprint",
            "candidate_fingerprint",
            "policy_fingerprint",
            "worker_identities",
        ],
    );
    let described = [
        (
            "snapshot_instance_fleet",
            "Read-only: the live fleet, its instances, identity collisions, stale rows and blockers. Controller and reconciler only.",
            snapshot,
        ),
        (
            "plan_stale_worker_retirement",
            "Read-only dry run: every registration is a candidate for retirement or preserved with its reason codes, plus the tokens an apply must present. Controller and reconciler only.",
            plan,
        ),
        (
            "apply_stale_worker_retirement",
            "Mutating: retire exactly the approved workers of a plan in one guarded transaction. Needs gitea.worker_registry.retire on a controller or reconciler profile.",
            apply,
        ),
    ];
    let mut out = Vec::new();
    for (name, description, input) in described {
        for full in [name.to_string(), format!("gitea_{name}")] {
            out.push(Tool::new(full, description, input.clone()));
        }
    }
    out
}

/// Arguments of the plan tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanArgs {
    canonical_repository: Option<String>,
    remote: Option<String>,
    host: Option<String>,
    org: Option<String>,
    repo: Option<String>,
}

/// Arguments of the snapshot tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotArgs {
    canonical_repository: Option<String>,
    expected_revision: Option<String>,
    expected_manifest: Option<Vec<Json>>,
    remote: Option<String>,
    host: Option<String>,
    org: Option<String>,
    repo: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Workers {
    List(Vec<String>),
    Text(String),
}

/// Arguments of the apply tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyArgs {
    registry_fingerprint: String,
    candidate_fingerprint: String,
    policy_fingerprint: String,
    worker_identities: Workers,
    canonical_repository: Option<String>,
    remote: Option<String>,
    host: Option<String>,
    org: Option<String>,
    repo: Option<String>,
}

fn audit_context(
    remote: &Option<String>,
    host: &Option<String>,
    org: &Option<String>,
    repo: &Option<String>,
) -> Json {
    json!({"remote": remote, "host": host, "org": org, "repo": repo})
}

fn parse<T: serde::de::DeserializeOwned>(
    tool: &str,
    args: Option<JsonObject>,
) -> std::result::Result<T, McpError> {
    serde_json::from_value(Json::Object(args.unwrap_or_default())).map_err(|e| {
        McpError::invalid_params(
            format!("{tool}: {e}; see the tool's input schema (tools/list)"),
            None,
        )
    })
}

/// A refusal or failure as a tool result: the reason code, the words, and
/// what to do.
fn tool_error(
    reason_code: &str,
    detail: String,
    what_to_do: &str,
    mut body: Json,
) -> CallToolResult {
    let summary = format!("{reason_code}: {detail} (what to do: {what_to_do})");
    if let Json::Object(o) = &mut body {
        o.insert("reason_code".into(), json!(reason_code));
        o.insert("what_to_do".into(), json!(what_to_do));
        o.entry("detail").or_insert(json!(detail));
    }
    let mut result = CallToolResult::structured_error(body);
    result.content = vec![ContentBlock::text(summary)];
    result
}

fn success(summary: String, body: Json) -> CallToolResult {
    let mut result = CallToolResult::structured(body);
    result.content = vec![ContentBlock::text(summary)];
    result
}

fn error_result(e: &Error) -> CallToolResult {
    let (code, todo) = match e {
        Error::Registry { .. }
        | Error::Sqlite {
            store: crate::error::Store::Registry,
            ..
        } => (
            "registry_unavailable",
            "check the registry this server was started with (FLEET_RETIRE_REGISTRY)",
        ),
        Error::Leases { .. }
        | Error::Sqlite {
            store: crate::error::Store::Leases,
            ..
        } => (
            "lease_store_unavailable",
            "check the lease store this server was started with (FLEET_RETIRE_LEASES)",
        ),
        Error::Profiles { .. } => (
            "profiles_unreadable",
            "fix profiles.json (GITEA_MCP_CONFIG); the next call reads it again",
        ),
        Error::Policy { .. } => (
            "policy_error",
            "the server's policy set is invalid; restart it with a valid one",
        ),
        _ => ("error", "read the detail; the server keeps serving"),
    };
    tool_error(code, e.to_string(), todo, json!({}))
}

/// What an operator does about an apply outcome that is not a success.
fn advice(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::PermissionDenied => "ask the operator to grant gitea.worker_registry.retire to a controller or reconciler profile; an agent cannot change its own profile",
        Outcome::PolicySetNotPinned => "restart the server with the built-in policies, or have the operator pin this set's fingerprint in profiles.json (\"policy_pins\")",
        Outcome::PolicySetMoved | Outcome::RegistryRevisionMoved | Outcome::CandidateSetMoved => "plan again and apply the new plan",
        Outcome::BlastRadiusExceeded => "review the plan and request fewer workers; the limit is the server's --max-retire",
        Outcome::RegistryUntrusted => "the registry holds triggers or views; an operator must inspect and drop them",
        Outcome::RegistryUnavailable | Outcome::LeaseStoreUnavailable => "check the stores this server was started with",
        Outcome::TransactionFailed => "nothing was retired; read the detail, then plan again",
        Outcome::Applied | Outcome::AlreadyRetired | Outcome::NothingRequested => "nothing",
    }
}

fn nonblank(text: Option<String>) -> std::result::Result<Option<String>, McpError> {
    match text {
        None => Ok(None),
        Some(t) => crate::text::nonblank_repository(&t)
            .map(Some)
            .map_err(|e| McpError::invalid_params(format!("canonical_repository: {e}"), None)),
    }
}

impl FleetServer {
    /// A server over a binding.
    pub fn new(binding: Binding) -> FleetServer {
        FleetServer {
            binding: Arc::new(binding),
            issued: Arc::new(Mutex::new(VecDeque::with_capacity(KEEP_PLANS))),
        }
    }

    /// Refuse unless the capability policies allow `operation` now.
    fn capability(&self, operation: Op) -> std::result::Result<(), Box<CallToolResult>> {
        let b = &self.binding;
        let profiles = Profiles::load(&b.profiles).map_err(|e| Box::new(error_result(&e)))?;
        match check(&b.policies, &profiles, &b.profile, operation) {
            Ok(d) if d.allowed => Ok(()),
            Ok(d) => Err(Box::new(tool_error(
                "permission_denied",
                d.explanation,
                "ask the operator to grant it in profiles.json; an agent cannot change its own profile",
                json!({"operation": operation.code(), "profile": b.profile}),
            ))),
            Err(e) => Err(Box::new(error_result(&e))),
        }
    }

    /// The repository this server was bound to at launch, if any. A call
    /// may restate it (the seed's callers do); naming any other is refused,
    /// whether or not the server has one.
    fn bound(
        &self,
        given: Option<String>,
    ) -> std::result::Result<Option<String>, Box<CallToolResult>> {
        let bound = self.binding.canonical_repository.clone();
        match given {
            Some(named) if bound.as_deref() != Some(named.as_str()) => {
                let detail = match &bound {
                    Some(b) => format!(
                        "this server is bound to canonical repository {b:?} at launch; \
                         the call named {named:?}"
                    ),
                    None => format!(
                        "this server was launched without a canonical repository; \
                         the call named {named:?}"
                    ),
                };
                Err(Box::new(tool_error(
                    "repository_not_bound",
                    detail,
                    "leave canonical_repository out or give the bound one; to work on another \
                     repository the operator launches a server bound to it \
                     (FLEET_RETIRE_CANONICAL_REPOSITORY)",
                    json!({"canonical_repository": named, "bound_repository": bound}),
                )))
            }
            _ => Ok(bound),
        }
    }

    /// The bound repository, which plan and apply need.
    fn canonical(&self, given: Option<String>) -> std::result::Result<String, Box<CallToolResult>> {
        self.bound(given)?.ok_or_else(|| {
            Box::new(tool_error(
                "canonical_repository_missing",
                "this server was launched without a canonical repository".into(),
                "the operator restarts the server with FLEET_RETIRE_CANONICAL_REPOSITORY \
                 (--canonical-repository); a tool call cannot choose it",
                json!({}),
            ))
        })
    }

    /// Run one tool call (blocking: SQLite, /proc, Cedar).
    fn call(
        &self,
        op: Op,
        name: &str,
        args: Option<JsonObject>,
    ) -> std::result::Result<CallToolResult, McpError> {
        match op {
            Op::Plan => {
                let a: PlanArgs = parse(name, args)?;
                let canonical = nonblank(a.canonical_repository)?;
                Ok(self.plan(
                    canonical,
                    audit_context(&a.remote, &a.host, &a.org, &a.repo),
                ))
            }
            Op::Snapshot => {
                let a: SnapshotArgs = parse(name, args)?;
                let canonical = nonblank(a.canonical_repository.clone())?;
                Ok(self.snapshot(a, canonical))
            }
            Op::Apply => {
                let a: ApplyArgs = parse(name, args)?;
                let canonical = nonblank(a.canonical_repository.clone())?;
                Ok(self.apply(a, canonical))
            }
        }
    }

    fn plan(&self, canonical: Option<String>, audit: Json) -> CallToolResult {
        if let Err(denied) = self.capability(Op::Plan) {
            return *denied;
        }
        let canonical = match self.canonical(canonical) {
            Ok(c) => c,
            Err(e) => return *e,
        };
        let b = &self.binding;
        let plan = match crate::plan::plan_from_files(
            &b.registry,
            &b.leases,
            &b.proc_root,
            canonical,
            &b.policies,
        ) {
            Ok(p) => p,
            Err(e) => return error_result(&e),
        };
        let mut bytes = Vec::new();
        if let Err(e) = plan.write_json(&mut bytes) {
            return error_result(&Error::Internal {
                doing: "rendering the plan".into(),
                source: Box::new(e),
            });
        }
        let mut body: Json = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => {
                return error_result(&Error::Internal {
                    doing: "rendering the plan".into(),
                    source: Box::new(e),
                })
            }
        };
        body["audit_context"] = audit;
        body["policy_source"] = json!(b.policies.source_label());
        let candidates = plan.candidates().count();
        let summary = format!(
            "{} rows assessed: {} may be retired, {} preserved. registry_fingerprint {}, \
             candidate_fingerprint {}, policy_fingerprint {}",
            plan.entries.len(),
            candidates,
            plan.entries.len() - candidates,
            plan.registry_fingerprint,
            plan.candidate_fingerprint,
            plan.policy_fingerprint
        );
        self.remember(Issued {
            rows: Arc::new(PlannedRows::of(&plan)),
        });
        success(summary, body)
    }

    fn remember(&self, issued: Issued) {
        let mut list = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|i| i.rows.registry_fingerprint != issued.rows.registry_fingerprint);
        if list.len() == KEEP_PLANS {
            list.pop_front();
        }
        list.push_back(issued);
    }

    fn recall(&self, registry_fingerprint: &str) -> Option<Arc<PlannedRows>> {
        let list = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        list.iter()
            .rev()
            .find(|i| i.rows.registry_fingerprint == registry_fingerprint)
            .map(|i| i.rows.clone())
    }

    fn snapshot(&self, a: SnapshotArgs, canonical: Option<String>) -> CallToolResult {
        if let Err(denied) = self.capability(Op::Snapshot) {
            return *denied;
        }
        let canonical = match self.bound(canonical) {
            Ok(c) => c,
            Err(refused) => return *refused,
        };
        let b = &self.binding;
        if let Some(list) = &a.expected_manifest {
            if let Some(i) = list
                .iter()
                .position(|item| !item.get("client_instance_id").is_some_and(Json::is_string))
            {
                return tool_error(
                    "invalid_manifest",
                    format!("expected_manifest[{i}] needs a string client_instance_id"),
                    "fix the manifest",
                    json!({}),
                );
            }
        }
        let rows = match crate::evidence::registry::load(&b.registry) {
            Ok(r) => r,
            Err(e) => return error_result(&e),
        };
        let opts = crate::snapshot::Options {
            now: crate::time::now(),
            canonical_repository: canonical,
            expected_live_revision: a.expected_revision.filter(|r| !r.is_empty()),
            manifest: a.expected_manifest,
            host_id: crate::evidence::probe::HostFacts::observe(&b.proc_root).host_id,
        };
        let mut snap = crate::snapshot::snapshot(&rows, &opts, &SystemProbe::new(&b.proc_root));
        snap["audit_context"] = audit_context(&a.remote, &a.host, &a.org, &a.repo);
        let summary = crate::report::snapshot_summary(&snap);
        success(summary, snap)
    }

    fn apply(&self, a: ApplyArgs, canonical: Option<String>) -> CallToolResult {
        let b = &self.binding;
        // Every plan this server issued used its bound repository, so the
        // recalled rows and the repository always agree.
        let canonical = match self.canonical(canonical) {
            Ok(c) => c,
            Err(refused) => return *refused,
        };
        let workers = match a.worker_identities {
            Workers::List(list) => list,
            Workers::Text(text) => match parse_workers(&text) {
                Ok(list) => list,
                Err(e) => {
                    return tool_error(
                        "invalid_worker_identities",
                        e.to_string(),
                        "pass a list of strings, a JSON list, or comma-separated identities",
                        json!({}),
                    )
                }
            },
        };
        let recalled = self.recall(&a.registry_fingerprint);
        let req = Request {
            registry_fingerprint: a.registry_fingerprint,
            candidate_fingerprint: a.candidate_fingerprint,
            policy_fingerprint: a.policy_fingerprint,
            workers,
            canonical_repository: Some(canonical),
            max_retire: b.max_retire,
            planned: recalled,
        };
        let probe = SystemProbe::new(&b.proc_root);
        let ctx = Context {
            registry: &b.registry,
            leases: &b.leases,
            profiles: &b.profiles,
            profile: &b.profile,
            proc_root: &b.proc_root,
            policies: &b.policies,
            probe: &probe,
            busy_timeout: b.busy_timeout,
        };
        let report = match apply(&req, &ctx, Hooks::default()) {
            Ok(r) => r,
            Err(e) => return error_result(&e),
        };
        let mut body = match serde_json::to_value(&report) {
            Ok(v) => v,
            Err(e) => return error_result(&Error::input(About::ToolCall, e.to_string())),
        };
        body["audit_context"] = audit_context(&a.remote, &a.host, &a.org, &a.repo);
        let code = body["outcome"].as_str().unwrap_or("").to_string();
        if report.outcome.exit_code() == ExitCode::Ok {
            let summary = format!(
                "{code}: retired {} of {} requested worker(s); {}",
                report.retired_count,
                req.workers.len(),
                report.detail
            );
            success(summary, body)
        } else {
            tool_error(&code, report.detail.clone(), advice(report.outcome), body)
        }
    }
}

impl ServerHandler for FleetServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "fleet-retire",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Plan, then apply, the retirement of stale worker registrations. This server's \
                 profile, files, policies and canonical repository are fixed at launch; tool \
                 arguments cannot change them.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let Some(op) = op_of(&name) else {
            return Err(McpError::invalid_params(
                format!("no tool named {name:?}; tools/list names them"),
                None,
            ));
        };
        let server = self.clone();
        let args = request.arguments;
        let result = tokio::task::spawn_blocking(move || {
            let result = server.call(op, &name, args);
            crate::pool::give_back_memory();
            result
        })
        .await
        .map_err(|e| McpError::internal_error(format!("the tool call failed: {e}"), None))??;
        Ok(result.into())
    }
}

/// How a served session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The client closed stdin (or the session ended).
    Closed,
    /// SIGTERM or SIGINT.
    Signal,
    /// The server's own registration is no longer active.
    RegistrationLost,
}

/// Register, serve on stdin/stdout until the client leaves or a signal
/// arrives, heartbeating all along, then release the registration.
pub fn run(binding: Binding, life: Lifecycle) -> Result<ExitCode> {
    crate::pool::limit_malloc_arenas();
    let registry = binding.registry.clone();
    let pid = i64::from(std::process::id());
    let registration = Registration {
        worker_identity: std::env::var("GITEA_MCP_WORKER_IDENTITY")
            .ok()
            .filter(|s| !s.trim().is_empty()),
        namespace: life.namespace.clone(),
        role: None,
        pid,
        ttl_seconds: life.ttl_seconds,
        repository_binding: binding.canonical_repository.clone(),
        remote: None,
        transport: Some("stdio".into()),
        env: std::env::vars().collect(),
    };
    // The handlers are in place before the row is written: a SIGTERM or
    // SIGINT that arrives during or just after registration is held for the
    // serve loop, which releases the row, instead of killing the process with
    // its row left active.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Internal {
            doing: "cannot start the async runtime".into(),
            source: Box::new(e),
        })?;
    let signals = {
        let _inside = runtime.enter();
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                return Err(Error::Internal {
                    doing: "cannot install the SIGTERM and SIGINT handlers".into(),
                    source: Box::new(e),
                })
            }
        }
    };
    // A fleet's workers heartbeat into the same registry; SQLite's busy
    // handler is not fair, so a registration can lose the lock to them past
    // its timeout. Only that is retried, for up to a minute.
    let started = std::time::Instant::now();
    let row = loop {
        match register(&registry, &binding.proc_root, &registration) {
            Err(e)
                if e.is_lock_contention()
                    && started.elapsed() < std::time::Duration::from_secs(60) =>
            {
                tracing::warn!("registering: {e}; trying again");
                std::thread::sleep(std::time::Duration::from_millis(
                    100 + u64::from(std::process::id() % 400),
                ));
            }
            other => break other?,
        }
    };
    let identity = row["worker_identity"].as_str().unwrap_or("").to_string();
    tracing::info!("registered as worker {identity}");
    let server = FleetServer::new(binding);
    let stop = runtime.block_on(serve_until_stopped(
        server,
        registry.clone(),
        identity.clone(),
        life,
        signals,
    ));
    // A read of stdin may still be pending on a blocking thread; it cannot be
    // cancelled, so the runtime is let go rather than waited for.
    runtime.shutdown_background();
    match stop {
        Stop::RegistrationLost => Err(Error::Refused(format!(
            "worker {identity}'s registration is no longer active (retired or released by \
             someone else); this server stops rather than act unregistered"
        ))),
        Stop::Closed | Stop::Signal => {
            release(&registry, &identity, "released", Writer::Owner)?;
            tracing::info!("released worker {identity}");
            Ok(ExitCode::Ok)
        }
    }
}

async fn serve_until_stopped(
    server: FleetServer,
    registry: PathBuf,
    identity: String,
    life: Lifecycle,
    (mut term, mut int): (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
) -> Stop {
    let lost = Arc::new(tokio::sync::Notify::new());
    let beat = tokio::spawn(heartbeat_loop(
        registry,
        identity,
        life.interval,
        lost.clone(),
    ));
    let stop = tokio::select! {
        started = server.serve(strict::stdio()) => match started {
            Err(e) => {
                tracing::warn!("the MCP session did not start: {e}");
                Stop::Closed
            }
            Ok(running) => {
                let cancel = running.cancellation_token();
                tokio::select! {
                    _ = running.waiting() => Stop::Closed,
                    _ = term.recv() => { cancel.cancel(); Stop::Signal }
                    _ = int.recv() => { cancel.cancel(); Stop::Signal }
                    _ = lost.notified() => { cancel.cancel(); Stop::RegistrationLost }
                }
            }
        },
        _ = term.recv() => Stop::Signal,
        _ = int.recv() => Stop::Signal,
        _ = lost.notified() => Stop::RegistrationLost,
    };
    beat.abort();
    stop
}

async fn heartbeat_loop(
    registry: PathBuf,
    identity: String,
    every: Duration,
    lost: Arc<tokio::sync::Notify>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate; registration just wrote the stamp
    loop {
        ticks.tick().await;
        let (r, w) = (registry.clone(), identity.clone());
        match tokio::task::spawn_blocking(move || heartbeat(&r, &w, Writer::Owner)).await {
            Ok(Ok(_)) => {}
            Ok(Err(Error::Input { message: why, .. })) => {
                tracing::error!("heartbeat refused: {why}");
                lost.notify_one();
                return;
            }
            Ok(Err(e)) => tracing::warn!("heartbeat failed, will retry: {e}"),
            Err(e) => tracing::warn!("heartbeat task failed, will retry: {e}"),
        }
    }
}
