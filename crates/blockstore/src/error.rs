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
    /// A size or offset is not a multiple of the block size where it must be.
    #[error("{what} {value} is not a multiple of 4096")]
    Unaligned { what: &'static str, value: u64 },
    /// A size is invalid (zero, shrinking, or beyond the supported maximum).
    #[error("invalid size {size}: {reason}")]
    InvalidSize { size: u64, reason: &'static str },
    /// An operating-system call failed.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// No layer with this id exists in the store.
    #[error("layer {0} not found")]
    LayerNotFound(String),
    /// The layer exists but is not sealed, so it cannot be referenced or exported.
    #[error("layer {0} is not sealed")]
    NotSealed(String),
    /// No disk with this name exists in the store.
    #[error("disk {0:?} not found")]
    DiskNotFound(String),
    /// A disk with this name already exists.
    #[error("disk {0:?} already exists")]
    DiskExists(String),
    /// No ref with this name exists in the store.
    #[error("ref {0:?} not found")]
    RefNotFound(String),
    /// The disk is open for writing elsewhere.
    #[error("disk {0:?} is open in another process or handle")]
    DiskBusy(String),
    /// A layer's data or metadata does not match its checksums.
    #[error("layer {layer} is corrupt: {reason}")]
    Corrupt { layer: String, reason: String },
    /// An imported chain segment needs a parent layer this store does not have.
    #[error("parent layer {parent} of imported layer {layer} is missing")]
    MissingParent { layer: String, parent: String },
    /// A disk or ref name is not acceptable.
    #[error("invalid name {0:?}: use 1 to 128 of [A-Za-z0-9._-], not starting with '.'")]
    InvalidName(String),
    /// A layer id is not 32 lowercase hex characters.
    #[error("invalid layer id {0:?}")]
    InvalidLayerId(String),
    /// A packed artifact is malformed, truncated or fails its checksums.
    #[error("invalid artifact: {reason}")]
    InvalidArtifact { reason: String },
    /// A disk manifest cannot be parsed or names layers that do not form a chain.
    #[error("disk manifest {name:?} is invalid: {reason}")]
    BadManifest { name: String, reason: String },
    /// A seal added a layer while a compaction was merging; the merge was discarded and
    /// may simply be retried.
    #[error("compaction of disk {0:?} raced with a seal; retry")]
    CompactionRaced(String),
    /// The disk failed in the middle of a seal and must be reopened (which completes it).
    #[error("disk {0:?} failed during a seal and must be reopened")]
    NeedsReopen(String),
    /// The layer given as base is not part of the chain below top.
    #[error("layer {base} is not below {top}")]
    NotAncestor { base: String, top: String },
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// A corruption of `layer`, described by `reason`.
    pub fn corrupt(layer: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            layer: layer.to_string(),
            reason: reason.into(),
        }
    }

    /// A malformed artifact, described by `reason`.
    pub fn artifact(reason: impl Into<String>) -> Self {
        Error::InvalidArtifact {
            reason: reason.into(),
        }
    }
}

/// Result type of the block store.
pub type Result<T, E = Error> = std::result::Result<T, E>;
