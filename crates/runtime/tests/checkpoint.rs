//! Checkpoints and restores of real sandboxes (root, runc, CRIU >= 4.2).

mod common;

use std::time::Duration;

use common::{req, sh, unique_id, TestEnv};
use proto::agent::Identity;
use runtime::{CheckpointKind, RestoreOptions, SnapshotSource};

/// Starts a process holding a value only in memory (its file is deleted) that rewrites
/// it to /tmp/out every 50 ms (by rename, so a reader never sees it half written), and an
/// HTTP server on port 8080.
const WORKLOAD: &str = "echo -n warm-$RANDOM$RANDOM > /seed; mkdir -p /www; echo served > /www/index.html; \
    (v=$(cat /seed); rm /seed; i=0; while :; do echo \"$v $i\" > /tmp/out.new; mv /tmp/out.new /tmp/out; i=$((i+1)); sleep 0.05; done) \
    </dev/null >/dev/null 2>&1 & httpd -p 8080 -h /www; sleep 0.3; cat /tmp/out";

async fn wait_file(agent: &agent_client::AgentClient, path: &str) -> String {
    for _ in 0..100 {
        let (code, out, _) = sh(agent, &format!("cat {path} 2>/dev/null")).await;
        if code == Some(0) && !out.is_empty() {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{path} did not appear");
}

fn value(out: &str) -> String {
    out.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_restore_resumes_processes_and_forks_diverge() {
    let env = TestEnv::new();
    let src = env.runtime.create(env.spec("ckm")).await.unwrap();
    let (code, out, err) = sh(&src.agent(), WORKLOAD).await;
    assert_eq!(code, Some(0), "{err}");
    let held = value(&out);
    assert!(held.starts_with("warm-"), "{out}");
    sh(&src.agent(), "echo on-disk > /data.txt").await;

    let images = env.dir.path().join("snap-images");
    let info = env
        .runtime
        .checkpoint(&src.id, CheckpointKind::Memory, Some(images.clone()))
        .await
        .unwrap();
    assert!(info.memory_bytes > 0 && info.memory_dir.is_some());
    // The source keeps running.
    let (_, after, _) = sh(&src.agent(), "sleep 0.2; cat /tmp/out").await;
    assert_eq!(value(&after), held);

    let from = SnapshotSource {
        layer: info.layer.clone(),
        memory_dir: info.memory_dir.clone(),
    };
    let children = futures_join(&env, &from, 4).await;
    for (i, child) in children.iter().enumerate() {
        let agent = child.agent();
        sh(&agent, "rm -f /tmp/out").await;
        let out = wait_file(&agent, "/tmp/out").await;
        assert_eq!(value(&out), held, "child {i} holds the value in memory");
        let (code, page, err) = sh(&agent, "wget -qO- http://127.0.0.1:8080/").await;
        assert_eq!((code, page.trim()), (Some(0), "served"), "{err}");
        let (_, fork, _) = sh(&agent, "cat /etc/sandfork/fork").await;
        assert!(fork.contains(&format!("SANDFORK_FORK_INDEX={i}")), "{fork}");
        let (_, data, _) = sh(&agent, "cat /data.txt").await;
        assert_eq!(data.trim(), "on-disk");
        let (_, hook, _) = sh(&agent, "cat /hook").await;
        assert_eq!(hook.trim(), "hooked", "the after-restore hook ran");
        sh(&agent, &format!("echo {i} > /mine-{i}")).await;
        let log = runtime::layout::Layout::new(env.dir.path().join("data"))
            .sandbox(&child.id)
            .logs()
            .join("restore.log");
        let log = std::fs::read_to_string(&log).unwrap();
        assert!(
            log.contains("Loaded kdat cache"),
            "CRIU probed the kernel instead of using its cache"
        );
    }
    for (i, child) in children.iter().enumerate() {
        let (_, ls, _) = sh(&child.agent(), "ls / | grep mine- | tr '\\n' ' '").await;
        assert_eq!(ls.trim(), format!("mine-{i}"), "forks never share files");
    }
    let (_, ls, _) = sh(&src.agent(), "ls / | grep -c mine- || true").await;
    assert_eq!(ls.trim(), "0");
}

async fn futures_join(env: &TestEnv, from: &SnapshotSource, n: u32) -> Vec<runtime::SandboxHandle> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let rt = env.runtime.clone();
        let spec = env.spec(&format!("f{i}"));
        let from = from.clone();
        let opts = RestoreOptions {
            identity: Some(Identity {
                sandbox_id: spec.id.clone(),
                fork_index: i,
                seed: vec![i as u8; 16],
                parent_snapshot_id: Some("snap-test".into()),
                env: vec![],
            }),
            hooks: vec![req("/bin/sh", &["-c", "echo hooked > /hook"])],
        };
        tasks.push(tokio::spawn(
            async move { rt.restore(spec, from, opts).await },
        ));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap().unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn filesystem_restore_has_files_not_processes() {
    let env = TestEnv::new();
    let src = env.runtime.create(env.spec("ckf")).await.unwrap();
    sh(&src.agent(), "echo kept > /kept; (sleep 1000 &) ; true").await;
    let info = env
        .runtime
        .checkpoint(&src.id, CheckpointKind::Filesystem, None)
        .await
        .unwrap();
    assert!(info.memory_dir.is_none());
    let from = SnapshotSource {
        layer: info.layer,
        memory_dir: None,
    };
    let spec = env.spec("ckf-child");
    let child = env
        .runtime
        .restore(spec, from, RestoreOptions::default())
        .await
        .unwrap();
    let (_, kept, _) = sh(&child.agent(), "cat /kept").await;
    assert_eq!(kept.trim(), "kept");
    let (_, ps, _) = sh(&src.agent(), "ps | grep -c '[s]leep 1000' || true").await;
    assert_eq!(ps.trim(), "1", "the source runs it: {ps}");
    let (_, ps, _) = sh(&child.agent(), "ps | grep -c '[s]leep 1000' || true").await;
    assert_eq!(ps.trim(), "0", "a cold boot runs no old process: {ps}");
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_checkpoint_leaves_no_files_and_source_runs() {
    let env = TestEnv::new();
    let src = env.runtime.create(env.spec("ckx")).await.unwrap();
    // An established TCP connection cannot be dumped without --tcp-established.
    let script = "mkdir -p /www; httpd -p 8081 -h /www; \
        (nc 127.0.0.1 8081 </dev/zero >/dev/null 2>&1 &); sleep 0.3; echo ok";
    sh(&src.agent(), script).await;
    let images = env.dir.path().join("bad-images");
    let r = env
        .runtime
        .checkpoint(&src.id, CheckpointKind::Memory, Some(images.clone()))
        .await;
    match &r {
        Err(e) => {
            assert!(!images.exists(), "no images are left after a failure: {e}");
            let msg = e.to_string();
            assert!(msg.contains("CRIU") || msg.contains("runc"), "{msg}");
            eprintln!("refused as expected: {msg}");
        }
        Ok(info) => eprintln!("CRIU dumped the established connection too: {info:?}"),
    }
    let (code, out, _) = sh(&src.agent(), "echo alive").await;
    assert_eq!((code, out.trim()), (Some(0), "alive"));
    let bad = SnapshotSource {
        layer: "nope".into(),
        memory_dir: None,
    };
    let id = unique_id("bad");
    let mut spec = env.spec("bad");
    spec.id = id.clone();
    assert!(env
        .runtime
        .restore(spec, bad, RestoreOptions::default())
        .await
        .is_err());
    assert!(!env.runtime.list().await.unwrap().contains(&id));
}
