//! cgroup limits of real sandboxes: memory, pids.

mod common;

use common::{sh, TestEnv};

#[tokio::test(flavor = "multi_thread")]
async fn allocation_past_memory_limit_dies_inside() {
    let env = TestEnv::new();
    let mut spec = env.spec("oom");
    spec.resources.memory_mb = 64;
    let sb = env.runtime.create(spec).await.unwrap();
    let neighbour = env.runtime.create(env.spec("nbr")).await.unwrap();
    // `tail -c N` keeps the last N bytes in memory: 200 MiB, past the 64 MiB limit.
    let script = "head -c 209715200 /dev/zero | tail -c 209715200 > /dev/null";
    let (code, _, _) = sh(&sb.agent(), script).await;
    assert_eq!(code, Some(137), "the allocating process must be OOM-killed");
    // The sandbox's agent and the neighbour live on.
    let (code, out, _) = sh(&sb.agent(), "echo alive").await;
    assert_eq!((code, out.as_str()), (Some(0), "alive\n"));
    let (_, out, _) = sh(&neighbour.agent(), "echo fine").await;
    assert_eq!(out, "fine\n");
    let (_, limit, _) = sh(
        &sb.agent(),
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max 2>/dev/null",
    )
    .await;
    assert_eq!(limit.trim(), (64u64 << 20).to_string());
}

#[tokio::test(flavor = "multi_thread")]
async fn pids_limit_stops_a_fork_bomb() {
    let env = TestEnv::new();
    let mut spec = env.spec("pids");
    spec.resources.pids = 64;
    let sb = env.runtime.create(spec).await.unwrap();
    let agent = sb.agent();
    let mut bomb = common::req("/bin/sh", &["-c", "b() { b | b & }; b; sleep 2"]);
    bomb.timeout_ms = Some(5000);
    let _ = agent.exec_collect(bomb, 1 << 16).await;
    let info = env.runtime.inspect(&sb.id).await.unwrap();
    assert!(info.usage.pids <= 64, "{} pids", info.usage.pids);
    let (code, out, _) = sh(&agent, "pkill -9 -f 'sh -c b'; echo still here").await;
    assert_eq!((code, out.as_str()), (Some(0), "still here\n"));
    env.runtime.destroy(&sb.id).await.unwrap();
    assert!(!sb.dir.exists());
}
