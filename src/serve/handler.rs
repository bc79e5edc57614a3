//! rmcp's side: the server's description, `tools/list`, `tools/call`
//! dispatched to a blocking thread with its progress and cancellation, and
//! the plans it keeps as resources.

use super::schemas::{tools, ToolKind};
use super::tools::{Call, FleetServer};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ServerCapabilities,
    ServerConfig,
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
        let result = tokio::task::spawn_blocking(move || {
            let result = server.call(tool, &name, args, &call);
            drop(call);
            crate::pool::give_back_memory();
            result
        })
        .await
        .map_err(|e| McpError::internal_error(format!("the tool call failed: {e}"), None))??;
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
        let listed = self
            .kept
            .all_whole()
            .iter()
            .map(|k| {
                let mut r = Resource::new(k.uri(), "plan");
                r.description = Some(format!(
                    "the plan issued under registry_fingerprint {} and candidate_fingerprint \
                     {}, a page per read",
                    k.plan.registry_fingerprint, k.plan.candidate_fingerprint
                ));
                r.mime_type = Some("application/json".into());
                r
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(listed))
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
