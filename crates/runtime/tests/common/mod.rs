//! Shared harness of the integration tests: a private data directory with a busybox
//! image, a runtime on the real host, and cleanup of everything on drop (built on the
//! workspace's `testkit`).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_client::AgentClient;
use proto::agent::{ExecRequest, StdinMode};
use runtime::host::{Disks, RealHost};
use runtime::image::{BuildSpec, Images, Source};
use runtime::net::NetConfig;
use runtime::{ContainerRuntime, ImageRef, NetworkMode, Resources, RuntimeConfig, SandboxSpec};

pub struct TestEnv {
    pub runtime: ContainerRuntime,
    pub image: ImageRef,
    pub dir: tempfile::TempDir,
}

pub use testkit::unique_id;

impl TestEnv {
    pub fn new() -> TestEnv {
        testkit::needs_root("runc, mounts, namespaces");
        let dir = testkit::data_dir("rt");
        let data = dir.path().join("data");
        let disks = Disks::open(data.join("store")).unwrap();
        let images = Images::new(disks.store().clone(), data.join("images"));
        let spec = BuildSpec {
            name: "busybox".into(),
            source: Source::Busybox,
            apt: vec![],
            pip: vec![],
        };
        let image = images.build(&spec, &|_| {}).unwrap().to_ref();
        let mut config = RuntimeConfig::new(&data).unwrap();
        config.net = NetConfig {
            lease_dir: PathBuf::from("/run/sandfork/leases"),
            ..NetConfig::default()
        };
        config.ready_timeout = Duration::from_secs(20);
        let host = RealHost::new(disks, "/run/sandfork");
        let runtime = ContainerRuntime::new(config, Arc::new(host));
        TestEnv {
            runtime,
            image,
            dir,
        }
    }

    /// Another runtime on the same data directory, as after a daemon restart.
    pub fn restarted(&self) -> ContainerRuntime {
        self.runtime_with(|_| {})
    }

    /// Another runtime on the same data directory with its config changed by `change`.
    pub fn runtime_with(&self, change: impl FnOnce(&mut RuntimeConfig)) -> ContainerRuntime {
        let mut config = self.runtime.config().clone();
        change(&mut config);
        let disks = Disks::open(config.data_dir.join("store")).unwrap();
        let host = RealHost::new(disks, "/run/sandfork");
        ContainerRuntime::new(config, Arc::new(host))
    }

    pub fn spec(&self, tag: &str) -> SandboxSpec {
        SandboxSpec {
            id: unique_id(tag),
            image: self.image.clone(),
            resources: Resources {
                cpus: 1.0,
                memory_mb: 256,
                pids: 256,
                disk_mb: 0,
            },
            env: Default::default(),
            network: NetworkMode::None,
            volumes: Vec::new(),
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // Drop may run inside the test's runtime: clean up from a thread of its own.
        let runtime = self.runtime.clone();
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                for id in runtime.list().await.unwrap_or_default() {
                    if let Err(e) = runtime.destroy(&id).await {
                        eprintln!("cleanup of {id} failed: {e}");
                    }
                }
            });
        });
        let _ = cleanup.join();
    }
}

pub fn req(cmd: &str, args: &[&str]) -> ExecRequest {
    ExecRequest {
        command: cmd.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        cwd: None,
        user: None,
        stdin: StdinMode::Null,
        timeout_ms: None,
    }
}

/// Runs `sh -c script`; returns (exit code, stdout, stderr).
pub async fn sh(agent: &AgentClient, script: &str) -> (Option<i32>, String, String) {
    let out = agent
        .exec_collect(req("/bin/sh", &["-c", script]), 1 << 20)
        .await
        .unwrap();
    (
        out.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
