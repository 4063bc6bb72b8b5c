//! Sandbox networking: address leases from a private pool, interface names, and the
//! nftables rules that confine a sandbox's traffic.
//!
//! All sandboxes share one nftables table, `inet sandfork`, that nothing else touches.
//! Its base chains drop anything entering a sandbox interface that the sandbox did not
//! start, anything from a sandbox to the host itself, and anything between sandboxes; each
//! sandbox with `internet` gets its own egress chain (allow/deny lists), reached through a
//! verdict map keyed by its host-side interface, and its address in the masquerade set.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::spec::Cidr;

/// Name of the nftables table owned by sandfork (family `inet`).
pub const NFT_TABLE: &str = "sandfork";

/// Host-wide network settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// Private pool carved into one /30 per sandbox with `internet`.
    pub pool: Cidr,
    /// Host-wide directory of address leases (one file per /30 in use). Shared by every
    /// data directory on the host because addresses and interface names are host-wide.
    pub lease_dir: PathBuf,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            pool: Cidr {
                addr: Ipv4Addr::new(10, 213, 0, 0),
                prefix: 16,
            },
            lease_dir: PathBuf::from("/run/sandfork/leases"),
        }
    }
}

/// The addresses and interface of one sandbox with `internet`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetAlloc {
    /// Index of the /30 in the pool; also names the lease and the interfaces.
    pub index: u32,
    /// Host end of the veth pair.
    pub host_if: String,
    /// Sandbox end, before it is moved into the sandbox's netns and renamed `eth0`.
    pub peer_if: String,
    pub host_addr: Ipv4Addr,
    pub sandbox_addr: Ipv4Addr,
    /// Lease file holding `index`.
    pub lease: PathBuf,
}

impl NetAlloc {
    fn new(config: &NetConfig, index: u32) -> Self {
        let base = u32::from(config.pool.network()) + index * 4;
        NetAlloc {
            index,
            host_if: format!("sfh{index:x}"),
            peer_if: format!("sfp{index:x}"),
            host_addr: Ipv4Addr::from(base + 1),
            sandbox_addr: Ipv4Addr::from(base + 2),
            lease: config.lease_dir.join(index.to_string()),
        }
    }

    /// Name of this sandbox's egress chain.
    pub fn chain(&self) -> String {
        format!("sb_{}", self.host_if)
    }
}

/// Takes a free /30 from the pool; the lease file (created exclusively) records `owner`.
pub fn lease(config: &NetConfig, owner: &str) -> Result<NetAlloc> {
    let dir = &config.lease_dir;
    std::fs::create_dir_all(dir).at(dir)?;
    let slots = (config.pool.size() / 4).min(u64::from(u32::MAX)) as u32;
    let start = fnv(owner) % slots.max(1);
    for i in 0..slots {
        let alloc = NetAlloc::new(config, (start + i) % slots);
        if try_create(&alloc.lease, owner)? {
            return Ok(alloc);
        }
    }
    Err(Error::PoolExhausted)
}

fn try_create(path: &Path, owner: &str) -> Result<bool> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path);
    match file {
        Ok(mut f) => {
            f.write_all(owner.as_bytes()).at(path)?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Releases a lease if `owner` still holds it.
pub fn release(alloc: &NetAlloc, owner: &str) -> Result<()> {
    match std::fs::read_to_string(&alloc.lease) {
        Ok(held) if held == owner => std::fs::remove_file(&alloc.lease).at(&alloc.lease),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(&alloc.lease, e)),
    }
}

/// Leases in `config.lease_dir` whose owner string starts with `prefix`.
pub fn leases_owned(config: &NetConfig, prefix: &str) -> Vec<(NetAlloc, String)> {
    let Ok(entries) = std::fs::read_dir(&config.lease_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let index = e.file_name().to_str()?.parse::<u32>().ok()?;
            let owner = std::fs::read_to_string(e.path()).ok()?;
            owner
                .starts_with(prefix)
                .then(|| (NetAlloc::new(config, index), owner))
        })
        .collect()
}

fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x01000193)
    })
}

/// The table with its base chains; applied once, when the table does not exist yet.
pub fn base_table_script() -> String {
    format!(
        r#"table inet {NFT_TABLE} {{
    set masq {{ type ipv4_addr; }}
    map egress {{ type ifname : verdict; }}
    chain forward {{
        type filter hook forward priority -1; policy accept;
        oifname "sfh*" ct state established,related accept
        oifname "sfh*" drop
        iifname "sfh*" iifname vmap @egress
        iifname "sfh*" drop
    }}
    chain input {{
        type filter hook input priority -1; policy accept;
        iifname "sfh*" ct state established,related accept
        iifname "sfh*" drop
    }}
    chain postrouting {{
        type nat hook postrouting priority 100; policy accept;
        oifname != "sfh*" ip saddr @masq masquerade
    }}
}}
"#
    )
}

/// Adds one sandbox's egress chain, map entry and masquerade address (one transaction).
pub fn sandbox_rules_script(alloc: &NetAlloc, allow: &[Cidr], deny: &[Cidr]) -> String {
    let t = format!("inet {NFT_TABLE}");
    let mut s = format!("add chain {t} {}\n", alloc.chain());
    s += &egress_rules(alloc, allow, deny);
    s += &format!(
        "add element {t} egress {{ \"{}\" : jump {} }}\n",
        alloc.host_if,
        alloc.chain()
    );
    s += &format!("add element {t} masq {{ {} }}\n", alloc.sandbox_addr);
    s
}

/// Replaces a running sandbox's egress rules in one transaction: its chain is emptied and
/// refilled, so no packet ever meets half a rule set.
pub fn sandbox_rules_replace(alloc: &NetAlloc, allow: &[Cidr], deny: &[Cidr]) -> String {
    format!("flush chain inet {NFT_TABLE} {}\n", alloc.chain()) + &egress_rules(alloc, allow, deny)
}

/// The rules of one sandbox's egress chain.
fn egress_rules(alloc: &NetAlloc, allow: &[Cidr], deny: &[Cidr]) -> String {
    let t = format!("inet {NFT_TABLE}");
    let chain = alloc.chain();
    let rule = |body: String| format!("add rule {t} {chain} {body}\n");
    let mut s = rule(format!("ip saddr != {} drop", alloc.sandbox_addr));
    s += &rule("meta nfproto != ipv4 drop".into());
    if !deny.is_empty() {
        s += &rule(format!("ip daddr {{ {} }} drop", cidr_list(deny)));
    }
    if allow.is_empty() {
        s += &rule("accept".into());
    } else {
        s += &rule(format!("ip daddr {{ {} }} accept", cidr_list(allow)));
        s += &rule("drop".into());
    }
    s
}

/// Removal commands for one sandbox's rules, each applied on its own so that a part
/// already gone does not stop the rest.
pub fn sandbox_rules_removal(alloc: &NetAlloc) -> Vec<String> {
    let t = format!("inet {NFT_TABLE}");
    let chain = alloc.chain();
    vec![
        format!("delete element {t} egress {{ \"{}\" }}", alloc.host_if),
        format!("delete element {t} masq {{ {} }}", alloc.sandbox_addr),
        format!("flush chain {t} {chain}"),
        format!("delete chain {t} {chain}"),
    ]
}

/// The resolver configuration of a sandbox with `internet`: the host's, less nameservers
/// on loopback (the sandbox's loopback is its own) and less anything but
/// `nameserver`, `search` and `options` lines.
pub fn resolv_conf(host: &str) -> String {
    let mut out = String::new();
    for line in host.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        let keep = match words.next() {
            Some("nameserver") => words
                .next()
                .and_then(|a| a.parse::<std::net::IpAddr>().ok())
                .is_some_and(|a| !a.is_loopback()),
            Some("search" | "options") => true,
            _ => false,
        };
        if keep {
            out += line;
            out.push('\n');
        }
    }
    out
}

fn cidr_list(list: &[Cidr]) -> String {
    list.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> NetConfig {
        NetConfig {
            pool: "10.99.0.0/29".parse().unwrap(),
            lease_dir: dir.to_path_buf(),
        }
    }

    #[test]
    fn leases_are_unique_and_released() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        let a = lease(&c, "d/a").unwrap();
        let b = lease(&c, "d/b").unwrap();
        assert_ne!(a.index, b.index);
        assert!(matches!(lease(&c, "d/c"), Err(Error::PoolExhausted)));
        release(&a, "someone else").unwrap();
        assert!(a.lease.exists());
        release(&a, "d/a").unwrap();
        let c2 = lease(&c, "d/c").unwrap();
        assert_eq!(c2.index, a.index);
        assert_eq!(leases_owned(&c, "d/").len(), 2);
    }

    #[test]
    fn resolv_conf_drops_loopback_resolvers() {
        let host = "# c\nnameserver 127.0.0.53\nnameserver 10.1.2.3\nnameserver ::1\n\
                    search example.org\noptions edns0\nsortlist x\n";
        assert_eq!(
            resolv_conf(host),
            "nameserver 10.1.2.3\nsearch example.org\noptions edns0\n"
        );
    }

    #[test]
    fn addresses_follow_index() {
        let dir = tempfile::tempdir().unwrap();
        let a = NetAlloc::new(&config(dir.path()), 1);
        assert_eq!(a.host_addr, Ipv4Addr::new(10, 99, 0, 5));
        assert_eq!(a.sandbox_addr, Ipv4Addr::new(10, 99, 0, 6));
        assert_eq!(a.host_if, "sfh1");
        assert!(a.chain().len() < 32);
    }

    #[test]
    fn deny_comes_before_allow() {
        let dir = tempfile::tempdir().unwrap();
        let a = NetAlloc::new(&config(dir.path()), 0);
        let allow = ["10.0.0.0/8".parse().unwrap()];
        let deny = ["10.1.0.0/16".parse().unwrap()];
        let s = sandbox_rules_script(&a, &allow, &deny);
        let d = s.find("10.1.0.0/16 } drop").unwrap();
        let al = s.find("10.0.0.0/8 } accept").unwrap();
        assert!(d < al);
        assert!(s.contains("ip saddr != 10.99.0.2 drop"));
        assert!(s.trim_end().ends_with("masq { 10.99.0.2 }"));
        let open = sandbox_rules_script(&a, &[], &[]);
        assert!(open.contains(" accept\n") && !open.contains(" drop\nadd element"));
    }
}
