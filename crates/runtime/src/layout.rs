//! Where the runtime keeps things under the data directory, and the per-sandbox record.
//!
//! ```text
//! <data>/runc/                     runc --root (sandfork's containers only)
//! <data>/sandboxes/<id>/
//!     sandbox.json                 record: spec + every host resource, written before use
//!     bundle/config.json           OCI config
//!     rootfs/                      ext4 mountpoint of the sandbox's disk
//!     run/                         bind-mounted at /run/sandfork (agent socket)
//!     disk/                        disk server run dir
//!     logs/                        runc log
//! ```
//!
//! The host never resolves a path inside `rootfs/` or `run/`; the agent socket is reached
//! only through the agent client's no-follow connect.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::net::NetAlloc;
use crate::spec::SandboxSpec;

/// The runtime's paths under one data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    data: PathBuf,
}

impl Layout {
    pub fn new(data: impl Into<PathBuf>) -> Self {
        Layout { data: data.into() }
    }

    pub fn data(&self) -> &Path {
        &self.data
    }

    /// runc's state root, private to this data directory.
    pub fn runc_root(&self) -> PathBuf {
        self.data.join("runc")
    }

    pub fn sandboxes(&self) -> PathBuf {
        self.data.join("sandboxes")
    }

    pub fn sandbox(&self, id: &str) -> SandboxPaths {
        SandboxPaths {
            dir: self.sandboxes().join(id),
        }
    }
}

/// Paths of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPaths {
    pub dir: PathBuf,
}

impl SandboxPaths {
    pub fn record(&self) -> PathBuf {
        self.dir.join("sandbox.json")
    }
    pub fn bundle(&self) -> PathBuf {
        self.dir.join("bundle")
    }
    pub fn config(&self) -> PathBuf {
        self.bundle().join("config.json")
    }
    /// CRIU's configuration file for this sandbox (see `oci::CRIU_OPTIONS`).
    pub fn criu_config(&self) -> PathBuf {
        self.bundle().join("criu.conf")
    }
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }
    /// Host-owned directory bind-mounted at `/run/sandfork` inside the sandbox.
    pub fn run(&self) -> PathBuf {
        self.dir.join("run")
    }
    pub fn disk(&self) -> PathBuf {
        self.dir.join("disk")
    }
    /// Resolver configuration bound at /etc/resolv.conf (sandboxes with `internet`).
    pub fn resolv_conf(&self) -> PathBuf {
        self.dir.join("resolv.conf")
    }
    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// Creates the directory skeleton; fails if the sandbox directory exists.
    pub fn create(&self, id: &str) -> Result<()> {
        if let Some(parent) = self.dir.parent() {
            std::fs::create_dir_all(parent).at(parent)?;
        }
        match std::fs::create_dir(&self.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::Exists(id.into()))
            }
            r => r.at(&self.dir)?,
        }
        for d in [
            self.bundle(),
            self.rootfs(),
            self.run(),
            self.disk(),
            self.logs(),
        ] {
            std::fs::create_dir(&d).at(&d)?;
        }
        Ok(())
    }

    /// Removes the directory tree. Only call once nothing is mounted below it.
    pub fn remove(&self) -> Result<()> {
        match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r.at(&self.dir),
        }
    }
}

/// Names of the host resources a sandbox uses, derived once and recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Names {
    /// runc container id.
    pub container: String,
    /// Network namespace name under /run/netns.
    pub netns: String,
    /// cgroup path (relative to each hierarchy's root).
    pub cgroup: String,
    /// Block-store disk name.
    pub disk: String,
}

impl Names {
    pub fn for_id(id: &str) -> Self {
        Names {
            container: id.into(),
            netns: format!("sf-{id}"),
            cgroup: format!("/sandfork/{id}"),
            disk: format!("sandbox-{id}"),
        }
    }
}

/// Everything needed to find, adopt or tear down a sandbox after a daemon restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub spec: SandboxSpec,
    pub names: Names,
    /// Set once an address lease is held.
    pub net: Option<NetAlloc>,
    /// Agent binary bind-mounted into the sandbox.
    pub agent_bin: PathBuf,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// Stopped on request (disk and network kept for a later start): not stale.
    #[serde(default)]
    pub stopped: bool,
}

impl Record {
    pub fn load(path: &Path) -> Result<Record> {
        let bytes = std::fs::read(path).at(path)?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Record {
            path: path.into(),
            source,
        })
    }

    /// Writes the record atomically (temp file + rename), readable by root only (its
    /// spec holds the sandbox's secrets).
    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(self).expect("record serialises");
        write_private(&tmp, &bytes)?;
        std::fs::rename(&tmp, path).at(path)
    }
}

/// Writes `bytes` to a new (or truncated) file of mode 0600.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .at(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .at(path)?;
    f.write_all(bytes).at(path)
}
