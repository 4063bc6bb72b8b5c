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
        (Side::Host(h), Side::Sandbox { id, path }) => {
            let path = upload_target(client, h, id, path).await?;
            upload(client, h, id, &path).await?
        }
        (Side::Sandbox { id, path }, Side::Host(h)) => download(client, id, path, h).await?,
        (Side::Host(_), Side::Host(_)) => bail!("one side of cp must be ID:/path"),
        (Side::Sandbox { .. }, Side::Sandbox { .. }) => {
            bail!("copying between two sandboxes is not supported; copy through the host")
        }
    }
    Ok(0)
}

/// Where an upload of host file `host` to `path` goes: into `path` when it names a
/// directory (ends in `/`, or is one in the sandbox), keeping the file's name, as `cp` does.
async fn upload_target(client: &Client, host: &str, id: &str, path: &str) -> Result<String> {
    let dir = path.ends_with('/') || is_dir(client, id, path).await;
    if !dir {
        return Ok(path.to_string());
    }
    let Some(name) = Path::new(host).file_name().filter(|_| host != "-") else {
        bail!("{path} is a directory: name the file to write stdin to");
    };
    Ok(format!(
        "{}/{}",
        path.trim_end_matches('/'),
        name.to_string_lossy()
    ))
}

/// Whether `path` is a directory in the sandbox (false when it does not exist).
async fn is_dir(client: &Client, id: &str, path: &str) -> bool {
    let url = format!(
        "/v1/sandboxes/{}/files/stat?path={}",
        encode(id),
        encode(path)
    );
    let stat: Result<serde_json::Value> = client.json(Method::GET, &url, None::<&()>).await;
    stat.is_ok_and(|s| s["type"] == "dir")
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
