//! Data-plane files (WIRE.md §5, D12-D15): the native file handlers themselves, with the
//! sandbox from the request's routing and Tensorlake's listing shape.

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::super::extract::ApiQuery;
use super::super::{files as native, ApiResult, AppState};
use super::TlSandbox;
use api_types::FileQuery;

/// `?path=` of the file routes.
#[derive(Debug, Deserialize)]
pub struct PathQuery {
    path: String,
}

fn query(q: PathQuery) -> ApiQuery<FileQuery> {
    ApiQuery(FileQuery {
        path: q.path,
        mode: None,
        recursive: false,
    })
}

/// D12: a file's bytes (streamed).
pub async fn read(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    native::download(State(m), Path(id), query(q)).await
}

/// D13: write a file from the raw body (streamed, bounded by `max_upload_bytes`; parent
/// directories are created).
pub async fn write(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    ApiQuery(q): ApiQuery<PathQuery>,
    req: Request,
) -> ApiResult<StatusCode> {
    native::upload(State(m), Path(id), query(q), req).await
}

/// D14: delete a file (or an empty directory).
pub async fn delete(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<StatusCode> {
    native::remove(State(m), Path(id), query(q)).await
}

#[derive(Debug, Serialize)]
pub struct Entry {
    name: String,
    is_dir: bool,
    size: u64,
    modified_at: String,
}

#[derive(Debug, Serialize)]
pub struct Listing {
    path: String,
    entries: Vec<Entry>,
}

/// D15: a directory's entries.
pub async fn list(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Json<Listing>> {
    let path = q.path.clone();
    let Json(native) = native::list(State(m), Path(id), query(q)).await?;
    let entries = native
        .entries
        .into_iter()
        .map(|e| Entry {
            is_dir: e.kind == "dir",
            name: e.name,
            size: e.size,
            modified_at: e.modified_at,
        })
        .collect();
    Ok(Json(Listing { path, entries }))
}
