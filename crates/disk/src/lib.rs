//! sandfork's disk path: a block-store disk served as a mounted ext4 filesystem on a
//! host without nbd, ublk or device-mapper.
//!
//! ```text
//!  ext4 (mountpoint) ─► /dev/loopN (direct I/O, 4 KiB) ─► RUNDIR/fuse/disk (FUSE)
//!        ─► disk server process (one per disk) ─► blockstore::Disk
//! ```
//! See `docs/disk-path.md`.

mod error;
pub mod fuse;

pub use error::{Error, Result};
