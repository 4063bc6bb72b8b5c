//! Sandbox lifecycle routes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::extract::{ApiJson, ApiQuery};
use super::{ApiResult, AppState};
use api_types::{
    CreateSandbox, ErrorBody, Labels, LabelsPatch, ListQuery, Sandbox, SandboxList, SandboxStats,
    UpdateSandbox,
};

/// Create and boot a sandbox.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateSandbox,
    responses((status = 201, body = Sandbox),
        (status = 400, body = ErrorBody), (status = 404, description = "Unknown image or snapshot", body = ErrorBody),
        (status = 409, description = "Name taken", body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 429, description = "Admission refused", body = ErrorBody)))]
pub async fn create(
    State(m): State<AppState>,
    ApiJson(req): ApiJson<CreateSandbox>,
) -> ApiResult<(StatusCode, Json<Sandbox>)> {
    Ok((StatusCode::CREATED, Json(m.create(req).await?)))
}

/// Change a live sandbox: its name, labels or egress lists.
#[utoipa::path(patch, path = "/v1/sandboxes/{id}", tag = "sandboxes", request_body = UpdateSandbox,
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = Sandbox), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Name taken or wrong state", body = ErrorBody),
        (status = 422, description = "Egress lists on a sandbox without internet", body = ErrorBody)))]
pub async fn update(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<UpdateSandbox>,
) -> ApiResult<Json<Sandbox>> {
    Ok(Json(m.update(&id, req).await?))
}

/// How to reach a port of the sandbox through the gateway: its paths, host name, access
/// token and a signed URL path (see docs/api.md, ports).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/port-urls", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body = api_types::PortUrlRequest,
    responses((status = 200, body = api_types::PortUrl), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn port_url(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<api_types::PortUrlRequest>,
) -> ApiResult<Json<api_types::PortUrl>> {
    Ok(Json(m.port_url(&id, req.port, req.expires_in_secs)?))
}

/// Rotate the sandbox's access token: every access token and signed URL made before opens
/// none of its ports any more.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/access-token", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = api_types::AccessToken), (status = 404, body = ErrorBody),
        (status = 409, description = "The sandbox is not live", body = ErrorBody)))]
pub async fn rotate_access_token(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<api_types::AccessToken>> {
    let access_token = m.rotate_access_token(&id).await?;
    let access_epoch = m.get(&id)?.access_epoch;
    Ok(Json(api_types::AccessToken {
        access_token,
        access_epoch,
    }))
}

/// What a running sandbox uses now: CPU time, memory, processes, root disk, network.
/// Reading it is not activity (no idle timeout moves, a suspended sandbox stays so: 409).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/stats", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxStats), (status = 404, body = ErrorBody),
        (status = 409, description = "Not running", body = ErrorBody)))]
pub async fn stats(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxStats>> {
    Ok(Json(m.stats(&id).await?))
}

/// Set and remove labels of a live sandbox in one step; answers the labels it now has.
#[utoipa::path(patch, path = "/v1/sandboxes/{id}/labels", tag = "sandboxes", request_body = LabelsPatch,
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = Labels), (status = 400, description = "A bad key or value, or too many labels", body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Not running or suspended", body = ErrorBody)))]
pub async fn patch_labels(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(patch): ApiJson<LabelsPatch>,
) -> ApiResult<Json<Labels>> {
    Ok(Json(Labels {
        labels: m.patch_labels(&id, patch).await?,
    }))
}

/// List sandboxes (terminated ones only with `state=terminated`).
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(ListQuery),
    responses((status = 200, body = SandboxList), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(m): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<SandboxList>> {
    Ok(Json(SandboxList {
        sandboxes: m.list(&q)?,
    }))
}

/// One sandbox, by id or name.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody)))]
pub async fn get(State(m): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Sandbox>> {
    Ok(Json(m.get(&id)?))
}

/// Terminate a sandbox (idempotent).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn terminate(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Sandbox>> {
    Ok(Json(m.terminate(&id).await?))
}
