//! Errors as the Tensorlake SDKs read them. The daemon's own error body (`{code, message}`,
//! with its status) is already their shape: the SDKs put the body into their message and
//! map 401, 403, 404 and 409 to their exception classes. What is added here: the answer
//! to a Tensorlake feature sandfork has no counterpart for, which names the feature.

use axum::http::{StatusCode, Uri};
use axum::response::Response;

use super::super::{error_response, ApiError};
use crate::error::Error;

/// An option of a supported call that sandfork cannot honour (422 `unsupported`).
pub(super) fn unsupported(what: &str) -> ApiError {
    ApiError(Error::Unsupported(format!(
        "{what} (Tensorlake compatibility; see docs/compat.md)"
    )))
}

/// A whole Tensorlake endpoint sandfork has no counterpart for (501 `unsupported`).
pub(super) async fn missing(uri: Uri) -> Response {
    error_response(
        StatusCode::NOT_IMPLEMENTED,
        api_types::ErrorCode::Unsupported,
        format!("{} (see docs/compat.md)", missing_feature(uri.path())),
    )
}

fn missing_feature(path: &str) -> &'static str {
    if path.contains("/sandbox-pools") {
        "Sandbox pools are not supported by sandfork: create sandboxes directly; to start \
         many alike quickly, take a memory snapshot and create from it (or copy), which \
         sandfork serves from its own pool of ready forks"
    } else if path.contains("/archived-sandboxes") {
        "Archived sandboxes are not supported by sandfork: list terminated sandboxes with \
         its native GET /v1/sandboxes?state=terminated"
    } else if path.ends_with("/file_systems") {
        "Mounting file systems into a sandbox (file_systems) is not supported by sandfork: \
         mount its named volumes at create through its native API"
    } else if path.ends_with("/logs") {
        "The Tensorlake sandbox log endpoint is not supported by sandfork: read the log with \
         its native GET /v1/sandboxes/{id}/logs"
    } else {
        "The Tensorlake process log endpoint is not supported by sandfork: list processes \
         with its native GET /v1/sandboxes/{id}/processes"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_missing_feature_is_named() {
        let ns = "/v1/namespaces/default";
        for (path, word) in [
            (format!("{ns}/sandbox-pools/p1/sandboxes"), "pools"),
            (format!("{ns}/archived-sandboxes"), "Archived"),
            (format!("{ns}/sandboxes/sb-1/file_systems"), "file_systems"),
            (format!("{ns}/sandboxes/sb-1/logs"), "log"),
        ] {
            assert!(missing_feature(&path).contains(word), "{path}");
        }
    }
}
