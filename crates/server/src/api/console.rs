//! The web console under `/ui/`: its files, built into the binary (`sandfork-console-embed`).
//! They hold no data; everything the console shows comes from the API, with the API's
//! token on the TCP listener.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use super::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        // A browser sent to the daemon's address lands on the console.
        .route("/", get(|| async { Redirect::temporary("/ui/") }))
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { file("") }))
        .route(
            "/ui/{*path}",
            get(|Path(path): Path<String>| async move { file(&path) }),
        )
}

fn file(path: &str) -> Response {
    // A path the console routes itself (#/…) never reaches here; anything unknown is a 404.
    let Some((bytes, media_type)) = console_embed::asset(path) else {
        return super::error_response(
            StatusCode::NOT_FOUND,
            api_types::ErrorCode::NotFound,
            format!("No console file {path}"),
        );
    };
    let cache = if path.starts_with("assets/") {
        "public, max-age=31536000, immutable" // content-hashed names
    } else {
        "no-cache"
    };
    (
        [
            (header::CONTENT_TYPE, media_type),
            (header::CACHE_CONTROL, cache),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::HeaderName::from_static("content-security-policy"), "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' blob: data:; connect-src 'self'; frame-ancestors 'none'"),
        ],
        bytes,
    )
        .into_response()
}
