//! Build directories: the scratch space of one image build, removed whatever happens,
//! and the clean-up of those a crashed build left (killing what still works in them).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, IoContext, Result};

/// A temporary build directory under `parent`, removed (after unmounting anything left
/// below it) when dropped.
pub struct BuildDir {
    path: PathBuf,
    serial: u64,
}

impl BuildDir {
    /// A fresh directory `.build-<name>-<pid>-<n>`: concurrent builds never share one.
    pub fn new(parent: &Path, name: &str) -> Result<BuildDir> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        std::fs::create_dir_all(parent).at(parent)?;
        loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = parent.join(format!(".build-{name}-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(BuildDir { path, serial: n }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(path, e)),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A number no other build directory of this process has.
    pub fn serial(&self) -> u64 {
        self.serial
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        // Never recurse into something still mounted below (a build chroot's /dev).
        if !mounts_below(&self.path).is_empty() {
            for m in mounts_below(&self.path).iter().rev() {
                let _ = Command::new("umount").arg("-l").arg(m).status();
            }
            if !mounts_below(&self.path).is_empty() {
                return;
            }
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes build directories under `dir` whose building process is gone (a daemon killed
/// mid-build cannot drop its [`BuildDir`]); builds of live processes are kept. Returns
/// the directories removed.
pub fn remove_stale_builds(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if build_owner(&name).is_some_and(|pid| !process_exists(pid)) {
            let path = e.path();
            tracing::info!(path = %path.display(), "removing an interrupted image build");
            // Its commands (a chroot, mkfs, debootstrap) outlive the killed daemon and
            // would go on writing into the directory while it is removed.
            kill_processes_in(&path);
            drop(BuildDir {
                path: path.clone(),
                serial: 0,
            });
            removed.push(path);
        }
    }
    removed
}

/// Kills every process working in `dir` (its root, working directory or command line
/// there) and waits, briefly, for them to be gone.
fn kill_processes_in(dir: &Path) {
    for _ in 0..100 {
        let found = processes_in(dir);
        if found.is_empty() {
            return;
        }
        for pid in found {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Processes rooted in, working in, or naming `dir` on their command line.
fn processes_in(dir: &Path) -> Vec<i32> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    let text = dir.to_string_lossy().into_owned();
    all.flatten()
        .filter(|p| p.pid != std::process::id() as i32)
        .filter(|p| {
            let inside = |link: procfs::ProcResult<std::path::PathBuf>| {
                link.is_ok_and(|l| l.starts_with(dir))
            };
            inside(p.root())
                || inside(p.cwd())
                || p.cmdline()
                    .is_ok_and(|args| args.iter().any(|a| a.contains(&text)))
        })
        .map(|p| p.pid)
        .collect()
}

pub(super) fn process_exists(pid: u32) -> bool {
    procfs::process::Process::new(pid as i32).is_ok()
}

/// The process id in a build directory's name (`.build-<name>-<pid>-<n>`).
fn build_owner(dir_name: &str) -> Option<u32> {
    let rest = dir_name.strip_prefix(".build-")?;
    let mut parts = rest.rsplitn(3, '-');
    parts.next()?.parse::<u64>().ok()?;
    let pid = parts.next()?.parse().ok()?;
    parts.next().filter(|n| !n.is_empty()).map(|_| pid)
}

/// Mount points at or below `dir`, from /proc/self/mountinfo.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_dir_names_give_their_owner() {
        assert_eq!(build_owner(".build-py-12-0"), Some(12));
        assert_eq!(build_owner(".build-my-img-img-345-7"), Some(345));
        assert_eq!(build_owner(".build-12-0"), None);
        assert_eq!(build_owner("py.json"), None);
        assert_eq!(build_owner(".build-py-x-0"), None);
    }

    #[test]
    fn only_builds_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let live = BuildDir::new(dir.path(), "live").unwrap();
        // Above the kernel's pid limit (2^22), so no process can own it.
        let dead = dir.path().join(".build-dead-img-99999999-0");
        std::fs::create_dir_all(dead.join("rootfs/bin")).unwrap();
        std::fs::write(dir.path().join("dead.json"), "{}").unwrap();
        assert_eq!(remove_stale_builds(dir.path()), vec![dead.clone()]);
        assert!(!dead.exists());
        assert!(live.path().exists());
        assert!(dir.path().join("dead.json").exists());
    }

    #[test]
    fn commands_still_working_in_a_stale_build_are_killed_first() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dir.path().join(".build-dead-99999999-0");
        std::fs::create_dir_all(dead.join("rootfs")).unwrap();
        // Like an orphaned build command: keeps writing into the directory.
        let script = "while :; do touch f$RANDOM; sleep 0.01; done";
        let mut child = Command::new("sh")
            .args(["-c", script])
            .current_dir(dead.join("rootfs"))
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(remove_stale_builds(dir.path()), vec![dead.clone()]);
        let status = child.wait().unwrap();
        assert!(!status.success(), "killed");
        assert!(!dead.exists());
    }
}
