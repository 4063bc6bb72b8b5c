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
    /// Input past a size limit (an image layer that unpacks past the import cap).
    #[error("{0}")]
    TooLarge(String),
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
    /// Whether a disk ran out of room somewhere in this error's causes: `ENOSPC` or
    /// `EDQUOT` from a file operation or a system call, however deep (the disk server's and
    /// the block store's errors keep theirs as typed sources). Read from the causes
    /// themselves, never from messages.
    pub fn is_storage_full(&self) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cause {
            let errno = e
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
                .or_else(|| e.downcast_ref::<nix::Error>().map(|n| *n as i32));
            if matches!(errno, Some(libc::ENOSPC | libc::EDQUOT)) {
                return true;
            }
            cause = e.source();
        }
        false
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_found_in_the_causes() {
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(Error::io("/x", full).is_storage_full());
        let deep = disk::Error::Io {
            context: "write".into(),
            source: std::io::Error::from_raw_os_error(libc::EDQUOT),
        };
        assert!(Error::Disk(Box::new(deep)).is_storage_full());
        let sys = disk::Error::Sys {
            context: "fallocate".into(),
            source: nix::Error::ENOSPC,
        };
        assert!(Error::Disk(Box::new(sys)).is_storage_full());
        let other = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(!Error::io("/x", other).is_storage_full());
        assert!(!Error::Checkpoint("No space left on device".into()).is_storage_full());
    }
}
