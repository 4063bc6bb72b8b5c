//! The agent as PID 1 of a fresh pid namespace (needs root and util-linux `unshare`).

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_client::AgentClient;
use common::{sh, AGENT};

/// `unshare --pid --fork` running an agent; kills the whole namespace on drop.
struct Namespace {
    unshare: Child,
    _dir: tempfile::TempDir,
    client: AgentClient,
}

impl Namespace {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc", AGENT])
            .arg("--socket")
            .arg(dir.path().join("agent.sock"))
            .arg("--identity-dir")
            .arg(dir.path().join("identity"));
        let socket_dir = dir.path().to_path_buf();
        Self::spawn(cmd, dir, &socket_dir).await
    }

    async fn spawn(mut cmd: Command, dir: tempfile::TempDir, socket_dir: &Path) -> Self {
        let unshare = cmd.stdin(Stdio::null()).spawn().expect("unshare");
        let client = AgentClient::new(socket_dir);
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

/// A root filesystem with nothing but static busybox and the static agent (the one the
/// host binaries embed), as in the smallest sandbox image.
fn busybox_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    for d in ["bin", "run/sandfork", "etc", "tmp"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", r.join("bin/busybox")).unwrap();
    for applet in ["sh", "echo", "id", "cat", "ls"] {
        std::os::unix::fs::symlink("busybox", r.join("bin").join(applet)).unwrap();
    }
    let agent = r.join("sandfork-agent");
    std::fs::write(&agent, agent_embed::AGENT).unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    root
}

#[tokio::test]
async fn static_agent_runs_without_a_c_library() {
    assert!(
        Path::new("/bin/busybox").exists(),
        "busybox-static is missing (scripts/setup installs it)"
    );
    let root = busybox_root();
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", "chroot"])
        .arg(root.path())
        .args(["/sandfork-agent", "--socket", "/run/sandfork/agent.sock"]);
    let socket_dir = root.path().join("run/sandfork");
    let ns = Namespace::spawn(cmd, root, &socket_dir).await;
    let out = ns
        .client
        .exec_collect(sh("echo hi from $(id -u):$(id -g)"), 1024)
        .await
        .unwrap();
    assert_eq!(out.stdout, b"hi from 0:0\n");
    let req = proto::agent::ExecRequest {
        user: Some("1000:1000".into()),
        ..sh("id -u")
    };
    assert_eq!(
        ns.client.exec_collect(req, 1024).await.unwrap().stdout,
        b"1000\n"
    );
    let id = proto::agent::Identity {
        sandbox_id: "sb-1".into(),
        fork_index: 1,
        seed: vec![7; 32],
        parent_snapshot_id: None,
        env: vec![],
    };
    ns.client.set_identity(id).await.unwrap();
    let fork = ns
        .client
        .read_file_bytes("/etc/sandfork/fork", 4096)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&fork).contains("SANDFORK_FORK_INDEX=1"));
}
