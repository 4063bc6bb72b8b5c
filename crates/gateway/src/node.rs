//! Talking to a node's API: a request passed on as it came (bodies streamed both ways,
//! upgrades such as terminals' WebSockets joined end to end), or a JSON call of the
//! gateway's own. Each request has a connection of its own to the node.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, Response, StatusCode, Uri};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// How long a connection to a node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest JSON answer the gateway reads itself (lists of many sandboxes).
pub const MAX_JSON: usize = 64 << 20;

/// Why a node did not answer.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("node {api} cannot be reached: {detail}")]
    Unreachable { api: String, detail: String },
    #[error("node {api} answered {status}: {message}")]
    Refused {
        api: String,
        status: StatusCode,
        message: String,
    },
    #[error("node {api}: {detail}")]
    Protocol { api: String, detail: String },
}

impl NodeError {
    /// Whether the node itself is gone (not that it refused the request).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, NodeError::Unreachable { .. })
    }
}

/// `host:port` of a node's base URL (`http://host:port`).
fn authority(api: &str) -> Result<String, NodeError> {
    let uri: Uri = api.parse().map_err(|_| NodeError::Protocol {
        api: api.into(),
        detail: "not a URL".into(),
    })?;
    if uri.scheme_str() != Some("http") {
        return Err(NodeError::Protocol {
            api: api.into(),
            detail: "only http:// node addresses are spoken to (TLS to nodes is not built yet)"
                .into(),
        });
    }
    uri.authority()
        .map(|a| a.to_string())
        .ok_or_else(|| NodeError::Protocol {
            api: api.into(),
            detail: "no host".into(),
        })
}

/// Sends `req` (its path and query; headers as the caller left them) to node `api` and
/// returns the node's answer, its body streaming.
pub async fn send(api: &str, req: Request<Body>) -> Result<Response<Body>, NodeError> {
    send_as(api, req, false).await
}

/// [`send`], keeping the request's own `Host` when `keep_host` (a port reached by host
/// name: the node routes it by that name, its `gateway_domain` being the gateway's).
pub async fn send_as(
    api: &str,
    mut req: Request<Body>,
    keep_host: bool,
) -> Result<Response<Body>, NodeError> {
    let unreachable = |detail: String| NodeError::Unreachable {
        api: api.into(),
        detail,
    };
    let host = authority(api)?;
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&host))
        .await
        .map_err(|_| unreachable(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    *req.uri_mut() = path.parse().map_err(|_| NodeError::Protocol {
        api: api.into(),
        detail: format!("bad path {path:?}"),
    })?;
    let upgrade = server::api::wants_upgrade(req.headers());
    server::api::strip_hop_by_hop(req.headers_mut(), upgrade);
    if !(keep_host && req.headers().contains_key(header::HOST)) {
        if let Ok(h) = HeaderValue::from_str(&host) {
            req.headers_mut().insert(header::HOST, h);
        }
    }
    *req.version_mut() = axum::http::Version::HTTP_11;
    let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let node_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = tokio::join!(client_side, node_side) {
                    let _ =
                        tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b))
                            .await;
                }
            });
        }
    }
    let (mut parts, body) = resp.into_parts();
    server::api::strip_hop_by_hop(
        &mut parts.headers,
        parts.status == StatusCode::SWITCHING_PROTOCOLS,
    );
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// A request of the gateway's own to node `api`, with the nodes' token.
pub fn request(
    method: Method,
    path: &str,
    token: &str,
    body: Option<&serde_json::Value>,
) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    let body = match body {
        Some(v) => {
            b = b.header(header::CONTENT_TYPE, "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    b.body(body).unwrap_or_else(|_| Request::new(Body::empty()))
}

/// Reads a whole (JSON) answer of at most [`MAX_JSON`] bytes.
pub async fn read(api: &str, resp: Response<Body>) -> Result<(StatusCode, Bytes), NodeError> {
    let status = resp.status();
    let limited = http_body_util::Limited::new(resp.into_body(), MAX_JSON);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| NodeError::Protocol {
            api: api.into(),
            detail: format!("reading its answer: {e}"),
        })?
        .to_bytes();
    Ok((status, bytes))
}

/// A JSON call: the decoded answer of a 2xx, else the node's error.
pub async fn call(
    api: &str,
    method: Method,
    path: &str,
    token: &str,
    body: Option<&serde_json::Value>,
) -> Result<serde_json::Value, NodeError> {
    let resp = send(api, request(method, path, token, body)).await?;
    let (status, bytes) = read(api, resp).await?;
    if !status.is_success() {
        let message = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["message"].as_str().map(String::from))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(300).collect());
        return Err(NodeError::Refused {
            api: api.into(),
            status,
            message,
        });
    }
    if bytes.is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| NodeError::Protocol {
        api: api.into(),
        detail: format!("not JSON: {e}"),
    })
}

/// A response rebuilt from a read answer.
pub fn respond(status: StatusCode, bytes: Bytes) -> Response<Body> {
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_are_plain_http_host_and_port() {
        assert_eq!(
            authority("http://198.18.0.11:7070").unwrap(),
            "198.18.0.11:7070"
        );
        assert!(authority("https://198.18.0.11:7070").is_err());
        assert!(authority("nonsense").is_err());
    }
}
