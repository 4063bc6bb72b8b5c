//! The daemon's error: one enum every front end maps to a status and a `{code, message}`.

use crate::backend::BackendError;
use crate::lifecycle::State;
use crate::store::StoreError;

/// What went wrong serving a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("Sandbox {id} is {state}")]
    WrongState { id: String, state: State },
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    OverCapacity(String),
    #[error("The daemon is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    ExecFailed(String),
    #[error("{0}")]
    Backend(BackendError),
    #[error("State database failed: {0}")]
    Store(#[from] StoreError),
}

/// Result of manager calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::NotFound(m) => Error::NotFound(m),
            BackendError::InvalidInput(m) => Error::InvalidArgument(m),
            BackendError::ExecFailed(m) => Error::ExecFailed(m),
            BackendError::TooLarge(m) => Error::TooLarge(m),
            BackendError::Conflict(m) => Error::Conflict(m),
            BackendError::Unsupported(m) => Error::Unsupported(m),
            other => Error::Backend(other),
        }
    }
}

impl Error {
    /// HTTP status and machine-readable code.
    pub fn status_code(&self) -> (u16, &'static str) {
        match self {
            Error::InvalidArgument(_) => (400, "invalid_argument"),
            Error::ExecFailed(_) => (400, "exec_failed"),
            Error::NotFound(_) => (404, "not_found"),
            Error::WrongState { .. } | Error::Conflict(_) => (409, "conflict"),
            Error::TooLarge(_) => (413, "too_large"),
            Error::Unsupported(_) => (422, "unsupported"),
            Error::OverCapacity(_) => (429, "over_capacity"),
            Error::ShuttingDown => (503, "unavailable"),
            Error::Backend(BackendError::TimedOut(_)) => (408, "timed_out"),
            Error::Backend(BackendError::Unavailable(_)) => (503, "unavailable"),
            Error::Backend(_) => (500, "runtime_error"),
            Error::Store(_) => (500, "internal"),
        }
    }

    /// The metric label of this error's kind.
    pub fn kind(&self) -> &'static str {
        self.status_code().1
    }

    /// The whole chain, for users and logs.
    pub fn message(&self) -> String {
        let mut msg = self.to_string();
        let mut src = std::error::Error::source(self);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_contract() {
        let cases: Vec<(Error, u16, &str)> = vec![
            (Error::InvalidArgument("x".into()), 400, "invalid_argument"),
            (Error::NotFound("x".into()), 404, "not_found"),
            (
                Error::WrongState {
                    id: "a".into(),
                    state: State::Suspended,
                },
                409,
                "conflict",
            ),
            (Error::TooLarge("x".into()), 413, "too_large"),
            (Error::Unsupported("x".into()), 422, "unsupported"),
            (Error::OverCapacity("x".into()), 429, "over_capacity"),
            (Error::ShuttingDown, 503, "unavailable"),
            (
                BackendError::ExecFailed("x".into()).into(),
                400,
                "exec_failed",
            ),
            (BackendError::NotFound("x".into()).into(), 404, "not_found"),
            (BackendError::Host("x".into()).into(), 500, "runtime_error"),
        ];
        for (err, status, code) in cases {
            assert_eq!(err.status_code(), (status, code), "{err:?}");
        }
    }

    #[test]
    fn wrong_state_names_the_state() {
        let e = Error::WrongState {
            id: "sb-1".into(),
            state: State::Terminated,
        };
        assert_eq!(e.message(), "Sandbox sb-1 is terminated");
    }

    #[test]
    fn store_errors_carry_their_source() {
        let e = Error::Store(StoreError::Task("boom".into()));
        assert!(e.message().contains("boom"), "{}", e.message());
    }
}
