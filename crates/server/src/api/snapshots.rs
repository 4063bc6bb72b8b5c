//! Checkpoint, snapshot, fork and suspend/resume routes.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use serde::Deserialize;

use api_types::{
    CheckpointRequest, DeleteSnapshotQuery, ErrorBody, ForkRequest, ForkResult, Sandbox, Snapshot,
    SnapshotList, SnapshotQuery, SnapshotType,
};

use super::extract::{ApiJson, ApiQuery};
use super::{ApiResult, AppState};
use crate::error::Error;
use crate::manager::CheckpointArgs;

/// Checkpoint a running sandbox into a snapshot; the sandbox keeps running.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoint", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body = CheckpointRequest,
    responses((status = 201, body = Snapshot), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 500, description = "What CRIU or the disk refused", body = ErrorBody)))]
pub async fn checkpoint(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CheckpointRequest>,
) -> ApiResult<(StatusCode, Json<Snapshot>)> {
    let hooks = req
        .hooks
        .into_iter()
        .map(super::exec::to_agent)
        .collect::<Result<Vec<_>, _>>()?;
    let args = CheckpointArgs {
        kind: req.kind.unwrap_or(SnapshotType::Filesystem),
        name: req.name,
        hooks,
        labels: req.labels,
    };
    Ok((StatusCode::CREATED, Json(m.checkpoint(&id, args).await?)))
}

/// Checkpoint a sandbox's memory in place, then start `count` children from it.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body = ForkRequest,
    responses((status = 200, body = ForkResult), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn fork_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ForkRequest>,
) -> ApiResult<Json<ForkResult>> {
    Ok(Json(m.fork_sandbox(&id, req).await?))
}

/// Suspend a running sandbox: memory checkpoint, then stop (id, name, files and processes
/// come back on resume).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/suspend", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn suspend(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Sandbox>> {
    Ok(Json(m.suspend(&id).await?))
}

/// Resume a suspended sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn resume(State(m): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Sandbox>> {
    Ok(Json(m.resume(&id).await?))
}

/// List snapshots, oldest first.
#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots", params(SnapshotQuery),
    responses((status = 200, body = SnapshotList), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(m): State<AppState>,
    ApiQuery(q): ApiQuery<SnapshotQuery>,
) -> ApiResult<Json<SnapshotList>> {
    Ok(Json(SnapshotList {
        snapshots: m.list_snapshots(&q).await?,
    }))
}

/// One snapshot.
#[utoipa::path(get, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    responses((status = 200, body = Snapshot), (status = 404, body = ErrorBody)))]
pub async fn get_one(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Snapshot>> {
    Ok(Json(m.get_snapshot(&id).await?))
}

/// Delete a snapshot (sandboxes started from it keep working).
#[utoipa::path(delete, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<DeleteSnapshotQuery>,
) -> ApiResult<StatusCode> {
    m.delete_snapshot(&id, q.everywhere == Some(true)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Publish a snapshot to the object store, so any node restores it (done by itself
/// after each checkpoint when `publish_snapshots` is on; this waits until it is there).
#[utoipa::path(post, path = "/v1/snapshots/{id}/publish", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    responses((status = 200, body = Snapshot), (status = 404, body = ErrorBody),
        (status = 422, description = "No object store is configured", body = ErrorBody),
        (status = 503, description = "The object store cannot be reached", body = ErrorBody)))]
pub async fn publish(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Snapshot>> {
    Ok(Json(m.publish_snapshot(&id).await?))
}

/// Start `count` independent sandboxes from a snapshot, concurrently.
#[utoipa::path(post, path = "/v1/snapshots/{id}/fork", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id")),
    request_body = ForkRequest,
    responses((status = 200, description = "Each child's sandbox or error", body = ForkResult),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn fork_snapshot(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ForkRequest>,
) -> ApiResult<Json<ForkResult>> {
    Ok(Json(m.fork_snapshot(&id, req).await?))
}

/// Query of `POST /v1/snapshots/{id}/export`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ExportQuery {
    /// A snapshot this one descends from that the receiver already has: the file then
    /// carries only the disk layers above it and the memory pages that differ from it,
    /// and importing it needs that snapshot (found by content).
    #[serde(default)]
    pub base: Option<String>,
}

/// Export a snapshot as one file (streamed).
#[utoipa::path(post, path = "/v1/snapshots/{id}/export", tag = "snapshots",
    params(("id" = String, Path, description = "Snapshot id"), ExportQuery),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "The base is not one this snapshot descends from", body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn export(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ExportQuery>,
) -> ApiResult<Response> {
    let path = m.export_snapshot(&id, q.base.as_deref()).await?;
    let file = tokio::fs::File::open(&path).await;
    // Unlinked at once: the open file streams on and nothing is left behind.
    let _ = tokio::fs::remove_file(&path).await;
    let file = file.map_err(|e| Error::InvalidArgument(format!("Export failed: {e}")))?;
    let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        body,
    )
        .into_response())
}

/// Query of `POST /v1/snapshots/import`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ImportQuery {
    /// Accept a filesystem snapshot that is unsigned or signed with another host's key
    /// (its disk is still checked block by block and by e2fsck). Memory snapshots always
    /// need this daemon's key.
    #[serde(default)]
    pub trust_unsigned: bool,
}

/// Import a snapshot file made by export; every checksum is verified first.
#[utoipa::path(post, path = "/v1/snapshots/import", tag = "snapshots", params(ImportQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = Snapshot),
        (status = 400, description = "Corrupt, unsigned or not a snapshot file", body = ErrorBody),
        (status = 413, description = "Over max_import_bytes", body = ErrorBody),
        (status = 507, description = "The host disk is too full", body = ErrorBody)))]
pub async fn import(
    State(m): State<AppState>,
    ApiQuery(q): ApiQuery<ImportQuery>,
    req: Request,
) -> ApiResult<(StatusCode, Json<Snapshot>)> {
    let dir = m.config().data_dir.join("tmp");
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| Error::InvalidArgument(format!("Import failed: {e}")))?;
    let path = dir.join(format!(
        "upload-{}",
        model::ids::new_snapshot_id().map_err(Error::from)?
    ));
    let received = receive(req.into_body(), &path, m.config()).await;
    let imported = match received {
        Ok(()) => m.import_snapshot(&path, q.trust_unsigned).await,
        Err(e) => Err(e),
    };
    let _ = tokio::fs::remove_file(&path).await;
    Ok((StatusCode::CREATED, Json(imported?)))
}

pub use crate::config::IMPORT_SPACE_FLOOR;

/// Writes the upload to `path`, refusing it past `max_import_bytes` (413) or once the host
/// disk would keep less than [`IMPORT_SPACE_FLOOR`] (507).
pub(super) async fn receive(
    body: Body,
    path: &std::path::Path,
    config: &crate::Config,
) -> Result<(), Error> {
    let fail = |e: String| Error::InvalidArgument(format!("Cannot read the upload: {e}"));
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut stream = body.into_data_stream();
    let (mut seen, mut next_check) = (0u64, 0u64);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| fail(e.to_string()))?;
        seen += chunk.len() as u64;
        if seen > config.max_import_bytes {
            return Err(Error::TooLarge(format!(
                "The snapshot file exceeds max_import_bytes ({} MiB)",
                config.max_import_bytes >> 20
            )));
        }
        if seen >= next_check {
            check_import_room(&config.data_dir)?;
            next_check = seen + (8 << 20);
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| fail(e.to_string()))?;
    }
    file.flush().await.map_err(|e| fail(e.to_string()))
}

fn check_import_room(data_dir: &std::path::Path) -> Result<(), Error> {
    let free = runtime::space::free_bytes(data_dir).unwrap_or(u64::MAX);
    if free < IMPORT_SPACE_FLOOR {
        return Err(Error::InsufficientStorage(format!(
            "Out of disk space: the host disk of {} has {} MiB free; an import keeps {} MiB",
            data_dir.display(),
            free >> 20,
            IMPORT_SPACE_FLOOR >> 20
        )));
    }
    Ok(())
}

pub(super) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    use utoipa_axum::routes;
    utoipa_axum::router::OpenApiRouter::new()
        .routes(routes!(checkpoint))
        .routes(routes!(fork_sandbox))
        .routes(routes!(suspend))
        .routes(routes!(resume))
        .routes(routes!(list))
        .routes(routes!(import))
        .routes(routes!(get_one, delete))
        .routes(routes!(fork_snapshot))
        .routes(routes!(publish))
        .routes(routes!(export))
}
