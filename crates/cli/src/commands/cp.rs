//! cp: host ↔ sandbox, streamed in both directions.

use std::path::Path;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Method;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use crate::client::{encode, Client};

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
pub enum Side<'a> {
    Host(&'a str),
    Sandbox { id: &'a str, path: &'a str },
}

/// `ID:/abs/path` is a sandbox path; anything else (including `-`) is the host's.
pub fn side(s: &str) -> Side<'_> {
    match s.split_once(':') {
        Some((id, path)) if !id.is_empty() && !id.contains('/') && path.starts_with('/') => {
            Side::Sandbox { id, path }
        }
        _ => Side::Host(s),
    }
}

pub async fn copy(client: &Client, src: &str, dst: &str) -> Result<i32> {
    match (side(src), side(dst)) {
        (Side::Host(h), Side::Sandbox { id, path }) => upload(client, h, id, path).await?,
        (Side::Sandbox { id, path }, Side::Host(h)) => download(client, id, path, h).await?,
        (Side::Host(_), Side::Host(_)) => bail!("one side of cp must be ID:/path"),
        (Side::Sandbox { .. }, Side::Sandbox { .. }) => {
            bail!("copying between two sandboxes is not supported; copy through the host")
        }
    }
    Ok(0)
}

async fn open(host: &str) -> Result<Box<dyn AsyncRead + Send + Sync + Unpin>> {
    if host == "-" {
        return Ok(Box::new(tokio::io::stdin()));
    }
    let f = tokio::fs::File::open(host)
        .await
        .with_context(|| format!("cannot open {host}"))?;
    Ok(Box::new(f))
}

async fn upload(client: &Client, host: &str, id: &str, path: &str) -> Result<()> {
    let mode = match host {
        "-" => None,
        h => std::fs::metadata(h)
            .ok()
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777),
    };
    let stream = ReaderStream::new(open(host).await?);
    let body =
        StreamBody::new(futures_util::StreamExt::map(stream, |c| c.map(Frame::data))).boxed();
    let mut url = format!("/v1/sandboxes/{}/files?path={}", encode(id), encode(path));
    if let Some(m) = mode {
        url.push_str(&format!("&mode={m:o}"));
    }
    client
        .call(Method::PUT, &url, "application/octet-stream", body)
        .await?;
    Ok(())
}

async fn download(client: &Client, id: &str, path: &str, host: &str) -> Result<()> {
    let url = format!("/v1/sandboxes/{}/files?path={}", encode(id), encode(path));
    let resp = client
        .call(Method::GET, &url, "", crate::client::full(Bytes::new()))
        .await?;
    let mut body = resp.into_body();
    let mut out: Box<dyn tokio::io::AsyncWrite + Unpin + Send> = if host == "-" {
        Box::new(tokio::io::stdout())
    } else {
        let target = if Path::new(host).is_dir() {
            Path::new(host).join(Path::new(path).file_name().unwrap_or_default())
        } else {
            host.into()
        };
        Box::new(
            tokio::fs::File::create(&target)
                .await
                .with_context(|| format!("cannot create {}", target.display()))?,
        )
    };
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.context("download interrupted")?.into_data() {
            out.write_all(&data).await?;
        }
    }
    out.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_parse() {
        assert_eq!(
            side("sb-1:/etc/x"),
            Side::Sandbox {
                id: "sb-1",
                path: "/etc/x"
            }
        );
        assert_eq!(side("./a:b"), Side::Host("./a:b"));
        assert_eq!(side("-"), Side::Host("-"));
        assert_eq!(side("/tmp/a:/b"), Side::Host("/tmp/a:/b"));
    }
}
