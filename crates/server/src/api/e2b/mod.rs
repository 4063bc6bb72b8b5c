//! E2B compatibility: the unmodified E2B SDKs (Python `e2b`, JS `e2b`) against the daemon,
//! with only `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY` set. The wire format is
//! specified in `tests/compat/e2b/WIRE.md`.
//!
//! A router at the edge, with no lifecycle logic of its own: every call is translated to
//! the daemon's own types and served by the same [`Manager`] methods as `/v1`. Two planes:
//!
//! * the control plane (`/v2/sandboxes`, `/sandboxes/{id}/…`, `/snapshots`,
//!   `/templates/…` and the template build API `/v3/templates`, `/v2/templates/…`), chosen
//!   by path when the request carries `X-API-KEY` (the daemon's API token) — or, for the
//!   PUT of a template's files, a signature the daemon handed out;
//! * envd, the in-sandbox daemon of E2B (`/health`, `/files`, Connect-RPC
//!   `/process.Process/*` and `/filesystem.Filesystem/*`), chosen by the `E2b-Sandbox-Id`
//!   header and served from the host over the sandbox's agent: nothing new runs inside.
//!   Its requests carry `X-Access-Token`, a per-sandbox token derived from the daemon's
//!   secret (never the API token).
//!
//! Anything else passes on untouched.

mod build_plan;
mod connect;
mod control;
mod envd;
mod errors;
mod files;
mod filesystem;
mod gate;
mod launch;
mod multipart;
mod process;
mod shapes;
mod templates;
mod users;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use sandfork_http::token::Token;
use tower::ServiceExt;

use crate::manager::Manager;

/// The header that routes a request to a sandbox's envd.
pub const SANDBOX_HEADER: &str = "e2b-sandbox-id";
/// The header of the control plane's key.
pub const API_KEY_HEADER: &str = "x-api-key";

/// What the E2B handlers share.
pub struct Shared {
    pub manager: Arc<Manager>,
    pub token: Option<Arc<Token>>,
    pub gates: gate::Gates,
    pub users: users::Users,
    pub watchers: filesystem::Watchers,
    pub templates: templates::Templates,
}

/// The handlers' state.
pub type E2bState = Arc<Shared>;

/// The E2B edge: its two routers, built once.
#[derive(Clone)]
pub struct Edge {
    control: Router,
    envd: Router,
}

impl Edge {
    pub fn new(manager: Arc<Manager>, token: Option<Arc<Token>>) -> Self {
        let shared = Arc::new(Shared {
            manager,
            token,
            gates: gate::Gates::default(),
            users: users::Users::default(),
            watchers: filesystem::Watchers::default(),
            templates: templates::Templates::default(),
        });
        Edge {
            control: control::routes()
                .merge(templates::routes())
                .with_state(shared.clone()),
            envd: envd_routes().with_state(shared),
        }
    }
}

/// Sends E2B requests to their router; everything else goes on.
pub async fn dispatch(State(edge): State<Edge>, req: Request, next: Next) -> Response {
    let router = match plane(req.headers(), req.uri().path(), req.uri().query()) {
        Some(Plane::Envd) => edge.envd,
        Some(Plane::Control) => edge.control,
        None => return next.run(req).await,
    };
    match router.oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Plane {
    Envd,
    Control,
}

/// Which E2B plane a request is for, if any. A signed `/files` URL is envd's even
/// without the header (it is refused then: it cannot say which sandbox it is for).
fn plane(headers: &HeaderMap, path: &str, query: Option<&str>) -> Option<Plane> {
    let envd = matches!(path, "/health" | "/files")
        || path.starts_with("/process.Process/")
        || path.starts_with("/filesystem.Filesystem/");
    let signed = path == "/files" && query.is_some_and(|q| q.contains("signature="));
    if envd && (headers.contains_key(SANDBOX_HEADER) || signed) {
        return Some(Plane::Envd);
    }
    let control = path == "/v2/sandboxes"
        || path.starts_with("/v2/sandboxes/")
        || path.starts_with("/sandboxes/")
        || path == "/snapshots"
        || path == "/templates"
        || path.starts_with("/templates/")
        || path == "/v2/templates"
        || path.starts_with("/v2/templates/")
        || path == "/v3/templates";
    // The upload URL of a template's files is signed instead (the SDKs PUT to it bare).
    let upload = path.starts_with("/templates/")
        && path.contains("/files/")
        && query.is_some_and(|q| q.contains("signature="));
    (control && (headers.contains_key(API_KEY_HEADER) || upload)).then_some(Plane::Control)
}

/// envd's routes: its process and filesystem services, `/files` and `/health` (each
/// admits its request through [`envd`] first).
fn envd_routes() -> axum::Router<E2bState> {
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/health", get(files::health))
        .route("/files", get(files::download).post(files::upload))
        .route("/process.Process/{method}", post(process::call))
        .route("/filesystem.Filesystem/{method}", post(filesystem::call))
        .fallback(|| async { errors::ApiErr::not_found("no such envd route").into_response() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planes_are_told_by_header_and_path() {
        let mut h = HeaderMap::new();
        assert_eq!(plane(&h, "/v2/sandboxes", None), None, "no key: not ours");
        assert_eq!(
            plane(&h, "/files", Some("path=a&signature=v1_x")),
            Some(Plane::Envd)
        );
        assert_eq!(plane(&h, "/files", Some("path=a")), None);
        assert_eq!(
            plane(&h, "/templates/t/files/ab", Some("signature=x")),
            Some(Plane::Control)
        );
        assert_eq!(plane(&h, "/templates/t/files/ab", None), None);
        h.insert(API_KEY_HEADER, "k".parse().unwrap());
        assert_eq!(plane(&h, "/v2/sandboxes", None), Some(Plane::Control));
        assert_eq!(plane(&h, "/sandboxes/x/pause", None), Some(Plane::Control));
        assert_eq!(plane(&h, "/templates/a%2Fb", None), Some(Plane::Control));
        assert_eq!(plane(&h, "/v3/templates", None), Some(Plane::Control));
        assert_eq!(
            plane(&h, "/v2/templates/t/builds/b", None),
            Some(Plane::Control)
        );
        assert_eq!(plane(&h, "/v1/sandboxes", None), None);
        h.insert(SANDBOX_HEADER, "sb".parse().unwrap());
        assert_eq!(plane(&h, "/v1/sandboxes", None), None, "not an envd path");
        assert_eq!(plane(&h, "/process.Process/Start", None), Some(Plane::Envd));
        assert_eq!(plane(&h, "/health", None), Some(Plane::Envd));
    }
}
