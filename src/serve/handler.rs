//! rmcp's side: the server's description, `tools/list`, `tools/call`
//! dispatched to a blocking thread with its progress and cancellation, and
//! the plans it keeps as resources (listed, and their URIs' template).

use super::schemas::{tools, ToolKind};
use super::tools::{Call, FleetServer};
use crate::capability::Operation as Op;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use std::time::Instant;
use tokio::task::JoinHandle;

impl ServerHandler for FleetServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new(
            "fleet-retire",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Plan, then apply, the retirement of stale worker registrations. Call \
             plan_stale_worker_retirement for the tokens and candidates, \
             explain_worker_retirement for why a row is kept, then \
             apply_stale_worker_retirement with the plan's tokens. This server's profile, \
             files, policies and canonical repository are fixed at launch; tool arguments \
             cannot change them.",
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
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, McpError> {
        let arrived = Instant::now();
        let _counted = self.enter();
        let name = request.name.to_string();
        let Some(tool) = ToolKind::named(&name) else {
            return Err(McpError::invalid_params(
                format!("no tool named {name:?}; tools/list names them"),
                None,
            ));
        };
        let (progress, reported) = progress_reporter(&context);
        let call = Call {
            arrived,
            progress,
            cancelled: {
                let ct = context.ct.clone();
                Box::new(move || ct.is_cancelled())
            },
        };
        let server = self.clone();
        let args = request.arguments;
        let result = tokio::task::spawn_blocking(move || server.call(tool, args, &call))
            .await
            .map_err(|e| McpError::internal_error(format!("the tool call failed: {e}"), None))?;
        // The call's memory goes back to the kernel while its answer is
        // sent, not before (issue 52: a plan call waited for it).
        tokio::task::spawn_blocking(|| {
            let started = Instant::now();
            crate::pool::give_back_memory();
            tracing::debug!("memory given back in {:?}", started.elapsed());
        });
        // Every progress notification goes out before the result: a client
        // forgets a request's progress token once it has the result.
        if let Some(reported) = reported {
            let _ = reported.await;
        }
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListResourcesResult, McpError> {
        // The plans this server keeps whole, which a read serves page by
        // page; none for a profile that may not plan (a read would refuse).
        let server = self.clone();
        let allowed = tokio::task::spawn_blocking(move || server.capability(Op::Plan).is_ok())
            .await
            .unwrap_or(false);
        let kept = if allowed {
            self.kept.all_whole()
        } else {
            Vec::new()
        };
        let listed = kept
            .iter()
            .rev()
            .map(|k| {
                let mut r = Resource::new(k.uri(), "plan");
                r.title = Some(format!(
                    "plan of {} rows: {} may be retired",
                    k.plan.entries.len(),
                    k.plan.candidates().count()
                ));
                r.description = Some(format!(
                    "the plan issued under registry_fingerprint {} and candidate_fingerprint \
                     {}, a page per read (next_uri leads to the next)",
                    k.plan.registry_fingerprint, k.plan.candidate_fingerprint
                ));
                r.mime_type = Some("application/json".into());
                r
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(listed))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            plan_template(),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ReadResourceResponse, McpError> {
        let server = self.clone();
        let uri = request.uri;
        let page =
            tokio::task::spawn_blocking(move || server.plan_resource(&uri).map(|t| (t, uri)))
                .await
                .map_err(|e| McpError::internal_error(format!("the read failed: {e}"), None))??;
        let (text, uri) = page;
        let mut contents = ResourceContents::text(text, uri);
        if let ResourceContents::TextResourceContents { mime_type, .. } = &mut contents {
            *mime_type = Some("application/json".into());
        }
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

/// The template of every plan's URI: a plan tool result gives both tokens
/// (and links the resource); the server serves the plans it keeps whole.
fn plan_template() -> ResourceTemplate {
    ResourceTemplate::new(
        "fleet-retire://plan/{registry_fingerprint}.{candidate_fingerprint}.{plan_number}",
        "plan",
    )
    .with_title("a plan this server issued, a page per read")
    .with_description(
        "The whole plan document of the tokens a plan_stale_worker_retirement result gave, \
         and the plan's number in this server (its resource_uri gives all three: a server may \
         issue two plans under the same tokens), read a page at a time: the tokens and counts, candidates and \
         preserved rows, and next_uri until the last page. This server keeps its last two \
         plans whole; an older one is not found, and the agent plans again.",
    )
    .with_mime_type("application/json")
}

/// Reports a call's steps.
type Reporter = Box<dyn Fn(&str) + Send + Sync>;

/// Where a call's steps are reported: `notifications/progress` with the
/// request's progress token, sent in order from the async side; nowhere
/// when the request carried no token. The task sending them ends when the
/// reporter is dropped; its handle is returned to be awaited.
fn progress_reporter(context: &RequestContext<RoleServer>) -> (Reporter, Option<JoinHandle<()>>) {
    let Some(token) = context.meta.get_progress_token() else {
        return (Box::new(|_| {}), None);
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let peer = context.peer.clone();
    let sender = tokio::spawn(async move {
        let mut step = 0.0;
        while let Some(message) = rx.recv().await {
            step += 1.0;
            let note = ProgressNotificationParam::new(token.clone(), step).with_message(message);
            if peer.notify_progress(note).await.is_err() {
                return;
            }
        }
    });
    let report: Reporter = Box::new(move |message: &str| {
        let _ = tx.send(message.to_string());
    });
    (report, Some(sender))
}
