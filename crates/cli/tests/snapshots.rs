//! Checkpoint, fork, suspend/resume and snapshot verbs of the `sandfork` binary against a
//! real daemon child process, including kill -9 of the daemon and restarts.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_sandfork");

/// A daemon child process; dropped → sandboxes removed, daemon stopped.
struct Daemon {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Daemon {
    fn start() -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("sandfork-snap-")
            .tempdir()
            .unwrap();
        let mut d = Daemon { dir, child: None };
        d.spawn();
        d
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("d.sock")
    }

    fn spawn(&mut self) {
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
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let up = wait_for(60, || self.cli(&["ls"]).status.success());
        assert!(up, "daemon did not come up: {}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    fn cli_cmd(&self, args: &[&str]) -> Command {
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

    fn cli(&self, args: &[&str]) -> Output {
        self.cli_cmd(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }

    fn sh(&self, id: &str, script: &str) -> String {
        self.ok(&["exec", id, "--", "sh", "-c", script])
    }

    fn live_ids(&self) -> Vec<String> {
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
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let end = Instant::now() + Duration::from_secs(20);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// A shell that keeps `$v` only in memory and writes it to /tmp/answer on /tmp/ask.
const HOLDER: &str = "v=$(cat /tmp/secret); rm /tmp/secret; while :; do \
    if [ -e /tmp/ask ]; then rm /tmp/ask; echo $v > /tmp/answer; fi; sleep 0.05; done";

fn hold(d: &Daemon, id: &str, secret: &str) {
    d.sh(id, &format!("echo {secret} > /tmp/secret"));
    let script = format!("({HOLDER}) </dev/null >/dev/null 2>&1 &");
    d.sh(id, &script);
    assert!(wait_for(10, || d
        .sh(id, "test -e /tmp/secret || echo gone")
        == "gone"));
}

fn ask(d: &Daemon, id: &str) -> String {
    d.sh(id, "rm -f /tmp/answer; touch /tmp/ask");
    let mut answer = String::new();
    wait_for(10, || {
        answer = d.sh(id, "cat /tmp/answer 2>/dev/null || true");
        !answer.is_empty()
    });
    answer
}

#[test]
fn checkpoint_survives_kill9_and_restart_and_suspended_sandbox_resumes() {
    let mut d = Daemon::start();
    let src = d.ok(&["create", "--memory-mb", "64"]);
    hold(&d, &src, "kept-in-memory");
    let snap = d.ok(&["checkpoint", &src, "--memory"]);
    assert!(snap.starts_with("snap-"), "{snap}");
    let named = d.ok(&["create", "--name", "napper", "--memory-mb", "64"]);
    hold(&d, &named, "napping-value");
    d.sh(&named, "echo on-disk > /nap.txt");
    assert!(d.ok(&["suspend", "napper"]).ends_with("suspended"));
    d.kill9();
    d.spawn();
    let listed = d.json(&["snapshot", "ls"]);
    assert_eq!(listed["snapshots"][0]["id"], snap.as_str(), "{listed}");
    let forked = d.json(&["fork", &snap, "-n", "2"]);
    for child in forked["children"].as_array().unwrap() {
        let id = child["sandbox"]["id"].as_str().unwrap();
        assert_eq!(ask(&d, id), "kept-in-memory");
    }
    assert_eq!(d.json(&["inspect", "napper"])["state"], "suspended");
    assert!(d.ok(&["resume", "napper"]).ends_with("running"));
    assert_eq!(ask(&d, &named), "napping-value");
    assert_eq!(d.sh(&named, "cat /nap.txt"), "on-disk");
    d.ok(&["snapshot", "rm", &snap]);
    assert!(d.json(&["snapshot", "ls"])["snapshots"]
        .as_array()
        .unwrap()
        .is_empty());
    let out = d.cli(&["snapshot", "rm", &snap]);
    assert!(!out.status.success(), "a deleted snapshot is gone");
}

#[test]
fn kill9_mid_checkpoint_leaves_no_half_snapshot() {
    let mut d = Daemon::start();
    let src = d.ok(&["create", "--memory-mb", "512"]);
    // About 150 MB in a shell's memory makes the dump take a while.
    let script = "(x=$(head -c 150000000 /dev/zero | tr '\\0' a); while :; do sleep 1; done) \
        </dev/null >/dev/null 2>&1 & sleep 3; echo started";
    assert_eq!(d.sh(&src, script), "started");
    let mut cp = d
        .cli_cmd(&["checkpoint", &src, "--memory"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    d.kill9();
    let _ = cp.wait();
    d.spawn();
    assert!(
        d.json(&["snapshot", "ls"])["snapshots"]
            .as_array()
            .unwrap()
            .is_empty(),
        "no half snapshot is visible"
    );
    let resumed = d.log().contains("resumed after an interrupted checkpoint");
    eprintln!("kill -9 landed while the source was paused: {resumed}");
    // The interrupted checkpoint is dropped; the source was resumed and runs on.
    let sb = d.json(&["inspect", &src]);
    assert_eq!(sb["state"], "running", "{sb}\n{}", d.log());
    assert_eq!(d.sh(&src, "echo alive"), "alive");
    d.sh(&src, "echo still-writable > /after.txt");
    let leftovers = wait_for(20, || {
        std::fs::read_dir(d.data().join("snapshots"))
            .map(|e| e.count() == 0)
            .unwrap_or(true)
    });
    assert!(leftovers, "no snapshot files are left");
    // The daemon still checkpoints after the interruption.
    let fresh = d.ok(&["create", "--memory-mb", "64"]);
    let snap = d.ok(&["checkpoint", &fresh]);
    let path = d.dir.path().join("snap.sfs");
    d.ok(&["snapshot", "export", &snap, path.to_str().unwrap()]);
    d.ok(&["snapshot", "rm", &snap]);
    let imported = d.ok(&["snapshot", "import", path.to_str().unwrap()]);
    assert!(imported.starts_with("snap-"));
}
