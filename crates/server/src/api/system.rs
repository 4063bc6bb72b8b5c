//! Health, metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

use super::AppState;
use api_types::Health;

/// Liveness and versions.
#[utoipa::path(get, path = "/v1/health", tag = "system", responses((status = 200, body = Health)))]
pub async fn health(State(m): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: crate::VERSION.into(),
        api_version: crate::API_VERSION,
        default_image: m.config().default_image.clone(),
    })
}

/// Prometheus metrics (text format).
#[utoipa::path(get, path = "/metrics", tag = "system",
    responses((status = 200, content_type = "text/plain", body = String)))]
pub async fn metrics(State(m): State<AppState>) -> impl IntoResponse {
    let mut text = m
        .metrics()
        .render(&m.state_counts(), m.host_merge(), m.pool_gauge());
    crate::metrics::render_counters(&mut text, &m.remote_counters());
    crate::metrics::render_sandboxes(&mut text, &m.all_stats().await);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// This API's OpenAPI document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "system",
    responses((status = 200, content_type = "application/json", body = Object)))]
pub async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::openapi_json(),
    )
}
