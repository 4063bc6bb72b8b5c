//! Lazy restores: CRIU's lazy-pages daemon serves a restored sandbox's memory over
//! userfaultfd.
//!
//! An eager restore reads every page of the images into the new processes before they
//! run: ≈ 45 ms for 50 MB, ≈ 400 ms for 500 MB here. A lazy restore starts
//! `criu lazy-pages` on the images first; the restoring CRIU then maps the private
//! anonymous memory empty, registers it with userfaultfd and hands the descriptors to
//! that daemon. The sandbox runs at once; a page it touches is copied in when it faults,
//! and the daemon copies the rest in the background, then exits. File-backed and shared
//! memory is restored as before.
//!
//! The daemon is a process of its own session, so a signal to the sandfork daemon's
//! process group does not take it (its sandbox would then see empty pages where the
//! daemon had not copied yet). Measured in docs/checkpoints.md.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The socket `criu lazy-pages` listens on, in its work directory.
const SOCKET: &str = "lazy-pages.socket";
/// How long the daemon may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether this host's CRIU and kernel can restore lazily (`criu check --feature
/// uffd-noncoop`: userfaultfd with the events a restored process tree needs).
pub fn supported() -> bool {
    Command::new("criu")
        .args(["check", "--feature", "uffd-noncoop"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A running `criu lazy-pages` for one restore.
pub struct LazyPages {
    child: Option<Child>,
}

impl LazyPages {
    /// Starts the daemon for container `id` on `images`, with its socket and log in
    /// `work`, and waits until it listens.
    pub fn start(images: &Path, work: &Path, id: &str) -> Result<LazyPages> {
        let mut c = Command::new("criu");
        c.args(["lazy-pages", "--images-dir"])
            .arg(images)
            .arg("--work-dir")
            .arg(work)
            .arg("--log-file")
            .arg(log_name(id))
            .arg("-v2")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let child = c.spawn().map_err(|e| Error::Command {
            command: "criu lazy-pages".into(),
            detail: e.to_string(),
        })?;
        let mut lazy = LazyPages { child: Some(child) };
        lazy.wait_listening(&work.join(SOCKET))?;
        Ok(lazy)
    }

    fn wait_listening(&mut self, socket: &Path) -> Result<()> {
        let started = Instant::now();
        while !socket.exists() {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || started.elapsed() > START_TIMEOUT {
                return Err(Error::Command {
                    command: "criu lazy-pages".into(),
                    detail: format!("not listening on {} ({exited:?})", socket.display()),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// The restore succeeded: the daemon serves the sandbox until it has copied every
    /// page, and a thread reaps it then.
    pub fn serve(mut self) {
        if let Some(mut child) = self.child.take() {
            std::thread::spawn(move || child.wait());
        }
    }
}

/// The log file of the lazy-pages daemon of container `id`: it names the container on
/// the daemon's command line, so [`wait_done`] finds it in /proc, even one started before
/// a restart of the sandfork daemon.
fn log_name(id: &str) -> String {
    format!("lazy-pages-{id}.log")
}

/// Pids of the processes whose command line (its arguments) `matches`.
fn daemons_where(matches: impl Fn(&[&[u8]]) -> bool) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| {
            let pid = p.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(p.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            matches(&args).then_some(pid)
        })
        .collect()
}

/// Pids of the lazy-pages daemons of container `id` (one, or none).
fn daemons_of(id: &str) -> Vec<i32> {
    let log = log_name(id);
    daemons_where(|args| args.contains(&log.as_bytes()))
}

/// Whether a lazy-pages daemon still serves container `id`.
fn serving(id: &str) -> bool {
    !daemons_of(id).is_empty()
}

/// Whether a lazy-pages daemon of ours is `args`.
fn is_ours(args: &[&[u8]]) -> bool {
    args.iter()
        .any(|a| a.starts_with(b"lazy-pages-") && a.ends_with(b".log"))
}

/// Whether any lazy-pages daemon of ours still runs (it may still read memory images).
pub fn any_serving() -> bool {
    !daemons_where(is_ours).is_empty()
}

/// Whether a lazy-pages daemon of ours still reads the images in `images`.
pub fn reading(images: &Path) -> bool {
    let dir = images.as_os_str().as_encoded_bytes();
    !daemons_where(|args| {
        is_ours(args)
            && args
                .windows(2)
                .any(|w| w[0] == b"--images-dir" && w[1] == dir)
    })
    .is_empty()
}

/// Stops the lazy-pages daemon of container `id`, once its processes are gone. It exits
/// by itself when they exit; this takes one whose restore never reached it (runc failed
/// before CRIU connected while nobody was left to stop it, as after a `kill -9` of the
/// sandfork daemon), which would otherwise wait for a connection for ever.
pub fn stop(id: &str) {
    for pid in daemons_of(id) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Waits up to `timeout` until no lazy-pages daemon serves container `id`; false if one
/// still does. Until then a page it has not copied yet is absent from the sandbox's
/// processes, and a dump (a memory checkpoint, a suspend) would record it as empty.
pub fn wait_done(id: &str, timeout: Duration) -> bool {
    let started = Instant::now();
    while serving(id) {
        if started.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

impl Drop for LazyPages {
    /// The restore failed (or [`LazyPages::serve`] was not reached): nothing was handed
    /// the daemon's pages, so it is stopped.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process named like container `id`'s lazy-pages daemon, living `secs` (in short
    /// sleeps, so a kill leaves no long-lived child behind).
    fn stand_in(id: &str, secs: f64) -> Child {
        let rounds = (secs / 0.05) as u32;
        let script = format!("i=0; while [ $i -lt {rounds} ]; do sleep 0.05; i=$((i+1)); done");
        let child = Command::new("sh")
            .args(["-c", &script, &log_name(id)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Until it has exec'd, the child still carries the test's command line.
        while !serving(id) {
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    }

    #[test]
    fn a_dump_waits_for_the_daemon_of_its_own_sandbox_only() {
        let id = format!("lazy-test-{}", std::process::id());
        let mut other = stand_in(&format!("{id}-other"), 30.0);
        let mut mine = stand_in(&id, 1.0);
        let started = Instant::now();
        let reaper = std::thread::spawn(move || mine.wait());
        assert!(wait_done(&id, Duration::from_secs(20)));
        assert!(started.elapsed() >= Duration::from_millis(500), "it waited");
        reaper.join().unwrap().unwrap();
        other.kill().unwrap();
        other.wait().unwrap();
    }

    #[test]
    fn a_reader_of_an_image_directory_is_found_by_it() {
        let id = format!("lazy-test-reader-{}", std::process::id());
        let images = format!("/tmp/lazy-test-images-{}", std::process::id());
        let mut child = Command::new("sh")
            .args([
                "-c",
                "while :; do sleep 0.05; done",
                "sh",
                "--images-dir",
                &images,
                &log_name(&id),
            ])
            .spawn()
            .unwrap();
        while !serving(&id) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(reading(Path::new(&images)));
        assert!(!reading(Path::new(&format!("{images}-other"))));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!reading(Path::new(&images)));
    }

    #[test]
    fn a_daemon_that_outlives_the_wait_is_reported_and_stopped_with_its_container() {
        let id = format!("lazy-test-late-{}", std::process::id());
        let mut late = stand_in(&id, 30.0);
        assert!(!wait_done(&id, Duration::from_millis(100)));
        stop(&id);
        late.wait().unwrap();
        assert!(wait_done(&id, Duration::from_secs(5)));
    }
}
