//! Volume routes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::extract::ApiJson;
use super::{ApiResult, AppState};
use api_types::{CreateVolume, ErrorBody, Volume, VolumeList};

/// Create a named volume: storage that outlives sandboxes, mounted with `volumes` at
/// sandbox create. 409 when the name is taken.
#[utoipa::path(post, path = "/v1/volumes", tag = "volumes", request_body = CreateVolume,
    responses((status = 201, body = Volume), (status = 400, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn create(
    State(m): State<AppState>,
    ApiJson(req): ApiJson<CreateVolume>,
) -> ApiResult<(StatusCode, Json<Volume>)> {
    Ok((StatusCode::CREATED, Json(m.create_volume(req).await?)))
}

/// List volumes.
#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, body = VolumeList)))]
pub async fn list(State(m): State<AppState>) -> ApiResult<Json<VolumeList>> {
    Ok(Json(VolumeList {
        volumes: m.volumes().await?,
    }))
}

/// One volume: size, bytes in use, the live sandboxes that mount it.
#[utoipa::path(get, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path)),
    responses((status = 200, body = Volume), (status = 404, body = ErrorBody)))]
pub async fn inspect(
    State(m): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Volume>> {
    Ok(Json(m.volume(&name).await?))
}

/// Delete a volume and its data; 409 while a live sandbox mounts it.
#[utoipa::path(delete, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete(State(m): State<AppState>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    m.delete_volume(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
