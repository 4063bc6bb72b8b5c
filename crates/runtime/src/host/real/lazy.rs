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
    /// Starts the daemon on `images`, with its socket and log (`lazy-pages.log`) in `work`,
    /// and waits until it listens.
    pub fn start(images: &Path, work: &Path) -> Result<LazyPages> {
        let mut c = Command::new("criu");
        c.args(["lazy-pages", "--images-dir"])
            .arg(images)
            .arg("--work-dir")
            .arg(work)
            .args(["--log-file", "lazy-pages.log", "-v2"])
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
