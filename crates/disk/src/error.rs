use std::io;

/// Errors of the disk path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{context}")]
    Sys {
        context: String,
        #[source]
        source: nix::Error,
    },
    /// A file or socket operation failed.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// The block store refused an operation.
    #[error("block store operation failed")]
    Store(#[from] blockstore::Error),
    /// An external tool (mkfs.ext4, resize2fs, e2fsck) failed.
    #[error("{tool} failed: {output}")]
    Tool { tool: String, output: String },
    /// The disk server answered with an error, or could not be reached.
    #[error("disk server: {0}")]
    Server(String),
    /// The kernel spoke a FUSE protocol this export does not.
    #[error("unsupported FUSE protocol from the kernel")]
    Protocol,
    /// The kernel refused to grow a mounted ext4 (online resize needs CAP_SYS_RESOURCE).
    /// The disk did grow; the filesystem grows at its next mount.
    #[error("the kernel refused an online resize of the filesystem; it grows at the next mount")]
    ResizeRefused,
    /// A request that makes no sense for this disk.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// Wraps a failed system call with what was being done.
    pub fn sys(context: impl Into<String>) -> impl FnOnce(nix::Error) -> Error {
        let context = context.into();
        move |source| Error::Sys { context, source }
    }

    /// Wraps a failed file operation with what was being done.
    pub fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

/// Result type of the disk path.
pub type Result<T, E = Error> = std::result::Result<T, E>;
