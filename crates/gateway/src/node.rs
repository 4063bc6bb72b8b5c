//! Talking to a node's API: a request passed on as it came (bodies streamed both ways,
//! upgrades such as terminals' WebSockets joined end to end), or a call of the gateway's
//! own, whose answer is read into its API type (`crate::wire`). Each request has a
//! connection of its own to the node.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, Response, StatusCode, Uri};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use sandfork_http::proxy::{strip_hop_by_hop, wants_upgrade};
use serde::de::DeserializeOwned;
use serde::Serialize;
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
    /// An answer that is not the API's type for it: a field missing or of another type.
    #[error("node {api} answered with a bad {what}: field {field}: {detail}")]
    Answer {
        api: String,
        /// The API type the answer should have been.
        what: &'static str,
        /// Where in the answer, as `children[0].sandbox.id`.
        field: String,
        detail: String,
    },
    #[error("node {api} is not trusted: {detail}")]
    Untrusted { api: String, detail: String },
}

impl NodeError {
    /// Whether the node itself is gone (not that it refused the request).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, NodeError::Unreachable { .. })
    }
}

/// `host:port` of a node's base URL (`http://host:port` or `https://host:port`), and
/// whether it is TLS.
fn authority(api: &str) -> Result<(String, bool), NodeError> {
    let uri: Uri = api.parse().map_err(|_| NodeError::Protocol {
        api: api.into(),
        detail: "not a URL".into(),
    })?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(NodeError::Protocol {
                api: api.into(),
                detail: "a node's address is http:// or https://".into(),
            })
        }
    };
    let authority = uri.authority().ok_or_else(|| NodeError::Protocol {
        api: api.into(),
        detail: "no host".into(),
    })?;
    Ok((authority.to_string(), tls))
}

/// How the gateway reaches its nodes, and which it trusts: over TLS, a node whose
/// certificate chains to the cluster's authority and names it (see `crate::trust`);
/// in plain HTTP, only a node on loopback, unless the operator allowed more.
pub struct Links {
    tls: Option<tokio_rustls::TlsConnector>,
    allow_plain: bool,
    /// API address → node name, of the nodes found trustworthy.
    trusted: std::sync::RwLock<std::collections::HashMap<String, String>>,
}

impl Links {
    pub fn new(tls: Option<tokio_rustls::TlsConnector>, allow_plain: bool) -> Links {
        Links {
            tls,
            allow_plain,
            trusted: Default::default(),
        }
    }

    fn trusted_name(&self, api: &str) -> Option<String> {
        self.trusted
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(api)
            .cloned()
    }

    /// Whether node `name` at `api` may receive the cluster's calls: checked once per
    /// address and name (a TLS handshake), then remembered.
    pub async fn admit(&self, api: &str, name: &str) -> Result<(), NodeError> {
        if self.trusted_name(api).as_deref() == Some(name) {
            return Ok(());
        }
        let untrusted = |detail: String| NodeError::Untrusted {
            api: api.into(),
            detail,
        };
        let (host, tls) = authority(api)?;
        if tls {
            let stream = connect(api, &host).await?;
            self.handshake(api, name, stream).await?;
        } else if !self.allow_plain && !is_loopback(&host) {
            return Err(untrusted(
                "plain HTTP to a node off this machine would send the node token in clear: \
                 serve nodes over TLS with certificates of the cluster's authority (gateway \
                 --node-ca), or pass --allow-insecure-nodes"
                    .into(),
            ));
        }
        self.trusted
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(api.to_string(), name.to_string());
        Ok(())
    }

    async fn handshake(
        &self,
        api: &str,
        name: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, NodeError> {
        let untrusted = |detail: String| NodeError::Untrusted {
            api: api.into(),
            detail,
        };
        let Some(connector) = &self.tls else {
            return Err(untrusted(
                "the node speaks TLS and the gateway has no cluster authority to check it \
                 (--node-ca)"
                    .into(),
            ));
        };
        let server_name = crate::trust::server_name(name)
            .ok_or_else(|| untrusted(format!("{name:?} cannot be a certificate's name")))?;
        connector.connect(server_name, stream).await.map_err(|e| {
            untrusted(format!(
                "its certificate is not the cluster's for {name}: {e}"
            ))
        })
    }

    /// Sends `req` (its path and query; headers as the caller left them) to node `api` and
    /// returns the node's answer, its body streaming.
    pub async fn send(&self, api: &str, req: Request<Body>) -> Result<Response<Body>, NodeError> {
        self.send_as(api, req, false).await
    }

    /// [`Links::send`], keeping the request's own `Host` when `keep_host` (a port reached
    /// by host name: the node routes it by that name, its `gateway_domain` being the
    /// gateway's). Only to a node found trustworthy.
    pub async fn send_as(
        &self,
        api: &str,
        mut req: Request<Body>,
        keep_host: bool,
    ) -> Result<Response<Body>, NodeError> {
        let (host, tls) = authority(api)?;
        let Some(name) = self.trusted_name(api) else {
            return Err(NodeError::Untrusted {
                api: api.into(),
                detail: "not an address of a trusted node of this cluster".into(),
            });
        };
        let stream = connect(api, &host).await?;
        prepare(api, &host, &mut req, keep_host)?;
        if tls {
            let stream = self.handshake(api, &name, stream).await?;
            exchange(api, TokioIo::new(stream), req).await
        } else {
            exchange(api, TokioIo::new(stream), req).await
        }
    }

    /// A call without a body: the answer of a 2xx read as `T`, else the node's error.
    pub async fn call<T: DeserializeOwned>(
        &self,
        api: &str,
        method: Method,
        path: &str,
        token: &str,
    ) -> Result<T, NodeError> {
        let resp = self.send(api, request(method, path, token, None)).await?;
        decode(api, resp).await
    }

    /// [`Links::call`] with `body` as JSON.
    pub async fn call_with<T: DeserializeOwned, B: Serialize>(
        &self,
        api: &str,
        method: Method,
        path: &str,
        token: &str,
        body: &B,
    ) -> Result<T, NodeError> {
        let body = serde_json::to_vec(body).map_err(|e| NodeError::Protocol {
            api: api.into(),
            detail: format!("cannot write the request: {e}"),
        })?;
        let resp = self
            .send(api, request(method, path, token, Some(body.into())))
            .await?;
        decode(api, resp).await
    }
}

fn is_loopback(authority: &str) -> bool {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

async fn connect(api: &str, host: &str) -> Result<TcpStream, NodeError> {
    let unreachable = |detail: String| NodeError::Unreachable {
        api: api.into(),
        detail,
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(host))
        .await
        .map_err(|_| unreachable(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// The request as a node gets it: origin-form path, no hop-by-hop headers, the node's
/// `Host` (unless kept), HTTP/1.1.
fn prepare(
    api: &str,
    host: &str,
    req: &mut Request<Body>,
    keep_host: bool,
) -> Result<(), NodeError> {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    *req.uri_mut() = path.parse().map_err(|_| NodeError::Protocol {
        api: api.into(),
        detail: format!("bad path {path:?}"),
    })?;
    let upgrade = wants_upgrade(req.headers());
    strip_hop_by_hop(req.headers_mut(), upgrade);
    if !(keep_host && req.headers().contains_key(header::HOST)) {
        if let Ok(h) = HeaderValue::from_str(host) {
            req.headers_mut().insert(header::HOST, h);
        }
    }
    *req.version_mut() = axum::http::Version::HTTP_11;
    Ok(())
}

/// One request over `io`; upgrades (terminals' WebSockets) joined end to end.
async fn exchange<IO>(
    api: &str,
    io: IO,
    mut req: Request<Body>,
) -> Result<Response<Body>, NodeError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let unreachable = |detail: String| NodeError::Unreachable {
        api: api.into(),
        detail,
    };
    let upgrade = wants_upgrade(req.headers());
    let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
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
    strip_hop_by_hop(
        &mut parts.headers,
        parts.status == StatusCode::SWITCHING_PROTOCOLS,
    );
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// A request of the gateway's own to node `api`, with the nodes' token (and a JSON body).
pub fn request(method: Method, path: &str, token: &str, body: Option<Bytes>) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    let body = match body {
        Some(bytes) => {
            b = b.header(header::CONTENT_TYPE, "application/json");
            Body::from(bytes)
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

/// The answer of a 2xx read as `T`, else the node's error.
async fn decode<T: DeserializeOwned>(api: &str, resp: Response<Body>) -> Result<T, NodeError> {
    let (status, bytes) = read(api, resp).await?;
    if !status.is_success() {
        let message = serde_json::from_slice::<api_types::ErrorBody>(&bytes)
            .map(|e| e.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).chars().take(300).collect());
        return Err(NodeError::Refused {
            api: api.into(),
            status,
            message,
        });
    }
    node_answer(api, &bytes)
}

/// Where a JSON text does not fit `T`: the field (dotted path, `.` for the whole) and what
/// is wrong with it.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, (String, String)> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let detail = e.inner().to_string();
        (field(&e.path().to_string(), &detail), detail)
    })?;
    de.end().map_err(|e| (".".to_string(), e.to_string()))?;
    Ok(value)
}

/// The field an error is about: its path, or for a field missing or unknown (which serde
/// reports at the object holding it) the path to the field itself.
fn field(path: &str, detail: &str) -> String {
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|p| detail.strip_prefix(p))
        .and_then(|rest| rest.split('`').next());
    match (path, named) {
        (".", Some(name)) => name.to_string(),
        (path, Some(name)) => format!("{path}.{name}"),
        (path, None) => path.to_string(),
    }
}

/// The short name of an API type, as errors tell it (`ForkResult`).
pub(crate) fn type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// A node's answer (an empty one is JSON `null`) read as `T`.
pub(crate) fn node_answer<T: DeserializeOwned>(api: &str, bytes: &[u8]) -> Result<T, NodeError> {
    let bytes = if bytes.is_empty() { b"null" } else { bytes };
    parse(bytes).map_err(|(field, detail)| NodeError::Answer {
        api: api.into(),
        what: type_name::<T>(),
        field,
        detail,
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
    fn node_addresses_are_http_or_https_host_and_port() {
        assert_eq!(
            authority("http://198.18.0.11:7070").unwrap(),
            ("198.18.0.11:7070".to_string(), false)
        );
        assert_eq!(
            authority("https://198.18.0.11:7070").unwrap(),
            ("198.18.0.11:7070".to_string(), true)
        );
        assert!(authority("ftp://198.18.0.11:7070").is_err());
        assert!(authority("nonsense").is_err());
    }

    #[tokio::test]
    async fn plain_http_reaches_only_loopback_nodes_unless_allowed() {
        let strict = Links::new(None, false);
        assert!(strict.admit("http://127.0.0.1:7070", "n1").await.is_ok());
        let far = strict.admit("http://198.18.0.11:7070", "n2").await;
        assert!(matches!(far, Err(NodeError::Untrusted { .. })), "{far:?}");
        // Never admitted: nothing is sent there, whatever the directory says.
        let sent = strict
            .send("http://198.18.0.11:7070", Request::new(Body::empty()))
            .await;
        assert!(matches!(sent, Err(NodeError::Untrusted { .. })), "{sent:?}");
        let lax = Links::new(None, true);
        assert!(lax.admit("http://198.18.0.11:7070", "n2").await.is_ok());
    }
}
