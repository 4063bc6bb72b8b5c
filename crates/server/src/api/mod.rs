//! The `/v1` HTTP API (axum). Handlers are thin: parse, call the manager, shape the reply.
//! Errors are `{code, message}` with the status [`crate::Error::status_code`] gives.

mod auth;
mod console;
mod e2b;
mod events;
mod exec;
mod extract;
mod files;
mod gateway;
mod images;
mod ndjson;
mod openapi;
mod processes;
mod pty;
mod sandboxes;
mod snapshots;
mod spawn;
mod system;
mod tensorlake;
mod volumes;

use std::sync::{Arc, OnceLock};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::{Json, Router};

use crate::error::Error;
use crate::logs::{RateLimit, Verdict};
use crate::manager::Manager;
use api_types::{ErrorBody, ErrorCode};
pub use openapi::openapi_json;
use sandfork_http::proxy::host_target;
use sandfork_http::token::Token;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// What every handler can reach.
pub type AppState = Arc<Manager>;

/// An error as an HTTP response.
#[derive(Debug)]
pub struct ApiError(pub Error);

impl<E: Into<Error>> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError(e.into())
    }
}

/// The limiter of server-error log lines.
fn server_errors() -> &'static RateLimit {
    static LIMIT: OnceLock<RateLimit> = OnceLock::new();
    LIMIT.get_or_init(|| RateLimit::new(std::time::Duration::from_secs(10), 20))
}

/// The error kind of a response, for the error counter.
#[derive(Debug, Clone, Copy)]
struct ErrorKind(&'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.0.status_code();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            // A broken sandbox (e.g. a killed agent) can make every request fail.
            if let Verdict::Log { suppressed } = server_errors().check(code) {
                tracing::error!(code, suppressed, error = %self.0.message(), "request failed");
            }
        } else {
            tracing::debug!(code, error = %self.0.message(), "request refused");
        }
        let body = ErrorBody {
            code: code.into(),
            message: self.0.message(),
        };
        let mut resp = (status, Json(body)).into_response();
        resp.extensions_mut().insert(ErrorKind(code));
        resp
    }
}

/// A plain error response without a daemon error behind it.
pub(crate) fn error_response(status: StatusCode, code: ErrorCode, message: String) -> Response {
    let mut resp = (
        status,
        Json(ErrorBody {
            code: code.as_str().into(),
            message,
        }),
    )
        .into_response();
    resp.extensions_mut().insert(ErrorKind(code.as_str()));
    resp
}

/// Handler result.
pub type ApiResult<T> = Result<T, ApiError>;

async fn count_errors(State(m): State<AppState>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if let Some(ErrorKind(kind)) = resp.extensions().get::<ErrorKind>() {
        m.metrics().error(kind);
    }
    resp
}

async fn fallback() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "No such route".into(),
    )
}

async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::BadRequest,
        "Method not allowed".into(),
    )
}

/// Every route of the native API, each registered once: a handler's `#[utoipa::path]`
/// gives both its route and its entry in the OpenAPI document (`openapi::document`).
pub(crate) fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(sandboxes::create, sandboxes::list))
        .routes(routes!(
            sandboxes::get,
            sandboxes::update,
            sandboxes::terminate
        ))
        .routes(routes!(sandboxes::patch_labels))
        .routes(routes!(sandboxes::stats))
        .routes(routes!(sandboxes::port_url))
        .routes(routes!(sandboxes::rotate_access_token))
        .routes(routes!(events::events))
        .routes(routes!(exec::exec))
        .routes(routes!(processes::spawn, processes::list))
        .routes(routes!(processes::get, processes::stop))
        .routes(routes!(processes::restart))
        .routes(routes!(processes::output))
        .routes(routes!(processes::stdin))
        .routes(routes!(processes::close_stdin))
        .routes(routes!(processes::signal))
        .routes(routes!(processes::wait))
        .routes(routes!(processes::logs))
        .routes(routes!(pty::create))
        .routes(routes!(pty::resize))
        .routes(routes!(pty::connect))
        .routes(routes!(files::download, files::upload, files::remove))
        .routes(routes!(files::list))
        .routes(routes!(files::watch))
        .routes(routes!(files::stat))
        .routes(routes!(files::mkdir))
        .routes(routes!(images::list, images::build))
        .routes(routes!(images::inspect, images::delete))
        .routes(routes!(images::ensure))
        .routes(routes!(images::pull))
        .routes(routes!(images::build_dockerfile))
        .routes(routes!(images::from_snapshot))
        .routes(routes!(images::import))
        .routes(routes!(images::push))
        .routes(routes!(images::export))
        .routes(routes!(volumes::list, volumes::create))
        .routes(routes!(volumes::inspect, volumes::delete))
        .routes(routes!(system::health))
        .routes(routes!(system::openapi))
        .routes(routes!(system::metrics))
        .merge(snapshots::routes())
}

/// The whole API; with a token, every request must carry it — but port requests (by path
/// or by host), which the gateway authorizes itself (the API token is one of the ways).
/// The Tensorlake SDKs' routes (`tensorlake`) sit beside the native ones, behind the
/// same token.
pub fn router(manager: Arc<Manager>, token: Option<Token>) -> Router {
    let token = token.map(Arc::new);
    let (api, _) = api_routes().split_for_parts();
    let mut app = api
        .merge(tensorlake::routes())
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::disable());
    let mut ports = Router::new()
        .route("/v1/sandboxes/{id}/ports/{port}", any(gateway::by_path))
        .route("/v1/sandboxes/{id}/ports/{port}/", any(gateway::by_path))
        .route(
            "/v1/sandboxes/{id}/ports/{port}/{*rest}",
            any(gateway::by_path),
        );
    if let Some(token) = &token {
        app = app.layer(middleware::from_fn_with_state(token.clone(), auth::require));
        ports = ports.layer(middleware::from_fn_with_state(token.clone(), auth::mark));
    }
    if manager.config().ui {
        ports = ports.merge(console::routes());
    }
    let routed = ports
        .merge(app)
        // E2B's SDKs (by their headers: see `e2b`), before any route or token check.
        .layer(middleware::from_fn_with_state(
            e2b::Edge::new(manager.clone(), token.clone()),
            e2b::dispatch,
        ))
        .layer(middleware::from_fn_with_state(
            (manager.clone(), token),
            route_by_host,
        ))
        .layer(middleware::from_fn_with_state(
            manager.clone(),
            count_errors,
        ))
        .with_state(manager);
    // The flat Tensorlake paths of a `sandbox.X` host are rewritten before routing.
    Router::new().fallback_service(tower::ServiceExt::map_request(
        routed,
        tensorlake::flat_paths,
    ))
}

/// Sends a request whose `Host` names a sandbox's port (`{port}-{id}.<gateway_domain>`)
/// to the gateway, before any API route or token check.
async fn route_by_host(
    State((m, token)): State<(AppState, Option<Arc<Token>>)>,
    mut req: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let Some((id, port)) = host_target(req.headers(), req.uri(), m.gateway_domain()) else {
        return next.run(req).await;
    };
    if let Some(token) = token {
        auth::mark_request(&token, &mut req);
    }
    gateway::by_host(&m, &id, &port, req).await
}
