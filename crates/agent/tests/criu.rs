//! The agent survives a CRIU checkpoint/restore: the listening socket comes back, a new
//! client reconnects, background processes keep running with their buffered output, and
//! exec (and so reaping) still works. Needs root and CRIU >= 4.2; skipped without CRIU.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agent_client::AgentClient;
use common::{sh, AGENT};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use proto::agent::{ExitStatus, ProcessState};

fn criu() -> Option<PathBuf> {
    ["/usr/local/sbin/criu", "/usr/sbin/criu"]
        .iter()
        .map(PathBuf::from)
        .find(|p| {
            let out = Command::new(p).arg("--version").output();
            out.is_ok_and(|o| {
                let v = String::from_utf8_lossy(&o.stdout).to_string();
                let version = v
                    .lines()
                    .find_map(|l| l.strip_prefix("Version: "))
                    .unwrap_or("0");
                let mut parts = version.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
                (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (4, 2)
            })
        })
}

/// Kills the (restored) agent and the processes it started, whoever their parent is.
struct Cleanup(Vec<i32>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = kill(Pid::from_raw(-*pid), Signal::SIGKILL);
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
    }
}

fn run_criu(criu: &Path, args: &[&str], images: &Path) {
    let status = Command::new(criu)
        .args(args)
        .arg("-D")
        .arg(images)
        .args(["-o", "criu.log"])
        .status()
        .unwrap();
    let log = std::fs::read_to_string(images.join("criu.log")).unwrap_or_default();
    assert!(status.success(), "criu {args:?} failed:\n{log}");
}

/// Waits until no process (zombies included) is left in process group `pgid`.
async fn wait_gone(pgid: i32) {
    let in_group = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            rest.split_whitespace().nth(2) == Some(pgid.to_string().as_str())
        })
    };
    for _ in 0..500 {
        if !in_group() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("process group {pgid} did not go away after the dump");
}

#[tokio::test]
async fn agent_survives_checkpoint_and_restore() {
    let Some(criu) = criu() else {
        eprintln!("no CRIU >= 4.2 installed (scripts/setup); skipping");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (sock_dir, images) = (dir.path().join("run"), dir.path().join("images"));
    std::fs::create_dir(&sock_dir).unwrap();
    std::fs::create_dir(&images).unwrap();
    let mut child = Command::new("setsid")
        .arg(AGENT)
        .arg("--socket")
        .arg(sock_dir.join("agent.sock"))
        .arg("--identity-dir")
        .arg(dir.path().join("identity"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let agent_pid = child.id() as i32;
    let mut cleanup = Cleanup(vec![agent_pid]);
    let client = AgentClient::new(&sock_dir);
    client.wait_ready(Duration::from_secs(10)).await.unwrap();
    let (id, pid) = client
        .spawn(sh(
            "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.05; done",
        ))
        .await
        .unwrap();
    cleanup.0.push(pid as i32);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Dump (which stops the tree), reap the original, restore detached.
    run_criu(&criu, &["dump", "-t", &agent_pid.to_string()], &images);
    child.wait().unwrap();
    // The dumped tree's zombies must be reaped (by the host's init) before their pids
    // can be restored.
    wait_gone(pid as i32).await;
    run_criu(&criu, &["restore", "-d"], &images);

    let fresh = AgentClient::new(&sock_dir);
    let hello = fresh.wait_ready(Duration::from_secs(10)).await.unwrap();
    assert_eq!(hello.pid, agent_pid as u32);
    let before = fresh.list_processes().await.unwrap()[0].stdout_len;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let procs = fresh.list_processes().await.unwrap();
    assert_eq!((procs[0].id, procs[0].state), (id, ProcessState::Running));
    assert!(
        procs[0].stdout_len > before,
        "the background process runs on after restore"
    );
    let out = fresh
        .exec_collect(sh("echo after restore"), 1024)
        .await
        .unwrap();
    assert_eq!(out.stdout, b"after restore\n");
    fresh.signal(id, 15, true).await.unwrap();
    let exit = fresh.wait(id, Some(Duration::from_secs(5))).await.unwrap();
    assert_eq!(
        exit.status,
        ExitStatus::Signal {
            signal: 15,
            core_dumped: false
        }
    );
    kill(Pid::from_raw(agent_pid), Signal::SIGTERM).unwrap();
    for _ in 0..300 {
        if kill(Pid::from_raw(agent_pid), None).is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the restored agent did not exit on SIGTERM");
}
