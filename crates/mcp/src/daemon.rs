//! The daemon, as this server sees it: the command line's client of the `/v1` API, with
//! every answer that is not a success turned into a typed [`Error`] that keeps the
//! daemon's own `code` and `message`. Nothing here knows how the daemon does its work.

use bytes::Bytes;
use cli::client::{encode, full, Body, Client, Lines};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Method, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Daemon {
    client: Client,
    /// `http://host:port` when the daemon is reached over TCP: the base of port URLs
    /// when the daemon itself names none.
    http_base: Option<String>,
}

fn unreachable(e: anyhow::Error) -> Error {
    Error::Unreachable(format!("{e:#}").replace('\n', " "))
}

impl Daemon {
    /// From `--url`/`SANDFORK_URL` and `--token`/`SANDFORK_TOKEN`, else the default socket.
    pub fn connect(url: Option<&str>, token: Option<String>) -> Result<Daemon> {
        let client = Client::from_url(url, token).map_err(|e| Error::Serve(format!("{e:#}")))?;
        let http_base = url
            .filter(|u| u.starts_with("http://"))
            .map(|u| u.trim_end_matches('/').to_string());
        Ok(Daemon { client, http_base })
    }

    pub fn http_base(&self) -> Option<&str> {
        self.http_base.as_deref()
    }

    /// Sends a request; a status that is not a success becomes [`Error::Daemon`].
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        ctype: &str,
        body: Body,
    ) -> Result<Response<Incoming>> {
        let resp = self
            .client
            .send(method, path, ctype, body)
            .await
            .map_err(unreachable)?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(error_of(resp).await)
    }

    /// A request without a body.
    pub async fn get(&self, method: Method, path: &str) -> Result<Response<Incoming>> {
        let empty = Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed();
        self.send(method, path, "", empty).await
    }

    /// A JSON request (or none) with a JSON answer.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T> {
        let resp = match body {
            Some(b) => {
                let bytes = serde_json::to_vec(b).map_err(|e| Error::invalid(e.to_string()))?;
                self.send(method, path, "application/json", full(bytes))
                    .await?
            }
            None => self.get(method, path).await?,
        };
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| Error::Unreachable(e.to_string()))?
            .to_bytes();
        let bytes = if status == StatusCode::NO_CONTENT || bytes.is_empty() {
            Bytes::from_static(b"null")
        } else {
            bytes
        };
        serde_json::from_slice(&bytes).map_err(|e| Error::BadReply(e.to_string()))
    }

    /// An NDJSON answer, line by line.
    pub async fn lines(&self, method: Method, path: &str, body: Option<Body>) -> Result<Lines> {
        let resp = match body {
            Some(b) => self.send(method, path, "application/json", b).await?,
            None => self.get(method, path).await?,
        };
        Ok(Lines::new(resp))
    }
}

/// The next line of an NDJSON answer.
pub async fn next_line(lines: &mut Lines) -> Result<Option<serde_json::Value>> {
    lines.next().await.map_err(|e| {
        let text = format!("{e:#}");
        if text.contains("bad stream line") {
            Error::BadReply(text)
        } else {
            Error::Unreachable(text)
        }
    })
}

/// The daemon's `{code, message}` as an [`Error::Daemon`].
async fn error_of(resp: Response<Incoming>) -> Error {
    let status = resp.status();
    let bytes = match resp.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Error::Unreachable(format!("{status}: {e}")),
    };
    let body: Option<api_types::ErrorBody> = serde_json::from_slice(&bytes).ok();
    let (code, message) = match body {
        Some(b) => (b.code, b.message),
        None => (
            status.as_str().to_string(),
            format!("{status}: {}", String::from_utf8_lossy(&bytes).trim()),
        ),
    };
    Error::Daemon {
        status: status.as_u16(),
        code,
        message,
    }
}

/// `/v1/sandboxes/{id}` and what follows, the id encoded as one path segment.
pub fn sandbox_path(id: &str, rest: &str) -> Result<String> {
    Ok(format!("/v1/sandboxes/{}{rest}", segment(id, "sandbox")?))
}

/// One path segment of an id or name (empty, or holding `/`, is refused).
pub fn segment(id: &str, what: &str) -> Result<String> {
    let id = id.trim();
    if id.is_empty() {
        return Err(Error::invalid(format!("the {what} id is empty")));
    }
    Ok(encode(id).replace('/', "%2F"))
}

/// A query value.
pub fn query(value: &str) -> String {
    encode(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_one_segment() {
        assert_eq!(
            sandbox_path("sb-1", "/exec").ok().as_deref(),
            Some("/v1/sandboxes/sb-1/exec")
        );
        assert_eq!(
            sandbox_path("a/b", "").ok().as_deref(),
            Some("/v1/sandboxes/a%2Fb")
        );
        assert!(sandbox_path("  ", "").is_err());
    }
}
