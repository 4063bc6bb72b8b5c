use std::io;

/// Errors returned by the block store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An access reaches past the end of the disk.
    #[error("{op} of {len} bytes at offset {offset} is past the end of the disk ({size} bytes)")]
    OutOfRange {
        op: &'static str,
        offset: u64,
        len: u64,
        size: u64,
    },
    /// An operating-system call failed.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result type of the block store.
pub type Result<T, E = Error> = std::result::Result<T, E>;
