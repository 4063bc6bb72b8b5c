//! Host side effects of checkpoints: pausing containers, freezing and sealing their disks,
//! and runc's CRIU-driven checkpoint and restore.

use std::path::{Path, PathBuf};

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
    /// `runc pause id` (cgroup freezer; no CRIU freezer cost at dump time), once a lazy
    /// restore of the sandbox has copied in every page: a dump follows it.
    fn runc_pause(&self, root: &Path, id: &str) -> Result<()>;
    /// `runc resume id`.
    fn runc_resume(&self, root: &Path, id: &str) -> Result<()>;
    /// `runc checkpoint --leave-running` into `criu.images`, of a sandbox paused by
    /// [`Self::runc_pause`].
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
    /// Gets the restore of container `id` from `criu.images` ready ahead of
    /// [`Self::runc_restore`] (a lazy restore's lazy-pages daemon started), so that this
    /// overlaps the sandbox's disk and network set-up; a failure here only leaves the
    /// work to `runc_restore`. `criu.work` must exist and stay as it is until then.
    fn prepare_restore(&self, _id: &str, _criu: CriuPaths<'_>) {}
    /// Drops what [`Self::prepare_restore`] made for `id`: its restore will not run.
    fn cancel_restore(&self, _id: &str) {}
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
    /// Whether a `runc --root <root> [verb] … <id>` process is alive (any verb when
    /// `None`): a runc command a killed daemon started runs on as an orphan.
    fn runc_busy(&self, root: &Path, id: &str, verb: Option<&str>) -> bool;
    /// Makes `work` a fresh, empty CRIU work directory.
    fn criu_work_dir(&self, work: &Path) -> Result<()>;
    /// Moves CRIU's log `log` out of `work` into the sandbox's logs; removes `work`.
    fn keep_criu_log(&self, paths: &SandboxPaths, work: &Path, log: &str);
    /// Creates the directory a memory dump goes to; returns its absolute path.
    fn images_dir(&self, dir: &Path) -> Result<PathBuf>;
    /// Removes the images of a checkpoint that failed.
    fn discard_images(&self, dir: &Path);
    /// Makes dumped images root's alone (they hold whatever the processes kept in memory,
    /// secrets from the environment included, and a copy of the data directory keeps
    /// modes); returns their total size.
    fn seal_images(&self, dir: &Path) -> Result<u64>;
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
    fn prepare_restore(&self, id: &str, _criu: CriuPaths<'_>) {
        let _ = self.call("prepare_restore", id);
    }
    fn cancel_restore(&self, id: &str) {
        let _ = self.call("cancel_restore", id);
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
    fn runc_busy(&self, _root: &Path, _id: &str, _verb: Option<&str>) -> bool {
        false
    }
    fn criu_work_dir(&self, work: &Path) -> Result<()> {
        self.call("criu_work_dir", &work.display().to_string())
    }
    fn keep_criu_log(&self, _paths: &SandboxPaths, _work: &Path, log: &str) {
        let _ = self.call("keep_criu_log", log);
    }
    fn images_dir(&self, dir: &Path) -> Result<PathBuf> {
        self.call("images_dir", &dir.display().to_string())?;
        Ok(dir.to_path_buf())
    }
    fn discard_images(&self, dir: &Path) {
        let _ = self.call("discard_images", &dir.display().to_string());
    }
    fn seal_images(&self, _dir: &Path) -> Result<u64> {
        Err(refused("seal images"))
    }
}
