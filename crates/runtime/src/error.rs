//! Errors of the runtime.

use std::path::PathBuf;

/// What went wrong in the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Invalid sandbox spec: {0}")]
    InvalidSpec(String),
    #[error("Sandbox {0} not found")]
    NotFound(String),
    #[error("Sandbox {0} already exists")]
    Exists(String),
    #[error("Sandbox {0} is not stopped")]
    NotStopped(String),
    #[error("Command {command} failed: {detail}")]
    Command { command: String, detail: String },
    #[error("I/O on {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Sandbox state record {path} is unreadable")]
    Record {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("Network address pool is exhausted")]
    PoolExhausted,
    /// The sandbox cannot do this (e.g. change the egress of a sandbox without network).
    #[error("{0}")]
    Unsupported(String),
    #[error("Disk operation failed")]
    Disk(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("Agent did not become ready: {0}")]
    Agent(String),
    #[error("SANDFORK_AGENT_BIN names {0}, which is not a statically linked executable")]
    NoAgentBinary(PathBuf),
    #[error("Image build failed: {0}")]
    Image(String),
    /// A layer or root filesystem tarball that could not be unpacked; the source names
    /// the offending entry.
    #[error("Image build failed: cannot unpack {layer}")]
    Layer {
        layer: PathBuf,
        #[source]
        source: crate::image::unpack::UnpackError,
    },
    #[error("Checkpoint failed: {0}")]
    Checkpoint(String),
    /// A process of the sandbox holds something a memory checkpoint cannot carry; the
    /// message names the process, the resource and what to do. The sandbox runs on.
    #[error("Checkpoint refused: {0}")]
    NotCheckpointable(String),
}

/// Result with the runtime's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Adds the path to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|e| Error::io(path, e))
    }
}
