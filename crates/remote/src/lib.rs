//! Snapshots in S3-compatible object storage (docs/scale-out.md).
//!
//! A node **publishes** a snapshot: each disk layer of its chain that the bucket does not
//! have yet (its held blocks packed in block order, its chunk table, then its metadata
//! record), each memory image file by content, and last the snapshot's signed manifest —
//! one PUT, so a snapshot is in the bucket whole or not at all. Any node **pulls** it: the
//! manifest (its signature checked), each layer's metadata and chunk table (checked
//! against the manifest's blake3), the memory images (each part checked); the disk's
//! blocks stay in the bucket until a read needs them, when the [`ChunkService`] fetches
//! their chunk with one ranged GET and the block store checks it before use.
//!
//! ```text
//! <prefix>/layers/<layer id>/blocks    held blocks, packed in block order
//! <prefix>/layers/<layer id>/chunks    chunk table (blockstore::remote)
//! <prefix>/layers/<layer id>/meta      metadata record (written last)
//! <prefix>/memory/<blake3>             a memory image file, by content
//! <prefix>/snapshots/<id>.json         signed manifest (written last)
//! ```

mod bucket;
mod error;
mod fetch;
pub mod manifest;
pub mod publish;
mod pull;

pub use bucket::{Bucket, BucketConfig, Stats};
pub use error::{RemoteError, Result};
pub use fetch::ChunkService;
pub use manifest::{FileEntry, LayerEntry, Manifest, MemoryLayer, Signature, Signer};
pub use publish::Tables;

/// Object names inside a bucket's prefix.
pub mod keys {
    /// A part of a published layer: `blocks`, `chunks` or `meta`.
    pub fn layer(id: &str, part: &str) -> String {
        format!("layers/{id}/{part}")
    }

    /// A memory image file, by its blake3.
    pub fn memory(blake3: &str) -> String {
        format!("memory/{blake3}")
    }

    /// A snapshot's manifest.
    pub fn manifest(snapshot: &str) -> String {
        format!("snapshots/{snapshot}.json")
    }

    /// Where manifests are listed from.
    pub const MANIFESTS: &str = "snapshots";
}
