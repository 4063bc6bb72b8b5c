//! The port gateway: HTTP requests (HTTP/1.1 or HTTP/2 from the client, WebSocket and
//! other upgrades, server-sent events and any streamed body) passed to a TCP port on a
//! sandbox's own loopback, by path (`/v1/sandboxes/{id}/ports/{port}/…`) or by host
//! (`{port}-{id}.<gateway_domain>`).
//!
//! Requests are authorized first (see `manager::ports`); nothing reaches the sandbox
//! before. Each request gets its own connection into the sandbox, speaking HTTP/1.1; the
//! daemon's credentials are stripped from what is passed on. A sandbox's connections are
//! capped (`gateway_connections_per_sandbox`), and each runs in its own task, so one
//! sandbox's flood or a slow client stalls nobody else.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;

use super::{ApiError, AppState};
use crate::error::Error;
use crate::manager::PortCredentials;
use sandfork_http::proxy::{
    passed_query, strip_credentials, strip_hop_by_hop, wants_upgrade, SandboxCredentials,
};

/// `ANY /v1/sandboxes/{id}/ports/{port}` and `…/{port}/{*rest}`.
///
/// A path-routed port shares the API's origin (and the console's), so what the sandbox
/// serves there must not act as that origin: its responses are served with
/// `Content-Security-Policy: sandbox` (the page runs in an opaque origin: no storage,
/// cookies or service workers of the API's origin), without the headers that would act on
/// the origin (`Set-Cookie`, `Service-Worker-Allowed`, `Clear-Site-Data`, its own CSP), and
/// a service worker script is never served. A sandbox's app that needs an origin of its
/// own is reached by host (`{port}-{id}.<gateway domain>`), which is not the API's.
pub async fn by_path(
    State(m): State<AppState>,
    Path(params): Path<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (Some(id), Some(port)) = (get("id"), get("port")) else {
        return ApiError(Error::NotFound("No such route".into())).into_response();
    };
    let rest = get("rest").unwrap_or_default();
    if req.headers().contains_key(SERVICE_WORKER) {
        return ApiError(Error::Forbidden(format!(
            "A sandbox's port reached by path shares the API's origin and serves no \
             service worker; reach port {port} by host ({port}-{id}.{}) instead",
            m.gateway_domain()
        )))
        .into_response();
    }
    let prefix = format!("/v1/sandboxes/{id}/ports/{port}");
    let mut resp = forward(&m, &id, &port, &format!("/{rest}"), Some(prefix), req).await;
    confine_to_opaque_origin(resp.headers_mut());
    resp
}

/// The request header a browser sends when it fetches a service worker script.
const SERVICE_WORKER: &str = "service-worker";

/// Response headers a path-routed sandbox page may not send: each acts on the API's
/// origin (cookies, service worker scope, stored data) or would relax the policy below.
const ORIGIN_HEADERS: [&str; 5] = [
    "set-cookie",
    "service-worker-allowed",
    "clear-site-data",
    "content-security-policy",
    "content-security-policy-report-only",
];

/// What a path-routed page runs under: scripts, forms, popups and downloads work, but in
/// an opaque origin (no `allow-same-origin`), so nothing of the API's origin is its own.
const PATH_ROUTE_CSP: &str = "sandbox allow-scripts allow-forms allow-popups \
    allow-popups-to-escape-sandbox allow-modals allow-downloads";

/// Makes a path-routed response harmless to the origin it shares with the API.
fn confine_to_opaque_origin(headers: &mut HeaderMap) {
    for name in ORIGIN_HEADERS {
        headers.remove(name);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PATH_ROUTE_CSP),
    );
}

/// Serves a request routed by host.
pub async fn by_host(m: &AppState, id: &str, port: &str, req: Request) -> Response {
    let path = req.uri().path().to_string();
    forward(m, id, port, &path, None, req).await
}

async fn forward(
    m: &AppState,
    id: &str,
    port: &str,
    path: &str,
    prefix: Option<String>,
    mut req: Request,
) -> Response {
    let port: u16 = match port.parse() {
        Ok(p) if p > 0 => p,
        _ => {
            return ApiError(Error::InvalidArgument(format!(
                "Invalid port {port:?}: use 1-65535"
            )))
            .into_response()
        }
    };
    let creds = credentials(&req);
    let id = match m.authorize_port(id, port, &creds) {
        Ok(id) => id,
        Err(e) => return ApiError(e).into_response(),
    };
    let conn = match m.connect_port(&id, port).await {
        Ok(c) => c,
        Err(e) => return ApiError(e).into_response(),
    };
    let query = passed_query(req.uri().query());
    let target = match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let Ok(uri) = target.parse::<Uri>() else {
        return ApiError(Error::InvalidArgument(format!("Invalid path {target:?}")))
            .into_response();
    };
    let upgrade = wants_upgrade(req.headers());
    let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    let outbound = outbound_request(req, uri, prefix, creds.api_token);
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(conn.stream)).await {
            Ok(pair) => pair,
            Err(e) => return bad_gateway(port, &id, &e),
        };
    let permit = conn.permit;
    tokio::spawn(async move {
        let _permit = permit;
        let _ = connection.with_upgrades().await;
    });
    let mut resp = match sender.send_request(outbound).await {
        Ok(r) => r,
        Err(e) => return bad_gateway(port, &id, &e),
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let sandbox_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = tokio::join!(client_side, sandbox_side) {
                    let _ =
                        tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b))
                            .await;
                }
            });
        }
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(
        &mut parts.headers,
        parts.status == StatusCode::SWITCHING_PROTOCOLS,
    );
    Response::from_parts(parts, Body::new(body))
}

fn bad_gateway(port: u16, id: &str, e: &hyper::Error) -> Response {
    ApiError(Error::BadGateway(format!(
        "Port {port} of sandbox {id} did not answer HTTP: {e}"
    )))
    .into_response()
}

/// What a request presents to open a port.
fn credentials(req: &Request) -> PortCredentials {
    let api_token = req
        .extensions()
        .get::<super::auth::Authenticated>()
        .is_some();
    let SandboxCredentials {
        access_token,
        signed,
    } = SandboxCredentials::of(req);
    PortCredentials {
        api_token,
        access_token,
        signed,
    }
}

/// The request as the sandbox gets it: HTTP/1.1 to `uri`, without the daemon's
/// credentials or hop-by-hop headers, with `X-Forwarded-*` telling where it came from.
fn outbound_request(
    req: Request,
    uri: Uri,
    prefix: Option<String>,
    api_token_used: bool,
) -> Request {
    let (mut parts, body) = req.into_parts();
    let host = parts.headers.get(header::HOST).cloned().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let upgrade = wants_upgrade(&parts.headers);
    strip_credentials(&mut parts.headers, upgrade, api_token_used);
    if let Some(host) = host {
        parts
            .headers
            .insert(HeaderName::from_static("x-forwarded-host"), host.clone());
        parts.headers.insert(header::HOST, host);
    }
    if let Some(prefix) = prefix.and_then(|p| HeaderValue::from_str(&p).ok()) {
        parts
            .headers
            .insert(HeaderName::from_static("x-forwarded-prefix"), prefix);
    }
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    Request::from_parts(parts, body)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_path_routed_page_cannot_act_as_the_api_origin() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("set-cookie", "session=x; Path=/"),
            ("service-worker-allowed", "/"),
            ("clear-site-data", "\"storage\""),
            ("content-security-policy", "default-src *"),
            ("content-type", "text/html"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        confine_to_opaque_origin(&mut h);
        for gone in ORIGIN_HEADERS
            .iter()
            .filter(|n| **n != "content-security-policy")
        {
            assert!(!h.contains_key(*gone), "{gone} passed");
        }
        let csp = h
            .get_all(header::CONTENT_SECURITY_POLICY)
            .iter()
            .collect::<Vec<_>>();
        assert_eq!(
            csp.len(),
            1,
            "the sandbox's own policy is replaced, not added to"
        );
        let csp = csp[0].to_str().unwrap();
        assert!(
            csp.starts_with("sandbox ") && !csp.contains("allow-same-origin"),
            "{csp}"
        );
        assert_eq!(h["content-type"], "text/html");
    }
}
