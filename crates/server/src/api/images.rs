//! Image routes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use tokio::sync::mpsc;

use super::extract::ApiJson;
use super::types::{BuildEvent, BuildImage, ErrorBody, ImageList};
use super::{ApiResult, AppState};
use crate::manager::validate_build;

/// List images.
#[utoipa::path(get, path = "/v1/images", tag = "images",
    responses((status = 200, body = ImageList)))]
pub async fn list(State(m): State<AppState>) -> ApiResult<Json<ImageList>> {
    Ok(Json(ImageList {
        images: m.images().await?,
    }))
}

/// Build an image; progress streams as NDJSON and the last line is `done` or `error`.
#[utoipa::path(post, path = "/v1/images", tag = "images", request_body = BuildImage,
    responses((status = 200, body = BuildEvent, content_type = "application/x-ndjson"),
        (status = 400, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn build(
    State(m): State<AppState>,
    ApiJson(req): ApiJson<BuildImage>,
) -> ApiResult<Response> {
    validate_build(&req)?;
    let (tx, rx) = mpsc::channel::<BuildEvent>(64);
    let (ptx, mut prx) = mpsc::channel::<String>(64);
    let progress_tx = tx.clone();
    tokio::spawn(async move {
        while let Some(message) = prx.recv().await {
            let _ = progress_tx.send(BuildEvent::Progress { message }).await;
        }
    });
    tokio::spawn(async move {
        let last = match m.build_image(req, ptx).await {
            Ok(image) => BuildEvent::Done { image },
            Err(e) => BuildEvent::Error {
                code: e.kind().into(),
                message: e.message(),
            },
        };
        let _ = tx.send(last).await;
    });
    Ok(super::ndjson::json_lines(rx))
}

/// Remove an image name (sandboxes using it are unaffected).
#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images",
    params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete(State(m): State<AppState>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    m.delete_image(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
