//! What a caller asks for when creating a sandbox.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Longest sandbox id accepted; it also bounds cgroup, netns and runc names.
pub const MAX_ID_LEN: usize = 48;

/// Default limit on the number of processes in a sandbox.
pub const DEFAULT_PIDS: u32 = 512;

/// The image a sandbox boots from: a sealed block-store layer plus its defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRef {
    /// Image name, informational.
    pub name: String,
    /// Sealed base layer id in the block store.
    pub layer: String,
    /// Environment every process in the sandbox starts with (before the sandbox's own).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Default working directory.
    #[serde(default = "default_cwd")]
    pub cwd: String,
    /// Default user of the sandbox's processes (`name`, `uid` or `uid:gid`); root if none.
    #[serde(default)]
    pub user: Option<String>,
}

fn default_cwd() -> String {
    "/".into()
}

/// An IPv4 network in CIDR notation, e.g. `10.0.0.0/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    /// The network address (host bits cleared).
    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) & self.mask())
    }

    fn mask(&self) -> u32 {
        u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0)
    }

    /// Number of addresses in the network.
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.prefix))
    }

    /// Whether `other` lies wholly inside this network.
    pub fn contains(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix
            && u32::from(other.addr) & self.mask() == u32::from(self.network())
    }
}

impl std::str::FromStr for Cidr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidSpec(format!("bad CIDR {s:?}"));
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().map_err(|_| bad())?),
            None => (s, 32),
        };
        let addr = addr.parse::<Ipv4Addr>().map_err(|_| bad())?;
        if prefix > 32 {
            return Err(bad());
        }
        Ok(Cidr { addr, prefix })
    }
}

impl TryFrom<String> for Cidr {
    type Error = Error;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> String {
        c.to_string()
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix)
    }
}

/// How a sandbox reaches the network.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum NetworkMode {
    /// Loopback only.
    #[default]
    None,
    /// Egress through the host with NAT. An empty `allow_out` allows everything not in
    /// `deny_out`; `deny_out` always wins.
    Internet {
        #[serde(default)]
        allow_out: Vec<Cidr>,
        #[serde(default)]
        deny_out: Vec<Cidr>,
        /// The lists also name hosts (kept by the daemon): DNS goes to its resolver.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by_name: Option<ByName>,
    },
}

/// A sandbox whose egress lists name hosts: its DNS is redirected to the daemon's
/// resolver, which fills the sandbox's sets of allowed and denied addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByName {
    /// Some allow entry is a name: the chain ends in drop even with no allowed CIDR.
    pub allow_list: bool,
}

/// Resource limits of one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPU share in cores (e.g. 0.5, 2.0).
    pub cpus: f64,
    /// Memory limit, including swap; past it the sandbox's processes are OOM-killed.
    pub memory_mb: u64,
    /// Maximum number of processes and threads.
    #[serde(default = "default_pids")]
    pub pids: u32,
    /// Root disk size; 0 keeps the image's size.
    #[serde(default)]
    pub disk_mb: u64,
}

fn default_pids() -> u32 {
    DEFAULT_PIDS
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: 1.0,
            memory_mb: 512,
            pids: DEFAULT_PIDS,
            disk_mb: 0,
        }
    }
}

/// Everything needed to create one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// Unique id; also the hostname. Lowercase letters, digits and `-`.
    pub id: String,
    pub image: ImageRef,
    #[serde(default)]
    pub resources: Resources,
    /// Environment for the sandbox's processes, over the image's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub network: NetworkMode,
    /// Named volumes bound into the sandbox.
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
}

/// A volume bound into a sandbox: the host mount point of the volume, where it appears in
/// the sandbox, and whether the sandbox may write to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    pub name: String,
    pub source: std::path::PathBuf,
    pub destination: String,
    #[serde(default)]
    pub read_only: bool,
}

/// Paths a volume may not be mounted over or under: the kernel's, the device tree, the
/// sandbox's agent and run directory.
const RESERVED_PATHS: &[&str] = &["/proc", "/sys", "/dev", "/.sandfork", "/run/sandfork"];

/// Checks where a volume is mounted: absolute, normal (no `.`, `..` or empty parts), not
/// `/` and not over or under a reserved path.
pub fn validate_mount_path(path: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::InvalidSpec(format!(
            "volume mount path {path:?}: {why}"
        )))
    };
    if !path.starts_with('/') || path.len() > 4096 || path.contains('\0') {
        return bad("must be an absolute path");
    }
    let parts: Vec<&str> = path[1..].split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return bad("must be a normal path without '.', '..' or empty parts");
    }
    if path == "/" {
        return bad("cannot be /");
    }
    for r in RESERVED_PATHS {
        if path == *r || path.starts_with(&format!("{r}/")) || r.starts_with(&format!("{path}/")) {
            return bad(&format!("overlaps {r}, which the sandbox needs"));
        }
    }
    Ok(())
}

impl SandboxSpec {
    /// Checks every field a hostile or careless caller could get wrong.
    pub fn validate(&self) -> Result<()> {
        validate_id(&self.id)?;
        let r = &self.resources;
        if !(r.cpus.is_finite() && r.cpus >= 0.01 && r.cpus <= 1024.0) {
            return Err(Error::InvalidSpec(format!("cpus {} out of range", r.cpus)));
        }
        if r.memory_mb < 16 {
            return Err(Error::InvalidSpec("memory_mb must be at least 16".into()));
        }
        if r.pids < 8 {
            return Err(Error::InvalidSpec("pids must be at least 8".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for v in &self.volumes {
            validate_mount_path(&v.destination)?;
            if !seen.insert(v.destination.as_str()) {
                return Err(Error::InvalidSpec(format!(
                    "two volumes mounted at {}",
                    v.destination
                )));
            }
        }
        for k in self.env.keys().chain(self.image.env.keys()) {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(Error::InvalidSpec(format!("bad env name {k:?}")));
            }
        }
        Ok(())
    }

    /// The environment of the sandbox's processes: image defaults, then the sandbox's.
    pub fn merged_env(&self) -> BTreeMap<String, String> {
        let mut env = self.image.env.clone();
        env.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.entry("PATH".into()).or_insert_with(|| {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
        });
        env.insert("HOSTNAME".into(), self.id.clone());
        env
    }
}

/// Checks a sandbox id: 1..=48 of `[a-z0-9-]`, not starting with `-`.
pub fn validate_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && !id.starts_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidSpec(format!("bad sandbox id {id:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parses_and_normalises() {
        let c: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert_eq!("1.2.3.4".parse::<Cidr>().unwrap().prefix, 32);
        assert!("1.2.3.4/33".parse::<Cidr>().is_err());
        assert!("x/3".parse::<Cidr>().is_err());
        assert_eq!("0.0.0.0/0".parse::<Cidr>().unwrap().size(), 1 << 32);
    }

    #[test]
    fn ids_are_checked() {
        assert!(validate_id("abc-123").is_ok());
        for bad in ["", "-a", "A", "a/b", "a.b", &"x".repeat(49)] {
            assert!(validate_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn network_mode_json() {
        let n: NetworkMode =
            serde_json::from_str(r#"{"mode":"internet","deny_out":["10.0.0.0/8"]}"#).unwrap();
        assert_eq!(
            n,
            NetworkMode::Internet {
                allow_out: vec![],
                deny_out: vec!["10.0.0.0/8".parse().unwrap()],
                by_name: None,
            }
        );
    }
}
