//! Errors in E2B's shapes: the control plane's `{code: <status>, message}`, envd's proxy
//! answer (502 "The sandbox was not found"), `/files`' `{code, message}` and Connect
//! errors (`{code: "<name>", message}`), each mapped from the daemon's [`Error`].

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::backend::BackendError;
use crate::error::Error;

/// A control-plane error: the status and `{"code": status, "message"}`.
#[derive(Debug)]
pub struct ApiErr {
    pub status: StatusCode,
    pub message: String,
}

impl ApiErr {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiErr {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// A feature of E2B that sandfork does not have.
    pub fn missing(feature: &str) -> Self {
        Self::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("sandfork does not support {feature}"),
        )
    }
}

impl From<Error> for ApiErr {
    fn from(e: Error) -> Self {
        let status = match &e {
            // A feature the daemon lacks: not a request E2B's SDKs would retry.
            Error::Unsupported(_) => 501,
            other => other.status_code().0,
        };
        ApiErr {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message: e.message(),
        }
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        let body = json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, Json(body)).into_response()
    }
}

/// The answer envd's proxy gives for a sandbox that is not running (the SDKs key on the
/// 502 and on "was not found").
pub fn sandbox_gone(id: &str) -> Response {
    let body = json!({"sandboxId": id, "message": "The sandbox was not found"});
    let mut resp = (StatusCode::BAD_GATEWAY, Json(body)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    resp
}

/// envd's refusal of a request without the sandbox's access token.
pub fn unauthorized() -> Response {
    ApiErr::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized access, please provide a valid access token or method signing if supported",
    )
    .into_response()
}

/// A Connect error code (the names of the Connect protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code.
    pub fn status(self) -> StatusCode {
        let s = match self {
            Code::Canceled => 499,
            Code::Internal => 500,
            Code::InvalidArgument | Code::FailedPrecondition => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        };
        StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// A Connect error.
#[derive(Debug)]
pub struct RpcErr {
    pub code: Code,
    pub message: String,
}

impl RpcErr {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        RpcErr {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// The sandbox stopped under a request.
    pub fn gone() -> Self {
        Self::new(Code::Unavailable, "The sandbox was not found")
    }

    /// The error's JSON (`{"code": "<name>", "message"}`).
    pub fn body(&self) -> serde_json::Value {
        json!({"code": self.code.name(), "message": self.message})
    }
}

impl From<Error> for RpcErr {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::InvalidArgument(_) | Error::ExecFailed(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::WrongState { .. } => Code::Unavailable,
            Error::Conflict(_) => Code::FailedPrecondition,
            Error::TooLarge(_) | Error::OverCapacity(_) | Error::InsufficientStorage(_) => {
                Code::ResourceExhausted
            }
            Error::Unsupported(_) => Code::Unimplemented,
            Error::Unauthorized(_) => Code::Unauthenticated,
            Error::Forbidden(_) => Code::PermissionDenied,
            Error::ShuttingDown | Error::BadGateway(_) => Code::Unavailable,
            Error::Backend(BackendError::TimedOut(_)) => Code::DeadlineExceeded,
            Error::Backend(BackendError::Unavailable(_)) => Code::Unavailable,
            _ => Code::Internal,
        };
        if matches!(e, Error::WrongState { .. }) {
            return RpcErr::gone();
        }
        RpcErr::new(code, e.message())
    }
}

impl IntoResponse for RpcErr {
    /// As a unary answer.
    fn into_response(self) -> Response {
        (self.code.status(), Json(self.body())).into_response()
    }
}

/// A `/files` error: `{"code": <status>, "message"}`.
pub fn files_error(e: Error, path: &str) -> Response {
    let (status, message) = match &e {
        Error::NotFound(_) => (404, format!("path '{path}' does not exist")),
        Error::Conflict(m) if m.to_lowercase().contains("directory") => {
            (400, format!("path '{path}' is a directory"))
        }
        Error::InsufficientStorage(m) => (507, m.clone()),
        Error::WrongState { .. } => (502, "The sandbox was not found".into()),
        other => (other.status_code().0, other.message()),
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    ApiErr::new(status, message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_errors_become_connect_codes() {
        let c = |e: Error| RpcErr::from(e).code;
        assert_eq!(c(Error::NotFound("x".into())), Code::NotFound);
        assert_eq!(c(Error::InvalidArgument("x".into())), Code::InvalidArgument);
        assert_eq!(
            c(Error::Backend(BackendError::TimedOut("x".into()))),
            Code::DeadlineExceeded
        );
        let gone = RpcErr::from(Error::WrongState {
            id: "sb".into(),
            state: model::State::Suspended,
        });
        assert_eq!(
            (gone.code, gone.message.as_str()),
            (Code::Unavailable, "The sandbox was not found")
        );
        assert_eq!(Code::AlreadyExists.status().as_u16(), 409);
        assert_eq!(RpcErr::gone().body()["code"], "unavailable");
    }

    #[test]
    fn unsupported_is_501_on_the_control_plane() {
        let e = ApiErr::from(Error::Unsupported("no".into()));
        assert_eq!(e.status.as_u16(), 501);
        assert_eq!(
            ApiErr::from(Error::NotFound("x".into())).status.as_u16(),
            404
        );
    }
}
