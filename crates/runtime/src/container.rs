//! [`ContainerRuntime`]: sandboxes as runc containers on sandfork disks.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::host::{ContainerStatus, Host, Usage};
use crate::layout::{Layout, Record};
use crate::lifecycle::{self, Ctx};
use crate::net::NetConfig;
use crate::{SandboxHandle, SandboxInfo, SandboxSpec, SandboxStatus};

/// Settings of a [`ContainerRuntime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Data directory (`sandboxes/`, `runc/` live below it).
    pub data_dir: PathBuf,
    pub net: NetConfig,
    /// The static agent binary, bind-mounted read-only into every sandbox.
    pub agent_bin: PathBuf,
    /// How long `create` waits for the agent to answer.
    pub ready_timeout: Duration,
}

impl RuntimeConfig {
    /// Defaults for `data_dir`, with the agent from [`crate::agent_binary`].
    pub fn new(data_dir: impl Into<PathBuf>) -> Result<Self> {
        let data_dir = data_dir.into();
        Ok(RuntimeConfig {
            agent_bin: crate::agent_binary()?,
            data_dir,
            net: NetConfig::default(),
            ready_timeout: Duration::from_secs(10),
        })
    }
}

struct Inner {
    config: RuntimeConfig,
    layout: Layout,
    host: Arc<dyn Host>,
}

impl Inner {
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            host: &*self.host,
            layout: &self.layout,
            net: &self.config.net,
            agent_bin: &self.config.agent_bin,
            ready_timeout: self.config.ready_timeout,
            restore_images: None,
        }
    }

    fn handle(&self, record: &Record) -> SandboxHandle {
        let paths = self.layout.sandbox(&record.spec.id);
        SandboxHandle {
            id: record.spec.id.clone(),
            dir: paths.dir.clone(),
            socket_dir: paths.run(),
            address: record.net.as_ref().map(|n| n.sandbox_addr),
            net: record.net.clone(),
            init_pid: crate::liveness::init_pid(&self.layout, &record.names.container),
        }
    }

    fn inspect(&self, id: &str) -> Result<SandboxInfo> {
        let ctx = self.ctx();
        let record = lifecycle::load(&ctx, id)?;
        let state = self
            .host
            .runc_state(&self.layout.runc_root(), &record.names.container)?;
        let status = match state.map(|s| s.status) {
            Some(ContainerStatus::Running) => SandboxStatus::Running,
            Some(ContainerStatus::Paused) => SandboxStatus::Paused,
            Some(ContainerStatus::Creating | ContainerStatus::Created) => SandboxStatus::Starting,
            Some(ContainerStatus::Stopped) | None => SandboxStatus::Stopped,
        };
        let usage = match status {
            SandboxStatus::Stopped => Usage::default(),
            _ => self
                .host
                .cgroup_usage(&record.names.cgroup)
                .unwrap_or_default(),
        };
        Ok(SandboxInfo {
            handle: self.handle(&record),
            status,
            pid: state.and_then(|s| s.pid),
            usage,
            spec: record.spec,
            created_at: record.created_at,
        })
    }

    fn adopt(&self, id: &str) -> Result<SandboxHandle> {
        let ctx = self.ctx();
        let record = lifecycle::load(&ctx, id)?;
        // Paused, or held by CRIU, only by a checkpoint its daemon did not live to finish.
        let interrupted = crate::checkpoint::interrupted(&ctx, &record)?;
        if !interrupted && !record.stopped && !lifecycle::is_running(&ctx, &record)? {
            return Err(Error::NotFound(id.into()));
        }
        let paths = self.layout.sandbox(id);
        self.host.adopt_disk(&record.names.disk, &paths)?;
        if interrupted {
            crate::checkpoint::unpause(&ctx, &record)?;
        } else {
            // A filesystem checkpoint cut short can leave the disk frozen while the
            // container runs; thawing a thawed disk is a no-op.
            self.host.disk_thaw(&record.names.disk)?;
        }
        Ok(self.handle(&record))
    }

    fn set_egress(
        &self,
        id: &str,
        allow_out: Vec<crate::Cidr>,
        deny_out: Vec<crate::Cidr>,
        by_name: Option<crate::spec::ByName>,
    ) -> Result<()> {
        let ctx = self.ctx();
        let mut record = lifecycle::load(&ctx, id)?;
        let (Some(alloc), crate::NetworkMode::Internet { .. }) =
            (&record.net, &record.spec.network)
        else {
            return Err(Error::Unsupported(format!(
                "sandbox {id} has no network of its own (created without internet access)"
            )));
        };
        let host = crate::net::HostNet::of_host();
        let egress = crate::net::Egress {
            allow: &allow_out,
            deny: &deny_out,
            host: &host,
            by_name,
        };
        self.host
            .nft_apply(&crate::net::sandbox_rules_replace(alloc, &egress))?;
        record.spec.network = crate::NetworkMode::Internet {
            allow_out,
            deny_out,
            by_name,
        };
        record.save(&self.layout.sandbox(id).record())
    }

    /// The file-only probe, confirmed by runc before an agent is called dead: runc checks
    /// pid and start time too, and knows a container it is still creating or restoring.
    fn liveness(&self, id: &str) -> Result<crate::Liveness> {
        let found = crate::liveness::probe(&self.layout, id)?;
        if !matches!(found, crate::Liveness::AgentDied { .. }) {
            return Ok(found);
        }
        let record = lifecycle::load(&self.ctx(), id)?;
        let state = self
            .host
            .runc_state(&self.layout.runc_root(), &record.names.container)?;
        Ok(match state.map(|s| s.status) {
            None | Some(ContainerStatus::Stopped) => found,
            Some(_) => crate::Liveness::Alive,
        })
    }

    fn list(&self) -> Result<Vec<String>> {
        let dir = self.layout.sandboxes();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(Vec::new());
        };
        let mut ids: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        ids.sort();
        Ok(ids)
    }
}

/// The container runtime: runc + sandfork disks + sandfork networking.
#[derive(Clone)]
pub struct ContainerRuntime {
    inner: Arc<Inner>,
}

impl ContainerRuntime {
    pub fn new(config: RuntimeConfig, host: Arc<dyn Host>) -> Self {
        let layout = Layout::new(&config.data_dir);
        ContainerRuntime {
            inner: Arc::new(Inner {
                config,
                layout,
                host,
            }),
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| Error::Command {
                command: "runtime task".into(),
                detail: e.to_string(),
            })?
    }
}

/// The sandbox runtime: one sandbox's whole life on this host, checkpoints and restores
/// included. Its side effects go through its [`Host`]; only its own records (the
/// [`crate::layout`] directory) are written directly.
impl ContainerRuntime {
    /// Creates and boots a sandbox; returns once its agent answers. A failed create
    /// leaves nothing behind.
    pub async fn create(&self, spec: SandboxSpec) -> Result<SandboxHandle> {
        let id = spec.id.clone();
        let handle = self
            .blocking(move |i| lifecycle::create(&i.ctx(), spec).map(|r| i.handle(&r)))
            .await?;
        self.until_ready(&id, Undo::Destroy).await?;
        Ok(handle)
    }

    /// Waits for the agent of a sandbox whose container the lifecycle just started; if it
    /// never answers, `undo` takes the sandbox back (removed, or stopped again).
    async fn until_ready(&self, id: &str, undo: Undo) -> Result<()> {
        let paths = self.inner.layout.sandbox(id);
        let client = agent_client::AgentClient::new(&paths.run());
        let gone = self.inner.host.init_exited(&paths);
        let t = std::time::Instant::now();
        let ready = agent_ready(&client, self.inner.config.ready_timeout, gone.as_deref()).await;
        let Err(e) = ready else {
            crate::steps::done("agent answers", t);
            return Ok(());
        };
        let e = lifecycle::with_init_output(e, &paths);
        tracing::warn!(%id, error = %e, "the agent did not answer, undoing");
        let id = id.to_string();
        let _ = match undo {
            Undo::Destroy => {
                self.blocking(move |i| lifecycle::destroy(&i.ctx(), &id))
                    .await
            }
            Undo::Stop => self.blocking(move |i| lifecycle::stop(&i.ctx(), &id)).await,
        };
        Err(e)
    }

    /// A client for a sandbox's agent: the exec channel.
    pub async fn agent(&self, id: &str) -> Result<agent_client::AgentClient> {
        let id = id.to_string();
        let handle = self.blocking(move |i| {
            let record = lifecycle::load(&i.ctx(), &id)?;
            Ok(i.handle(&record))
        });
        Ok(handle.await?.agent())
    }

    /// Kills the sandbox's processes; its disk and network stay for [`ContainerRuntime::start`].
    pub async fn stop(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.blocking(move |i| lifecycle::stop(&i.ctx(), &id)).await
    }

    /// Boots a stopped sandbox again on its disk; stopped again if its agent never answers.
    pub async fn start(&self, id: &str) -> Result<SandboxHandle> {
        let owned = id.to_string();
        let handle = self
            .blocking(move |i| lifecycle::restart(&i.ctx(), &owned).map(|r| i.handle(&r)))
            .await?;
        self.until_ready(id, Undo::Stop).await?;
        Ok(handle)
    }

    /// Removes everything the sandbox holds. Idempotent.
    pub async fn destroy(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        crate::spec::validate_id(&id).map_err(|_| Error::NotFound(id.clone()))?;
        self.blocking(move |i| lifecycle::destroy(&i.ctx(), &id))
            .await
    }

    pub async fn inspect(&self, id: &str) -> Result<SandboxInfo> {
        let id = id.to_string();
        self.blocking(move |i| i.inspect(&id)).await
    }

    /// How many processes the OOM killer has killed in the sandbox: a few cgroup file
    /// reads, no runc call (the daemon's liveness watch asks every second).
    pub async fn oom_kills(&self, id: &str) -> Result<u64> {
        let id = id.to_string();
        self.blocking(move |i| {
            let record = lifecycle::load(&i.ctx(), &id)?;
            Ok(i.host.cgroup_usage(&record.names.cgroup)?.oom_kills)
        })
        .await
    }

    /// How many of the sandbox's disk writes its disk server holds for want of host space
    /// (one control-socket call).
    pub async fn disk_held_writes(&self, id: &str) -> Result<u64> {
        let id = id.to_string();
        self.blocking(move |i| {
            let record = lifecycle::load(&i.ctx(), &id)?;
            i.host.disk_held_writes(&record.names.disk)
        })
        .await
    }

    /// The sandbox's CPU, memory, pids, root disk and network use, read now.
    pub async fn stats(&self, id: &str) -> Result<crate::Stats> {
        let info = self.inspect(id).await?;
        let rootfs = self.layout().sandbox(id).rootfs();
        tokio::task::spawn_blocking(move || {
            let (disk_used_bytes, disk_total_bytes) = crate::space::fs_usage(&rootfs)?;
            let net = info.pid.map(crate::net::counters).unwrap_or_default();
            Ok(crate::Stats {
                usage: info.usage,
                disk_used_bytes,
                disk_total_bytes,
                net,
            })
        })
        .await
        .map_err(|e| Error::Command {
            command: "runtime task".into(),
            detail: e.to_string(),
        })?
    }

    /// Ids of every sandbox in the data directory.
    pub async fn list(&self) -> Result<Vec<String>> {
        self.blocking(|i| i.list()).await
    }

    /// Re-attaches to a running (or stopped on request) sandbox after a daemon restart.
    pub async fn adopt(&self, id: &str) -> Result<SandboxHandle> {
        let id = id.to_string();
        self.blocking(move |i| i.adopt(&id)).await
    }

    /// Removes what dead sandboxes left behind; returns their ids.
    pub async fn cleanup_stale(&self) -> Result<Vec<String>> {
        self.blocking(|i| crate::stale::cleanup(&i.ctx())).await
    }

    /// Replaces the egress lists of a running sandbox with `internet` (effective at once,
    /// and kept across restarts of the daemon).
    pub async fn set_egress(
        &self,
        id: &str,
        allow_out: Vec<crate::Cidr>,
        deny_out: Vec<crate::Cidr>,
        by_name: Option<crate::spec::ByName>,
    ) -> Result<()> {
        let id = id.to_string();
        self.blocking(move |i| i.set_egress(&id, allow_out, deny_out, by_name))
            .await
    }

    /// Adds addresses the resolver of the sandbox on `alloc` learned from its answers
    /// (seconds each stays); blocking: call it off the async threads.
    pub fn learn_addresses(
        &self,
        alloc: &crate::net::NetAlloc,
        allowed: &[(std::net::Ipv4Addr, u32)],
        denied: &[(std::net::Ipv4Addr, u32)],
    ) -> Result<()> {
        let script = crate::net::learned_script(alloc, allowed, denied);
        if script.is_empty() {
            return Ok(());
        }
        self.inner.host.nft_apply(&script)
    }

    /// Whether the agent and the disk server of a sandbox whose container should be
    /// running are alive (a cheap check: files only, no runc call).
    pub async fn liveness(&self, id: &str) -> Result<crate::Liveness> {
        let id = id.to_string();
        crate::spec::validate_id(&id).map_err(|_| Error::NotFound(id.clone()))?;
        self.blocking(move |i| i.liveness(&id)).await
    }

    /// Checkpoints a running sandbox, which keeps running; memory images go to
    /// `memory_dir` (needed for [`CheckpointKind::Memory`]). A failed checkpoint leaves no
    /// files in `memory_dir`.
    pub async fn checkpoint(
        &self,
        id: &str,
        kind: crate::CheckpointKind,
        memory_dir: Option<PathBuf>,
    ) -> Result<crate::CheckpointInfo> {
        let id = id.to_string();
        self.blocking(move |i| {
            crate::checkpoint::checkpoint(&i.ctx(), &id, kind, memory_dir.as_deref())
        })
        .await
    }

    /// Creates sandbox `spec.id` from a snapshot (warm from memory images, else a cold
    /// boot on the snapshot's disk), then applies `opts`. A failed restore leaves nothing.
    pub async fn restore(
        &self,
        spec: SandboxSpec,
        from: crate::SnapshotSource,
        opts: crate::RestoreOptions,
    ) -> Result<SandboxHandle> {
        let id = spec.id.clone();
        let handle = self
            .blocking(move |i| {
                crate::checkpoint::restore(&i.ctx(), spec, &from).map(|r| i.handle(&r))
            })
            .await?;
        self.until_ready(&id, Undo::Destroy).await?;
        let t = std::time::Instant::now();
        if let Err(e) = crate::checkpoint::after_restore(&handle.agent(), opts).await {
            let _ = self.destroy(&id).await;
            return Err(e);
        }
        crate::steps::done("fork identity and after-restore hooks", t);
        Ok(handle)
    }

    /// Restores sandbox `spec.id` as [`ContainerRuntime::restore`] does, but gives it no
    /// identity and runs no hooks yet, and freezes it: a parked fork, which costs no CPU
    /// until [`ContainerRuntime::hand_over`] (a pool of ready forks). A failed park
    /// leaves nothing.
    pub async fn park(
        &self,
        spec: SandboxSpec,
        from: crate::SnapshotSource,
    ) -> Result<SandboxHandle> {
        let handle = self
            .restore(spec, from, crate::RestoreOptions::default())
            .await?;
        warm_exec_path(&handle.agent()).await;
        if let Err(e) = self.set_frozen(&handle.id, true).await {
            let _ = self.destroy(&handle.id).await;
            return Err(e);
        }
        Ok(handle)
    }

    /// Thaws a parked sandbox and applies `opts` (its identity, then the hooks), so that
    /// it is what [`ContainerRuntime::restore`] would have made. On failure the sandbox
    /// is left for the caller to destroy.
    pub async fn hand_over(&self, id: &str, opts: crate::RestoreOptions) -> Result<()> {
        let t = std::time::Instant::now();
        self.set_frozen(id, false).await?;
        crate::steps::done("parked fork thawed", t);
        let t = std::time::Instant::now();
        let agent = self.agent(id).await?;
        crate::checkpoint::after_restore(&agent, opts).await?;
        crate::steps::done("fork identity and after-restore hooks", t);
        Ok(())
    }

    /// Freezes every process of a sandbox at once (the cgroup freezer), or thaws them.
    pub async fn set_frozen(&self, id: &str, frozen: bool) -> Result<()> {
        let id = id.to_string();
        self.blocking(move |i| {
            let record = lifecycle::load(&i.ctx(), &id)?;
            i.host.cgroup_freeze(&record.names.cgroup, frozen)
        })
        .await
    }
}

/// Runs one no-op command, so that the first command a parked fork is given does not pay
/// for reading the shell through its new disk's cold page cache (≈ 25 ms for busybox).
/// Best effort: an image without `true` just misses the warm-up.
async fn warm_exec_path(agent: &agent_client::AgentClient) {
    let req = proto::agent::ExecRequest {
        command: "true".into(),
        stdin: proto::agent::StdinMode::Null,
        ..Default::default()
    };
    if let Err(e) = agent.exec_collect(req, 1 << 10).await {
        tracing::debug!(error = %e, "warming a parked fork's exec path failed");
    }
}

/// What takes a sandbox back when its agent never answers.
enum Undo {
    /// A new sandbox: removed whole.
    Destroy,
    /// A stopped one booted again: stopped again, its disk and network kept.
    Stop,
}

/// Waits for the agent (see [`agent_client::AgentClient::wait_ready_unless`]); gives up
/// early once the init has exited (`gone`).
async fn agent_ready(
    client: &agent_client::AgentClient,
    timeout: Duration,
    gone: Option<&AtomicBool>,
) -> Result<()> {
    let exited = || gone.is_some_and(|g| g.load(Ordering::Acquire));
    match client.wait_ready_unless(timeout, exited).await {
        Ok(_) => Ok(()),
        Err(e) if exited() => Err(Error::Agent(format!("the sandbox's init exited ({e})"))),
        Err(agent_client::ClientError::NotReady { source, .. }) => Err(Error::Agent(format!(
            "no answer within {timeout:?} ({source})"
        ))),
        Err(e) => Err(Error::Agent(format!("the agent socket is unusable ({e})"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::FakeHost;
    use crate::spec::NetworkMode;

    #[tokio::test]
    async fn a_sandbox_whose_agent_never_answers_is_removed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let host = Arc::new(FakeHost::new());
        let config = RuntimeConfig {
            data_dir: dir.path().join("data"),
            net: NetConfig {
                pool: "198.18.0.0/28".parse().unwrap(),
                lease_dir: dir.path().join("leases"),
            },
            agent_bin: dir.path().join("agent"),
            ready_timeout: Duration::from_millis(50),
        };
        let rt = ContainerRuntime::new(config, host.clone());
        let spec = crate::lifecycle::tests::spec("quiet", NetworkMode::None);
        let err = rt.create(spec).await.unwrap_err();
        assert!(matches!(err, Error::Agent(_)), "{err}");
        let ops = host.ops();
        let after_run = &ops[ops.iter().position(|o| o == "runc_run").unwrap()..];
        for undone in ["runc_delete", "unmount_disk"] {
            assert!(
                after_run.iter().any(|o| o == undone),
                "{undone} missing: {ops:?}"
            );
        }
        assert!(!rt.layout().sandbox("quiet").dir.exists(), "nothing left");
    }
}
