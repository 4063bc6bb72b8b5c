//! Create, exec and destroy of real sandboxes (root, runc).

mod common;

use common::{req, sh, TestEnv};
use proto::agent::StdinMode;

#[tokio::test(flavor = "multi_thread")]
async fn echo_has_exact_output_and_exit_code() {
    let env = TestEnv::new();
    let sb = env.runtime.create(env.spec("echo")).await.unwrap();
    let out = sb
        .agent()
        .exec_collect(req("echo", &["hi"]), 1024)
        .await
        .unwrap();
    assert_eq!(out.stdout, b"hi\n");
    assert!(out.stderr.is_empty());
    assert_eq!(out.code(), Some(0));
    let (code, _, _) = sh(&sb.agent(), "exit 7").await;
    assert_eq!(code, Some(7));
    env.runtime.destroy(&sb.id).await.unwrap();
    assert!(!sb.dir.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn env_cwd_stdin_and_timeout() {
    let env = TestEnv::new();
    let mut spec = env.spec("env");
    spec.env.insert("FROM_SPEC".into(), "yes".into());
    let sb = env.runtime.create(spec).await.unwrap();
    let agent = sb.agent();
    let mut r = req("/bin/sh", &["-c", "echo $FROM_SPEC $EXTRA; pwd; cat"]);
    r.env = vec![("EXTRA".into(), "more".into())];
    r.cwd = Some("/tmp".into());
    r.stdin = StdinMode::Bytes(b"from stdin".to_vec());
    let out = agent.exec_collect(r, 1024).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "yes more\n/tmp\nfrom stdin"
    );
    let mut r = req("sleep", &["30"]);
    r.timeout_ms = Some(300);
    let started = std::time::Instant::now();
    let out = agent.exec_collect(r, 1024).await.unwrap();
    assert!(out.exit.timed_out);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_sees_only_itself() {
    let env = TestEnv::new();
    let marker = env.dir.path().join("host-marker");
    std::fs::write(&marker, "secret").unwrap();
    let spec = env.spec("iso");
    let id = spec.id.clone();
    let sb = env.runtime.create(spec).await.unwrap();
    let agent = sb.agent();
    let (_, host, _) = sh(&agent, "hostname").await;
    assert_eq!(host.trim(), id);
    let (_, pids, _) = sh(&agent, "ls /proc | grep -c '^[0-9]'").await;
    let n: u32 = pids.trim().parse().unwrap();
    assert!(n <= 4, "sandbox sees {n} processes");
    let script = format!(
        "cat {} 2>&1; ls {} 2>&1",
        marker.display(),
        env.dir.path().display()
    );
    let (_, out, _) = sh(&agent, &script).await;
    assert!(!out.contains("secret"), "{out}");
    assert!(out.contains("No such file"), "{out}");
    let (code, _, err) = sh(&agent, "mount -t tmpfs x /mnt").await;
    assert_ne!(code, Some(0), "{err}");
    // The host-owned run directory is a small tmpfs: it cannot fill the host's disk.
    let (code, _, err) = sh(&agent, "head -c 64m /dev/zero > /run/sandfork/fill").await;
    assert_ne!(code, Some(0), "{err}");
    let (_, size, _) = sh(&agent, "wc -c < /run/sandfork/fill; rm /run/sandfork/fill").await;
    assert!(size.trim().parse::<u64>().unwrap() <= 4 << 20, "{size}");
    let (code, _, err) = sh(&agent, "unshare -n true").await;
    assert_ne!(code, Some(0), "{err}");
    // Capabilities: exactly the documented set; no new privileges; seccomp filtering.
    let (_, status, _) = sh(
        &agent,
        "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status",
    )
    .await;
    let fields: Vec<&str> = status
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(
        fields,
        ["00000000200405fb", "00000000200405fb", "1", "2"],
        "{status}"
    );
    // The everyday file syscalls stay allowed, the legacy ones included (rmdir(2), which
    // Python's os.rmdir uses, was once missing from the profile).
    let (code, _, err) = sh(
        &agent,
        "mkdir /tmp/d && ln -s d /tmp/l && mv /tmp/l /tmp/m && rm /tmp/m && rmdir /tmp/d",
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    // The init's stdio are pipes, never host files (memory checkpoints need that).
    let pid = env.runtime.inspect(&id).await.unwrap().pid.unwrap();
    for fd in 0..3 {
        let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
        assert!(
            link.to_string_lossy().starts_with("pipe:"),
            "fd {fd} is {link:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn adopt_after_restart_and_clean_up_the_dead() {
    let env = TestEnv::new();
    let live = env.runtime.create(env.spec("live")).await.unwrap();
    let dead = env.runtime.create(env.spec("dead")).await.unwrap();
    sh(&live.agent(), "echo before > /root/f").await;
    // The dead sandbox's init is killed behind the runtime's back.
    let pid = env.runtime.inspect(&dead.id).await.unwrap().pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    // A second runtime on the same data directory stands for the restarted daemon.
    let restarted = env.restarted();
    let mut cleaned = Vec::new();
    for _ in 0..50 {
        cleaned = restarted.cleanup_stale().await.unwrap();
        if !cleaned.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(cleaned, vec![dead.id.clone()]);
    assert!(!dead.dir.exists());
    assert!(!std::path::Path::new(&format!("/run/sandfork/netns/sf-{}", dead.id)).exists());
    let adopted = restarted.adopt(&live.id).await.unwrap();
    let (_, out, _) = sh(&adopted.agent(), "cat /root/f").await;
    assert_eq!(out, "before\n");
    restarted.destroy(&live.id).await.unwrap();
    assert!(!live.dir.exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(env.dir.path().to_str().unwrap()),
        "{mounts}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn large_output_streams() {
    let env = TestEnv::new();
    let sb = env.runtime.create(env.spec("big")).await.unwrap();
    let mut stream = sb
        .agent()
        .exec(req("/bin/sh", &["-c", "head -c 104857600 /dev/zero"]))
        .await
        .unwrap();
    let mut total = 0usize;
    let exit = loop {
        match stream.next().await.unwrap() {
            Some(agent_client::ExecEvent::Stdout(d)) => total += d.len(),
            Some(agent_client::ExecEvent::Stderr(_)) => {}
            Some(agent_client::ExecEvent::Exit(e)) => break e,
            None => panic!("stream closed early"),
        }
    };
    assert_eq!(total, 100 << 20);
    assert_eq!(exit.status, proto::agent::ExitStatus::Code(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_start_and_inspect() {
    let env = TestEnv::new();
    let sb = env.runtime.create(env.spec("stop")).await.unwrap();
    sh(&sb.agent(), "echo kept > /root/file").await;
    let info = env.runtime.inspect(&sb.id).await.unwrap();
    assert_eq!(info.status, runtime::SandboxStatus::Running);
    assert!(info.usage.pids >= 1);
    env.runtime.stop(&sb.id).await.unwrap();
    assert_eq!(
        env.runtime.inspect(&sb.id).await.unwrap().status,
        runtime::SandboxStatus::Stopped
    );
    let sb = env.runtime.start(&sb.id).await.unwrap();
    let (_, out, _) = sh(&sb.agent(), "cat /root/file").await;
    assert_eq!(out, "kept\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_init_that_never_answers_fails_create_and_leaves_nothing() {
    let env = TestEnv::new();
    // busybox called as "agent" prints an error and exits: no agent ever listens.
    let broken = env.runtime_with(|c| {
        c.agent_bin = "/bin/busybox".into();
        c.ready_timeout = std::time::Duration::from_secs(60);
    });
    let spec = env.spec("noinit");
    let id = spec.id.clone();
    let started = std::time::Instant::now();
    let err = broken.create(spec).await.unwrap_err().to_string();
    assert!(err.contains("applet not found"), "{err}");
    // Known as soon as the init exits, not at the end of the readiness timeout.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{err}"
    );
    let data = env.runtime.config().data_dir.clone();
    assert!(!data.join("sandboxes").join(&id).exists());
    assert!(!std::path::Path::new(&format!("/run/sandfork/netns/sf-{id}")).exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "{mounts}");
    assert!(broken.list().await.unwrap().is_empty());
}
