//! Mapping runtime and agent errors to backend errors.

use agent_client::ClientError;
use proto::agent::ErrorKind;

use crate::backend::BackendError;

pub fn host_err(e: runtime::Error) -> BackendError {
    if e.is_storage_full() {
        return BackendError::StorageFull(error_chain(&e));
    }
    match e {
        runtime::Error::InvalidSpec(m) => BackendError::InvalidInput(m),
        runtime::Error::NotFound(id) => BackendError::Unavailable(format!("Sandbox {id} is gone")),
        runtime::Error::PoolExhausted => BackendError::Unavailable(e.to_string()),
        runtime::Error::Unsupported(m) => BackendError::Unsupported(m),
        runtime::Error::NotCheckpointable(_) => BackendError::Conflict(e.to_string()),
        other => BackendError::Host(error_chain(&other)),
    }
}

pub(crate) use model::error_chain;

/// Maps an agent client error to a backend error.
pub fn agent_err(e: ClientError) -> BackendError {
    match e {
        ClientError::Agent(a) => {
            let m = a.message;
            match a.kind {
                ErrorKind::NotFound => BackendError::NotFound(m),
                ErrorKind::InvalidInput => BackendError::InvalidInput(m),
                ErrorKind::TooLarge => BackendError::TooLarge(m),
                ErrorKind::TimedOut => BackendError::TimedOut(m),
                ErrorKind::PermissionDenied
                | ErrorKind::IsADirectory
                | ErrorKind::NotADirectory
                | ErrorKind::AlreadyExists => BackendError::Conflict(m),
                ErrorKind::Other => BackendError::Host(m),
            }
        }
        ClientError::TooLarge(n) => BackendError::TooLarge(format!("Output exceeds {n} bytes")),
        other => BackendError::Unavailable(format!("Agent unreachable: {}", error_chain(&other))),
    }
}

/// A background process that fails to start: a name already taken is a conflict, anything
/// else as for [`exec_err`].
pub fn spawn_err(e: ClientError) -> BackendError {
    if let ClientError::Agent(a) = &e {
        if a.kind == ErrorKind::AlreadyExists {
            return BackendError::Conflict(a.message.clone());
        }
    }
    exec_err(e)
}

/// An exec that fails to start is the caller's mistake (e.g. no such program).
pub fn exec_err(e: ClientError) -> BackendError {
    match agent_err(e) {
        BackendError::NotFound(m) | BackendError::Conflict(m) | BackendError::InvalidInput(m) => {
            BackendError::ExecFailed(m)
        }
        other => other,
    }
}
