//! A real daemon (`sandfork serve` as a child process on a private data directory) and
//! the `sandfork` binary pointed at it, shared by the CLI test binaries.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_sandfork");

/// A daemon child process; dropped → sandboxes removed, daemon stopped.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Daemon {
    pub fn start() -> Daemon {
        testkit::needs_root("a daemon runs real sandboxes");
        let dir = testkit::data_dir("cli");
        let mut d = Daemon { dir, child: None };
        d.spawn();
        d
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("d.sock")
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .unwrap();
        let child = Command::new(BIN)
            .arg("serve")
            .arg("--data-dir")
            .arg(self.data())
            .arg("--socket")
            .arg(self.socket())
            .args(["--default-image", "busybox"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let up = eventually(60, || self.cli(&["ls"]).status.success());
        assert!(up, "daemon did not come up: {}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// Sends SIGTERM and waits up to 20 s; `None` if the daemon ignored it (then killed).
    pub fn try_sigterm(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if let Ok(Some(s)) = c.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    pub fn sigterm(&mut self) -> ExitStatus {
        self.try_sigterm().expect("daemon ignored SIGTERM")
    }

    pub fn cli_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env(
                "SANDFORK_URL",
                format!("unix://{}", self.socket().display()),
            )
            .env_remove("SANDFORK_TOKEN")
            .stdin(Stdio::null());
        c
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_cmd(args).output().unwrap()
    }

    /// Runs a verb that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// [`Daemon::ok`], trimmed: for verbs that print one value.
    pub fn line(&self, args: &[&str]) -> String {
        self.ok(args).trim().to_string()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }

    /// Runs a shell script in sandbox `id`; returns its trimmed stdout.
    pub fn sh(&self, id: &str, script: &str) -> String {
        self.line(&["exec", id, "--", "sh", "-c", script])
    }

    pub fn live_ids(&self) -> Vec<String> {
        self.json(&["ls"])["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_none() {
            self.spawn();
        }
        for id in self.live_ids() {
            let _ = self.cli(&["rm", &id]);
        }
        let _ = self.try_sigterm();
    }
}

pub use testkit::eventually;
