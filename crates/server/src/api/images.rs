//! Image routes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use tokio::sync::mpsc;

use super::extract::ApiJson;
use super::{ApiResult, AppState};
use crate::manager::{validate_build, BUILDERS};
use api_types::{BuildEvent, BuildImage, ErrorBody, ImageDetails, ImageList, PullImage};

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
    Ok(stream_build(move |progress| async move {
        m.build_image(req, progress).await
    }))
}

/// Make sure an image exists: a built-in one (busybox, debian, python, browser) is built when
/// missing, or a build of it already in flight is joined. Progress streams as NDJSON and
/// the last line is `done` (at once when the image exists) or `error`.
#[utoipa::path(post, path = "/v1/images/{name}/ensure", tag = "images",
    params(("name" = String, Path)),
    responses((status = 200, body = BuildEvent, content_type = "application/x-ndjson"),
        (status = 404, body = ErrorBody)))]
pub async fn ensure(State(m): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    // An unknown name is a 404 before any stream starts (ensure_image answers it at once);
    // a registry reference is pulled while the stream runs.
    if registry::looks_like_reference(&name) {
        registry::canonical(&name)
            .map_err(|e| crate::error::Error::InvalidArgument(model::error_chain(&e)))?;
    } else if !BUILDERS.contains(&name.as_str()) {
        let (progress, _) = mpsc::channel(1);
        m.ensure_image(&name, progress).await?;
    }
    Ok(stream_build(move |progress| async move {
        m.ensure_image(&name, progress).await
    }))
}

/// Pull an image from an OCI registry (`docker.io/library/python:3.12-slim`,
/// `registry.example:5000/team/app@sha256:…`), recorded under its canonical reference.
/// Every blob is verified against its digest. Progress streams as NDJSON and the last
/// line is `done` or `error` (`not_found`, `registry_error` for unreachable registries,
/// refused credentials or blobs that fail verification).
#[utoipa::path(post, path = "/v1/images/pull", tag = "images", request_body = PullImage,
    responses((status = 200, body = BuildEvent, content_type = "application/x-ndjson"),
        (status = 400, body = ErrorBody)))]
pub async fn pull(
    State(m): State<AppState>,
    ApiJson(req): ApiJson<PullImage>,
) -> ApiResult<Response> {
    registry::canonical(&req.reference)
        .map_err(|e| crate::error::Error::InvalidArgument(model::error_chain(&e)))?;
    Ok(stream_build(move |progress| async move {
        m.pull_image(req, progress).await
    }))
}

/// Runs a build with a progress channel and streams its events: progress lines, then
/// `done` or `error`.
fn stream_build<F, Fut>(run: F) -> Response
where
    F: FnOnce(mpsc::Sender<String>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = crate::error::Result<api_types::Image>> + Send,
{
    let (tx, rx) = mpsc::channel::<BuildEvent>(64);
    let (ptx, mut prx) = mpsc::channel::<String>(64);
    let progress_tx = tx.clone();
    let forward = tokio::spawn(async move {
        while let Some(message) = prx.recv().await {
            let _ = progress_tx.send(BuildEvent::Progress { message }).await;
        }
    });
    tokio::spawn(async move {
        let last = match run(ptx).await {
            Ok(image) => BuildEvent::Done { image },
            Err(e) => BuildEvent::Error {
                code: e.kind().into(),
                message: e.message(),
            },
        };
        // The build dropped its progress sender: every line it sent goes out first, so
        // `done` or `error` is the last line (bounded, should a clone of it live on).
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), forward).await;
        let _ = tx.send(last).await;
    });
    super::ndjson::json_lines(rx)
}

/// One image: its record, config (env, working directory, user, entrypoint, command,
/// ports, labels) and origin. A registry reference may be given in short form; `/` as `%2F`.
#[utoipa::path(get, path = "/v1/images/{name}", tag = "images",
    params(("name" = String, Path)),
    responses((status = 200, body = ImageDetails), (status = 404, body = ErrorBody)))]
pub async fn inspect(
    State(m): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<ImageDetails>> {
    Ok(Json(m.image_details(&name).await?))
}

/// Remove an image name (sandboxes using it are unaffected).
#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images",
    params(("name" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete(State(m): State<AppState>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    m.delete_image(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
