//! Image routes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::mpsc;

use super::extract::ApiJson;
use super::{ApiResult, AppState};
use crate::manager::{validate_build, BUILDERS};
use api_types::{
    BuildEvent, BuildImage, ErrorBody, Image, ImageDetails, ImageFromSnapshot, ImageList,
    PullImage, PushImage, PushedImage,
};

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

/// Make an image of a snapshot's disk (filesystem or memory snapshot: its files only),
/// with its source image's config and the snapshot's env: a template that outlives the
/// snapshot.
#[utoipa::path(post, path = "/v1/images/from-snapshot", tag = "images", request_body = ImageFromSnapshot,
    responses((status = 201, body = Image), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn from_snapshot(
    State(m): State<AppState>,
    ApiJson(req): ApiJson<ImageFromSnapshot>,
) -> ApiResult<(StatusCode, Json<Image>)> {
    let image = m.image_from_snapshot(&req.name, &req.snapshot_id).await?;
    Ok((StatusCode::CREATED, Json(image)))
}

/// Query of `GET /v1/images/{name}/export`.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ExportQuery {
    /// `oci-archive` (default) or `docker-archive` (what `docker load` reads).
    pub format: Option<String>,
}

/// Export an image as an archive, streamed: an oci-archive (an OCI image layout — its root
/// file system as one layer, its config, an index naming it — in a tar) or a
/// docker-archive.
#[utoipa::path(get, path = "/v1/images/{name}/export", tag = "images",
    params(("name" = String, Path), ExportQuery),
    responses((status = 200, content_type = "application/x-tar", body = Vec<u8>),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn export(
    State(m): State<AppState>,
    Path(name): Path<String>,
    super::extract::ApiQuery(q): super::extract::ApiQuery<ExportQuery>,
) -> ApiResult<Response> {
    use axum::http::header;
    let docker = match q.format.as_deref() {
        None | Some("oci-archive") => false,
        Some("docker-archive") => true,
        Some(other) => {
            return Err(crate::error::Error::InvalidArgument(format!(
                "Unknown export format {other:?} (oci-archive or docker-archive)"
            ))
            .into())
        }
    };
    let path = m.export_image(&name, docker).await?;
    let file = tokio::fs::File::open(&path).await;
    // Unlinked at once: the open file streams on and nothing is left behind.
    let _ = tokio::fs::remove_file(&path).await;
    let file =
        file.map_err(|e| crate::error::Error::InvalidArgument(format!("Export failed: {e}")))?;
    let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-tar".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        body,
    )
        .into_response())
}

/// Push an image to an OCI registry (its root file system as one layer, and its config).
#[utoipa::path(post, path = "/v1/images/push", tag = "images", request_body = PushImage,
    responses((status = 200, body = PushedImage), (status = 404, body = ErrorBody),
        (status = 502, body = ErrorBody)))]
pub async fn push(
    State(m): State<AppState>,
    ApiJson(req): ApiJson<PushImage>,
) -> ApiResult<Json<PushedImage>> {
    Ok(Json(m.push_image(req).await?))
}

/// Query of `POST /v1/images/import`.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ImportImageQuery {
    /// Name of the image; default: the name the archive gives it.
    pub name: Option<String>,
}

/// Import an image archive: a `docker save` tarball (docker-archive), an oci-archive (an
/// OCI layout in a tar), gzip-compressed or not. Every OCI blob is checked against its
/// digest and every docker-archive layer against the config's diff ids before anything
/// is unpacked; nothing in a layer may leave the image's root.
#[utoipa::path(post, path = "/v1/images/import", tag = "images", params(ImportImageQuery),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 201, body = Image), (status = 400, body = ErrorBody),
        (status = 413, body = ErrorBody)))]
pub async fn import(
    State(m): State<AppState>,
    super::extract::ApiQuery(q): super::extract::ApiQuery<ImportImageQuery>,
    req: axum::extract::Request,
) -> ApiResult<(StatusCode, Json<Image>)> {
    let dir = m.config().data_dir.join("tmp");
    let id = model::ids::random_id::<8>("archive").map_err(crate::error::Error::from)?;
    let (tar, unpacked) = (dir.join(format!("{id}.tar")), dir.join(&id));
    let received = receive_context(&m, req.into_body(), &tar, &unpacked).await;
    let _ = tokio::fs::remove_file(&tar).await;
    let imported = match received {
        Ok(()) => m.import_image(&unpacked, q.name.as_deref()).await,
        Err(e) => Err(e),
    };
    let _ = tokio::fs::remove_dir_all(&unpacked).await;
    Ok((StatusCode::CREATED, Json(imported?)))
}

/// Query of `POST /v1/images/build`.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DockerfileQuery {
    /// Name of the image to build (`[a-z0-9._-]`, 1-64).
    pub name: String,
    /// Path of the Dockerfile in the build context (default `Dockerfile`).
    pub dockerfile: Option<String>,
    /// `ARG` values, as a JSON object of strings.
    pub build_args: Option<String>,
}

/// Build an image from a Dockerfile. The body is the build context as a tar (the CLI
/// leaves out what `.dockerignore` names); each RUN, COPY and ADD step runs in a build
/// sandbox and is cached as a layer, so a rebuild reuses every step before the first
/// one that changed. Progress (the steps, their output) streams as NDJSON and the last
/// line is `done` or `error`.
#[utoipa::path(post, path = "/v1/images/build", tag = "images", params(DockerfileQuery),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 200, body = BuildEvent, content_type = "application/x-ndjson"),
        (status = 400, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn build_dockerfile(
    State(m): State<AppState>,
    super::extract::ApiQuery(q): super::extract::ApiQuery<DockerfileQuery>,
    req: axum::extract::Request,
) -> ApiResult<Response> {
    let args: std::collections::BTreeMap<String, String> = match &q.build_args {
        Some(json) => serde_json::from_str(json).map_err(|e| {
            crate::error::Error::InvalidArgument(format!(
                "build_args: a JSON object of strings: {e}"
            ))
        })?,
        None => Default::default(),
    };
    let dir = m.config().data_dir.join("tmp");
    let id = model::ids::random_id::<8>("context").map_err(crate::error::Error::from)?;
    let (tar, context) = (dir.join(format!("{id}.tar")), dir.join(&id));
    let unpacked = receive_context(&m, req.into_body(), &tar, &context).await;
    let _ = tokio::fs::remove_file(&tar).await;
    if let Err(e) = unpacked {
        let _ = tokio::fs::remove_dir_all(&context).await;
        return Err(e.into());
    }
    let dockerfile = q.dockerfile.unwrap_or_else(|| "Dockerfile".into());
    Ok(stream_build(move |progress| async move {
        let built = m
            .build_dockerfile(&q.name, &context, &dockerfile, &args, progress)
            .await;
        let _ = tokio::fs::remove_dir_all(&context).await;
        built
    }))
}

/// Receives the context tar and unpacks it (hostile input: nothing may leave `context`).
async fn receive_context(
    m: &AppState,
    body: axum::body::Body,
    tar: &std::path::Path,
    context: &std::path::Path,
) -> crate::error::Result<()> {
    tokio::fs::create_dir_all(context)
        .await
        .map_err(|e| crate::error::Error::InvalidArgument(format!("build context: {e}")))?;
    super::snapshots::receive(body, tar, m.config()).await?;
    let (tar, context) = (tar.to_path_buf(), context.to_path_buf());
    // A compressed context inflates within the import cap and the free-space floor.
    let limits = runtime::image::UnpackLimits {
        max_bytes: m.config().max_import_bytes,
        floor_bytes: crate::config::IMPORT_SPACE_FLOOR,
    };
    tokio::task::spawn_blocking(move || {
        runtime::image::import_tarball(&tar, &context, limits, &|_| {})
    })
    .await
    .map_err(|e| crate::error::Error::InvalidArgument(e.to_string()))?
    .map_err(context_error)
}

/// A build context that could not be unpacked: too large or out of space as such, else
/// a bad archive.
fn context_error(e: runtime::Error) -> crate::error::Error {
    use crate::error::Error;
    let chain = model::error_chain(&e);
    match e {
        runtime::Error::TooLarge(_) => Error::TooLarge(format!("build context: {chain}")),
        _ if crate::error::says_storage_full(&chain) => {
            Error::InsufficientStorage(format!("Out of disk space: build context: {chain}"))
        }
        _ => Error::InvalidArgument(format!("build context: {chain}")),
    }
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
