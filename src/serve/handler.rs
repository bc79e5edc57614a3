//! rmcp's side: the server's description, `tools/list`, and `tools/call`
//! dispatched to a blocking thread.

use super::schemas::{op_of, tools};
use super::FleetServer;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};

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
