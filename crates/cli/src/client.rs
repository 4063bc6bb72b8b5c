//! A small HTTP/1.1 client of the daemon over a Unix socket or TCP (one connection per
//! request, which keeps it trivially safe to use from many tasks at once).

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Default socket of the daemon.
pub const DEFAULT_SOCKET: &str = "/var/lib/sandfork/sandfork.sock";

/// A request body.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// A byte stream both ways (a Unix or TCP connection to the daemon).
pub trait Duplex: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Duplex for T {}

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    Tcp(String),
}

impl Target {
    /// Parses `unix:///path`, `http://host:port` or a bare socket path.
    pub fn parse(url: &str) -> Result<Target> {
        if let Some(p) = url.strip_prefix("unix://") {
            return Ok(Target::Unix(PathBuf::from(p)));
        }
        if let Some(rest) = url.strip_prefix("http://") {
            let host = rest.trim_end_matches('/');
            if host.is_empty() || host.contains('/') {
                bail!("invalid daemon URL {url:?}");
            }
            return Ok(Target::Tcp(host.to_string()));
        }
        if url.starts_with('/') {
            return Ok(Target::Unix(PathBuf::from(url)));
        }
        if url.starts_with("https://") {
            bail!(
                "the sandfork CLI does not speak HTTPS yet ({url:?}); run it on the daemon's host \
                 against its Unix socket, or use the Python SDK, which does"
            );
        }
        bail!("invalid daemon URL {url:?} (use unix:///path or http://host:port)")
    }
}

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    target: Target,
    token: Option<String>,
}

/// Builds a request body from bytes.
pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed()
}

impl Client {
    pub fn new(target: Target, token: Option<String>) -> Client {
        Client { target, token }
    }

    /// From `--url`/`SANDFORK_URL` and `--token`/`SANDFORK_TOKEN`, else the default socket.
    pub fn from_url(url: Option<&str>, token: Option<String>) -> Result<Client> {
        let target = match url {
            Some(u) if !u.is_empty() => Target::parse(u)?,
            _ => Target::Unix(PathBuf::from(DEFAULT_SOCKET)),
        };
        Ok(Client::new(target, token.filter(|t| !t.is_empty())))
    }

    /// A new connection to the daemon.
    pub async fn stream(&self) -> Result<Box<dyn Duplex>> {
        Ok(match &self.target {
            Target::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await.with_context(|| {
                    format!(
                        "cannot reach the daemon at {} (is `sandfork serve` running?)",
                        p.display()
                    )
                })?;
                Box::new(s)
            }
            Target::Tcp(h) => {
                let s = tokio::net::TcpStream::connect(h)
                    .await
                    .with_context(|| format!("cannot reach the daemon at {h}"))?;
                Box::new(s)
            }
        })
    }

    async fn connect(&self) -> Result<hyper::client::conn::http1::SendRequest<Body>> {
        let stream = self.stream().await?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake with the daemon failed")?;
        tokio::spawn(conn);
        Ok(send)
    }

    /// The `Host` header requests carry.
    pub fn host(&self) -> &str {
        match &self.target {
            Target::Tcp(h) => h.as_str(),
            Target::Unix(_) => "localhost",
        }
    }

    /// The bearer token, when the daemon needs one.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Sends a request and returns the response whatever its status.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        ctype: &str,
        body: Body,
    ) -> Result<Response<Incoming>> {
        let mut send = self.connect().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.host());
        if !ctype.is_empty() {
            req = req.header("content-type", ctype);
        }
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(body).context("invalid request")?;
        send.send_request(req)
            .await
            .context("the daemon closed the connection")
    }

    /// Sends a request; a non-2xx status becomes the server's message as an error.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        ctype: &str,
        body: Body,
    ) -> Result<Response<Incoming>> {
        let resp = self.send(method, path, ctype, body).await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(error_of(resp).await)
    }

    /// A JSON request with a JSON reply.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T> {
        let resp = match body {
            Some(b) => {
                self.call(
                    method,
                    path,
                    "application/json",
                    full(serde_json::to_vec(b)?),
                )
                .await?
            }
            None => self.call(method, path, "", full(Bytes::new())).await?,
        };
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let bytes = if status == StatusCode::NO_CONTENT || bytes.is_empty() {
            Bytes::from_static(b"null")
        } else {
            bytes
        };
        serde_json::from_slice(&bytes).context("the daemon sent an unreadable reply")
    }
}

/// The JSON body of a successful response.
pub async fn json_body(resp: Response<Incoming>) -> Result<serde_json::Value> {
    let bytes = resp.into_body().collect().await?.to_bytes();
    serde_json::from_slice(&bytes).context("the daemon sent an unreadable reply")
}

/// The `{code, message}` of an error response as an error.
pub async fn error_of(resp: Response<Incoming>) -> anyhow::Error {
    let status = resp.status();
    let bytes = match resp.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return anyhow!("{status}: {e}"),
    };
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(v) if v["message"].is_string() => {
            anyhow!("{}", v["message"].as_str().unwrap_or_default())
        }
        _ => anyhow!("{status}: {}", String::from_utf8_lossy(&bytes).trim()),
    }
}

/// Reads an NDJSON body line by line.
pub struct Lines {
    body: Incoming,
    buf: Vec<u8>,
}

impl Lines {
    pub fn new(resp: Response<Incoming>) -> Lines {
        Lines {
            body: resp.into_body(),
            buf: Vec::new(),
        }
    }

    /// The next JSON value, or `None` at the end.
    pub async fn next(&mut self) -> Result<Option<serde_json::Value>> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(
                    serde_json::from_slice(&line).context("bad stream line")?,
                ));
            }
            match self.body.frame().await {
                Some(frame) => {
                    if let Ok(data) = frame.context("stream from the daemon broke")?.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    let line = std::mem::take(&mut self.buf);
                    return Ok(Some(
                        serde_json::from_slice(&line).context("bad stream line")?,
                    ));
                }
            }
        }
    }
}

/// Percent-encodes a query value.
/// Percent-encodes one path segment: as [`encode`], and `/` too (image references).
pub fn encode_segment(s: &str) -> String {
    encode(s).replace('/', "%2F")
}

pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            Target::parse("unix:///a/b.sock").unwrap(),
            Target::Unix("/a/b.sock".into())
        );
        assert_eq!(
            Target::parse("http://127.0.0.1:7000/").unwrap(),
            Target::Tcp("127.0.0.1:7000".into())
        );
        assert_eq!(
            Target::parse("/x.sock").unwrap(),
            Target::Unix("/x.sock".into())
        );
        assert!(Target::parse("https://x").is_err());
        assert!(Target::parse("http://h/p").is_err());
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("/a b/ü&x"), "/a%20b/%C3%BC%26x");
    }
}
