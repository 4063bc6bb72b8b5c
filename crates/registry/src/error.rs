//! Why a pull failed.

use std::path::{Path, PathBuf};

/// A pull's failure, by cause. Messages name the reference, registry or digest involved.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("invalid image reference {reference:?}: {reason}")]
    BadReference { reference: String, reason: String },
    #[error("image {0} not found in its registry")]
    NotFound(String),
    #[error("registry {registry} refused the credentials for {reference} ({detail})")]
    Unauthorized {
        registry: String,
        reference: String,
        detail: String,
    },
    #[error("cannot reach registry {registry}: {detail}")]
    Unreachable { registry: String, detail: String },
    #[error("no image for {platform} in the index of {reference} (it offers: {offered})")]
    NoPlatform {
        reference: String,
        platform: String,
        offered: String,
    },
    #[error("malformed digest {0:?} (only sha256:<64 hex> is accepted)")]
    BadDigest(String),
    #[error("blob content does not match its digest: expected {expected}, got {actual}")]
    DigestMismatch { expected: String, actual: String },
    #[error("blob {digest} has {actual} bytes, its descriptor declares {expected}")]
    SizeMismatch {
        digest: String,
        expected: u64,
        actual: u64,
    },
    #[error("unsupported {what} media type {media_type:?}")]
    UnsupportedMediaType {
        what: &'static str,
        media_type: String,
    },
    #[error("invalid image config of {reference}: {reason}")]
    BadConfig { reference: String, reason: String },
    #[error("credentials for {registry} from the Docker config: {detail}")]
    Credentials { registry: String, detail: String },
    #[error("TLS certificate {path}: {detail}")]
    Certificate { path: PathBuf, detail: String },
    #[error("registry protocol error for {reference}: {detail}")]
    Protocol { reference: String, detail: String },
    /// Something a registry sent or declared is larger than the daemon reads or keeps.
    #[error("{what} is too large: {} (the limit is {limit} bytes)", actual.map_or("over the limit".to_string(), |n| format!("{n} bytes")))]
    TooLarge {
        what: String,
        limit: u64,
        actual: Option<u64>,
    },
    /// The registry pointed the daemon (a token realm, a redirect) somewhere it may not go.
    #[error("registry {registry} sent the daemon where it may not go: {detail}")]
    Blocked { registry: String, detail: String },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl PullError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> PullError {
        PullError::Io {
            path: path.into(),
            source,
        }
    }

    /// Whether the disk filled up (the pull may succeed once room is made).
    pub fn is_disk_full(&self) -> bool {
        match self {
            PullError::Io { source, .. } => source.raw_os_error() == Some(28),
            _ => false,
        }
    }
}

pub type Result<T, E = PullError> = std::result::Result<T, E>;
