//! The Tensorlake SDKs' wire format (tests/compat/tensorlake/WIRE.md), translated at the
//! edge: every handler here turns a Tensorlake request into the daemon's own API types,
//! calls the manager (or the native handler) the `/v1` routes call, and shapes the answer
//! as the SDKs read it. Nothing here keeps state or decides anything of its own.
//!
//! Two path shapes reach the same handlers: `/v1/namespaces/{ns}/...` (what the SDKs use
//! when their API URL is `localhost` or `127.0.0.1`) and the flat `/sandboxes`,
//! `/snapshots`, ... of a `sandbox.X` host (an `api.X` API URL), rewritten to the first
//! by [`flat_paths`]. The data plane (`/api/v1/...`) names its sandbox by `Host:
//! {id}.local` or `X-Tensorlake-Sandbox-Id` ([`TlSandbox`]). Authentication is the
//! daemon's bearer token, checked by the same middleware as every other route.

mod errors;
mod files;
mod lifecycle;
mod processes;
mod pty;
mod shapes;
mod sse;

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Uri};
use axum::routing::{any, get, post};
use axum::Router;

use super::{ApiError, AppState};
use crate::error::Error;

/// The namespaced prefix of the lifecycle routes.
const NS: &str = "/v1/namespaces/{ns}";

/// Lifecycle paths of the flat (`sandbox.X` host) shape.
const FLAT_ROOTS: [&str; 4] = [
    "/sandboxes",
    "/snapshots",
    "/sandbox-pools",
    "/archived-sandboxes",
];

/// Every Tensorlake route; mounted beside the native ones, behind the same token check.
pub(super) fn routes() -> Router<AppState> {
    lifecycle_routes()
        .merge(data_plane_routes())
        .merge(missing_routes())
}

fn lifecycle_routes() -> Router<AppState> {
    use lifecycle as l;
    Router::new()
        .route(&format!("{NS}/sandboxes"), post(l::create).get(l::list))
        .route(
            &format!("{NS}/sandboxes/{{id}}"),
            get(l::get).patch(l::update).delete(l::delete),
        )
        .route(&format!("{NS}/sandboxes/{{id}}/suspend"), post(l::suspend))
        .route(&format!("{NS}/sandboxes/{{id}}/resume"), post(l::resume))
        .route(
            &format!("{NS}/sandboxes/{{id}}/snapshot"),
            post(l::snapshot),
        )
        .route(
            &format!("{NS}/sandboxes/{{id}}/snapshots"),
            get(l::sandbox_snapshots),
        )
        .route(&format!("{NS}/sandboxes/{{id}}/copy"), post(l::copy))
        .route(&format!("{NS}/snapshots"), get(l::list_snapshots))
        .route(
            &format!("{NS}/snapshots/{{snap}}"),
            get(l::get_snapshot).delete(l::delete_snapshot),
        )
}

fn data_plane_routes() -> Router<AppState> {
    use processes as p;
    Router::new()
        .route("/api/v1/processes/run", post(p::run))
        .route("/api/v1/processes", post(p::start).get(p::list))
        .route("/api/v1/processes/{proc}", get(p::get).delete(p::kill))
        .route("/api/v1/processes/{proc}/signal", post(p::signal))
        .route("/api/v1/processes/{proc}/stdin", post(p::stdin))
        .route("/api/v1/processes/{proc}/stdin/close", post(p::close_stdin))
        .route("/api/v1/processes/{proc}/restart", post(p::restart))
        .route("/api/v1/processes/{proc}/{stream}", get(p::output))
        .route("/api/v1/processes/{proc}/{stream}/follow", get(p::follow))
        .route(
            "/api/v1/files",
            get(files::read).put(files::write).delete(files::delete),
        )
        .route("/api/v1/files/list", get(files::list))
        .route("/api/v1/pty", post(pty::create))
        .route("/api/v1/pty/{session}", axum::routing::delete(pty::kill))
        .route("/api/v1/pty/{session}/ws", get(pty::connect))
        .route("/api/v1/health", get(processes::health))
        .route("/api/v1/info", get(processes::info))
}

/// Tensorlake features sandfork has no counterpart for: each answers an error naming it.
fn missing_routes() -> Router<AppState> {
    let e = errors::missing;
    Router::new()
        .route(&format!("{NS}/sandbox-pools"), any(e))
        .route(&format!("{NS}/sandbox-pools/{{*rest}}"), any(e))
        .route(&format!("{NS}/archived-sandboxes"), any(e))
        .route(&format!("{NS}/archived-sandboxes/{{*rest}}"), any(e))
        .route(&format!("{NS}/sandboxes/{{id}}/file_systems"), any(e))
        .route(&format!("{NS}/sandboxes/{{id}}/logs"), any(e))
        .route(&format!("{NS}/sandboxes/{{id}}/processes"), any(e))
}

/// Rewrites a flat lifecycle path of a `sandbox.X` host to its namespaced form (namespace
/// `default`), before routing; every other request passes unchanged.
pub(super) fn flat_paths(mut req: Request) -> Request {
    if let Some(uri) = flat_uri(req.headers(), req.uri()) {
        *req.uri_mut() = uri;
    }
    req
}

fn flat_uri(headers: &HeaderMap, uri: &Uri) -> Option<Uri> {
    let host = request_host(headers, uri)?;
    if !host.starts_with("sandbox.") {
        return None;
    }
    let path = uri.path();
    let flat = FLAT_ROOTS
        .iter()
        .any(|root| path == *root || path.starts_with(&format!("{root}/")));
    if !flat {
        return None;
    }
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    format!("/v1/namespaces/default{path}{query}").parse().ok()
}

/// The `Host` a client asked for (HTTP/2: the URI's authority).
fn request_host<'a>(headers: &'a HeaderMap, uri: &'a Uri) -> Option<&'a str> {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
}

/// `host` without a trailing `:port`.
fn without_port(host: &str) -> &str {
    if host.starts_with('[') {
        // An IPv6 literal: `[::1]` or `[::1]:80`.
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// Whether `id` can be a sandbox id or name (what the daemon itself accepts as a name).
fn plausible_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// The sandbox a data-plane request is for: `X-Tensorlake-Sandbox-Id`, else the
/// `{id}` of `Host: {id}.local`.
pub(super) struct TlSandbox(pub String);

impl<S: Send + Sync> FromRequestParts<S> for TlSandbox {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        sandbox_of(&parts.headers, &parts.uri).map(TlSandbox)
    }
}

fn sandbox_of(headers: &HeaderMap, uri: &Uri) -> Result<String, ApiError> {
    let by_header = headers
        .get("x-tensorlake-sandbox-id")
        .and_then(|v| v.to_str().ok());
    let by_host = request_host(headers, uri)
        .map(without_port)
        .and_then(|h| h.strip_suffix(".local"))
        .filter(|label| !label.contains('.'));
    let id = by_header.or(by_host).ok_or_else(|| {
        ApiError(Error::InvalidArgument(
            "No sandbox named: send Host {sandbox_id}.local or X-Tensorlake-Sandbox-Id".into(),
        ))
    })?;
    if !plausible_id(id) {
        return Err(ApiError(Error::InvalidArgument(format!(
            "Invalid sandbox id {id:?}"
        ))));
    }
    Ok(id.to_string())
}

/// The `sandbox_url` answered for a sandbox: this daemon as the client reached it
/// (`http://localhost:PORT` makes the SDKs send `Host: {id}.local`; any other host makes
/// them send `X-Tensorlake-Sandbox-Id`). `None` when the request named no usable host.
pub(super) struct SandboxUrl(pub Option<String>);

impl FromRequestParts<AppState> for SandboxUrl {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, m: &AppState) -> Result<Self, Self::Rejection> {
        let tls = m.config().tls_cert.is_some();
        Ok(SandboxUrl(sandbox_url(&parts.headers, &parts.uri, tls)))
    }
}

fn sandbox_url(headers: &HeaderMap, uri: &Uri, tls: bool) -> Option<String> {
    let host = request_host(headers, uri)?;
    let sane = !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
    if !sane {
        return None;
    }
    let forwarded_tls = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let scheme = if tls || forwarded_tls {
        "https"
    } else {
        "http"
    };
    Some(format!("{scheme}://{host}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn flat_paths_of_a_sandbox_host_get_the_default_namespace() {
        let h = headers(&[("host", "sandbox.example.test:7070")]);
        let uri: Uri = "/sandboxes/sb-1/copy?times=2".parse().unwrap();
        assert_eq!(
            flat_uri(&h, &uri).unwrap().to_string(),
            "/v1/namespaces/default/sandboxes/sb-1/copy?times=2"
        );
        for path in ["/v1/sandboxes", "/api/v1/files", "/sandboxesx", "/metrics"] {
            assert!(flat_uri(&h, &path.parse().unwrap()).is_none(), "{path}");
        }
        let local = headers(&[("host", "localhost:7070")]);
        assert!(flat_uri(&local, &"/sandboxes".parse().unwrap()).is_none());
    }

    #[test]
    fn the_data_plane_sandbox_comes_from_the_header_or_the_local_host() {
        let uri: Uri = "/api/v1/health".parse().unwrap();
        let by_host = headers(&[("host", "sb-0123.local")]);
        assert_eq!(sandbox_of(&by_host, &uri).unwrap(), "sb-0123");
        let by_host_port = headers(&[("host", "sb-0123.local:80")]);
        assert_eq!(sandbox_of(&by_host_port, &uri).unwrap(), "sb-0123");
        let by_header = headers(&[
            ("host", "sandbox.example.test:7070"),
            ("x-tensorlake-sandbox-id", "sb-9"),
        ]);
        assert_eq!(sandbox_of(&by_header, &uri).unwrap(), "sb-9");
        for bad in [
            headers(&[("host", "localhost:7070")]),
            headers(&[("host", "a.b.local")]),
            headers(&[("x-tensorlake-sandbox-id", "../etc")]),
        ] {
            assert!(sandbox_of(&bad, &uri).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_sandbox_url_is_this_daemon_as_reached() {
        let uri: Uri = "/".parse().unwrap();
        let h = headers(&[("host", "localhost:7070")]);
        assert_eq!(
            sandbox_url(&h, &uri, false).as_deref(),
            Some("http://localhost:7070")
        );
        let proxied = headers(&[("host", "sandbox.x.test"), ("x-forwarded-proto", "https")]);
        assert_eq!(
            sandbox_url(&proxied, &uri, false).as_deref(),
            Some("https://sandbox.x.test")
        );
        assert!(sandbox_url(&headers(&[("host", "a b")]), &uri, false).is_none());
    }

    #[test]
    fn ports_are_cut_from_hosts() {
        assert_eq!(without_port("a.local:80"), "a.local");
        assert_eq!(without_port("a.local"), "a.local");
        assert_eq!(without_port("[::1]:80"), "[::1]");
    }
}
