//! The [`Backend`] on the container runtime (runc) and the in-sandbox agent.
//!
//! Lifecycle calls go to [`runtime::ContainerRuntime`]; data-plane calls open a connection to the
//! sandbox's agent and pump it into bounded channels, so the daemon never buffers more than
//! [`STREAM_DEPTH`] chunks of anyone's output.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client::AgentClient;
use agent_client::WriteOptions;
use async_trait::async_trait;
use bytes::Bytes;
use proto::agent::{DirEntry, ExecRequest, ExitInfo, FileStat, ProcessInfo, SpawnRequest};
use runtime::host::{Disks, RealHost};
use runtime::image::{BuildSpec, Images, Source};
use runtime::{ContainerRuntime, ImageRef, NetworkMode, Resources, RuntimeConfig, SandboxSpec};
use tokio::sync::mpsc;

use crate::backend::*;
use crate::config::Config;

/// How long a connection to a sandbox's port may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

mod build;
mod dns;
mod dockerfile;
mod errors;
mod pull;
mod snapshots;
mod streams;

use errors::{agent_err, error_chain, exec_err, host_err, spawn_err};
use streams::{pump_attach, pump_exec, until_error};

/// The container runtime as the daemon's backend.
pub struct RuncBackend {
    data_dir: std::path::PathBuf,
    runtime: Arc<ContainerRuntime>,
    images: Arc<Images>,
    agents: Mutex<HashMap<String, AgentClient>>,
    /// Sandboxes are marked mergeable (`Config::memory_merge`).
    memory_merge: bool,
    /// Pulls images from registries into `<data>/blobs`.
    puller: Arc<registry::Puller>,
    /// Named volumes, `<data>/volumes`.
    volumes: runtime::volume::Volumes,
    /// Resolvers of sandboxes whose egress lists name hosts.
    resolvers: dns::Resolvers,
}

impl RuncBackend {
    /// The runtime for `config.data_dir` on the real host.
    pub fn open(config: &Config) -> Result<Arc<dyn Backend>, BackendError> {
        Ok(Arc::new(Self::open_concrete(config)?))
    }

    fn open_concrete(config: &Config) -> Result<RuncBackend, BackendError> {
        runtime::host::runc_version::check().map_err(host_err)?;
        let data = config.data_dir.clone();
        let disks = Disks::open_with(data.join("store"), config.disk_flush).map_err(host_err)?;
        // Pulls and unpacks keep to the import cap and the free-space floor of imports.
        let floor = crate::config::IMPORT_SPACE_FLOOR;
        let images = Arc::new(
            Images::new(disks.store().clone(), data.join("images")).with_unpack_limits(
                runtime::image::UnpackLimits {
                    max_bytes: config.max_import_bytes,
                    floor_bytes: floor,
                },
            ),
        );
        let mut rc = RuntimeConfig::new(&data).map_err(host_err)?;
        rc.ready_timeout = Duration::from_secs(30);
        if config.memory_merge
            && runtime::ksm::ensure_running(Default::default()).map_err(host_err)?
        {
            tracing::info!("started the kernel's page merging (ksmd) for memory_merge");
        }
        if config.cgroup_favor_dynmods {
            match runtime::cgroup_tuning::favor_dynmods() {
                Ok(true) => tracing::info!("turned favordynmods on for the cgroup2 mount"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "cgroup_favor_dynmods: left as it was"),
            }
        }
        let lazy = config.lazy_restore && runtime::host::lazy::supported();
        if config.lazy_restore && !lazy {
            tracing::warn!(
                "lazy_restore: CRIU or the kernel lacks uffd-noncoop; restores are eager"
            );
        }
        let host = RealHost::new(disks, "/run/sandfork")
            .with_memory_merge(config.memory_merge)
            .with_lazy_pages(lazy);
        let runtime = Arc::new(ContainerRuntime::new(rc, Arc::new(host)));
        let blobs = registry::BlobStore::open(data.join("blobs"))
            .map_err(|e| BackendError::Host(model::error_chain(&e)))?
            .with_floor(floor);
        let registries = registry::RegistryConfig {
            ca_certs: config.registry_ca.clone(),
            insecure: config.insecure_registries.clone(),
            docker_config: config.registry_docker_config,
            max_image_bytes: Some(config.max_import_bytes),
        };
        let resolvers = dns::Resolvers::new(config, runtime.clone())?;
        Ok(RuncBackend {
            resolvers,
            puller: Arc::new(registry::Puller::new(registries, blobs)),
            volumes: runtime::volume::Volumes::new(data.join("volumes")),
            memory_merge: config.memory_merge,
            data_dir: data,
            runtime,
            images,
            agents: Mutex::new(HashMap::new()),
        })
    }

    fn agent(&self, id: &str) -> BackendResult<AgentClient> {
        let agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        agents.get(id).cloned().ok_or_else(|| {
            BackendError::Unavailable(format!("Sandbox {id} has no agent connection"))
        })
    }

    fn remember(&self, handle: &runtime::SandboxHandle) {
        let client = handle.agent();
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle.id.clone(), client);
    }

    /// A sandbox started: its agent is remembered and, with `internet`, its resolver
    /// started (on failure the sandbox is taken down again).
    async fn started(&self, spec: &BootSpec, handle: &runtime::SandboxHandle) -> BackendResult<()> {
        self.remember(handle);
        let lists = dns::Lists::parse(&spec.network.allow_out, &spec.network.deny_out)?;
        if let Err(e) = self
            .resolvers
            .started(&spec.id, handle.net.clone(), &lists)
            .await
        {
            let _ = self.destroy(&spec.id).await;
            return Err(e);
        }
        Ok(())
    }

    /// The image's defaults when its name still points at the same layer.
    fn image_ref(&self, i: &ImageSpec) -> ImageRef {
        match self.images.get(&i.name) {
            Ok(meta) if meta.layer == i.layer_id => meta.to_ref(),
            _ => ImageRef {
                name: i.name.clone(),
                layer: i.layer_id.clone(),
                env: BTreeMap::new(),
                cwd: "/".into(),
                user: None,
            },
        }
    }

    /// The runtime's spec of a sandbox; its volumes are mounted on the host first.
    fn spec(&self, b: &BootSpec) -> BackendResult<SandboxSpec> {
        let network = if b.network.internet {
            let lists = dns::Lists::parse(&b.network.allow_out, &b.network.deny_out)?;
            NetworkMode::Internet {
                by_name: Some(lists.by_name()),
                allow_out: lists.allow,
                deny_out: lists.deny,
            }
        } else {
            NetworkMode::None
        };
        let volumes = b
            .volumes
            .iter()
            .map(|v| {
                let source = self.volumes.ensure_mounted(&v.name).map_err(|e| match e {
                    runtime::Error::NotFound(_) => BackendError::NotFound(format!(
                        "Volume {} not found (mounted at {})",
                        v.name, v.path
                    )),
                    other => host_err(other),
                })?;
                Ok(runtime::spec::VolumeMount {
                    name: v.name.clone(),
                    source,
                    destination: v.path.clone(),
                    read_only: v.read_only,
                })
            })
            .collect::<BackendResult<Vec<_>>>()?;
        Ok(SandboxSpec {
            id: b.id.clone(),
            image: self.image_ref(&b.image),
            resources: Resources {
                cpus: b.cpus,
                memory_mb: b.memory_mb,
                disk_mb: b.disk_mb,
                ..Resources::default()
            },
            // Secrets reach the sandbox like env, only at create and restore.
            env: b
                .env
                .iter()
                .chain(&b.secrets)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            network,
            volumes,
        })
    }
}

fn volume_data(v: runtime::volume::VolumeInfo) -> VolumeData {
    VolumeData {
        name: v.name,
        size_mb: v.size_mb,
        used_bytes: v.used_bytes,
        created: v.created,
    }
}

fn volume_err(e: runtime::Error) -> BackendError {
    match e {
        runtime::Error::NotFound(m) => BackendError::NotFound(format!("Volume {m} not found")),
        runtime::Error::Exists(m) => BackendError::Conflict(format!("{m} exists already")),
        runtime::Error::InvalidSpec(m) => BackendError::InvalidInput(m),
        other => host_err(other),
    }
}

fn booted(h: &runtime::SandboxHandle) -> Booted {
    Booted {
        address: h.address.map(|a| a.to_string()),
    }
}

#[async_trait]
impl Backend for RuncBackend {
    fn block_store(&self) -> Option<blockstore::Store> {
        Some(self.images.store().clone())
    }

    fn host_disk(&self) -> Option<HostDisk> {
        let free = runtime::space::free_bytes(&self.data_dir).ok()?;
        Some(HostDisk {
            free_mb: free >> 20,
        })
    }

    fn host_merge(&self) -> Option<HostMerge> {
        if !self.memory_merge {
            return None;
        }
        let s = runtime::ksm::stats()?;
        Some(HostMerge {
            saved_bytes: s.saved_bytes,
            cpu_ms: s.cpu_ms,
            full_scans: s.full_scans,
        })
    }

    fn host_memory(&self) -> Option<HostMemory> {
        let (total_mb, available_mb) = runtime::space::memory_mb().ok()?;
        Some(HostMemory {
            total_mb,
            available_mb,
        })
    }

    async fn cleanup_stale(&self, keep: &[String]) -> BackendResult<()> {
        // First: the steps below stop at their first error.
        let images = self.images.clone();
        let builds = tokio::task::spawn_blocking(move || images.remove_stale_builds())
            .await
            .unwrap_or_default();
        if !builds.is_empty() {
            tracing::info!(count = builds.len(), "removed interrupted image builds");
        }
        // Blobs of pulls a crash cut short, and of images removed before they were
        // collected.
        self.collect_blobs().await;
        let removed = self.runtime.cleanup_stale().await.map_err(host_err)?;
        if !removed.is_empty() {
            tracing::info!(count = removed.len(), "removed stale sandboxes");
        }
        for id in self.runtime.list().await.map_err(host_err)? {
            if !keep.contains(&id) {
                tracing::info!(sandbox = %id, "removing sandbox unknown to the state");
                self.runtime.destroy(&id).await.map_err(host_err)?;
            }
        }
        Ok(())
    }

    async fn create(&self, spec: &BootSpec) -> BackendResult<Booted> {
        let h = self
            .runtime
            .create(self.spec(spec)?)
            .await
            .map_err(host_err)?;
        self.started(spec, &h).await?;
        Ok(booted(&h))
    }

    async fn adopt(&self, spec: &BootSpec) -> BackendResult<Booted> {
        let h = self.runtime.adopt(&spec.id).await.map_err(host_err)?;
        h.agent()
            .wait_ready(Duration::from_secs(5))
            .await
            .map_err(agent_err)?;
        self.remember(&h);
        let lists = dns::Lists::parse(&spec.network.allow_out, &spec.network.deny_out)?;
        if let Err(e) = self
            .resolvers
            .started(&spec.id, h.net.clone(), &lists)
            .await
        {
            tracing::warn!(sandbox = %spec.id, error = %e, "adopted without its DNS resolver");
        }
        Ok(booted(&h))
    }

    async fn destroy(&self, id: &str) -> BackendResult<()> {
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.resolvers.stop(id).await;
        // A disk server that is still exiting can hold the disk for a moment: retry briefly.
        let mut attempt = 0;
        loop {
            match self.runtime.destroy(id).await {
                Ok(()) | Err(runtime::Error::NotFound(_)) => return Ok(()),
                Err(e) if attempt >= 4 => return Err(host_err(e)),
                Err(e) => tracing::debug!(sandbox = %id, error = %e, "destroy retry"),
            }
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
        }
    }

    async fn dead_reason(&self, id: &str) -> BackendResult<Option<String>> {
        let found = self.runtime.liveness(id).await.map_err(host_err)?;
        Ok(found.reason())
    }

    async fn logs(
        &self,
        id: &str,
        since: u64,
        follow: bool,
    ) -> BackendResult<Stream<Vec<proto::agent::LogLine>>> {
        let stream = self
            .agent(id)?
            .logs(since, follow)
            .await
            .map_err(agent_err)?;
        Ok(streams::pump_logs(stream))
    }

    async fn oom_kills(&self, id: &str) -> BackendResult<u64> {
        self.runtime.oom_kills(id).await.map_err(host_err)
    }

    async fn disk_held_writes(&self, id: &str) -> BackendResult<u64> {
        self.runtime.disk_held_writes(id).await.map_err(host_err)
    }

    async fn stats(&self, id: &str) -> BackendResult<crate::backend::ResourceUse> {
        let s = self.runtime.stats(id).await.map_err(host_err)?;
        Ok(crate::backend::ResourceUse {
            cpu_seconds: s.usage.cpu_nanos as f64 / 1e9,
            memory_bytes: s.usage.memory_bytes,
            memory_limit_bytes: s.usage.memory_limit_bytes,
            pids: s.usage.pids,
            oom_kills: s.usage.oom_kills,
            disk_used_bytes: s.disk_used_bytes,
            disk_total_bytes: s.disk_total_bytes,
            net_rx_bytes: s.net.rx_bytes,
            net_tx_bytes: s.net.tx_bytes,
            net_rx_packets: s.net.rx_packets,
            net_tx_packets: s.net.tx_packets,
        })
    }

    async fn exec(&self, id: &str, req: ExecRequest) -> BackendResult<Stream<ExecEvent>> {
        let stream = self.agent(id)?.exec(req).await.map_err(exec_err)?;
        Ok(pump_exec(stream))
    }

    async fn spawn(&self, id: &str, req: SpawnRequest) -> BackendResult<ProcessInfo> {
        let agent = self.agent(id)?;
        let (pid, _) = agent.spawn(req).await.map_err(spawn_err)?;
        let list = agent.list_processes().await.map_err(agent_err)?;
        list.into_iter()
            .find(|p| p.id == pid)
            .ok_or_else(|| BackendError::NotFound(format!("Process {pid} not found")))
    }

    async fn connect_port(&self, id: &str, port: u16) -> BackendResult<tokio::net::TcpStream> {
        self.agent(id)?;
        let ns = runtime::net::netns_path(&runtime::layout::Names::for_id(id).netns);
        let connect = tokio::task::spawn_blocking(move || {
            runtime::net::connect_in_netns(&ns, port, CONNECT_TIMEOUT)
        });
        let stream = connect
            .await
            .map_err(|e| BackendError::Host(e.to_string()))?
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::TimedOut => {
                    BackendError::Refused(format!(
                        "Nothing listens on port {port} in sandbox {id} ({e})"
                    ))
                }
                _ => BackendError::Host(format!("Cannot reach port {port} in sandbox {id}: {e}")),
            })?;
        stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(stream))
            .map_err(|e| BackendError::Host(e.to_string()))
    }

    async fn spawn_pty(
        &self,
        id: &str,
        req: SpawnRequest,
        size: proto::agent::PtySize,
    ) -> BackendResult<ProcessInfo> {
        let agent = self.agent(id)?;
        let (pid, _) = agent.spawn_pty(req, size).await.map_err(spawn_err)?;
        let list = agent.list_processes().await.map_err(agent_err)?;
        list.into_iter()
            .find(|p| p.id == pid)
            .ok_or_else(|| BackendError::NotFound(format!("Process {pid} not found")))
    }

    async fn pty_connect(&self, id: &str, pid: u64, offset: u64) -> BackendResult<PtyChannel> {
        let (output, input) = self
            .agent(id)?
            .pty_connect(pid, offset)
            .await
            .map_err(agent_err)?;
        Ok(PtyChannel {
            output: pump_attach(output),
            input: streams::pump_pty_input(input),
        })
    }

    async fn resize_pty(
        &self,
        id: &str,
        pid: u64,
        size: proto::agent::PtySize,
    ) -> BackendResult<()> {
        self.agent(id)?
            .resize_pty(pid, size)
            .await
            .map_err(agent_err)
    }

    async fn processes(&self, id: &str) -> BackendResult<Vec<ProcessInfo>> {
        self.agent(id)?.list_processes().await.map_err(agent_err)
    }

    async fn set_egress(
        &self,
        id: &str,
        allow_out: &[String],
        deny_out: &[String],
    ) -> BackendResult<()> {
        let lists = dns::Lists::parse(allow_out, deny_out)?;
        // The resolver takes the new names first, so no answer under the old ones lands
        // in the sets after the runtime has emptied them.
        self.resolvers.changed(id, &lists).await?;
        self.runtime
            .set_egress(
                id,
                lists.allow.clone(),
                lists.deny.clone(),
                Some(lists.by_name()),
            )
            .await
            .map_err(host_err)
    }

    async fn restart(&self, id: &str, pid: u64) -> BackendResult<u64> {
        let (new_pid, _) = self.agent(id)?.restart(pid).await.map_err(exec_err)?;
        Ok(new_pid)
    }

    async fn stop(&self, id: &str, pid: u64) -> BackendResult<()> {
        self.agent(id)?.stop(pid).await.map_err(agent_err)
    }

    async fn attach(
        &self,
        id: &str,
        pid: u64,
        offsets: (u64, u64),
        follow: bool,
    ) -> BackendResult<Stream<ExecEvent>> {
        let stream = self
            .agent(id)?
            .attach(pid, offsets, follow)
            .await
            .map_err(agent_err)?;
        Ok(pump_attach(stream))
    }

    async fn write_stdin(&self, id: &str, pid: u64, data: Bytes) -> BackendResult<()> {
        self.agent(id)?
            .write_stdin(pid, &data)
            .await
            .map_err(agent_err)
    }

    async fn close_stdin(&self, id: &str, pid: u64) -> BackendResult<()> {
        self.agent(id)?.close_stdin(pid).await.map_err(agent_err)
    }

    async fn signal(&self, id: &str, pid: u64, signal: i32) -> BackendResult<()> {
        self.agent(id)?
            .signal(pid, signal, true)
            .await
            .map_err(agent_err)
    }

    async fn wait(&self, id: &str, pid: u64, timeout_ms: Option<u64>) -> BackendResult<ExitInfo> {
        let timeout = timeout_ms.map(Duration::from_millis);
        self.agent(id)?.wait(pid, timeout).await.map_err(agent_err)
    }

    async fn read_file(&self, id: &str, path: &str) -> BackendResult<(FileStat, Stream<Bytes>)> {
        let mut dl = self.agent(id)?.read_file(path).await.map_err(agent_err)?;
        let stat = dl.stat.clone();
        let (tx, rx) = mpsc::channel(STREAM_DEPTH);
        tokio::spawn(async move {
            loop {
                let item = match dl.chunk().await {
                    Ok(Some(c)) => Ok(Bytes::from(c)),
                    Ok(None) => return,
                    Err(e) => Err(agent_err(e)),
                };
                let last = item.is_err();
                if tx.send(item).await.is_err() || last {
                    return;
                }
            }
        });
        Ok((stat, rx))
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        how: WriteAs,
        data: Stream<Bytes>,
    ) -> BackendResult<u64> {
        let agent = self.agent(id)?;
        let (abort_tx, abort_rx) = tokio::sync::oneshot::channel();
        let mut reader = tokio_util::io::StreamReader::new(Box::pin(until_error(data, abort_tx)));
        let opts = WriteOptions {
            mode: how.mode,
            create_parents: true,
            owner: how.owner,
        };
        // On an aborted upload the agent connection is dropped before its end-of-file, so
        // the agent discards the partial file.
        let written = async {
            match agent.write_file(path, opts, &mut reader).await {
                // An agent from before owned writes (a restored older snapshot) refused it
                // before reading any data: the plain write, then `chown` in the sandbox.
                Err(e) if e.predates_request() => {
                    let plain = WriteOptions {
                        owner: None,
                        ..opts
                    };
                    let n = agent.write_file(path, plain, &mut reader).await?;
                    chown_in_sandbox(&agent, path, opts.owner).await.map(|()| n)
                }
                other => other,
            }
        };
        tokio::select! {
            r = written => r.map_err(agent_err),
            Ok(e) = abort_rx => Err(e),
        }
    }

    async fn list_dir(&self, id: &str, path: &str) -> BackendResult<Vec<DirEntry>> {
        self.agent(id)?.list_dir(path).await.map_err(agent_err)
    }

    async fn watch_dir(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> BackendResult<Stream<Vec<proto::agent::FsEvent>>> {
        let stream = self
            .agent(id)?
            .watch_dir(path, recursive)
            .await
            .map_err(agent_err)?;
        Ok(streams::pump_watch(stream))
    }

    async fn stat(&self, id: &str, path: &str) -> BackendResult<FileStat> {
        self.agent(id)?.stat(path).await.map_err(agent_err)
    }

    async fn remove(&self, id: &str, path: &str, recursive: bool) -> BackendResult<()> {
        self.agent(id)?
            .remove(path, recursive)
            .await
            .map_err(agent_err)
    }

    async fn mkdir(&self, id: &str, path: &str, parents: bool) -> BackendResult<()> {
        self.agent(id)?
            .mkdir(path, parents, None)
            .await
            .map_err(agent_err)
    }

    async fn build_image(
        &self,
        req: &ImageBuild,
        progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        let source = match req.builder.as_str() {
            "busybox" => Source::Busybox,
            "debian" => Source::Debian,
            "python" => Source::Python,
            "browser" => Source::Browser,
            other => {
                return Err(BackendError::InvalidInput(format!(
                    "Unknown builder {other:?}"
                )))
            }
        };
        let spec = BuildSpec {
            name: req.name.clone(),
            source,
            apt: req.apt.clone(),
            pip: req.pip.clone(),
        };
        self.build(spec, progress).await
    }

    async fn build_dockerfile(
        &self,
        name: &str,
        file: &runtime::image::dockerfile::Dockerfile,
        context: &std::path::Path,
        base: &ImageSpec,
        progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        RuncBackend::build_dockerfile(self, name, file, context, base, progress).await
    }

    async fn image_from_layer(
        &self,
        name: &str,
        layer: &str,
        base: &str,
        env: &BTreeMap<String, String>,
    ) -> BackendResult<BuiltImage> {
        let layer: blockstore::LayerId = layer
            .parse()
            .map_err(|e| BackendError::Host(format!("Snapshot layer id: {e}")))?;
        let images = self.images.clone();
        let (name, base, env) = (name.to_string(), base.to_string(), env.clone());
        let meta = tokio::task::spawn_blocking(move || {
            let size = images
                .store()
                .layer_info(&layer)
                .map_err(|e| runtime::Error::Disk(Box::new(e)))?
                .size;
            let mut defaults = images
                .get(&base)
                .map(|m| runtime::image::Defaults {
                    env: m.env,
                    cwd: Some(m.cwd),
                    user: m.user,
                    entrypoint: m.entrypoint,
                    cmd: m.cmd,
                    exposed_ports: m.exposed_ports,
                    labels: m.labels,
                    source: None,
                    digest: None,
                    blobs: Vec::new(),
                })
                .unwrap_or_default();
            defaults.env.extend(env);
            images.publish_layer(&name, &layer, size, defaults)
        })
        .await
        .map_err(|e| BackendError::Host(e.to_string()))?
        .map_err(host_err)?;
        Ok(BuiltImage {
            layer_id: meta.layer,
            size_bytes: meta.size,
        })
    }

    async fn import_image(
        &self,
        dir: &std::path::Path,
        name: Option<&str>,
    ) -> BackendResult<(String, BuiltImage)> {
        let images = self.images.clone();
        let (dir, name) = (dir.to_path_buf(), name.map(str::to_string));
        tokio::task::spawn_blocking(move || {
            let invalid = |e: runtime::Error| BackendError::InvalidInput(model::error_chain(&e));
            let archive = runtime::image::archive::read_archive(&dir).map_err(invalid)?;
            let name = name.or(archive.name).ok_or_else(|| {
                BackendError::InvalidInput(
                    "The archive names no image: give a name (sandfork image import -t NAME)"
                        .into(),
                )
            })?;
            let name = if registry::looks_like_reference(&name) {
                registry::canonical(&name)
                    .map_err(|e| BackendError::InvalidInput(model::error_chain(&e)))?
            } else {
                name
            };
            runtime::image::validate_name(&name).map_err(invalid)?;
            let meta = images
                .import_layers(&name, &archive.layers, archive.defaults, &|_| {})
                .map_err(|e| match e {
                    runtime::Error::Layer { .. } => invalid(e),
                    other => host_err(other),
                })?;
            Ok((
                name,
                BuiltImage {
                    layer_id: meta.layer,
                    size_bytes: meta.size,
                },
            ))
        })
        .await
        .map_err(|e| BackendError::Host(e.to_string()))?
    }

    async fn export_image(
        &self,
        name: &str,
        out: &std::path::Path,
        docker: bool,
    ) -> BackendResult<()> {
        self.export_archive(name, out, docker).await
    }

    async fn push_image(
        &self,
        name: &str,
        reference: &str,
        credentials: Option<(String, String)>,
    ) -> BackendResult<String> {
        self.push(name, reference, credentials).await
    }

    async fn pull_image(
        &self,
        reference: &str,
        credentials: Option<(String, String)>,
        progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        self.pull(reference, credentials, progress).await
    }

    async fn create_volume(&self, name: &str, size_mb: u64) -> BackendResult<VolumeData> {
        let (volumes, name) = (self.volumes.clone(), name.to_string());
        let v = tokio::task::spawn_blocking(move || volumes.create(&name, size_mb))
            .await
            .map_err(|e| BackendError::Host(e.to_string()))?
            .map_err(volume_err)?;
        Ok(volume_data(v))
    }

    async fn volumes(&self) -> BackendResult<Vec<VolumeData>> {
        let volumes = self.volumes.clone();
        let list = tokio::task::spawn_blocking(move || volumes.list())
            .await
            .map_err(|e| BackendError::Host(e.to_string()))?
            .map_err(volume_err)?;
        Ok(list.into_iter().map(volume_data).collect())
    }

    async fn release_volume(&self, name: &str) -> BackendResult<()> {
        let (volumes, name) = (self.volumes.clone(), name.to_string());
        tokio::task::spawn_blocking(move || volumes.unmount(&name))
            .await
            .map_err(|e| BackendError::Host(e.to_string()))?
            .map_err(volume_err)
    }

    async fn delete_volume(&self, name: &str) -> BackendResult<()> {
        let (volumes, name) = (self.volumes.clone(), name.to_string());
        tokio::task::spawn_blocking(move || volumes.remove(&name))
            .await
            .map_err(|e| BackendError::Host(e.to_string()))?
            .map_err(volume_err)
    }

    async fn image_config(&self, name: &str) -> BackendResult<ImageConfig> {
        let (images, name) = (self.images.clone(), name.to_string());
        let m = tokio::task::spawn_blocking(move || images.get(&name))
            .await
            .map_err(|e| BackendError::Host(e.to_string()))?
            .map_err(host_err)?;
        Ok(ImageConfig {
            source: m.source,
            digest: m.digest,
            env: m.env,
            working_dir: m.cwd,
            user: m.user,
            entrypoint: m.entrypoint,
            cmd: m.cmd,
            exposed_ports: m.exposed_ports,
            labels: m.labels,
        })
    }

    async fn remove_image(&self, name: &str) -> BackendResult<()> {
        let (images, name) = (self.images.clone(), name.to_string());
        tokio::task::spawn_blocking(move || images.remove(&name))
            .await
            .map_err(|e| BackendError::Host(e.to_string()))?
            .map_err(host_err)?;
        self.collect_blobs().await;
        Ok(())
    }

    async fn images(&self) -> BackendResult<Vec<(String, BuiltImage)>> {
        let images = self.images.clone();
        let list = tokio::task::spawn_blocking(move || images.list())
            .await
            .map_err(|e| BackendError::Host(e.to_string()))?
            .map_err(host_err)?;
        Ok(list
            .into_iter()
            .map(|m| {
                let built = BuiltImage {
                    layer_id: m.layer,
                    size_bytes: m.size,
                };
                (m.name, built)
            })
            .collect())
    }

    async fn checkpoint(
        &self,
        id: &str,
        kind: model::SnapshotType,
        memory_dir: Option<std::path::PathBuf>,
    ) -> BackendResult<crate::backend::Checkpointed> {
        self.checkpoint_sandbox(id, kind, memory_dir).await
    }

    async fn restore(
        &self,
        spec: &BootSpec,
        from: crate::backend::RestoreFrom,
    ) -> BackendResult<Booted> {
        self.restore_sandbox(spec, from).await
    }

    async fn park(
        &self,
        spec: &BootSpec,
        from: crate::backend::RestoreFrom,
    ) -> BackendResult<Booted> {
        self.park_sandbox(spec, from).await
    }

    async fn hand_over(
        &self,
        id: &str,
        identity: proto::agent::Identity,
        hooks: Vec<proto::agent::ExecRequest>,
    ) -> BackendResult<()> {
        let opts = runtime::RestoreOptions {
            identity: Some(identity),
            hooks,
        };
        self.runtime.hand_over(id, opts).await.map_err(host_err)
    }

    async fn share_memory(
        &self,
        dir: &std::path::Path,
        parent: &std::path::Path,
    ) -> BackendResult<u64> {
        snapshots::share_images(dir, parent).await
    }

    async fn flatten_memory(
        &self,
        dir: &std::path::Path,
        out: &std::path::Path,
    ) -> BackendResult<()> {
        snapshots::flatten_images(dir, out).await
    }

    async fn memory_digest(&self, dir: &std::path::Path) -> BackendResult<[u8; 32]> {
        snapshots::memory_digest(dir).await
    }

    async fn pin_layer(&self, name: &str, layer: &str) -> BackendResult<()> {
        self.pin(name, layer).await
    }

    async fn unpin_layer(&self, name: &str) -> BackendResult<()> {
        self.unpin(name).await
    }

    async fn collect_garbage(&self) -> BackendResult<()> {
        self.gc().await
    }

    async fn export_layer(
        &self,
        layer: &str,
        base: Option<&str>,
        out: std::path::PathBuf,
    ) -> BackendResult<()> {
        self.export(layer, base, out).await
    }

    async fn import_layer(&self, input: std::path::PathBuf) -> BackendResult<String> {
        self.import(input).await
    }
}

/// `chown UID:GID -- PATH` run in the sandbox (for an agent without owned writes).
async fn chown_in_sandbox(
    agent: &AgentClient,
    path: &str,
    owner: Option<(u32, u32)>,
) -> agent_client::Result<()> {
    let Some((uid, gid)) = owner else {
        return Ok(());
    };
    let req = ExecRequest {
        command: "chown".into(),
        args: vec![format!("{uid}:{gid}"), "--".into(), path.into()],
        ..Default::default()
    };
    let out = agent.exec_collect(req, 4096).await?;
    if out.code() == Some(0) {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(agent_client::ClientError::Agent(
        proto::agent::AgentError::new(
            proto::agent::ErrorKind::InvalidInput,
            format!("chown {path}: {why}"),
        ),
    ))
}
