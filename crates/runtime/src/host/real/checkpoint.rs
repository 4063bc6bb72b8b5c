//! [`CheckpointHost`] on the real host: runc + CRIU, and the block-store disks.

use std::path::Path;
use std::process::Command;

use super::cmd::{self, run};
use super::{runc, RealHost};
use crate::error::{Error, Result};
use crate::host::checkpoint::{CheckpointHost, CriuPaths};
use crate::host::Host;
use crate::layout::SandboxPaths;

/// Lines of a CRIU log worth quoting in an error: its errors, else its last lines.
fn criu_log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    // Every CRIU log has a harmless RLIMIT_NOFILE error line.
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error") && !l.contains("RLIMIT_NOFILE"))
        .collect();
    let picked: Vec<&str> = if errors.is_empty() {
        text.lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect()
    } else {
        errors.into_iter().rev().take(3).rev().collect()
    };
    picked
        .iter()
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Free bytes below which a failed dump is blamed on a full disk: CRIU (and the tar it
/// runs for tmpfs contents) often logs only that a write or a helper failed.
const NEARLY_FULL: u64 = 2 << 20;

/// Whether a failed CRIU run into `images` ran out of disk space.
fn out_of_space(images: &Path, log: &str) -> bool {
    let said = ["No space left on device", "Wrote only", "ENOSPC"]
        .iter()
        .any(|s| log.contains(s));
    let free = crate::space::free_bytes(images).unwrap_or(u64::MAX);
    said || free < NEARLY_FULL
}

/// Adds what CRIU refused (from its log in the work dir) to a failed runc call, and
/// says so plainly when the image directory's disk ran full.
fn with_criu_log(e: Error, log: &Path, images: &Path) -> Error {
    match e {
        Error::Command { command, detail } => {
            let tail = criu_log_tail(log);
            let mut detail = if tail.is_empty() {
                detail
            } else {
                format!("{detail}; CRIU: {tail}")
            };
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if out_of_space(images, &text) {
                detail.push_str("; No space left on device for the memory images");
            }
            Error::Command { command, detail }
        }
        other => other,
    }
}

fn disk_err(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Disk(Box::new(e))
}

impl RealHost {
    /// CRIU restores the UTS namespace of the checkpointed container: a restored copy
    /// gets its own hostname (its id) as a fresh sandbox has, set from the host side.
    fn name_restored(&self, root: &Path, id: &str) -> Result<()> {
        let pid = self
            .runc_state(root, id)?
            .and_then(|s| s.pid)
            .ok_or_else(|| Error::Command {
                command: "runc restore".into(),
                detail: "the restored container has no init process".into(),
            })?;
        let mut c = Command::new("nsenter");
        c.arg(format!("--target={pid}"))
            .args(["--uts", "--", "hostname", id]);
        run(&mut c).map(drop)
    }
}

impl CheckpointHost for RealHost {
    fn runc_pause(&self, root: &Path, id: &str) -> Result<()> {
        run(runc(root).args(["pause", id])).map(drop)
    }

    fn runc_resume(&self, root: &Path, id: &str) -> Result<()> {
        run(runc(root).args(["resume", id])).map(drop)
    }

    fn runc_checkpoint(&self, root: &Path, id: &str, criu: CriuPaths<'_>) -> Result<()> {
        let mut c = runc(root);
        c.args(["checkpoint", "--leave-running", "--image-path"])
            .arg(criu.images)
            .arg("--work-path")
            .arg(criu.work)
            .arg(id);
        run(&mut c)
            .map(drop)
            .map_err(|e| with_criu_log(e, &criu.work.join("dump.log"), criu.images))
    }

    fn runc_restore(
        &self,
        root: &Path,
        id: &str,
        paths: &SandboxPaths,
        criu: CriuPaths<'_>,
    ) -> Result<()> {
        let log = paths.logs().join("runc.log");
        let mut c = runc(root);
        c.arg("--log")
            .arg(&log)
            .args(["restore", "--detach", "--image-path"]);
        c.arg(criu.images).arg("--work-path").arg(criu.work);
        c.arg("--bundle").arg(paths.bundle()).arg(id);
        cmd::run_detached(c, &log, &paths.logs().join("init.log"))
            .map_err(|e| with_criu_log(e, &criu.work.join("restore.log"), criu.work))?;
        self.name_restored(root, id)
    }

    fn disk_freeze(&self, disk: &str) -> Result<()> {
        self.disks()
            .with_mounted(disk, |m| m.freeze().map_err(disk_err))
    }

    fn disk_thaw(&self, disk: &str) -> Result<()> {
        self.disks()
            .with_mounted(disk, |m| m.thaw().map_err(disk_err))
    }

    fn disk_seal_frozen(&self, disk: &str) -> Result<String> {
        self.disks().with_mounted(disk, |m| {
            m.seal_frozen().map(|l| l.to_string()).map_err(disk_err)
        })
    }

    fn layer_bytes(&self, layer: &str) -> Result<u64> {
        let id: blockstore::LayerId = layer
            .parse()
            .map_err(|_| Error::InvalidSpec(format!("bad layer id {layer:?}")))?;
        let info = self.disks().store().layer_info(&id).map_err(disk_err)?;
        Ok(info.bytes_on_disk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_is_blamed_on_a_full_disk_when_its_log_or_the_disk_says_so() {
        let dir = tempfile::tempdir().unwrap();
        assert!(out_of_space(
            dir.path(),
            "tar: -: Wrote only 4096 of 10240 bytes"
        ));
        assert!(out_of_space(dir.path(), "write: No space left on device"));
        assert!(!out_of_space(
            dir.path(),
            "Error (criu/cr-dump.c:1975): Dumping FAILED."
        ));
    }

    #[test]
    fn the_error_gains_the_plain_reason() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("dump.log");
        std::fs::write(
            &log,
            "(00.1) Error (criu/util.c:657): exited, status=2\nWrote only 1 of 2 bytes\n",
        )
        .unwrap();
        let e = Error::Command {
            command: "runc checkpoint".into(),
            detail: "exit status: 1".into(),
        };
        let msg = with_criu_log(e, &log, dir.path()).to_string();
        assert!(msg.contains("exited, status=2"), "{msg}");
        assert!(msg.contains("No space left on device"), "{msg}");
    }
}
