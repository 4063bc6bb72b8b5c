//! What the manager needs from the machinery that runs sandboxes.
//!
//! The manager owns lifecycle decisions; a [`Backend`] carries them out (containers, disks,
//! networking) and forwards data-plane work (exec, files, processes) to the agent inside a
//! sandbox. Streams are bounded channels, so a slow HTTP client slows the agent connection
//! down instead of growing buffers in the daemon.

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
use bytes::Bytes;
use model::SnapshotType;
use proto::agent::{
    DirEntry, ExecRequest, ExitInfo, FileStat, OutputStream, ProcessInfo, SpawnRequest,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// Capacity of every stream channel between the backend and the API (in chunks).
pub const STREAM_DEPTH: usize = 16;

/// Why the backend refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// A path, process or image the request named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request was malformed for the agent or runtime.
    #[error("{0}")]
    InvalidInput(String),
    /// The command could not be started.
    #[error("{0}")]
    ExecFailed(String),
    /// Something exceeded a size limit.
    #[error("{0}")]
    TooLarge(String),
    /// The target exists in a state that refuses the request (e.g. not a directory).
    #[error("{0}")]
    Conflict(String),
    /// A wait ran out of time.
    #[error("{0}")]
    TimedOut(String),
    /// The backend cannot do this at all.
    #[error("{0}")]
    Unsupported(String),
    /// The sandbox or its agent is unreachable or broken.
    #[error("{0}")]
    Unavailable(String),
    /// A disk (the host's, or the sandbox's own) ran out of room.
    #[error("{0}")]
    StorageFull(String),
    /// The host failed to set something up (runc, disk, network).
    #[error("{0}")]
    Host(String),
    /// A registry could not be reached, refused the credentials, or sent something that
    /// failed verification.
    #[error("{0}")]
    Registry(String),
    /// Nothing answered on a sandbox's port.
    #[error("{0}")]
    Refused(String),
}

/// Result of backend calls.
pub type BackendResult<T> = Result<T, BackendError>;

/// A stream of items from the backend.
pub type Stream<T> = mpsc::Receiver<BackendResult<T>>;

/// How a sandbox reaches the network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkSpec {
    pub internet: bool,
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
}

/// A sealed base image as the backend knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSpec {
    pub name: String,
    pub layer_id: String,
}

/// Everything needed to boot (or re-adopt) one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BootSpec {
    pub id: String,
    pub image: ImageSpec,
    pub cpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub env: BTreeMap<String, String>,
    /// Like `env`, but never copied into a snapshot or an export: given at create and at
    /// restore only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    pub network: NetworkSpec,
    /// Named volumes bound into the sandbox; a snapshot keeps the list, not the data, and
    /// a restore binds them again by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMountSpec>,
}

/// A named volume bound into a sandbox at `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMountSpec {
    pub name: String,
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

impl BootSpec {
    /// The spec a snapshot keeps: everything but the secrets.
    pub fn without_secrets(&self) -> BootSpec {
        BootSpec {
            secrets: BTreeMap::new(),
            ..self.clone()
        }
    }
}

/// What a booted sandbox reports back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Booted {
    /// Its network address, when it has one besides loopback.
    pub address: Option<String>,
}

/// One event of a running process's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Output {
        stream: OutputStream,
        offset: u64,
        data: Bytes,
    },
    /// Output in `from..to` was dropped from the agent's bounded buffer.
    Dropped {
        stream: OutputStream,
        from: u64,
        to: u64,
    },
    Exit(ExitInfo),
}

/// What a terminal client sends: typed input or a new size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyInput {
    Data(Bytes),
    Resize(proto::agent::PtySize),
}

/// An attached terminal session: its output (ends with [`ExecEvent::Exit`], or without it
/// when the session was interrupted) and where its input goes. Dropping both detaches.
pub struct PtyChannel {
    pub output: Stream<ExecEvent>,
    pub input: mpsc::Sender<PtyInput>,
}

/// An image build request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageBuild {
    pub name: String,
    pub builder: String,
    pub apt: Vec<String>,
    pub pip: Vec<String>,
}

/// A named volume as the backend holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeData {
    pub name: String,
    pub size_mb: u64,
    pub used_bytes: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
}

fn no_volumes() -> BackendError {
    BackendError::Unsupported("This backend has no volumes".into())
}

/// An image's config as sandboxes see it, and its origin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    pub source: Option<String>,
    pub digest: Option<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub working_dir: String,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub exposed_ports: Vec<String>,
    pub labels: std::collections::BTreeMap<String, String>,
}

/// A built image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    pub layer_id: String,
    pub size_bytes: u64,
}

/// The host's memory, in MiB, as the kernel counts it (`MemTotal`, `MemAvailable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    pub total_mb: u64,
    pub available_mb: u64,
}

/// What merging equal pages across sandboxes has done, host-wide (`runtime::ksm`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostMerge {
    /// Memory saved: bytes mapped from a page shared with another mapping.
    pub saved_bytes: u64,
    /// CPU the merging has used since boot, in milliseconds.
    pub cpu_ms: u64,
    /// Complete passes over the memory of mergeable sandboxes.
    pub full_scans: u64,
}

/// Free space, in MiB, of the host filesystem holding the data directory (sandbox disks
/// grow into it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostDisk {
    pub free_mb: u64,
}

pub use api_types::ResourceUse;

/// How a file is written into a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteAs {
    /// Permission bits; default: the replaced file's, else 0644.
    pub mode: Option<u32>,
    /// The account (`uid`, `gid`) the file and the directories the write creates belong
    /// to; `None`: the replaced file's owner (new ones are root's).
    pub owner: Option<(u32, u32)>,
}

/// The runtime side of the daemon.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The host's memory now, or `None` where it cannot be known (admission then applies
    /// its caps only).
    fn host_memory(&self) -> Option<HostMemory> {
        None
    }
    /// What page merging across sandboxes has done, or `None` when it is off.
    fn host_merge(&self) -> Option<HostMerge> {
        None
    }
    /// The data directory's filesystem now, or `None` where it cannot be known.
    fn host_disk(&self) -> Option<HostDisk> {
        None
    }
    /// The block store sandbox disks live in, for publishing to and pulling from an
    /// object store; `None` where disks are not block-store disks.
    fn block_store(&self) -> Option<blockstore::Store> {
        None
    }
    /// Removes every host resource of sandboxes not in `keep` (after a crash).
    async fn cleanup_stale(&self, keep: &[String]) -> BackendResult<()>;
    /// Boots a sandbox; on error nothing of it is left behind.
    async fn create(&self, spec: &BootSpec) -> BackendResult<Booted>;
    /// Takes over a sandbox left running by a previous daemon.
    async fn adopt(&self, spec: &BootSpec) -> BackendResult<Booted>;
    /// Replaces the egress lists (CIDRs) of a running sandbox that has internet access.
    async fn set_egress(
        &self,
        _id: &str,
        _allow_out: &[String],
        _deny_out: &[String],
    ) -> BackendResult<()> {
        Err(BackendError::Unsupported(
            "changing egress rules is not supported by this backend".into(),
        ))
    }
    /// Stops a sandbox and removes everything it held. Idempotent.
    async fn destroy(&self, id: &str) -> BackendResult<()>;
    /// Why a running sandbox is dead (its agent or disk server died), or `None` while its
    /// parts are alive. Cheap: the manager asks every second.
    async fn dead_reason(&self, _id: &str) -> BackendResult<Option<String>> {
        Ok(None)
    }

    /// Watches directory `path` in the sandbox (recursively on request): batches of
    /// changes until the receiver is dropped.
    async fn watch_dir(
        &self,
        _id: &str,
        _path: &str,
        _recursive: bool,
    ) -> BackendResult<Stream<Vec<proto::agent::FsEvent>>> {
        Err(BackendError::Unsupported(
            "This backend cannot watch directories".into(),
        ))
    }

    /// The sandbox log (what its background processes write) from line `since`; with
    /// `follow`, new lines as they come until the receiver is dropped.
    async fn logs(
        &self,
        _id: &str,
        _since: u64,
        _follow: bool,
    ) -> BackendResult<Stream<Vec<proto::agent::LogLine>>> {
        Err(BackendError::Unsupported(
            "This backend keeps no sandbox logs".into(),
        ))
    }

    /// How many processes the OOM killer has killed in a running sandbox; cheap (the
    /// liveness watch asks every second).
    async fn oom_kills(&self, id: &str) -> BackendResult<u64> {
        Ok(self.stats(id).await?.oom_kills)
    }

    /// How many disk writes of a running sandbox wait for host space now. Backends whose
    /// disks never hold writes hold none.
    async fn disk_held_writes(&self, _id: &str) -> BackendResult<u64> {
        Ok(0)
    }

    /// What a running sandbox uses now.
    async fn stats(&self, _id: &str) -> BackendResult<ResourceUse> {
        Err(BackendError::Unsupported(
            "This backend cannot report resource use".into(),
        ))
    }

    /// A TCP connection to `port` on the sandbox's own loopback (from inside its network
    /// namespace, so a server bound to 127.0.0.1 in the sandbox is reached too).
    async fn connect_port(&self, _id: &str, _port: u16) -> BackendResult<tokio::net::TcpStream> {
        Err(BackendError::Unsupported(
            "This backend cannot reach sandbox ports".into(),
        ))
    }

    /// Starts a background process on a new terminal.
    async fn spawn_pty(
        &self,
        _id: &str,
        _req: SpawnRequest,
        _size: proto::agent::PtySize,
    ) -> BackendResult<ProcessInfo> {
        Err(BackendError::Unsupported(
            "This backend has no terminal sessions".into(),
        ))
    }

    /// Attaches to terminal process `pid` from output `offset`.
    async fn pty_connect(&self, _id: &str, _pid: u64, _offset: u64) -> BackendResult<PtyChannel> {
        Err(BackendError::Unsupported(
            "This backend has no terminal sessions".into(),
        ))
    }

    async fn resize_pty(
        &self,
        _id: &str,
        _pid: u64,
        _size: proto::agent::PtySize,
    ) -> BackendResult<()> {
        Err(BackendError::Unsupported(
            "This backend has no terminal sessions".into(),
        ))
    }

    /// Runs a command; the stream ends with [`ExecEvent::Exit`].
    async fn exec(&self, id: &str, req: ExecRequest) -> BackendResult<Stream<ExecEvent>>;
    /// Starts a background process.
    async fn spawn(&self, id: &str, req: SpawnRequest) -> BackendResult<ProcessInfo>;
    /// Stops a background process and starts its request again; returns the new pid.
    async fn restart(&self, id: &str, pid: u64) -> BackendResult<u64>;
    /// Stops a background process (a supervised one is not restarted).
    async fn stop(&self, id: &str, pid: u64) -> BackendResult<()>;
    async fn processes(&self, id: &str) -> BackendResult<Vec<ProcessInfo>>;
    /// Streams a background process's output from the given offsets.
    async fn attach(
        &self,
        id: &str,
        pid: u64,
        offsets: (u64, u64),
        follow: bool,
    ) -> BackendResult<Stream<ExecEvent>>;
    async fn write_stdin(&self, id: &str, pid: u64, data: Bytes) -> BackendResult<()>;
    async fn close_stdin(&self, id: &str, pid: u64) -> BackendResult<()>;
    async fn signal(&self, id: &str, pid: u64, signal: i32) -> BackendResult<()>;
    async fn wait(&self, id: &str, pid: u64, timeout_ms: Option<u64>) -> BackendResult<ExitInfo>;

    /// Reads a file: its metadata, then its contents in chunks.
    async fn read_file(&self, id: &str, path: &str) -> BackendResult<(FileStat, Stream<Bytes>)>;
    /// Writes a file from `data` (parents created); returns the bytes written. An error
    /// item in `data` aborts the write and leaves the old file in place.
    async fn write_file(
        &self,
        id: &str,
        path: &str,
        how: WriteAs,
        data: Stream<Bytes>,
    ) -> BackendResult<u64>;
    async fn list_dir(&self, id: &str, path: &str) -> BackendResult<Vec<DirEntry>>;
    async fn stat(&self, id: &str, path: &str) -> BackendResult<FileStat>;
    async fn remove(&self, id: &str, path: &str, recursive: bool) -> BackendResult<()>;
    async fn mkdir(&self, id: &str, path: &str, parents: bool) -> BackendResult<()>;

    /// Builds an image, reporting progress lines.
    async fn build_image(
        &self,
        req: &ImageBuild,
        progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage>;
    /// Builds image `name` from a parsed Dockerfile with its build context in `context`,
    /// on base image `base` (here already), reporting progress lines.
    async fn build_dockerfile(
        &self,
        _name: &str,
        _file: &runtime::image::dockerfile::Dockerfile,
        _context: &std::path::Path,
        _base: &ImageSpec,
        _progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        Err(BackendError::Unsupported(
            "This backend cannot build Dockerfiles".into(),
        ))
    }
    /// Publishes sealed layer `layer` (a snapshot's disk) as image `name`, with the config
    /// of image `base` (when it is still here) and `env` over it.
    async fn image_from_layer(
        &self,
        _name: &str,
        _layer: &str,
        _base: &str,
        _env: &BTreeMap<String, String>,
    ) -> BackendResult<BuiltImage> {
        Err(BackendError::Unsupported(
            "This backend cannot make images from snapshots".into(),
        ))
    }
    /// Imports the image of an unpacked archive (docker-archive or OCI layout) at `dir` as
    /// `name`, else under the name the archive gives it; returns the name and the image.
    async fn import_image(
        &self,
        _dir: &std::path::Path,
        _name: Option<&str>,
    ) -> BackendResult<(String, BuiltImage)> {
        Err(BackendError::Unsupported(
            "This backend cannot import image archives".into(),
        ))
    }
    /// Writes image `name` to `out` as an oci-archive (an OCI layout, one layer, in a
    /// tar, its index naming it `name`), or with `docker` as a docker-archive.
    async fn export_image(
        &self,
        _name: &str,
        _out: &std::path::Path,
        _docker: bool,
    ) -> BackendResult<()> {
        Err(BackendError::Unsupported(
            "This backend cannot export images".into(),
        ))
    }
    /// Pushes image `name` to `reference` (canonical); returns the manifest's URL.
    async fn push_image(
        &self,
        _name: &str,
        _reference: &str,
        _credentials: Option<(String, String)>,
    ) -> BackendResult<String> {
        Err(BackendError::Unsupported(
            "This backend cannot push images".into(),
        ))
    }
    /// Pulls image `reference` (canonical) from its registry and publishes it under that
    /// name, reporting progress lines.
    async fn pull_image(
        &self,
        _reference: &str,
        _credentials: Option<(String, String)>,
        _progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        Err(BackendError::Unsupported(
            "This backend cannot pull images from registries".into(),
        ))
    }
    /// Removes an image by name (sandboxes using its layer keep working).
    async fn remove_image(&self, name: &str) -> BackendResult<()>;
    /// Creates named volume `name` of `size_mb` MiB.
    async fn create_volume(&self, _name: &str, _size_mb: u64) -> BackendResult<VolumeData> {
        Err(no_volumes())
    }
    /// Every named volume.
    async fn volumes(&self) -> BackendResult<Vec<VolumeData>> {
        Ok(Vec::new())
    }
    /// Unmounts volume `name` from the host while no sandbox needs it.
    async fn release_volume(&self, _name: &str) -> BackendResult<()> {
        Ok(())
    }
    /// Removes volume `name` and its data (the caller checks no sandbox mounts it).
    async fn delete_volume(&self, _name: &str) -> BackendResult<()> {
        Err(no_volumes())
    }
    /// What image `name` gives its sandboxes (its config) and where it came from.
    async fn image_config(&self, name: &str) -> BackendResult<ImageConfig> {
        Err(BackendError::NotFound(format!(
            "Image {name} has no config here"
        )))
    }
    /// Every image the backend holds, by name (to put the store back in line after a
    /// crash). None by default.
    async fn images(&self) -> BackendResult<Vec<(String, BuiltImage)>> {
        Ok(Vec::new())
    }

    /// Checkpoints a running sandbox (it keeps running); memory images go to `memory_dir`.
    async fn checkpoint(
        &self,
        _id: &str,
        _kind: SnapshotType,
        _memory_dir: Option<PathBuf>,
    ) -> BackendResult<Checkpointed> {
        Err(no_snapshots())
    }
    /// Boots a sandbox from a snapshot; on error nothing of it is left behind.
    async fn restore(&self, _spec: &BootSpec, _from: RestoreFrom) -> BackendResult<Booted> {
        Err(no_snapshots())
    }
    /// Restores a sandbox from a snapshot as [`Backend::restore`] does, but with no
    /// identity or hooks yet, and freezes it (a parked fork, for the pool of ready forks).
    /// On error nothing of it is left behind.
    async fn park(&self, _spec: &BootSpec, _from: RestoreFrom) -> BackendResult<Booted> {
        Err(BackendError::Unsupported(
            "This backend cannot keep a pool of ready forks".into(),
        ))
    }
    /// Thaws a parked sandbox and gives it `identity`, then runs `hooks`: what a restore
    /// does after CRIU. On error the sandbox is left for the caller to destroy.
    async fn hand_over(
        &self,
        _id: &str,
        _identity: proto::agent::Identity,
        _hooks: Vec<proto::agent::ExecRequest>,
    ) -> BackendResult<()> {
        Err(BackendError::Unsupported(
            "This backend cannot keep a pool of ready forks".into(),
        ))
    }
    /// Makes the memory images in `dir` read every page they share with the images in
    /// `parent` from there (see `runtime::memory_images`); returns the bytes saved. An
    /// error leaves `dir` unusable: the caller discards it.
    async fn share_memory(
        &self,
        _dir: &std::path::Path,
        _parent: &std::path::Path,
    ) -> BackendResult<u64> {
        Ok(0)
    }
    /// Copies the memory images of `dir` into the empty directory `out`, self-contained
    /// (pages read from parents copied in): what an export carries.
    async fn flatten_memory(
        &self,
        _dir: &std::path::Path,
        _out: &std::path::Path,
    ) -> BackendResult<()> {
        Err(no_snapshots())
    }
    /// A digest of the pages the memory images of `dir` hold, parents followed
    /// (`runtime::memory_images::pages_digest`): equal for equal memory.
    async fn memory_digest(&self, _dir: &std::path::Path) -> BackendResult<[u8; 32]> {
        Err(no_snapshots())
    }
    /// Keeps a sealed layer (and its chain) alive under `name`.
    async fn pin_layer(&self, _name: &str, _layer: &str) -> BackendResult<()> {
        Err(no_snapshots())
    }
    /// Drops a pin and frees the layers nothing else uses.
    async fn unpin_layer(&self, _name: &str) -> BackendResult<()> {
        Err(no_snapshots())
    }
    /// Frees the layers nothing uses any more (after sandboxes from snapshots went).
    async fn collect_garbage(&self) -> BackendResult<()> {
        Ok(())
    }
    /// Writes a layer's chain as one verifiable artifact file: the whole chain, or with
    /// `base` only the layers above that ancestor.
    async fn export_layer(
        &self,
        _layer: &str,
        _base: Option<&str>,
        _out: PathBuf,
    ) -> BackendResult<()> {
        Err(no_snapshots())
    }
    /// Verifies and imports an artifact file; returns its top layer.
    async fn import_layer(&self, _input: PathBuf) -> BackendResult<String> {
        Err(no_snapshots())
    }
}

fn no_snapshots() -> BackendError {
    BackendError::Unsupported("This backend has no checkpoints".into())
}

/// A checkpoint as the backend reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpointed {
    pub layer_id: String,
    pub memory_dir: Option<PathBuf>,
    /// Bytes of the new layer plus the memory images.
    pub size_bytes: u64,
}

/// What a restore starts from and what happens in the child before it is handed out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreFrom {
    pub layer_id: String,
    pub memory_dir: Option<PathBuf>,
    pub identity: Option<proto::agent::Identity>,
    pub hooks: Vec<proto::agent::ExecRequest>,
}
