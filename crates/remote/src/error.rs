/// Why an object-store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The object store could not be reached or refused the request (after retries).
    #[error("Object store {url}: {what}: {detail}")]
    Store {
        url: String,
        what: String,
        detail: String,
    },
    /// What was asked for is not in the bucket.
    #[error("Not in the object store: {0}")]
    NotFound(String),
    /// What the bucket holds fails its checks (hash, signature, structure): never used.
    #[error("Refused from the object store: {0}")]
    Invalid(String),
    /// An object of the bucket fails its hash: the message names the object (its key)
    /// and what of the snapshot it holds.
    #[error("Integrity check failed: {0}")]
    Integrity(String),
    /// The configuration names something that cannot work.
    #[error("Object store configuration: {0}")]
    Config(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Blocks(#[from] blockstore::Error),
}

pub type Result<T, E = RemoteError> = std::result::Result<T, E>;

impl RemoteError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> RemoteError {
        RemoteError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn integrity(what: impl Into<String>) -> RemoteError {
        RemoteError::Integrity(what.into())
    }

    pub(crate) fn invalid(what: impl Into<String>) -> RemoteError {
        RemoteError::Invalid(what.into())
    }
}

/// Runs blocking work (the block store's) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RemoteError::io("a blocking task", std::io::Error::other(e)))?
}
