//! The errors of the MCP server, by kind, and what each becomes on the wire: a tool's
//! failure is a tool result with `isError` (so the model reads why), a resource's is a
//! JSON-RPC error with the code MCP gives it.

use rmcp::model::{CallToolResult, ContentBlock, ErrorData};
use serde_json::json;

/// Why a tool call or a resource read did not work.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong (a missing or contradictory argument, a bad URI).
    #[error("{0}")]
    InvalidInput(String),
    /// Something sandfork cannot do at all; `feature` names it.
    #[error("sandfork does not support {feature}: {detail}")]
    Unsupported {
        feature: &'static str,
        detail: String,
    },
    /// The daemon answered with an error (`code` and `message` are its own).
    #[error("{message}")]
    Daemon {
        status: u16,
        code: String,
        message: String,
    },
    /// No connection to the daemon, or it broke mid-answer.
    #[error("cannot reach the daemon: {0}")]
    Unreachable(String),
    /// The daemon answered something this server cannot read.
    #[error("the daemon sent an unreadable reply: {0}")]
    BadReply(String),
    /// The MCP server itself could not start or serve (bind, stdio).
    #[error("{0}")]
    Serve(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::InvalidInput(message.into())
    }

    /// A short machine-readable kind.
    pub fn kind(&self) -> &str {
        match self {
            Error::InvalidInput(_) => "invalid_argument",
            Error::Unsupported { .. } => "unsupported",
            Error::Daemon { code, .. } => code,
            Error::Unreachable(_) => "unavailable",
            Error::BadReply(_) | Error::Serve(_) => "internal",
        }
    }

    fn is_not_found(&self) -> bool {
        matches!(self, Error::Daemon { status: 404, .. })
    }

    /// The error as the JSON object tool results and error data carry.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = json!({"code": self.kind(), "message": self.to_string()});
        match self {
            Error::Unsupported { feature, .. } => v["feature"] = json!(feature),
            Error::Daemon { status, .. } => v["status"] = json!(status),
            _ => {}
        }
        v
    }

    /// A tool's failure: a result the model reads, with `isError` set.
    pub fn into_tool_result(self) -> CallToolResult {
        let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
            "error ({}): {self}",
            self.kind()
        ))]);
        result.structured_content = Some(json!({ "error": self.to_json() }));
        result
    }

    /// A resource's failure as a JSON-RPC error.
    pub fn into_error_data(self) -> ErrorData {
        let data = Some(self.to_json());
        let message = self.to_string();
        match &self {
            _ if self.is_not_found() => ErrorData::resource_not_found(message, data),
            Error::InvalidInput(_) | Error::Unsupported { .. } => {
                ErrorData::invalid_params(message, data)
            }
            Error::Daemon { status, .. } if (400..500).contains(status) => {
                ErrorData::invalid_params(message, data)
            }
            _ => ErrorData::internal_error(message, data),
        }
    }
}

impl From<Error> for ErrorData {
    fn from(e: Error) -> ErrorData {
        e.into_error_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsupported_feature_is_named_in_the_tool_result() {
        let r = Error::Unsupported {
            feature: "GPUs",
            detail: "its sandboxes have no GPU".into(),
        }
        .into_tool_result();
        assert_eq!(r.is_error, Some(true));
        let s = r.structured_content.expect("structured");
        assert_eq!(s["error"]["code"], "unsupported");
        assert_eq!(s["error"]["feature"], "GPUs");
    }

    #[test]
    fn a_missing_sandbox_is_a_resource_not_found() {
        let e = Error::Daemon {
            status: 404,
            code: "not_found".into(),
            message: "no sandbox sb-1".into(),
        }
        .into_error_data();
        assert_eq!(e.code, rmcp::model::ErrorCode::RESOURCE_NOT_FOUND);
        let e = Error::Unreachable("gone".into()).into_error_data();
        assert_eq!(e.code, rmcp::model::ErrorCode::INTERNAL_ERROR);
    }
}
