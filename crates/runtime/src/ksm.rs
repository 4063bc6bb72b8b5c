//! Page merging across sandboxes: the kernel's samepage merging (KSM).
//!
//! Forks of one memory snapshot start with the same pages: CRIU restores each copy into
//! anonymous memory of its own, so without help eight forks of a 200 MB process take
//! 8 × 200 MB. With merging on, every sandbox's processes are marked mergeable
//! (`PR_SET_MEMORY_MERGE` on the runc that starts or restores it; the mark is inherited
//! by every process of the sandbox, across fork and exec). The kernel's `ksmd` then finds
//! pages with equal content and maps them once, copy-on-write: a fork that writes a page
//! gets its own copy again, so isolation between forks is the kernel's page protection,
//! as for any forked process.
//!
//! The cost is CPU: `ksmd` scans marked memory at the rate set in `/sys/kernel/mm/ksm`
//! ([`ScanRate`]); [`Stats`] reports what it merged and the CPU it used, and
//! docs/checkpoints.md has the measurements.

use std::path::Path;
use std::process::Command;

use crate::error::{Error, IoContext, Result};

const KSM: &str = "/sys/kernel/mm/ksm";

/// How fast `ksmd` scans when sandfork starts it: pages per wake-up and the sleep
/// between wake-ups. The kernel's defaults (100 pages every 20 ms, 20 MB/s) take minutes
/// to go once over the memory of a fan-out of forks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanRate {
    pub pages_to_scan: u32,
    pub sleep_millisecs: u32,
}

impl Default for ScanRate {
    /// 1,000 pages every 20 ms: 200 MB/s of scanning.
    fn default() -> Self {
        ScanRate {
            pages_to_scan: 1000,
            sleep_millisecs: 20,
        }
    }
}

/// What merging has done, host-wide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Whether `ksmd` runs.
    pub running: bool,
    /// Bytes that are mapped from a page shared with another mapping: memory saved.
    pub saved_bytes: u64,
    /// Bytes of the shared pages themselves.
    pub shared_bytes: u64,
    /// Complete passes over the marked memory.
    pub full_scans: u64,
    /// CPU time `ksmd` has used since boot, in milliseconds.
    pub cpu_ms: u64,
}

fn read_u64(name: &str) -> Option<u64> {
    std::fs::read_to_string(Path::new(KSM).join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn write(name: &str, value: &str) -> Result<()> {
    let path = Path::new(KSM).join(name);
    std::fs::write(&path, value).at(&path)
}

/// Whether this kernel has KSM.
pub fn available() -> bool {
    Path::new(KSM).join("run").exists()
}

/// Starts `ksmd` at `rate` if it is stopped; a running `ksmd` keeps the host's settings.
/// Returns whether it was started here.
pub fn ensure_running(rate: ScanRate) -> Result<bool> {
    if !available() {
        return Err(Error::Unsupported(
            "memory merging needs a kernel with KSM (CONFIG_KSM); set memory_merge = false".into(),
        ));
    }
    if read_u64("run") == Some(1) {
        return Ok(false);
    }
    write("pages_to_scan", &rate.pages_to_scan.to_string())?;
    write("sleep_millisecs", &rate.sleep_millisecs.to_string())?;
    write("run", "1")?;
    Ok(true)
}

/// What merging has done so far, host-wide; `None` without KSM.
pub fn stats() -> Option<Stats> {
    if !available() {
        return None;
    }
    let page = page_size();
    Some(Stats {
        running: read_u64("run") == Some(1),
        saved_bytes: read_u64("pages_sharing").unwrap_or(0) * page,
        shared_bytes: read_u64("pages_shared").unwrap_or(0) * page,
        full_scans: read_u64("full_scans").unwrap_or(0),
        cpu_ms: ksmd_cpu_ms().unwrap_or(0),
    })
}

fn page_size() -> u64 {
    procfs::page_size()
}

/// CPU time of the `ksmd` kernel thread, in milliseconds.
fn ksmd_cpu_ms() -> Option<u64> {
    let ticks = procfs::ticks_per_second();
    procfs::process::all_processes()
        .ok()?
        .flatten()
        .filter_map(|p| p.stat().ok())
        .find(|s| s.comm == "ksmd")
        .map(|s| (s.utime + s.stime) * 1000 / ticks)
}

/// Marks the process `cmd` starts, and so every process of the sandbox it starts, as
/// mergeable.
pub(crate) fn mark_mergeable(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let merge = || {
        // SAFETY: PR_SET_MEMORY_MERGE takes an integer flag and no pointers.
        let r = unsafe { libc::prctl(libc::PR_SET_MEMORY_MERGE, 1, 0, 0, 0) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: the closure runs in the child between fork and exec; it makes one prctl
    // system call, which is async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(merge);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ksm_stat(marked: bool) -> String {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "exec cat /proc/self/ksm_stat"]);
        if marked {
            mark_mergeable(&mut cmd);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A marked command's process is mergeable, and so is what it executes (the shell
    /// execs `cat`); an unmarked one is not.
    #[test]
    fn the_mark_survives_exec() {
        assert!(available(), "this kernel has no KSM");
        assert!(ksm_stat(true).contains("ksm_merge_any: yes"));
        assert!(ksm_stat(false).contains("ksm_merge_any: no"));
    }
}
