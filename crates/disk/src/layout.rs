//! Where a disk server keeps its things inside its run directory.

use std::path::{Path, PathBuf};

/// The FUSE mountpoint.
pub fn fuse_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("fuse")
}

/// The exported disk file.
pub fn fuse_file(run_dir: &Path) -> PathBuf {
    fuse_dir(run_dir).join(crate::fuse::FILE_NAME)
}

/// The control socket (host-only).
pub fn control_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("control.sock")
}

/// The server's pid, written once it serves.
pub fn pid_file(run_dir: &Path) -> PathBuf {
    run_dir.join("server.pid")
}

/// The server's stdout and stderr.
pub fn log_file(run_dir: &Path) -> PathBuf {
    run_dir.join("server.log")
}
