//! What each tool does. Every call checks the capability afresh, holds the
//! repository to the one bound at launch, and runs on a blocking thread
//! (SQLite, /proc, Cedar).

use super::args::{audit_context, nonblank, parse, ApplyArgs, PlanArgs, SnapshotArgs};
use super::results::{advice, error_result, success, tool_error};
use super::{Binding, KEEP_PLANS};
use crate::apply::{apply, Context, Hooks, Request, Tokens, Workers};
use crate::capability::{check, Operation as Op, Profiles};
use crate::error::{About, Error, ExitCode};
use crate::evidence::probe::SystemProbe;
use crate::plan::planned::PlannedRows;
use crate::snapshot::{Options, Snapshot};
use crate::text::Restated;
use rmcp::model::{CallToolResult, JsonObject};
use rmcp::ErrorData as McpError;
use serde_json::{json, Value as Json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// A plan this server issued: its rows, which an apply presenting its
/// registry token is judged against row by row.
struct Issued {
    rows: Arc<PlannedRows>,
}

/// The MCP server handler.
#[derive(Clone)]
pub struct FleetServer {
    binding: Arc<Binding>,
    issued: Arc<Mutex<VecDeque<Issued>>>,
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
        let detail = match crate::text::restated(bound.as_deref(), given.as_deref()) {
            Restated::Fixed(r) => return Ok(Some(r)),
            Restated::Neither => return Ok(None),
            Restated::Conflict { fixed, given } => format!(
                "this server is bound to canonical repository {fixed:?} at launch; \
                 the call named {given:?}"
            ),
            Restated::GivenOnly(given) => format!(
                "this server was launched without a canonical repository; \
                 the call named {given:?}"
            ),
        };
        Err(Box::new(tool_error(
            "repository_not_bound",
            detail,
            "leave canonical_repository out or give the bound one; to work on another \
             repository the operator launches a server bound to it \
             (FLEET_RETIRE_CANONICAL_REPOSITORY)",
            json!({"canonical_repository": given, "bound_repository": bound}),
        )))
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
    pub(super) fn call(
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
        let manifest = a.expected_manifest.as_deref().unwrap_or_default();
        if let Some(i) = crate::snapshot::entry_without_instance_id(manifest) {
            return tool_error(
                "invalid_manifest",
                format!("expected_manifest[{i}] needs a string client_instance_id"),
                "fix the manifest",
                json!({}),
            );
        }
        let rows = match crate::evidence::registry::load(&b.registry) {
            Ok(r) => r,
            Err(e) => return error_result(&e),
        };
        let opts = Options::here(
            &b.proc_root,
            canonical,
            a.expected_revision,
            a.expected_manifest,
        );
        let snap = Snapshot::take(&rows, &opts, &SystemProbe::new(&b.proc_root));
        let summary = crate::report::snapshot_summary(&snap.summary_json());
        let mut body = match serde_json::to_value(&snap) {
            Ok(v) => v,
            Err(e) => return error_result(&Error::input(About::ToolCall, e.to_string())),
        };
        body["audit_context"] = audit_context(&a.remote, &a.host, &a.org, &a.repo);
        success(summary, body)
    }

    fn apply(&self, a: ApplyArgs, canonical: Option<String>) -> CallToolResult {
        // Every plan this server issued used its bound repository, so the
        // recalled rows and the repository always agree.
        let canonical = match self.canonical(canonical) {
            Ok(c) => c,
            Err(refused) => return *refused,
        };
        let req = match self.request(a.tokens(), a.worker_identities, canonical) {
            Ok(r) => r,
            Err(refused) => return *refused,
        };
        let b = &self.binding;
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
        let code = report.outcome.code();
        if report.outcome.exit_code() == ExitCode::Ok {
            let summary = format!(
                "{code}: retired {} of {} requested worker(s); {}",
                report.retired_count,
                req.workers.len(),
                report.detail
            );
            success(summary, body)
        } else {
            tool_error(code, report.detail.clone(), advice(report.outcome), body)
        }
    }

    /// The apply request of a call: its tokens and workers, the bound
    /// repository, the server's limit, and the rows of the plan this server
    /// issued under that registry token, if it still keeps them.
    fn request(
        &self,
        tokens: Tokens,
        workers: Workers,
        canonical: String,
    ) -> std::result::Result<Request, Box<CallToolResult>> {
        let workers = workers.into_list().map_err(|e| {
            Box::new(tool_error(
                "invalid_worker_identities",
                e.to_string(),
                "pass a list of strings, a JSON list, or comma-separated identities",
                json!({}),
            ))
        })?;
        let recalled = self.recall(&tokens.registry_fingerprint);
        let mut req = Request::new(tokens, workers)
            .with_planned(recalled)
            .map_err(|e| Box::new(error_result(&Error::input(About::ToolCall, e))))?;
        req.canonical_repository = Some(canonical);
        req.max_retire = self.binding.max_retire;
        Ok(req)
    }
}
