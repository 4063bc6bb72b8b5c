//! The MCP server: its tools (`tools.rs`) and resources (`resources.rs`) over one client
//! of the daemon. One value per connection (HTTP makes one per session); all share
//! nothing but the daemon's address.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    Implementation, ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool_handler, ErrorData, RoleServer, ServerHandler};

use crate::daemon::Daemon;
use crate::resources;

const INSTRUCTIONS: &str = "sandfork runs isolated Linux sandboxes. create_sandbox, then \
run_command / read_file / write_file / list_files in it; checkpoint it (type memory keeps its \
running processes) and fork N children from the snapshot, each starting warm where it was; \
suspend/resume; terminate when done. get_port_url gives a URL to a port a sandbox serves. \
Resources: sandfork://sandboxes/{id}/files/{path} and sandfork://sandboxes/{id}/logs.";

/// The server of one MCP connection.
#[derive(Debug, Clone)]
pub struct Sandfork {
    pub(crate) daemon: Daemon,
    tool_router: ToolRouter<Sandfork>,
}

impl Sandfork {
    pub fn new(daemon: Daemon) -> Sandfork {
        Sandfork {
            daemon,
            tool_router: Self::tool_router(),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Sandfork {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("sandfork", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        resources::list(&self.daemon).await.map_err(Into::into)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(resources::templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        resources::read(&self.daemon, &request.uri)
            .await
            .map(Into::into)
            .map_err(Into::into)
    }
}
