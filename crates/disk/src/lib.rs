//! sandfork's disk path: a block-store disk served as a mounted ext4 filesystem on a
//! host without nbd, ublk or device-mapper.
//!
//! ```text
//!  ext4 at the mountpoint
//!    └─ /dev/loopN            direct I/O, 4 KiB logical blocks
//!        └─ RUNDIR/fuse/disk  one regular file over FUSE
//!            └─ disk server   one process per disk (`sandfork-disk serve`)
//!                └─ blockstore::Disk
//! ```
//! See `docs/disk-path.md`.

mod cleanup;
pub mod cli;
pub mod control;
mod error;
pub mod ext4;
pub mod fuse;
pub mod layout;
pub mod loopdev;
mod mounted;
pub mod mounts;
pub mod server;

pub use cleanup::{cleanup_stale, server_answers, CleanupReport};
pub use error::{Error, Result};
pub use ext4::build_ext4_image;
pub use mounted::{
    server_binary, stats_of, use_server_binary, DiskSpec, MountOptions, MountedDisk, SealTimes,
    ServedFile,
};
