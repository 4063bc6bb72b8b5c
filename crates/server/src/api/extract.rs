//! Extractors whose rejections are API errors (`{code, message}`), not axum's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::{ApiError, AppState};
use crate::error::Error;

/// A JSON body, bounded by `max_json_bytes`; unknown fields are refused (400).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.config().max_json_bytes;
        let bytes = read_limited(req, limit).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Reads a whole body of at most `limit` bytes (413 past it).
pub async fn read_limited(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|e| {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                ApiError(Error::TooLarge(format!(
                    "Request body exceeds {limit} bytes"
                )))
            } else {
                ApiError(Error::InvalidArgument(format!(
                    "Cannot read request body: {e}"
                )))
            }
        })
}

/// Parses JSON, naming what was wrong.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return serde_json::from_slice(b"{}")
            .map_err(|_| ApiError(Error::InvalidArgument("A JSON body is required".into())));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError(Error::InvalidArgument(format!("Invalid JSON body: {e}"))))
}

/// A query string (400 on bad or unknown parameters).
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let q = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str(q)
            .map(ApiQuery)
            .map_err(|e| ApiError(Error::InvalidArgument(format!("Invalid query: {e}"))))
    }
}
