//! The daemon's error: one enum every front end maps to a status and a `{code, message}`.

use api_types::ErrorCode;
use model::State;

use crate::backend::BackendError;
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
    /// A disk (the host's, or the sandbox's own) ran out of space.
    #[error("{0}")]
    InsufficientStorage(String),
    #[error("The daemon is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    ExecFailed(String),
    /// A port request without a valid access token.
    #[error("{0}")]
    Unauthorized(String),
    /// A port request with a token that does not open this sandbox's ports.
    #[error("{0}")]
    Forbidden(String),
    /// What the object store holds fails its hash: the message names the object.
    #[error("{0}")]
    Integrity(String),
    /// Nothing answered on the sandbox's port.
    #[error("{0}")]
    BadGateway(String),
    #[error("{0}")]
    Backend(BackendError),
    #[error("State database failed: {0}")]
    Store(#[source] StoreError),
    /// No id could be made: the system's random number generator failed.
    #[error(transparent)]
    Ids(#[from] model::IdError),
}

/// Whether an error message (with its sources) says a disk is full: `ENOSPC` from any
/// layer — the block store, the runtime, CRIU, tar, SQLite, the agent.
pub fn says_storage_full(message: &str) -> bool {
    const SIGNS: [&str; 5] = [
        "no space left on device",
        "os error 28",
        "database or disk is full",
        "because database is full",
        "disk quota exceeded",
    ];
    let message = message.to_lowercase();
    SIGNS.iter().any(|s| message.contains(s))
}

/// The 507 answer for a full disk, keeping the cause.
fn storage_full(cause: &str) -> Error {
    Error::InsufficientStorage(format!("Out of disk space: {cause}"))
}

/// Whether an I/O error is `ENOSPC` (or a quota's `EDQUOT`).
pub fn is_storage_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull
        || e.kind() == std::io::ErrorKind::QuotaExceeded
        || e.raw_os_error() == Some(28)
}

impl From<std::io::Error> for Error {
    /// Local file work of the daemon (snapshot and transfer directories).
    fn from(e: std::io::Error) -> Self {
        if is_storage_full(&e) {
            return storage_full(&e.to_string());
        }
        Error::Backend(BackendError::Host(e.to_string()))
    }
}

impl From<model::LabelError> for Error {
    fn from(e: model::LabelError) -> Self {
        Error::InvalidArgument(e.0)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        let chain = model::error_chain(&e);
        if says_storage_full(&chain) {
            return storage_full(&format!("State database failed: {chain}"));
        }
        Error::Store(e)
    }
}

/// Result of manager calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        // Typed where the cause is typed; messages of other programs (CRIU, tar, the
        // agent's) only as text.
        if matches!(e, BackendError::StorageFull(_)) || says_storage_full(&e.to_string()) {
            return storage_full(&e.to_string());
        }
        match e {
            BackendError::NotFound(m) => Error::NotFound(m),
            BackendError::Refused(m) => Error::BadGateway(m),
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
    /// The machine-readable kind of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::ExecFailed(_) => ErrorCode::ExecFailed,
            Error::Unauthorized(_) => ErrorCode::Unauthorized,
            Error::Forbidden(_) => ErrorCode::Forbidden,
            Error::BadGateway(_) => ErrorCode::BadGateway,
            Error::Integrity(_) => ErrorCode::Integrity,
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::WrongState { .. } | Error::Conflict(_) => ErrorCode::Conflict,
            Error::TooLarge(_) => ErrorCode::TooLarge,
            Error::Unsupported(_) => ErrorCode::Unsupported,
            Error::OverCapacity(_) => ErrorCode::OverCapacity,
            Error::InsufficientStorage(_) => ErrorCode::InsufficientStorage,
            Error::ShuttingDown => ErrorCode::Unavailable,
            Error::Backend(BackendError::TimedOut(_)) => ErrorCode::TimedOut,
            Error::Backend(BackendError::Unavailable(_)) => ErrorCode::Unavailable,
            Error::Backend(BackendError::Registry(_)) => ErrorCode::RegistryError,
            Error::Backend(_) => ErrorCode::RuntimeError,
            Error::Store(_) | Error::Ids(_) => ErrorCode::Internal,
        }
    }

    /// HTTP status and machine-readable code.
    pub fn status_code(&self) -> (u16, &'static str) {
        let code = self.code();
        (code.status(), code.as_str())
    }

    /// The same error for another caller waiting on the same work (status kept).
    pub fn for_another(&self) -> Error {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::NotFound(m) => Error::NotFound(m.clone()),
            Error::WrongState { id, state } => Error::WrongState {
                id: id.clone(),
                state: *state,
            },
            Error::Conflict(m) => Error::Conflict(m.clone()),
            Error::TooLarge(m) => Error::TooLarge(m.clone()),
            Error::Unsupported(m) => Error::Unsupported(m.clone()),
            Error::OverCapacity(m) => Error::OverCapacity(m.clone()),
            Error::InsufficientStorage(m) => Error::InsufficientStorage(m.clone()),
            Error::ShuttingDown => Error::ShuttingDown,
            Error::ExecFailed(m) => Error::ExecFailed(m.clone()),
            Error::Unauthorized(m) => Error::Unauthorized(m.clone()),
            Error::Forbidden(m) => Error::Forbidden(m.clone()),
            Error::BadGateway(m) => Error::BadGateway(m.clone()),
            Error::Integrity(m) => Error::Integrity(m.clone()),
            Error::Backend(b) => Error::Backend(b.clone()),
            Error::Store(_) | Error::Ids(_) => Error::Backend(BackendError::Host(self.message())),
        }
    }

    /// The metric label of this error's kind.
    pub fn kind(&self) -> &'static str {
        self.status_code().1
    }

    /// The whole chain, for users and logs.
    pub fn message(&self) -> String {
        model::error_chain(self)
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
            (
                BackendError::Host("write: No space left on device (os error 28)".into()).into(),
                507,
                "insufficient_storage",
            ),
            (
                BackendError::Unavailable("criu: No space left on device".into()).into(),
                507,
                "insufficient_storage",
            ),
            (
                std::io::Error::from_raw_os_error(28).into(),
                507,
                "insufficient_storage",
            ),
            (
                std::io::Error::from_raw_os_error(5).into(),
                500,
                "runtime_error",
            ),
        ];
        for (err, status, code) in cases {
            assert_eq!(err.status_code(), (status, code), "{err:?}");
        }
    }

    #[test]
    fn a_full_disk_is_named_and_keeps_its_cause() {
        let e: Error =
            BackendError::Host("Checkpoint failed: No space left on device".into()).into();
        assert!(
            e.message().starts_with("Out of disk space: "),
            "{}",
            e.message()
        );
        assert!(e.message().contains("Checkpoint failed"), "{}", e.message());
        let full = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            None,
        );
        let e: Error = StoreError::Sql(full).into();
        assert_eq!(e.status_code().0, 507, "{}", e.message());
        assert!(!says_storage_full("Image build failed: exit status 1"));
        assert!(says_storage_full("/root/big: no space left on device"));
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
