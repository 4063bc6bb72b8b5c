//! checkpoint, fork, suspend, resume, snapshot ls|rm|export|import.

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Method;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use super::parse_env;
use crate::args::{ForkArgs, SnapshotCommand};
use crate::client::{encode, full, Client};
use crate::output;

fn print_snapshot(s: &Value, json: bool) {
    if json {
        output::json(s);
    } else {
        println!("{}", output::field(s, "id"));
    }
}

pub async fn checkpoint(
    client: &Client,
    id: &str,
    memory: bool,
    name: Option<String>,
    json: bool,
) -> Result<i32> {
    let mut body = json!({ "type": if memory { "memory" } else { "filesystem" } });
    if let Some(n) = name {
        body["name"] = n.into();
    }
    let path = format!("/v1/sandboxes/{}/checkpoint", encode(id));
    let snap: Value = client.json(Method::POST, &path, Some(&body)).await?;
    print_snapshot(&snap, json);
    Ok(0)
}

/// Forks a snapshot (`snap-…`) or a running sandbox; exits 1 if any child failed.
pub async fn fork(client: &Client, f: ForkArgs, json: bool) -> Result<i32> {
    let mut body = json!({ "count": f.count, "env": parse_env(&f.env)? });
    if let Some(p) = &f.name_prefix {
        body["name_prefix"] = p.clone().into();
    }
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
    let reply: Result<Value> = client.json(Method::POST, &path, Some(&body)).await;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let reply = reply?;
    let children = reply["children"].as_array().cloned().unwrap_or_default();
    let failed = children.iter().filter(|c| !c["error"].is_null()).count();
    if json {
        output::json(&reply);
    } else {
        let rows = children.iter().map(child_row).collect::<Vec<_>>();
        output::table(&["INDEX", "SANDBOX", "ADDRESS", "ERROR"], &rows);
    }
    Ok(i32::from(failed > 0))
}

fn child_row(c: &Value) -> Vec<String> {
    vec![
        output::field(c, "index"),
        output::field(&c["sandbox"], "id"),
        output::field(&c["sandbox"]["network"], "address"),
        output::field(&c["error"], "message"),
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
        let sb: Value = client.json(Method::POST, &path, None::<&()>).await?;
        if json {
            output::json(&sb);
        } else {
            println!(
                "{} {}",
                output::field(&sb, "id"),
                output::field(&sb, "state")
            );
        }
    }
    Ok(0)
}

pub async fn snapshot(client: &Client, c: SnapshotCommand, json: bool) -> Result<i32> {
    match c {
        SnapshotCommand::Ls { source, kind } => list(client, source, kind, json).await,
        SnapshotCommand::Rm { ids } => {
            for id in ids {
                let path = format!("/v1/snapshots/{}", encode(&id));
                let _: Value = client.json(Method::DELETE, &path, None::<&()>).await?;
            }
            Ok(0)
        }
        SnapshotCommand::Export { id, file } => export(client, &id, &file).await,
        SnapshotCommand::Import { file } => import(client, &file, json).await,
    }
}

async fn list(
    client: &Client,
    source: Option<String>,
    kind: Option<String>,
    json: bool,
) -> Result<i32> {
    let mut query = Vec::new();
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
    let reply: Value = client.json(Method::GET, &path, None::<&()>).await?;
    if json {
        output::json(&reply);
        return Ok(0);
    }
    let snaps = reply["snapshots"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = snaps
        .iter()
        .map(|s| {
            vec![
                output::field(s, "id"),
                output::field(s, "type"),
                output::field(s, "source_sandbox_id"),
                output::size(s["size_bytes"].as_u64().unwrap_or(0)),
                output::field(s, "created_at"),
            ]
        })
        .collect();
    output::table(&["ID", "TYPE", "SOURCE", "SIZE", "CREATED"], &rows);
    Ok(0)
}

/// Streams the export into `file` (written beside it, renamed when complete).
async fn export(client: &Client, id: &str, file: &str) -> Result<i32> {
    let path = format!("/v1/snapshots/{}/export", encode(id));
    let resp = client
        .call(Method::POST, &path, "", full(Bytes::new()))
        .await?;
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
    let snap: Value = serde_json::from_slice(&bytes).context("unreadable reply")?;
    print_snapshot(&snap, json);
    Ok(0)
}
