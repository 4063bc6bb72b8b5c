//! Every side effect the runtime has on the host, behind one trait, so that the lifecycle
//! logic (ordering, rollback) is unit-tested with a recording fake and no root.

pub mod checkpoint;
mod fake;
mod real;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub use checkpoint::{CheckpointHost, CriuPaths};
pub use fake::FakeHost;
pub use real::{lazy, runc_version, Disks, RealHost};

use crate::error::Result;
use crate::layout::SandboxPaths;
use crate::net::NetAlloc;

/// What runc reports about a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerStatus {
    Creating,
    Created,
    Running,
    Paused,
    Stopped,
}

/// A container as runc sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerState {
    pub status: ContainerStatus,
    /// Host pid of the container's init, when it runs.
    pub pid: Option<u32>,
}

/// Memory, CPU and pids usage read from the sandbox's cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub memory_bytes: u64,
    pub pids: u64,
    /// The memory limit (0 when the cgroup has none readable).
    pub memory_limit_bytes: u64,
    /// CPU time used by every task of the cgroup since it was made.
    pub cpu_nanos: u64,
    /// Processes the kernel's OOM killer killed in the cgroup.
    pub oom_kills: u64,
}

/// Host side effects used by the container runtime.
pub trait Host: CheckpointHost + Send + Sync {
    /// Mounts a small tmpfs, owned by the host, at the sandbox's run directory (bound at
    /// /run/sandfork inside): the sandbox can write there, so it must not be host disk.
    fn mount_run_dir(&self, paths: &SandboxPaths) -> Result<()>;
    /// Unmounts the run directory; succeeds if nothing is mounted.
    fn unmount_run_dir(&self, paths: &SandboxPaths) -> Result<()>;
    /// Forks block-store disk `disk` from `base` (a sealed layer), `size_mb` large (0 = the
    /// base's size).
    fn create_disk(&self, disk: &str, base: &str, size_mb: u64) -> Result<()>;
    /// Starts the disk's server and mounts its ext4 at `paths.rootfs()`.
    fn mount_disk(&self, disk: &str, paths: &SandboxPaths) -> Result<()>;
    /// Re-attaches to a disk whose server survived a daemon restart.
    fn adopt_disk(&self, disk: &str, paths: &SandboxPaths) -> Result<()>;
    /// Unmounts and stops the disk server; succeeds if nothing is mounted.
    fn unmount_disk(&self, disk: &str, paths: &SandboxPaths) -> Result<()>;
    /// Deletes the disk's writable overlay; succeeds if it does not exist.
    fn delete_disk(&self, disk: &str) -> Result<()>;
    /// How many writes the disk's server holds now for want of host space.
    fn disk_held_writes(&self, disk: &str) -> Result<u64>;

    /// Creates network namespace `name` with loopback up.
    fn netns_add(&self, name: &str) -> Result<()>;
    /// Deletes a network namespace; succeeds if it does not exist.
    fn netns_delete(&self, name: &str) -> Result<()>;
    /// Adds the veth pair, moves its peer into `netns` as eth0, sets addresses and the
    /// default route.
    fn veth_add(&self, netns: &str, alloc: &NetAlloc) -> Result<()>;
    /// Deletes the host end (and with it the peer); succeeds if it does not exist.
    fn veth_delete(&self, alloc: &NetAlloc) -> Result<()>;
    /// Makes sure forwarding is on and sandfork's nftables table exists.
    fn nft_prepare(&self) -> Result<()>;
    /// Applies an nftables script as one transaction.
    fn nft_apply(&self, script: &str) -> Result<()>;
    /// Applies each command on its own, ignoring ones whose object is already gone.
    fn nft_remove(&self, commands: &[String]) -> Result<()>;

    /// Writes the bundle: config.json (root's alone: its environment holds the sandbox's
    /// secrets), CRIU's options file and, for a sandbox with a network (`resolv_conf`),
    /// its resolv.conf naming its nameserver.
    fn write_bundle(
        &self,
        paths: &SandboxPaths,
        config: &[u8],
        resolv_conf: Option<crate::net::Nameserver>,
    ) -> Result<()>;
    /// RLIMIT_NOFILE for sandboxes: the host's hard limit, never more (raising it needs
    /// CAP_SYS_RESOURCE).
    fn nofile_limit(&self) -> u64;
    /// `runc run --detach`, with stdio on /dev/null.
    fn runc_run(&self, root: &Path, id: &str, paths: &SandboxPaths) -> Result<()>;
    /// `runc kill [--all] id signal`; succeeds if the container is gone.
    fn runc_kill(&self, root: &Path, id: &str, signal: &str) -> Result<()>;
    /// `runc delete --force id`; succeeds if the container is gone.
    fn runc_delete(&self, root: &Path, id: &str) -> Result<()>;
    /// `runc state id`; `None` if runc does not know the container.
    fn runc_state(&self, root: &Path, id: &str) -> Result<Option<ContainerState>>;
    /// Ids of all containers in `root`.
    fn runc_list(&self, root: &Path) -> Result<Vec<String>>;

    /// Takes the flag that turns true once the init `runc_run` started for this sandbox
    /// has exited, so a wait for its agent can give up early; `None` when there is none.
    fn init_exited(&self, paths: &SandboxPaths) -> Option<Arc<AtomicBool>>;
    /// Removes a container's cgroup in every hierarchy; succeeds if it does not exist.
    fn cgroup_remove(&self, cgroup: &str) -> Result<()>;
    /// Reads memory and pids usage of a cgroup.
    fn cgroup_usage(&self, cgroup: &str) -> Result<Usage>;
    /// Freezes every process of a cgroup (returns once they are all frozen) or thaws
    /// them. Thawing a cgroup that does not exist succeeds.
    fn cgroup_freeze(&self, cgroup: &str, frozen: bool) -> Result<()>;
    /// Whether network namespace `name` exists.
    fn netns_exists(&self, name: &str) -> bool;
}
