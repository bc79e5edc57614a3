//! What each tool does. Every call checks the capability afresh, holds the
//! repository to the one bound at launch, and runs on a blocking thread
//! (SQLite, /proc, Cedar).

use super::args::{audit_context, nonblank, parse, ApplyArgs, ExplainArgs, PlanArgs, SnapshotArgs};
use super::cursor::Sealer;
use super::kept::Kept;
use super::plan_dir::Found;
use super::results::{advice, error_result, stopping_result, success, tool_error};
use super::schemas::ToolKind;
use super::Binding;
use crate::apply::{apply, Context, Hooks, Request, Tokens, Workers};
use crate::capability::{check, Operation as Op, Profiles};
use crate::error::{About, Error, ExitCode};
use crate::evidence::probe::SystemProbe;
use crate::plan::planned::PlannedRows;
use crate::text::Restated;
use rmcp::model::{CallToolResult, JsonObject};
use serde_json::{json, Value as Json};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The MCP server handler.
#[derive(Clone)]
pub struct FleetServer {
    pub(super) binding: Arc<Binding>,
    pub(super) kept: Arc<Kept>,
    pub(super) sealer: Arc<Sealer>,
    /// Why the server is stopping, once it is: calls still queued are
    /// answered with it instead of being cut off.
    pub(super) stopping: Arc<Mutex<Option<String>>>,
    /// Tool calls being answered now.
    pub(super) in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Tool calls that have arrived, in all.
    pub(super) arrived: Arc<std::sync::atomic::AtomicUsize>,
}

/// A tool call counted in flight while this lives.
pub(super) struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What a running call carries besides its arguments: when it arrived,
/// where its progress goes, and whether the client has cancelled it.
pub(super) struct Call {
    /// When the request arrived (a plan computed since serves it).
    pub(super) arrived: Instant,
    /// Report a step done (`notifications/progress` when the request
    /// carried a progress token).
    pub(super) progress: Box<dyn Fn(&str) + Send + Sync>,
    /// Whether the client has cancelled the request.
    pub(super) cancelled: Box<dyn Fn() -> bool + Send + Sync>,
}

impl FleetServer {
    /// A server over a binding.
    pub fn new(binding: Binding) -> crate::error::Result<FleetServer> {
        let kept = Kept::new(binding.plan_dir.clone());
        Ok(FleetServer {
            binding: Arc::new(binding),
            kept: Arc::new(kept),
            sealer: Arc::new(Sealer::new()?),
            stopping: Arc::new(Mutex::new(None)),
            in_flight: Arc::default(),
            arrived: Arc::default(),
        })
    }

    /// Count a call in flight until the guard drops.
    pub(super) fn enter(&self) -> InFlight {
        use std::sync::atomic::Ordering::SeqCst;
        self.arrived.fetch_add(1, SeqCst);
        self.in_flight.fetch_add(1, SeqCst);
        InFlight(self.in_flight.clone())
    }

    /// How many calls are being answered, and how many have arrived.
    pub(super) fn activity(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::SeqCst;
        (self.in_flight.load(SeqCst), self.arrived.load(SeqCst))
    }

    /// From now on, answer every call with why the server stops.
    pub(super) fn stop(&self, why: String) {
        *self.stopping.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// Why the server is stopping, if it is.
    pub(super) fn stopping(&self) -> Option<String> {
        self.stopping
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Refuse unless the capability policies allow `operation` now.
    pub(super) fn capability(&self, operation: Op) -> std::result::Result<(), Box<CallToolResult>> {
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
    pub(super) fn bound(
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
    pub(super) fn canonical(
        &self,
        given: Option<String>,
    ) -> std::result::Result<String, Box<CallToolResult>> {
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
        tool: ToolKind,
        args: Option<JsonObject>,
        call: &Call,
    ) -> CallToolResult {
        if let Some(why) = self.stopping() {
            return stopping_result(why);
        }
        let answer = match tool {
            ToolKind::Plan => parse(tool, args).and_then(|a: PlanArgs| {
                let canonical = nonblank(tool, a.canonical_repository.clone())?;
                Ok(self.plan(a, canonical, call))
            }),
            ToolKind::Explain => parse(tool, args).and_then(|a: ExplainArgs| {
                let canonical = nonblank(tool, a.canonical_repository.clone())?;
                Ok(self.explain(a, canonical, call))
            }),
            ToolKind::Snapshot => parse(tool, args).and_then(|a: SnapshotArgs| {
                let canonical = nonblank(tool, a.canonical_repository.clone())?;
                Ok(self.snapshot(a, canonical, call))
            }),
            ToolKind::Apply => parse(tool, args).and_then(|a: ApplyArgs| {
                let canonical = nonblank(tool, a.canonical_repository.clone())?;
                Ok(self.apply(a, canonical, call))
            }),
        };
        answer.unwrap_or_else(|refused| *refused)
    }

    fn apply(&self, a: ApplyArgs, canonical: Option<String>, call: &Call) -> CallToolResult {
        // Every plan this server issued used its bound repository, so the
        // recalled rows and the repository always agree.
        let canonical = match self.canonical(canonical) {
            Ok(c) => c,
            Err(refused) => return *refused,
        };
        let req = match self.request(a.tokens(), a.worker_identities, a.first, canonical) {
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
        // A cancelled call stops before the lock, or rolls back before
        // COMMIT; the client never reads the answer (its SDK drops it), so
        // the log says how the call ended.
        let hooks = Hooks {
            cancelled: Some(&*call.cancelled),
            ..Hooks::default()
        };
        let report = match apply(&req, &ctx, hooks) {
            Ok(r) => r,
            Err(e) => return error_result(&e),
        };
        if (call.cancelled)() {
            tracing::warn!(
                outcome = report.outcome.code(),
                retired = report.retired_count,
                "apply_stale_worker_retirement was cancelled by the client: {}",
                report.detail
            );
        }
        let mut body = match serde_json::to_value(&report) {
            Ok(v) => v,
            Err(e) => return error_result(&Error::input(About::ToolCall, e.to_string())),
        };
        body["audit_context"] = audit_context(&a.remote, &a.host, &a.org, &a.repo);
        trim_residual_blockers(&mut body);
        trim_lists(&mut body);
        let code = report.outcome.code();
        if report.outcome.exit_code() == ExitCode::Ok {
            success(format!("{code}: {}", report.detail), body)
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
        workers: Option<Workers>,
        first: Option<usize>,
        canonical: String,
    ) -> std::result::Result<Request, Box<CallToolResult>> {
        let refuse = |code: &str, why: String, advice: &str| {
            Box::new(tool_error(code, why, advice, json!({})))
        };
        // The tokens decide the scope, as the CLI's saved plan does: a
        // host-scoped plan of this server's is always this host's.
        let scoped = [&tokens.registry_fingerprint, &tokens.candidate_fingerprint]
            .iter()
            .any(|t| t.starts_with(crate::fingerprint::HOST_SCOPE));
        let scope = if scoped {
            let facts = crate::observe::RunFacts::of_this_host(&self.binding.proc_root, None, &[]);
            let host =
                crate::plan::scoped::this_host(&facts).map_err(|e| Box::new(error_result(&e)))?;
            Some(host)
        } else {
            None
        };
        let recalled = self.recall(&tokens)?;
        let workers =
            match (workers, first, &recalled) {
                (Some(w), None, _) => w.into_list().map_err(|e| {
                    refuse(
                        "invalid_worker_identities",
                        e.to_string(),
                        "pass a list of strings, a JSON list, or comma-separated identities",
                    )
                })?,
                (None, Some(_), Some(rows)) => rows.candidates(),
                (None, Some(_), None) => return Err(refuse(
                    "plan_not_kept",
                    "first takes the candidates of a plan issued under these tokens, and neither \
                     this server nor the folder of kept plans holds one"
                        .into(),
                    "plan again, or name worker_identities",
                )),
                _ => {
                    return Err(refuse(
                        "invalid_worker_identities",
                        "give exactly one of worker_identities and first".into(),
                        "name the workers, or ask for the first N candidates of the plan",
                    ))
                }
            };
        let mut req = Request::new(tokens, workers)
            .with_planned(recalled)
            .map_err(|e| Box::new(error_result(&Error::input(About::ToolCall, e))))?;
        req.canonical_repository = Some(canonical);
        req.max_retire = self.binding.max_retire;
        req.first = first;
        req.scope = scope;
        Ok(req)
    }
}

impl FleetServer {
    /// The rows of the plan made under an apply's tokens, if one is kept
    /// (in memory, or in the folder by a server of this one's binding).
    /// A kept plan vouches only for what made it (finding 50.7): tokens of
    /// a plan another binding made (another policy set, registry,
    /// repository or profile) are refused, never paired with this
    /// server's (once the profile is known to be allowed to apply), and one
    /// of this binding's is taken only while this server's profile may
    /// still plan.
    fn recall(
        &self,
        tokens: &Tokens,
    ) -> std::result::Result<Option<Arc<PlannedRows>>, Box<CallToolResult>> {
        let found = self
            .kept
            .rows(&tokens.registry_fingerprint, &tokens.candidate_fingerprint);
        match found {
            Found::Nothing => Ok(None),
            Found::Ours(rows) => {
                self.capability(Op::Plan)?;
                Ok(Some(rows))
            }
            Found::Elsewhere(differs) => {
                // A profile that may not apply is told that first, as
                // apply would tell it.
                self.capability(Op::Apply)?;
                Err(Box::new(made_elsewhere(tokens, &differs)))
            }
        }
    }
}

/// The refusal of tokens of a plan made under another binding (`differs`
/// says how).
fn made_elsewhere(tokens: &Tokens, differs: &str) -> CallToolResult {
    let clipped = super::results::clipped;
    tool_error(
        "plan_made_elsewhere",
        format!(
            "registry_fingerprint {} and candidate_fingerprint {} are the tokens of a plan made \
             by a server bound otherwise ({differs}); a plan vouches only for the policy set, \
             registry, canonical repository and profile that made it, so its tokens are never \
             applied by this server",
            clipped(&tokens.registry_fingerprint),
            clipped(&tokens.candidate_fingerprint),
        ),
        "plan with this server (plan_stale_worker_retirement) and apply the three tokens that \
         plan returns, together",
        json!({}),
    )
}

/// The lists of an apply's report that grow with the fleet rather than
/// with the request: each shows its first [`BLOCKERS_SHOWN`] entries in a
/// tool result, and `<name>_not_shown` counts the rest (the command line's
/// JSON keeps them whole).
const FLEET_SIZED: [&str; 5] = [
    "heartbeats_tolerated_workers",
    "verdicts_moved",
    "candidates_added_since_plan",
    "retired_since_plan",
    "rows_changed_since_plan",
];

/// Cut each of [`FLEET_SIZED`] to its first entries, counting the rest.
fn trim_lists(body: &mut Json) {
    let Some(map) = body.as_object_mut() else {
        return;
    };
    for name in FLEET_SIZED {
        let Some(list) = map.get_mut(name).and_then(Json::as_array_mut) else {
            continue;
        };
        let over = list.len().saturating_sub(BLOCKERS_SHOWN);
        if over > 0 {
            list.truncate(BLOCKERS_SHOWN);
            map.insert(format!("{name}_not_shown"), json!(over));
        }
    }
}

/// How many post-apply blockers an apply's result shows (their count is
/// in `residual_blocker_count`; the snapshot tool pages them all).
pub(super) const BLOCKERS_SHOWN: usize = 20;

/// Keep an apply's result compact: the post-apply blockers of a large
/// fleet are cut to the first [`BLOCKERS_SHOWN`], and to what fits (their
/// count stays in `residual_blocker_count`).
fn trim_residual_blockers(body: &mut Json) {
    let Some(list) = body
        .pointer_mut("/post_apply/residual_blockers")
        .and_then(Json::as_array_mut)
    else {
        return;
    };
    list.truncate(BLOCKERS_SHOWN);
    super::pages::keep_within(list, super::pages::RESULT_BOUND / 2);
}
