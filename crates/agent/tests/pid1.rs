//! The agent as PID 1 of a fresh pid namespace (needs root and util-linux `unshare`).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent::AgentClient;
use common::{sh, AGENT};

/// `unshare --pid --fork` running the agent; kills the whole namespace on drop.
struct Namespace {
    unshare: Child,
    _dir: tempfile::TempDir,
    client: AgentClient,
}

impl Namespace {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let unshare = Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                AGENT,
                "--socket",
            ])
            .arg(dir.path().join("agent.sock"))
            .arg("--identity-dir")
            .arg(dir.path().join("identity"))
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare");
        let client = AgentClient::new(dir.path());
        let ns = Self {
            unshare,
            _dir: dir,
            client,
        };
        ns.client
            .wait_ready(Duration::from_secs(10))
            .await
            .expect("agent ready");
        ns
    }

    /// Host pid of the agent (the only child of `unshare`).
    fn agent_host_pid(&self) -> i32 {
        let pid = self.unshare.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
        children.split_whitespace().next().unwrap().parse().unwrap()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// Host pids of `parent`'s children that are zombies.
fn zombie_children(parent: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state, ppid, ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") && fields.get(1) == Some(&parent.to_string().as_str()) {
            out.push(pid);
        }
    }
    out
}

#[tokio::test]
async fn reaps_orphans_as_pid1() {
    let ns = Namespace::start().await;
    assert_eq!(ns.client.hello().await.unwrap().pid, 1);
    let agent_pid = ns.agent_host_pid();

    // Orphans: each subshell forks a sleep and exits, so the sleeps are reparented to PID 1.
    let out = ns
        .client
        .exec_collect(
            sh("for i in 1 2 3 4 5; do (sleep 0.2 &); done; sleep 0 & exec sleep 0.3"),
            1024,
        )
        .await
        .unwrap();
    assert_eq!(out.code(), Some(0));
    let (id, _) = ns
        .client
        .spawn(sh("for i in 1 2 3; do (true &); done"))
        .await
        .unwrap();
    ns.client
        .wait(id, Some(Duration::from_secs(5)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(zombie_children(agent_pid), Vec::<i32>::new());

    // Still serving, and it sees only its own namespace.
    let out = ns
        .client
        .exec_collect(sh("echo $$; ls /proc | grep -c '^[0-9]'"), 1024)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].parse::<i32>().unwrap() > 1, "{text}");
    assert!(
        lines[1].parse::<i32>().unwrap() <= 4,
        "only the agent, sh and ls: {text}"
    );
}

#[tokio::test]
async fn sigterm_to_pid1_stops_everything() {
    let mut ns = Namespace::start().await;
    let (_, _) = ns.client.spawn(sh("sleep 60")).await.unwrap();
    let (_, _) = ns.client.spawn(sh("setsid sleep 60 & wait")).await.unwrap();
    let agent_pid = ns.agent_host_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent_pid),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || {
        let s = ns.unshare.wait().unwrap();
        (s, ns)
    });
    let (status, _ns) = tokio::time::timeout(Duration::from_secs(10), status)
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}
