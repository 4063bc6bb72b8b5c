//! sandfork's sandbox runtime.
//!
//! [`ContainerRuntime`] creates, stops, adopts, checkpoints, restores and destroys
//! sandboxes on runc: each sandbox is a container whose root filesystem is its own
//! block-store disk, whose network namespace sandfork made, and whose init is the
//! sandfork agent. All host side effects go through [`host::Host`]. See `docs/runtime.md`
//! and `docs/SECURITY.md`.

pub mod cgroup_tuning;
pub mod checkpoint;
mod container;
mod error;
pub mod host;
pub mod image;
pub mod ksm;
pub mod layout;
pub mod lifecycle;
pub mod liveness;
pub mod memory_images;
pub mod net;
pub mod oci;
mod seccomp;
pub mod space;
pub mod spec;
mod stale;
mod steps;
pub mod volume;

use std::path::PathBuf;

pub use checkpoint::{CheckpointInfo, CheckpointKind, RestoreOptions, SnapshotSource};
pub use container::{ContainerRuntime, RuntimeConfig};
pub use error::{Error, Result};
pub use host::Usage;
pub use liveness::Liveness;
pub use spec::{ByName, Cidr, ImageRef, NetworkMode, Resources, SandboxSpec};

/// A created sandbox and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxHandle {
    pub id: String,
    /// The sandbox's directory on the host.
    pub dir: PathBuf,
    /// Host-owned directory holding the agent's socket (`/run/sandfork` inside).
    pub socket_dir: PathBuf,
    /// The sandbox's address, with `internet`.
    pub address: Option<std::net::Ipv4Addr>,
    /// Its link to the host, with `internet` (addresses, interface, nftables names).
    pub net: Option<net::NetAlloc>,
    /// Host pid of the container's init, the agent: only a socket it listens on is
    /// talked to (a sandbox can replace `agent.sock` in its writable socket directory).
    pub init_pid: Option<u32>,
}

impl SandboxHandle {
    /// A client for the sandbox's agent (exec, files, processes), pinned to the agent's
    /// process when it is known.
    pub fn agent(&self) -> agent_client::AgentClient {
        let client = agent_client::AgentClient::new(&self.socket_dir);
        match self.init_pid {
            Some(pid) => client.pinned_to(pid),
            None => client,
        }
    }
}

/// Lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxStatus {
    Starting,
    Running,
    Paused,
    Stopped,
}

/// A running sandbox's resource use, as [`ContainerRuntime::stats`] reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub usage: Usage,
    /// Of its root disk, as its file system reports.
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
    /// Summed over its network interfaces but loopback.
    pub net: NetCounters,
}

/// Bytes and packets through a network namespace's interfaces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetCounters {
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
}

/// What [`Runtime::inspect`] reports.
#[derive(Debug, Clone)]
pub struct SandboxInfo {
    pub handle: SandboxHandle,
    pub status: SandboxStatus,
    /// Host pid of the sandbox's init.
    pub pid: Option<u32>,
    pub usage: Usage,
    pub spec: SandboxSpec,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
}

/// The agent binary for sandboxes: `SANDFORK_AGENT_BIN` when set (for development; it
/// must be statically linked), else the agent embedded in this binary, written out once
/// to /run/sandfork/agent (see the `agent_embed` crate).
pub fn agent_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SANDFORK_AGENT_BIN") {
        let path = PathBuf::from(p);
        // Images may have no C library: only a statically linked agent will do.
        return if is_static_elf(&path) {
            Ok(path)
        } else {
            Err(Error::NoAgentBinary(path))
        };
    }
    agent_embed::install().map_err(|e| Error::io(e.path, e.source))
}

/// Whether `path` is an ELF executable without a program interpreter (statically linked).
fn is_static_elf(path: &std::path::Path) -> bool {
    const PT_INTERP: u32 = 3;
    // Headers and program headers sit at the start of the file.
    let mut bytes = Vec::new();
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    if std::io::Read::read_to_end(&mut std::io::Read::take(file, 64 << 10), &mut bytes).is_err() {
        return false;
    }
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if bytes.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..usize::from(phnum)).all(|i| {
        let off = usize::try_from(phoff)
            .unwrap_or(usize::MAX)
            .saturating_add(i * usize::from(phentsize));
        u32_at(off).is_some_and(|t| t != PT_INTERP)
    })
}
