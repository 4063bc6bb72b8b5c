//! sandfork's layered copy-on-write block store.
//!
//! A disk is an immutable chain of sealed layers plus one writable overlay. Blocks are
//! 4 KiB. See `docs/blockstore.md` for the on-disk format and the crash-safety rules.

mod device;
mod error;

pub use device::{check_range, BlockDevice, FileDevice};
pub use error::{Error, Result};

/// Size of one block, in bytes.
pub const BLOCK_SIZE: u64 = 4096;
