//! CRIU's cache of kernel facts (`/run/criu.kdat`). CRIU probes the kernel at the start
//! of every dump and restore (≈ 25 ms here: it forks and traces a child to learn the
//! vDSO) unless it finds the cache, and it only writes the cache itself when `/run` is a
//! tmpfs — a file there must not outlive a reboot into another kernel. On hosts whose
//! `/run` is an ordinary directory the cache is made here instead: CRIU probes once inside
//! a private mount namespace with a tmpfs over `/run`, and the file it leaves is copied
//! out. A cache older than the last boot is made again.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const CACHE: &str = "/run/criu.kdat";
/// Smaller than any cache CRIU writes (912 bytes for CRIU 4.2).
const MIN_SIZE: usize = 256;

/// Makes sure CRIU finds a current cache. Best effort: without one, CRIU only runs slower.
pub fn ensure_cache() {
    let run = Path::new("/run");
    if !run.is_dir() || on_tmpfs(run) || cache_is_current() {
        return;
    }
    match probe() {
        Ok(bytes) => {
            if let Err(e) = install(&bytes) {
                tracing::debug!(error = %e, "could not install the CRIU kernel-facts cache");
            }
        }
        Err(e) => tracing::debug!(error = %e, "could not make the CRIU kernel-facts cache"),
    }
}

fn on_tmpfs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

fn cache_is_current() -> bool {
    let Some(boot) = boot_time() else {
        return false;
    };
    fs::metadata(CACHE)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t > boot)
}

/// When the host booted, from `btime` in `/proc/stat`.
fn boot_time() -> Option<SystemTime> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let secs: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

/// Runs `criu check` with a tmpfs over `/run` in a private mount namespace and returns
/// the cache it wrote there.
fn probe() -> std::io::Result<Vec<u8>> {
    let script = "mount -t tmpfs tmpfs /run && criu check >/dev/null 2>&1; cat /run/criu.kdat";
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()?;
    if out.stdout.len() < MIN_SIZE {
        return Err(std::io::Error::other(format!(
            "criu check left no cache ({} bytes, {})",
            out.stdout.len(),
            out.status
        )));
    }
    Ok(out.stdout)
}

/// Puts `bytes` in place atomically (a private temp name: never CRIU's own).
fn install(bytes: &[u8]) -> std::io::Result<()> {
    let tmp = format!("/run/.criu.kdat.{}", std::process::id());
    fs::write(&tmp, bytes)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))?;
    fs::rename(&tmp, CACHE).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_is_in_the_past() {
        let boot = boot_time().expect("btime in /proc/stat");
        assert!(boot < SystemTime::now());
        assert!(boot > UNIX_EPOCH + Duration::from_secs(1_000_000_000));
    }
}
