//! The two transports: stdio (one client, the process's standard input and output) and
//! streamable HTTP at `http://ADDR/mcp`, where every request must carry the daemon's
//! token as `Authorization: Bearer …` (anything else is a 401 before MCP sees it).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt as _;
use tokio_util::sync::CancellationToken;
use tower_service::Service as _;

use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::server::Sandfork;

/// The path the MCP endpoint is served at.
pub const ENDPOINT: &str = "/mcp";

type HttpResponse = Response<BoxBody<Bytes, Infallible>>;

/// Serves one client over stdin and stdout until it leaves.
pub async fn serve_stdio(daemon: Daemon) -> Result<()> {
    let running = Sandfork::new(daemon)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Error::Serve(format!("the MCP session over stdio did not start: {e}")))?;
    running
        .waiting()
        .await
        .map_err(|e| Error::Serve(format!("the MCP session over stdio failed: {e}")))?;
    Ok(())
}

/// Serves streamable HTTP on `addr` until SIGINT or SIGTERM.
pub async fn serve_http(
    addr: SocketAddr,
    token: String,
    allowed_hosts: Vec<String>,
    daemon: Daemon,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Serve(format!("cannot listen on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::Serve(format!("cannot listen on {addr}: {e}")))?;
    eprintln!("sandfork mcp: streamable HTTP at http://{local}{ENDPOINT} (bearer token required)");
    let stop = CancellationToken::new();
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token());
    // `Host` is checked against loopback names (DNS rebinding); a listener on another
    // address is also reached by that address.
    if !addr.ip().is_loopback() && !addr.ip().is_unspecified() {
        config.allowed_hosts.push(addr.ip().to_string());
        config.allowed_hosts.push(local.to_string());
    }
    config.allowed_hosts.extend(allowed_hosts);
    let service = StreamableHttpService::new(
        move || Ok(Sandfork::new(daemon.clone())),
        LocalSessionManager::default().into(),
        config,
    );
    let token: Arc<str> = token.into();
    let mut shutdown = std::pin::pin!(shutdown_signal());
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("sandfork mcp: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let service = service.clone();
        let token = token.clone();
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
                let mut service = service.clone();
                let token = token.clone();
                async move {
                    if let Some(refusal) = refuse(&req, &token) {
                        return Ok::<_, Infallible>(refusal);
                    }
                    service.call(req).await
                }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(stream), handler)
                .await;
        });
    }
    stop.cancel();
    Ok(())
}

/// The answer to a request that does not reach MCP: another path, or a missing or wrong
/// token.
fn refuse<B>(req: &Request<B>, token: &str) -> Option<HttpResponse> {
    let path = req.uri().path();
    if path != ENDPOINT && path != "/mcp/" {
        return Some(plain(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("the MCP endpoint is {ENDPOINT}"),
        ));
    }
    let presented = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    match presented {
        None => Some(plain(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this MCP endpoint needs the daemon's token: Authorization: Bearer <token>",
        )),
        Some(t) if !same(t.trim().as_bytes(), token.as_bytes()) => Some(plain(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the bearer token is not the daemon's token",
        )),
        Some(_) => None,
    }
}

fn plain(status: StatusCode, code: &str, message: &str) -> HttpResponse {
    let body = serde_json::json!({"code": code, "message": message}).to_string();
    let mut resp = Response::new(Full::new(Bytes::from(body)).boxed());
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if status == StatusCode::UNAUTHORIZED {
        headers.insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer realm=\"sandfork\""),
        );
    }
    resp
}

/// Compares in time that depends on the length only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, auth: Option<&str>) -> Request<()> {
        let mut b = Request::builder().uri(path);
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        b.body(()).expect("request")
    }

    #[test]
    fn only_the_token_opens_the_endpoint() {
        assert!(refuse(&req("/mcp", Some("Bearer s3cret")), "s3cret").is_none());
        let no = refuse(&req("/mcp", None), "s3cret").expect("refused");
        assert_eq!(no.status(), StatusCode::UNAUTHORIZED);
        let wrong = refuse(&req("/mcp", Some("Bearer s3cres")), "s3cret").expect("refused");
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
        let short = refuse(&req("/mcp", Some("Bearer s3c")), "s3cret").expect("refused");
        assert_eq!(short.status(), StatusCode::UNAUTHORIZED);
        let other = refuse(&req("/", Some("Bearer s3cret")), "s3cret").expect("refused");
        assert_eq!(other.status(), StatusCode::NOT_FOUND);
    }
}
