//! Cleaning up after a crash: every mount, loop device, FUSE connection and disk server
//! below a directory goes, whatever state it was left in.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::loopdev;
use crate::mounts::{self, canonical};
use crate::{ext4, layout, mounted, Result};

/// What [`cleanup_stale`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub unmounted: Vec<PathBuf>,
    pub loops_detached: Vec<PathBuf>,
    pub servers_stopped: Vec<i32>,
    pub fuse_aborted: Vec<PathBuf>,
}

impl CleanupReport {
    pub fn is_empty(&self) -> bool {
        *self == CleanupReport::default()
    }
}

/// Unmounts every filesystem mounted below `under` (lazily when busy), detaches loop
/// devices whose backing file is below it, stops disk servers whose run directory is
/// below it, and aborts and detaches their FUSE connections.
pub fn cleanup_stale(under: &Path) -> Result<CleanupReport> {
    let under = canonical(under);
    let mut report = CleanupReport::default();
    unmount_filesystems(&under, &mut report);
    for (dev, backing) in loopdev::attached() {
        if backing.starts_with(&under) && dev.detach().is_ok() {
            report.loops_detached.push(dev.path().to_path_buf());
        }
    }
    for (pid, dir) in mounts::disk_servers() {
        if canonical(&dir).starts_with(&under) {
            mounted::stop_server(&dir, pid);
            report.servers_stopped.push(pid);
        }
    }
    for m in mounts::mounts().into_iter().rev() {
        if m.mountpoint.starts_with(&under) && m.fstype.starts_with("fuse") {
            mounts::abort_and_detach_fuse(&m.mountpoint);
            report.fuse_aborted.push(m.mountpoint);
        }
    }
    Ok(report)
}

/// Unmounts the non-FUSE filesystems below `under`, deepest first.
fn unmount_filesystems(under: &Path, report: &mut CleanupReport) {
    let mut found: Vec<PathBuf> = mounts::mounts()
        .into_iter()
        .filter(|m| m.mountpoint.starts_with(under) && !m.fstype.starts_with("fuse"))
        .map(|m| m.mountpoint)
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    for m in found {
        let _ = ext4::thaw(&m);
        if ext4::unmount(&m).is_ok() {
            report.unmounted.push(m);
        }
    }
}

/// Whether a disk server for `run_dir` still answers.
pub fn server_answers(run_dir: &Path) -> bool {
    crate::control::call(
        &layout::control_socket(run_dir),
        &crate::control::Request::Stats,
        Duration::from_secs(2),
    )
    .is_ok()
}
