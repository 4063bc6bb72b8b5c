//! Routes reserved for checkpoints, snapshots, fork and suspend/resume. Until those land
//! they answer 422 so clients get a clear message instead of a 404 on a documented path.

use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use super::{error_response, AppState};

async fn not_yet() -> Response {
    error_response(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unsupported",
        "Checkpoints, snapshots, fork and suspend are not available in this build".into(),
    )
}

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/checkpoint", post(not_yet))
        .route("/v1/sandboxes/{id}/fork", post(not_yet))
        .route("/v1/sandboxes/{id}/suspend", post(not_yet))
        .route("/v1/sandboxes/{id}/resume", post(not_yet))
        .route("/v1/snapshots", get(not_yet))
        .route("/v1/snapshots/import", post(not_yet))
        .route("/v1/snapshots/{id}", get(not_yet).delete(not_yet))
        .route("/v1/snapshots/{id}/fork", post(not_yet))
        .route("/v1/snapshots/{id}/export", post(not_yet))
}
