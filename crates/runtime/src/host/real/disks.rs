//! Root disks of sandboxes.

use std::path::PathBuf;
use std::process::Command;

use super::cmd::{run, run_tolerant};
use crate::error::Result;
use crate::layout::SandboxPaths;

/// Where sandbox root filesystems come from.
pub enum Disks {
    /// Images are root filesystem directories under `images`; each sandbox gets a copy
    /// bind-mounted at its rootfs. Needs no block store; used for baselines.
    Directory { images: PathBuf },
}

impl Disks {
    pub fn create(&self, _disk: &str, _base: &str, _size_mb: u64) -> Result<()> {
        Ok(())
    }

    pub fn mount(&self, _disk: &str, paths: &SandboxPaths) -> Result<()> {
        let Disks::Directory { images } = self;
        let base = images.join(_base_of(paths)?);
        let copy = paths.disk().join("rootfs");
        run(Command::new("cp").arg("-a").arg(&base).arg(&copy))?;
        run(Command::new("mount")
            .args(["--bind"])
            .arg(&copy)
            .arg(paths.rootfs()))
        .map(drop)
    }

    pub fn adopt(&self, _disk: &str, _paths: &SandboxPaths) -> Result<()> {
        Ok(())
    }

    pub fn unmount(&self, _disk: &str, paths: &SandboxPaths) -> Result<()> {
        run_tolerant(
            Command::new("umount").arg(paths.rootfs()),
            &["not mounted", "no mount"],
        )
    }

    pub fn delete(&self, _disk: &str) -> Result<()> {
        Ok(())
    }
}

fn _base_of(paths: &SandboxPaths) -> Result<String> {
    Ok(crate::layout::Record::load(&paths.record())?
        .spec
        .image
        .layer)
}
