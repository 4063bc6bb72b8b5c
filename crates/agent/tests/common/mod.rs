//! Runs the real agent binary as a child process on a socket in a temporary directory.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_client::AgentClient;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use proto::agent::{ExecRequest, StdinMode};
use tempfile::TempDir;

pub const AGENT: &str = env!("CARGO_BIN_EXE_sandfork-agent");

/// An agent process; on drop it gets SIGTERM (it stops its children), then SIGKILL.
pub struct TestAgent {
    pub child: Child,
    pub dir: TempDir,
    pub client: AgentClient,
}

impl TestAgent {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra: &[&str]) -> Self {
        let dir = testkit::data_dir("agent");
        let sock_dir = dir.path().join("run");
        std::fs::create_dir(&sock_dir).expect("mkdir run");
        let child = Command::new(AGENT)
            .arg("--socket")
            .arg(sock_dir.join("agent.sock"))
            .arg("--identity-dir")
            .arg(dir.path().join("etc-sandfork"))
            .args(extra)
            .stdin(Stdio::null())
            .spawn()
            .expect("start agent");
        let client = AgentClient::new(&sock_dir);
        let me = Self { child, dir, client };
        me.client
            .wait_ready(Duration::from_secs(10))
            .await
            .expect("agent ready");
        me
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn sock_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// Sends SIGTERM and waits for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
        for _ in 0..500 {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        self.child.wait().expect("wait agent")
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

pub fn sh(script: &str) -> ExecRequest {
    ExecRequest {
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        ..Default::default()
    }
}

pub fn sh_stdin(script: &str, stdin: StdinMode) -> ExecRequest {
    ExecRequest {
        stdin,
        ..sh(script)
    }
}

/// Peak resident memory of a process, in KiB.
pub fn vm_hwm_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
