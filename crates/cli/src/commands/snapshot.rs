//! checkpoint, fork, suspend, resume, snapshot ls|rm|export|import.

use anyhow::{Context, Result};
use api_types::{
    CheckpointRequest, ForkChild, ForkRequest, ForkResult, Sandbox, Snapshot, SnapshotList,
    SnapshotType,
};
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Method;
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use super::parse_env;
use crate::args::{ForkArgs, SnapshotCommand};
use crate::client::{encode, full, Client};
use crate::output;

fn print_snapshot(s: &Snapshot, json: bool) {
    if json {
        output::json(s);
    } else {
        println!("{}", s.id);
    }
}

pub async fn checkpoint(
    client: &Client,
    id: &str,
    memory: bool,
    name: Option<String>,
    json: bool,
) -> Result<i32> {
    let body = CheckpointRequest {
        kind: Some(if memory {
            SnapshotType::Memory
        } else {
            SnapshotType::Filesystem
        }),
        name,
        ..CheckpointRequest::default()
    };
    let path = format!("/v1/sandboxes/{}/checkpoint", encode(id));
    let snap: Snapshot = client.json(Method::POST, &path, Some(&body)).await?;
    print_snapshot(&snap, json);
    Ok(0)
}

/// Forks a snapshot (`snap-…`) or a running sandbox; exits 1 if any child failed.
pub async fn fork(client: &Client, f: ForkArgs, json: bool) -> Result<i32> {
    let body = ForkRequest {
        count: f.count,
        env: parse_env(&f.env)?,
        name_prefix: f.name_prefix.clone(),
        ..ForkRequest::default()
    };
    let path = if f.source.starts_with("snap-") {
        format!("/v1/snapshots/{}/fork", encode(&f.source))
    } else {
        format!("/v1/sandboxes/{}/fork", encode(&f.source))
    };
    let spinner = (!json).then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.set_message(format!("forking {} children", f.count));
        s.enable_steady_tick(std::time::Duration::from_millis(100));
        s
    });
    let reply: Result<ForkResult> = client.json(Method::POST, &path, Some(&body)).await;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let reply = reply?;
    let failed = reply.children.iter().filter(|c| c.error.is_some()).count();
    if json {
        output::json(&reply);
    } else {
        let rows = reply.children.iter().map(child_row).collect::<Vec<_>>();
        output::table(&["INDEX", "SANDBOX", "ADDRESS", "ERROR"], &rows);
    }
    Ok(i32::from(failed > 0))
}

fn child_row(c: &ForkChild) -> Vec<String> {
    let sandbox = c.sandbox.as_ref();
    vec![
        c.index.to_string(),
        output::or_dash(sandbox.map(|s| s.id.clone())),
        output::or_dash(sandbox.and_then(|s| s.network.address.clone())),
        output::or_dash(c.error.as_ref().map(|e| e.message.clone())),
    ]
}

/// `suspend` or `resume` of each sandbox.
pub async fn suspend_resume(
    client: &Client,
    ids: &[String],
    verb: &str,
    json: bool,
) -> Result<i32> {
    for id in ids {
        let path = format!("/v1/sandboxes/{}/{verb}", encode(id));
        let sb: Sandbox = client.json(Method::POST, &path, None::<&()>).await?;
        if json {
            output::json(&sb);
        } else {
            println!("{} {}", sb.id, sb.state);
        }
    }
    Ok(0)
}

pub async fn snapshot(client: &Client, c: SnapshotCommand, json: bool) -> Result<i32> {
    match c {
        SnapshotCommand::Ls {
            source,
            kind,
            published,
        } => list(client, source, kind, published, json).await,
        SnapshotCommand::Rm { ids, everywhere } => {
            let query = if everywhere { "?everywhere=true" } else { "" };
            for id in ids {
                let path = format!("/v1/snapshots/{}{query}", encode(&id));
                let _: serde_json::Value = client.json(Method::DELETE, &path, None::<&()>).await?;
            }
            Ok(0)
        }
        SnapshotCommand::Publish { ids } => {
            for id in ids {
                let path = format!("/v1/snapshots/{}/publish", encode(&id));
                let snap: Snapshot = client.json(Method::POST, &path, None::<&()>).await?;
                print_snapshot(&snap, json);
            }
            Ok(0)
        }
        SnapshotCommand::Export {
            id,
            output,
            file,
            base,
        } => {
            let file = output.or(file).unwrap_or_default();
            export(client, &id, base.as_deref(), &file).await
        }
        SnapshotCommand::Import { file } => import(client, &file, json).await,
    }
}

async fn list(
    client: &Client,
    source: Option<String>,
    kind: Option<String>,
    published: bool,
    json: bool,
) -> Result<i32> {
    let mut query = Vec::new();
    if published {
        query.push("published=true".to_string());
    }
    if let Some(s) = source {
        query.push(format!("source={}", encode(&s)));
    }
    if let Some(k) = kind {
        query.push(format!("type={}", encode(&k)));
    }
    let path = if query.is_empty() {
        "/v1/snapshots".to_string()
    } else {
        format!("/v1/snapshots?{}", query.join("&"))
    };
    let reply: SnapshotList = client.json(Method::GET, &path, None::<&()>).await?;
    if json {
        output::json(&reply);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = reply
        .snapshots
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.kind.as_str().to_string(),
                output::or_dash(s.source_sandbox_id.clone()),
                output::size(s.size_bytes),
                if s.published { "yes" } else { "-" }.to_string(),
                s.created_at.clone(),
            ]
        })
        .collect();
    output::table(
        &["ID", "TYPE", "SOURCE", "SIZE", "PUBLISHED", "CREATED"],
        &rows,
    );
    Ok(0)
}

async fn export(client: &Client, id: &str, base: Option<&str>, file: &str) -> Result<i32> {
    let mut path = format!("/v1/snapshots/{}/export", encode(id));
    if let Some(base) = base {
        path += &format!("?base={}", encode(base));
    }
    download(client, Method::POST, &path, file).await
}

/// Streams the answer to `method path` into `file` (written beside it, renamed when
/// complete).
pub(super) async fn download(
    client: &Client,
    method: Method,
    path: &str,
    file: &str,
) -> Result<i32> {
    let resp = client.call(method, path, "", full(Bytes::new())).await?;
    let tmp = format!("{file}.partial");
    let mut out = tokio::fs::File::create(&tmp)
        .await
        .with_context(|| format!("cannot create {tmp}"))?;
    let mut body = resp.into_body();
    let result = async {
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.context("export interrupted")?.into_data() {
                out.write_all(&data).await?;
            }
        }
        out.sync_all().await?;
        tokio::fs::rename(&tmp, file).await?;
        anyhow::Ok(())
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result.map(|()| 0)
}

async fn import(client: &Client, file: &str, json: bool) -> Result<i32> {
    let f = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("cannot open {file}"))?;
    let stream = ReaderStream::new(f);
    let body =
        StreamBody::new(futures_util::StreamExt::map(stream, |c| c.map(Frame::data))).boxed();
    let resp = client
        .call(
            Method::POST,
            "/v1/snapshots/import",
            "application/octet-stream",
            body,
        )
        .await?;
    let bytes = resp.into_body().collect().await?.to_bytes();
    let snap: Snapshot = serde_json::from_slice(&bytes).context("unreadable reply")?;
    print_snapshot(&snap, json);
    Ok(0)
}
