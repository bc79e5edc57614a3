//! The plan and explain tools: a plan computed once for the calls that
//! arrive together, answered as a summary, a page of preserved rows, or the
//! whole document when it fits; and one row's explanation.

use super::args::{audit_context, ExplainArgs, Include, PlanArgs, PlanScope, PreservedAsk};
use super::cursor::{List, Position};
use super::pages::{self, KeptPlan, DEFAULT_LIMIT, MAX_LIMIT, RESULT_BOUND};
use super::results::{clipped, error_result, success, tool_error};
use super::tools::{Call, FleetServer};
use crate::capability::Operation as Op;
use crate::error::{About, Error, Result};
use crate::plan::planned::PlannedRows;
use crate::reasons::Reason;
use rmcp::model::{CallToolResult, ContentBlock, Resource};
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;

/// A refusal as the early return of a tool's steps.
type Refusal = Box<CallToolResult>;

impl FleetServer {
    /// `plan_stale_worker_retirement`.
    pub(super) fn plan(
        &self,
        a: PlanArgs,
        canonical: Option<String>,
        call: &Call,
    ) -> CallToolResult {
        match self.plan_steps(a, canonical, call) {
            Ok(result) | Err(result) => *result,
        }
    }

    fn plan_steps(
        &self,
        a: PlanArgs,
        canonical: Option<String>,
        call: &Call,
    ) -> std::result::Result<Refusal, Refusal> {
        self.capability(Op::Plan)?;
        let canonical = self.canonical(canonical)?;
        let audit = audit_context(&a.remote, &a.host, &a.org, &a.repo);
        let ask = a.preserved.as_ref().map(page_asked).transpose()?;
        if let Some(Asked::Next(cursor, limit, reason)) = ask.clone() {
            return self.next_page(&cursor, limit, reason, audit);
        }
        let kept = self.fresh_plan(canonical, a.scope.unwrap_or_default(), call)?;
        let rendering = std::time::Instant::now();
        if a.include == Some(Include::All) {
            return whole_document(&kept, audit);
        }
        let rows = a.include == Some(Include::Candidates);
        let (mut body, mut text) = pages::summary(&kept, self.binding.max_retire, rows);
        self.first_cursors_into(&mut body, &kept);
        if let Some(Asked::First(limit, reason, offset)) = ask {
            let first = Position {
                plan: kept.key(),
                list: List::Preserved,
                reason_code: reason.clone(),
                offset,
                limit,
            };
            let (shown, remaining) = self.preserved_into(&mut body, &kept, &first);
            // Say which rows these are first: a client paging by offset
            // reads this page of a plan made for this very call.
            text =
                format!(
                "preserved rows {} to {} of {} in a plan made for this call ({remaining} more; \
                 the next page starts at offset {}). {text}",
                offset + 1,
                offset + shown,
                reason.as_deref().map_or("every reason".to_string(), |r| format!("reason {r}")),
                offset + shown,
            );
        }
        body.insert("audit_context".into(), audit);
        (call.progress)("rendered");
        let result = bounded(text, body, Some(&kept));
        tracing::debug!("plan summary rendered in {:?}", rendering.elapsed());
        Ok(Box::new(result))
    }

    /// A plan of `scope` at least as fresh as the call: computed now, or
    /// by a call that started computing after this one arrived.
    fn fresh_plan(
        &self,
        canonical: String,
        scope: PlanScope,
        call: &Call,
    ) -> std::result::Result<Arc<KeptPlan>, Refusal> {
        let b = &self.binding;
        let scoped = scope == PlanScope::Host;
        let compute = || -> Result<KeptPlan> {
            if let Some(why) = self.stopping() {
                return Err(Error::Refused(why));
            }
            let plan = self.judged(canonical, scope, call)?;
            let started = std::time::Instant::now();
            // Rows unchanged since the last plan of this scope keep their
            // digests.
            let earlier = self.kept.newest_whole(scoped);
            let earlier = earlier.as_ref().map(|k| (&k.plan, &*k.rows));
            let rows = Arc::new(PlannedRows::of_after(&plan, earlier));
            tracing::debug!(
                "plan of {} rows: digests in {:?}",
                plan.entries.len(),
                started.elapsed()
            );
            Ok(KeptPlan {
                rows,
                plan,
                policy_source: b.policies.source_label(),
                issued: KeptPlan::next_issued(),
            })
        };
        self.kept.fresh(call.arrived, scoped, compute).map_err(|e| {
            // A call that waited for the plan gate while the server decided
            // to stop is told why.
            Box::new(match self.stopping() {
                Some(why) => super::results::stopping_result(why),
                None if scoped && scope_refused(&e) => scope_unavailable(&e),
                None => error_result(&e),
            })
        })
    }

    /// Read and judge the rows of `scope`: this host's scope (its active
    /// rows and their peers, `plan::scoped`), or the whole registry.
    fn judged(
        &self,
        canonical: String,
        scope: PlanScope,
        call: &Call,
    ) -> Result<crate::plan::Plan> {
        let b = &self.binding;
        /// What was read.
        enum Read {
            Whole(Vec<crate::row::Row>),
            Scope(crate::store::scope::Scope),
        }
        let read = match scope {
            PlanScope::Registry => Read::Whole(crate::evidence::registry::load(&b.registry)?),
            PlanScope::Host => {
                let unknown = crate::observe::RunFacts::of_this_host(&b.proc_root, None, &[]);
                let host = crate::plan::scoped::this_host(&unknown)?;
                Read::Scope(crate::evidence::registry::load_scope(&b.registry, &host)?)
            }
        };
        let lease_rows = crate::evidence::leases::load(&b.leases)?;
        (call.progress)("read");
        cancelled(call)?;
        let facts =
            crate::observe::RunFacts::of_this_host(&b.proc_root, Some(canonical), &lease_rows);
        let probe = crate::evidence::probe::SystemProbe::new(&b.proc_root);
        let started = std::time::Instant::now();
        let plan = match read {
            Read::Whole(rows) => crate::plan::plan(rows, facts, &probe, &b.policies)?,
            Read::Scope(s) => crate::plan::scoped::plan_scope(s, facts, &probe, &b.policies)?,
        };
        (call.progress)("judged, tokens computed");
        cancelled(call)?;
        tracing::debug!("plan judged in {:?}", started.elapsed());
        Ok(plan)
    }

    /// The page a cursor names, of the plan it was issued for.
    fn next_page(
        &self,
        cursor: &str,
        limit: Option<usize>,
        reason: Option<String>,
        audit: Json,
    ) -> std::result::Result<Refusal, Refusal> {
        let mut position = self.sealer.open(cursor).map_err(|_| {
            refusal(
                "invalid_cursor",
                "the cursor is not one this server issued (edited, or from another server)".into(),
                "pass next_cursor exactly as a result gave it, or plan again",
            )
        })?;
        let restated_otherwise = reason.is_some() && position.reason_code != reason;
        if position.list != List::Preserved || restated_otherwise {
            return Err(refusal(
                "cursor_mismatch",
                format!(
                    "the cursor pages preserved rows of reason code {:?}; the call asked for {:?}",
                    position.reason_code, reason
                ),
                "pass the cursor alone, or with the reason_code it was issued for",
            ));
        }
        let kept = self.kept.whole(&position.plan).ok_or_else(|| {
            refusal(
                "cursor_expired",
                format!(
                    "the plan {} is no longer kept (a server keeps its last {} plans whole)",
                    position.plan,
                    super::kept::KEEP_WHOLE
                ),
                "plan again and page the new plan",
            )
        })?;
        if let Some(l) = limit {
            position.limit = l;
        }
        let mut body = Map::new();
        pages::tokens_into(&mut body, &kept);
        let (shown, remaining) = self.preserved_into(&mut body, &kept, &position);
        body.insert("audit_context".into(), audit);
        let text = format!(
            "preserved rows {} to {} of plan {} ({remaining} not yet shown)",
            position.offset + 1,
            position.offset + shown,
            position.plan,
        );
        Ok(Box::new(bounded(text, body, Some(&kept))))
    }

    /// Add the cursor of each reason code's first page of preserved rows,
    /// bound to this plan, so that every page an agent reads of it is cut
    /// from the plan its summary counted.
    fn first_cursors_into(&self, body: &mut Map<String, Json>, kept: &KeptPlan) {
        let cursors: Map<String, Json> = kept
            .plan
            .reason_counts()
            .keys()
            .map(|code| {
                let first = Position {
                    plan: kept.key(),
                    list: List::Preserved,
                    reason_code: Some((*code).to_string()),
                    offset: 0,
                    limit: DEFAULT_LIMIT,
                };
                ((*code).to_string(), json!(self.sealer.seal(&first)))
            })
            .collect();
        body.insert("preserved_cursors".into(), Json::Object(cursors));
    }

    /// Add a page of preserved rows and the cursor of the next; returns
    /// how many rows it holds and how many are left after it.
    fn preserved_into(
        &self,
        body: &mut Map<String, Json>,
        kept: &KeptPlan,
        at: &Position,
    ) -> (usize, usize) {
        let page = pages::preserved_page(kept, at);
        let counted = (page.rows.len(), page.remaining);
        body.insert("preserved".into(), Json::Array(page.rows));
        body.insert("preserved_reason_code".into(), json!(at.reason_code));
        body.insert("preserved_not_shown".into(), json!(page.remaining));
        if let Some(next) = page.next {
            // The offset serves a client that cannot keep a cursor (one
            // server per call): the same rows of a plan made afresh.
            body.insert("next_offset".into(), json!(next.offset));
            body.insert("next_cursor".into(), json!(self.sealer.seal(&next)));
        }
        counted
    }

    /// `explain_worker_retirement`: one row's evidence, its Cedar answers
    /// and every eligibility policy's verdict, in a fresh plan.
    pub(super) fn explain(
        &self,
        a: ExplainArgs,
        canonical: Option<String>,
        call: &Call,
    ) -> CallToolResult {
        let steps = || -> std::result::Result<Refusal, Refusal> {
            self.capability(Op::Plan)?;
            let canonical = self.canonical(canonical)?;
            // A row of another host is explained too: the whole registry.
            let kept = self.fresh_plan(canonical, PlanScope::Registry, call)?;
            let plan = &kept.plan;
            let found: Vec<&crate::plan::Entry> = plan
                .entries
                .iter()
                .filter(|e| plan.identity(e) == a.worker_identity)
                .collect();
            let mut explanations: Vec<Json> = found
                .iter()
                .map(|e| crate::explain::explain_entry(plan, e, &self.binding.policies))
                .collect();
            if explanations.is_empty() {
                return Err(refusal(
                    "unknown_worker",
                    format!(
                        "no registry row has worker_identity {:?}",
                        a.worker_identity
                    ),
                    "take the identity from a plan's candidates or preserved rows",
                ));
            }
            let peers_not_shown = trim_peers(&mut explanations);
            let mut body = Map::new();
            pages::tokens_into(&mut body, &kept);
            body.insert("worker_identity".into(), json!(a.worker_identity));
            body.insert("explanations".into(), Json::Array(explanations));
            body.insert("peers_not_shown".into(), json!(peers_not_shown));
            body.insert(
                "audit_context".into(),
                audit_context(&a.remote, &a.host, &a.org, &a.repo),
            );
            let text = explain_text(&a.worker_identity, &found);
            Ok(Box::new(bounded(text, body, None)))
        };
        match steps() {
            Ok(r) | Err(r) => *r,
        }
    }
}

/// What a call's `preserved` asks: a first page of the plan computed now,
/// or the page a cursor names.
#[derive(Clone)]
enum Asked {
    /// Rows per page, reason code, and how many rows in to start.
    First(usize, Option<String>, usize),
    /// The cursor, a new page size if given, and the reason code restated.
    Next(String, Option<usize>, Option<String>),
}

/// Check a `preserved` request: a known reason code, a page size in range.
fn page_asked(p: &PreservedAsk) -> std::result::Result<Asked, Refusal> {
    if let Some(code) = &p.reason_code {
        if Reason::from_code(code).is_none_or(|r| r == Reason::Eligible) {
            let known: Vec<&str> = crate::reasons::ALL
                .iter()
                .filter(|r| **r != Reason::Eligible)
                .map(|r| r.code())
                .collect();
            return Err(refusal(
                "unknown_reason_code",
                format!("{code:?} is not a reason code a row is preserved for"),
                &format!("use one of: {}", known.join(", ")),
            ));
        }
    }
    if let Some(limit) = p.limit {
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(refusal(
                "invalid_limit",
                format!("limit {limit} is outside 1 to {MAX_LIMIT}"),
                "ask for fewer rows per page and follow next_cursor",
            ));
        }
    }
    Ok(match (&p.cursor, p.offset) {
        (Some(_), Some(_)) => {
            return Err(refusal(
                "cursor_and_offset",
                "a call gives a cursor or an offset, not both".into(),
                "follow next_cursor with the server that issued it, or page a fresh plan by offset",
            ))
        }
        (Some(c), None) => Asked::Next(c.clone(), p.limit, p.reason_code.clone()),
        (None, offset) => Asked::First(
            p.limit.unwrap_or(DEFAULT_LIMIT),
            p.reason_code.clone(),
            offset.unwrap_or(0),
        ),
    })
}

/// The whole plan document, or a refusal when it would be over the bound.
fn whole_document(kept: &KeptPlan, audit: Json) -> std::result::Result<Refusal, Refusal> {
    let bound = RESULT_BOUND - 4096;
    let mut doc = pages::whole(kept, bound).map_err(|size| {
        refusal(
            "result_too_large",
            format!(
                "the whole plan is over {bound} bytes (stopped at {size}); one result stays \
                 under {RESULT_BOUND}"
            ),
            &format!(
                "read the summary (leave include out), page preserved rows with preserved \
                 {{\"reason_code\", \"limit\", \"cursor\"}}, or read the resource {} page by page",
                kept.uri()
            ),
        )
    })?;
    doc["policy_source"] = json!(kept.policy_source);
    doc["audit_context"] = audit;
    let text = format!(
        "the whole plan: {} rows assessed; registry_fingerprint {}",
        kept.plan.entries.len(),
        kept.plan.registry_fingerprint
    );
    let Json::Object(body) = doc else {
        unreachable!("a plan document is an object")
    };
    Ok(Box::new(bounded(text, body, Some(kept))))
}

/// A success, linking the plan's resource, or `result_too_large` if the
/// body grew past the bound after all (a last guard: every part is cut to
/// a budget before).
fn bounded(text: String, body: Map<String, Json>, kept: Option<&KeptPlan>) -> CallToolResult {
    let body = Json::Object(body);
    let size = pages::json_size(&body);
    if size.saturating_add(text.len()) > RESULT_BOUND {
        return tool_error(
            "result_too_large",
            format!("the result would be {size} bytes; one result stays under {RESULT_BOUND}"),
            "ask for fewer rows (limit)",
            json!({}),
        );
    }
    let mut result = success(text, body);
    if let Some(kept) = kept {
        let mut link = Resource::new(kept.uri(), "plan");
        link.description = Some("the whole plan document, a page per read".into());
        link.mime_type = Some("application/json".into());
        result.content.push(ContentBlock::resource_link(link));
    }
    result
}

/// Cut the peers of each explanation's first-stage answers to what fits;
/// returns how many were left out.
fn trim_peers(explanations: &mut [Json]) -> usize {
    let budget = RESULT_BOUND / 2 / explanations.len().max(1);
    let mut left_out = 0;
    for e in explanations.iter_mut() {
        let Some(peers) = e
            .pointer_mut("/first_stage/peers")
            .and_then(Json::as_array_mut)
        else {
            continue;
        };
        left_out += pages::keep_within(peers, budget);
    }
    left_out
}

/// The one line an agent reads of an explanation.
fn explain_text(worker: &str, found: &[&crate::plan::Entry]) -> String {
    let lines: Vec<String> = found
        .iter()
        .map(|e| {
            let decision = if e.is_candidate() { "retire" } else { "keep" };
            format!("row {}: {decision} ({})", e.index + 1, e.reason().code())
        })
        .collect();
    format!("worker {}: {}", crate::text::esc(worker), lines.join("; "))
}

/// Stop a computation the client has cancelled.
fn cancelled(call: &Call) -> Result<()> {
    if (call.cancelled)() {
        return Err(Error::input(
            About::ToolCall,
            "the client cancelled the call",
        ));
    }
    Ok(())
}

/// Whether a host-scoped plan was refused for its scope: this host's id
/// unknown, a policy set the scope's read does not keep exact
/// (`policy::scope_check`), or a registry the scope cannot be read from
/// (no `host_id` column, no scope indexes).
fn scope_refused(e: &Error) -> bool {
    match e {
        Error::Input { about, .. } => *about == About::Option("--scope host"),
        Error::Registry { message, .. } => crate::store::scope::is_unreadable_scope(message),
        _ => false,
    }
}

/// The refusal of a host-scoped plan, with the way out. The server never
/// falls back to the whole registry by itself: an agent that asked for
/// this host's scope is told, and chooses.
fn scope_unavailable(e: &Error) -> CallToolResult {
    tool_error(
        "scope_unavailable",
        format!("this host's scope cannot be planned (the default scope, \"host\"): {e}"),
        "call plan_stale_worker_retirement again with scope \"registry\": the whole registry \
         is read and judged, as the seed's plan does. A registry lacking the scope's indexes \
         is fixed by its operator with `fleet-retire registry versions --registry FILE`",
        json!({"scope": "host"}),
    )
}

/// A refusal with its reason code, words and what to do.
fn refusal(code: &str, detail: String, what_to_do: &str) -> Refusal {
    Box::new(tool_error(code, detail, what_to_do, json!({})))
}

impl FleetServer {
    /// `resources/read` of `fleet-retire://plan/<registry token>`, or of a
    /// page's `next_uri` (`…?cursor=…`): one page of the whole document.
    pub(super) fn plan_resource(&self, uri: &str) -> std::result::Result<String, rmcp::ErrorData> {
        let refused = |why: String| rmcp::ErrorData::invalid_params(why, None);
        if let Err(denied) = self.capability(Op::Plan) {
            let why = denied
                .content
                .first()
                .and_then(|c| c.as_text())
                .map_or_else(|| "permission denied".to_string(), |t| t.text.clone());
            return Err(refused(why));
        }
        let rest = uri.strip_prefix("fleet-retire://plan/").ok_or_else(|| {
            rmcp::ErrorData::resource_not_found(
                format!(
                    "{} is not a resource of this server (fleet-retire://plan/<registry \
                     token>.<candidate token>.<plan number>)",
                    clipped(uri)
                ),
                None,
            )
        })?;
        let (token, cursor) = match rest.split_once("?cursor=") {
            Some((t, c)) => (t, Some(c)),
            None => (rest, None),
        };
        let position = match cursor {
            None => Position {
                plan: token.to_string(),
                list: List::Document,
                reason_code: None,
                offset: 0,
                limit: MAX_LIMIT,
            },
            Some(c) => self
                .sealer
                .open(c)
                .ok()
                .filter(|p| p.list == List::Document && p.plan == token)
                .ok_or_else(|| {
                    refused("the cursor is not one this server issued for this plan".into())
                })?,
        };
        let kept = self.kept.whole(token).ok_or_else(|| {
            rmcp::ErrorData::resource_not_found(
                format!("no plan {} is kept; plan again", clipped(token)),
                None,
            )
        })?;
        let page = pages::document_page(&kept, &position, &self.sealer);
        serde_json::to_string(&page).map_err(|e| refused(e.to_string()))
    }
}
