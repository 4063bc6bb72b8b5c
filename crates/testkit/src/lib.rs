//! The one test harness of the workspace. Each crate's integration tests keep a thin
//! fixture of their own (an agent, a disk store, a runtime, an in-process daemon, the
//! `sandfork` binary against a daemon child) built on these pieces:
//!
//! - [`needs_root`] marks a test (through its fixture) as one that needs root: it fails
//!   at once with that reason instead of an `EPERM` from deep inside a mount;
//! - [`data_dir`] gives each test a private temporary directory, so tests run in parallel
//!   and twice in a row;
//! - [`eventually`] polls a condition;
//! - [`unique_id`] names sandboxes that cannot clash across test processes;
//! - [`sandbox_traces`], [`traces_under`] and [`processes_mentioning`] find what a test
//!   left on the host, so that cleanup is asserted, not assumed.

use std::path::Path;
use std::time::{Duration, Instant};

/// Fails the calling test unless it runs as root, naming what needs it. Fixtures that
/// mount, attach loop devices, make namespaces or cgroups call it first: that is how a
/// test is marked as needing root.
pub fn needs_root(what: &str) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "this test needs root ({what}); run the tests as root, as `make test` does"
    );
}

/// A private temporary directory named `sandfork-<tag>-…`, removed when dropped.
pub fn data_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("sandfork-{tag}-"))
        .tempdir()
        .expect("create a temporary data directory")
}

/// Polls `f` every 100 ms until it returns true or `secs` seconds pass; returns its last
/// answer.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

/// A valid sandbox id, unique across the test processes running at once.
pub fn unique_id(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let salt = (std::process::id() as u128) << 32;
    format!("t-{tag}-{:x}", (nanos ^ salt) & 0xffff_ffff_ffff)
}

/// Host processes (but this one) whose command line mentions `needle`: disk servers,
/// runc, CRIU, a sandbox's own processes.
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let me = std::process::id() as i32;
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.flatten()
        .filter(|p| p.pid() != me)
        .filter_map(|p| {
            let cmd = p.cmdline().ok()?.join(" ");
            cmd.contains(needle).then_some(cmd)
        })
        .collect()
}

/// Mount points in this mount namespace whose path contains `needle`.
fn mounts_mentioning(needle: &str) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.contains(needle))
        .map(|m| format!("mount {m}"))
        .collect()
}

/// Loop devices whose backing file's path contains `needle`.
fn loop_devices_mentioning(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            backing.contains(needle).then(|| {
                format!(
                    "loop device {} on {}",
                    e.file_name().to_string_lossy(),
                    backing.trim()
                )
            })
        })
        .collect()
}

/// What is left below `root` (a test's data directory): mounts, loop devices backed by
/// its files, processes that name it.
pub fn traces_under(root: &Path) -> Vec<String> {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let needle = root.to_string_lossy();
    let mut found = mounts_mentioning(&needle);
    found.extend(loop_devices_mentioning(&needle));
    found.extend(
        processes_mentioning(&needle)
            .into_iter()
            .map(|p| format!("process {p}")),
    );
    found
}

/// Everything of sandbox `id` of the daemon whose data directory is `data`: its runc
/// container, network namespace, cgroups, mounts, directory, loop devices, processes.
pub fn sandbox_traces(data: &Path, id: &str) -> Vec<String> {
    let mut found = Vec::new();
    let runc = std::process::Command::new("runc")
        .arg("--root")
        .arg(data.join("runc"))
        .args(["list", "-q"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if runc.lines().any(|l| l.trim() == id) {
        found.push(format!("runc container {id}"));
    }
    if Path::new("/run/sandfork/netns")
        .join(format!("sf-{id}"))
        .exists()
    {
        found.push(format!("netns sf-{id}"));
    }
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let cg = h.path().join("sandfork").join(id);
        if cg.exists() {
            found.push(format!("cgroup {}", cg.display()));
        }
    }
    found.extend(mounts_mentioning(id));
    if data.join("sandboxes").join(id).exists() {
        found.push(format!("directory sandboxes/{id}"));
    }
    found.extend(loop_devices_mentioning(id));
    found.extend(
        processes_mentioning(id)
            .into_iter()
            .map(|p| format!("process {p}")),
    );
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_differ_and_are_valid() {
        let a = unique_id("x");
        std::thread::sleep(Duration::from_millis(1));
        let b = unique_id("x");
        assert_ne!(a, b);
        assert!(a.starts_with("t-x-") && a.len() <= 64, "{a}");
    }

    #[test]
    fn a_process_is_found_by_its_command_line() {
        let mut child = std::process::Command::new("sleep")
            .arg("30.123456")
            .spawn()
            .unwrap();
        assert!(eventually(5, || !processes_mentioning("30.123456").is_empty()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(processes_mentioning("30.123456").is_empty());
    }

    #[test]
    fn an_empty_directory_leaves_no_traces() {
        let dir = data_dir("testkit");
        assert!(traces_under(dir.path()).is_empty());
    }
}
