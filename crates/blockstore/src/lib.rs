//! sandfork's layered copy-on-write block store.
//!
//! A disk is an immutable chain of sealed layers plus one writable overlay. Blocks are
//! 4 KiB. See `docs/blockstore.md` for the on-disk format and the crash-safety rules.

mod artifact;
mod bitmap;
mod compact;
mod device;
mod disk;
mod error;
mod fsutil;
mod id;
mod image;
mod layer;
mod meta;
mod partial;
mod refs;
pub mod remote;
mod store;

pub use artifact::{verify_artifact, ArtifactLayer, ExportStats, MAX_LAYERS};
pub use device::{check_range, BlockDevice, FileDevice};
pub use disk::{Disk, MAX_DEPTH};
pub use error::{Error, Result};
pub use id::{validate_name, LayerId};
pub use refs::{GcStats, LayerInfo};
pub use store::{Store, StoreOptions};

/// Size of one block, in bytes.
pub const BLOCK_SIZE: u64 = 4096;
