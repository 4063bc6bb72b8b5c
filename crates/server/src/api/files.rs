//! Files inside a sandbox. Contents stream through bounded channels in both directions;
//! paths are resolved by the agent inside the sandbox, never on the host.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use proto::agent::{FileKind, FileStat};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::extract::{ApiJson, ApiQuery};
use super::{ApiResult, AppState};
use crate::backend::{BackendError, STREAM_DEPTH};
use crate::error::Error;
use api_types::{ErrorBody, FileEntry, FileEvent, FileList, FileQuery, MkdirRequest};

fn check_path(path: &str) -> Result<(), Error> {
    if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
        return Err(Error::InvalidArgument(format!(
            "Invalid path {path:?}: must be absolute"
        )));
    }
    Ok(())
}

fn parse_mode(mode: Option<&str>) -> Result<Option<u32>, Error> {
    let Some(m) = mode else { return Ok(None) };
    u32::from_str_radix(m.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .map(Some)
        .ok_or_else(|| Error::InvalidArgument(format!("Invalid mode {m:?}: use octal like 0644")))
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    }
}

/// The API view of a path's metadata.
pub fn entry(path: &str, name: &str, st: &FileStat) -> FileEntry {
    FileEntry {
        name: name.to_string(),
        path: path.to_string(),
        kind: kind_name(st.kind).into(),
        size: st.size,
        mode: st.mode,
        modified_at: model::timestamp::from_unix_millis(st.mtime_unix_ms),
    }
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

fn base_name(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

/// Download a file (raw bytes, streamed).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), FileQuery),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn download(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Response> {
    check_path(&q.path)?;
    let (_stat, chunks) = m.read_file(&id, &q.path).await?;
    let body =
        ReceiverStream::new(chunks).map(|c| c.map_err(|e| std::io::Error::other(e.to_string())));
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(body),
    )
        .into_response())
}

/// Upload a file (raw body, streamed; parent directories are created).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), FileQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 413, body = ErrorBody)))]
pub async fn upload(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
    req: Request,
) -> ApiResult<StatusCode> {
    check_path(&q.path)?;
    let mode = parse_mode(q.mode.as_deref())?;
    let limit = m.config().max_upload_bytes;
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    let pump = tokio::spawn(pump_body(req.into_body(), tx, limit));
    let how = crate::backend::WriteAs { mode, owner: None };
    let written = m.write_file(&id, &q.path, how, rx).await;
    // A reader that died cut the body short: never a success.
    let pumped = pump.await.unwrap_or_else(|e| {
        let e = BackendError::Host(format!("the upload's reader failed: {e}"));
        Err(Error::Backend(e))
    });
    pumped?;
    written?;
    Ok(StatusCode::NO_CONTENT)
}

/// Feeds a request body into `tx`, aborting (an error item) past `limit` bytes.
async fn pump_body(
    mut body: Body,
    tx: mpsc::Sender<Result<Bytes, BackendError>>,
    limit: u64,
) -> Result<(), Error> {
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(f) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
            Err(e) => {
                let msg = format!("Upload interrupted: {e}");
                let _ = tx.send(Err(BackendError::InvalidInput(msg.clone()))).await;
                return Err(Error::InvalidArgument(msg));
            }
        };
        total += data.len() as u64;
        if total > limit {
            let msg = format!("Upload exceeds {limit} bytes");
            let _ = tx.send(Err(BackendError::TooLarge(msg.clone()))).await;
            discard_rest(body).await;
            return Err(Error::TooLarge(msg));
        }
        if tx.send(Ok(data)).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// Reads and drops what is left of a refused upload, within bounds, so a client still
/// sending it gets the 413 instead of a connection cut mid-write.
async fn discard_rest(mut body: Body) {
    const MAX_DISCARD: u64 = 64 << 20;
    let drain = async {
        let mut dropped = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            dropped += frame.data_ref().map_or(0, |d| d.len() as u64);
            if dropped > MAX_DISCARD {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), drain).await;
}

/// Remove a file or directory.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path), FileQuery),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn remove(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<StatusCode> {
    check_path(&q.path)?;
    m.remove(&id, &q.path, q.recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List a directory.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path), FileQuery),
    responses((status = 200, body = FileList), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Json<FileList>> {
    check_path(&q.path)?;
    let entries = m
        .list_dir(&id, &q.path)
        .await?
        .iter()
        .map(|e| entry(&join(&q.path, &e.name), &e.name, &e.stat))
        .collect();
    Ok(Json(FileList { entries }))
}

/// Watch a directory (with `recursive`, the directories under it too, those made later
/// included): NDJSON, one `FileEvent` per change, until the client leaves. The response
/// starts once the watch is in place, so a change made after it is seen.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/watch", tag = "files",
    params(("id" = String, Path), FileQuery),
    responses((status = 200, content_type = "application/x-ndjson", body = FileEvent),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn watch(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Response> {
    check_path(&q.path)?;
    let mut batches = m.watch_dir(&id, &q.path, q.recursive).await?;
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        loop {
            // A client that left ends the watch at once (dropping `batches` closes the
            // agent's connection and lets the sandbox checkpoint again).
            let batch = tokio::select! {
                next = batches.recv() => match next {
                    Some(Ok(batch)) => batch,
                    _ => return,
                },
                () = tx.closed() => return,
            };
            for e in batch {
                if tx.send(file_event(e)).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(super::ndjson::json_lines_with_heartbeat(rx))
}

fn file_event(e: proto::agent::FsEvent) -> FileEvent {
    use proto::agent::FsEventKind as K;
    let kind = match e.kind {
        K::Create => "create",
        K::Modify => "modify",
        K::Delete => "delete",
        K::Rename => "rename",
        K::Chmod => "chmod",
        K::Overflow => "overflow",
    };
    FileEvent {
        kind: kind.into(),
        path: e.path,
        old_path: e.old_path,
        is_dir: e.is_dir,
    }
}

/// Metadata of a path (symlinks are not followed).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path), FileQuery),
    responses((status = 200, body = FileEntry), (status = 404, body = ErrorBody)))]
pub async fn stat(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Json<FileEntry>> {
    check_path(&q.path)?;
    let st = m.stat(&id, &q.path).await?;
    Ok(Json(entry(&q.path, base_name(&q.path), &st)))
}

/// Create a directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path)), request_body = MkdirRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn mkdir(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<MkdirRequest>,
) -> ApiResult<StatusCode> {
    check_path(&req.path)?;
    m.mkdir(&id, &req.path, req.parents).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_modes_are_checked() {
        assert!(check_path("/a/b").is_ok());
        assert!(check_path("a/b").is_err());
        assert!(check_path("/a\0").is_err());
        assert_eq!(parse_mode(Some("0644")).unwrap(), Some(0o644));
        assert_eq!(parse_mode(Some("755")).unwrap(), Some(0o755));
        assert!(parse_mode(Some("9")).is_err());
        assert!(parse_mode(Some("77777")).is_err());
        assert_eq!(base_name("/a/b/"), "b");
        assert_eq!(join("/", "x"), "/x");
    }
}
