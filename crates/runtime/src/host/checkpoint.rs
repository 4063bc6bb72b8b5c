//! Host side effects of checkpoints: pausing containers, freezing and sealing their disks,
//! and runc's CRIU-driven checkpoint and restore.

use std::path::Path;

use super::FakeHost;
use crate::error::{Error, Result};
use crate::layout::SandboxPaths;

/// Where a CRIU run keeps its images and its work files (logs). Both absolute.
#[derive(Debug, Clone, Copy)]
pub struct CriuPaths<'a> {
    pub images: &'a Path,
    pub work: &'a Path,
}

/// Checkpoint side effects, joined to [`super::Host`].
pub trait CheckpointHost {
    /// `runc pause id` (cgroup freezer; no CRIU freezer cost at dump time).
    fn runc_pause(&self, root: &Path, id: &str) -> Result<()>;
    /// `runc resume id`.
    fn runc_resume(&self, root: &Path, id: &str) -> Result<()>;
    /// `runc checkpoint --leave-running` into `criu.images`.
    fn runc_checkpoint(&self, root: &Path, id: &str, criu: CriuPaths<'_>) -> Result<()>;
    /// `runc restore --detach` of `criu.images` into the bundle at `paths`, with stdio
    /// pipes like `runc_run`.
    fn runc_restore(
        &self,
        root: &Path,
        id: &str,
        paths: &SandboxPaths,
        criu: CriuPaths<'_>,
    ) -> Result<()>;
    /// Freezes the mounted filesystem of `disk` (flushing its page cache to the disk).
    fn disk_freeze(&self, disk: &str) -> Result<()>;
    /// Thaws it; thawing a filesystem that is not frozen is fine.
    fn disk_thaw(&self, disk: &str) -> Result<()>;
    /// Seals a frozen disk: its overlay becomes a sealed layer, whose id is returned.
    fn disk_seal_frozen(&self, disk: &str) -> Result<String>;
    /// Bytes a layer occupies on the host.
    fn layer_bytes(&self, layer: &str) -> Result<u64>;
    /// The processes of cgroup `cgroup` CRIU cannot dump as they are (stopped by a signal
    /// or a debugger: seizing them waits for them to run, which they never do while the
    /// sandbox is frozen), each described for an error message.
    fn undumpable_processes(&self, _cgroup: &str) -> Vec<String> {
        Vec::new()
    }
}

fn refused(op: &str) -> Error {
    Error::Command {
        command: op.into(),
        detail: "not available on the fake host".into(),
    }
}

impl CheckpointHost for FakeHost {
    fn runc_pause(&self, _root: &Path, _id: &str) -> Result<()> {
        Err(refused("runc pause"))
    }
    fn runc_resume(&self, _root: &Path, _id: &str) -> Result<()> {
        Err(refused("runc resume"))
    }
    fn runc_checkpoint(&self, _root: &Path, _id: &str, _criu: CriuPaths<'_>) -> Result<()> {
        Err(refused("runc checkpoint"))
    }
    fn runc_restore(
        &self,
        _root: &Path,
        _id: &str,
        _paths: &SandboxPaths,
        _criu: CriuPaths<'_>,
    ) -> Result<()> {
        Err(refused("runc restore"))
    }
    fn disk_freeze(&self, _disk: &str) -> Result<()> {
        Err(refused("freeze"))
    }
    fn disk_thaw(&self, _disk: &str) -> Result<()> {
        Ok(())
    }
    fn disk_seal_frozen(&self, _disk: &str) -> Result<String> {
        Err(refused("seal"))
    }
    fn layer_bytes(&self, _layer: &str) -> Result<u64> {
        Err(refused("layer info"))
    }
}
