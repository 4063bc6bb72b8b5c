//! Sandbox networking: address leases from a pool in 198.18.0.0/15, interface names, and
//! the nftables rules that confine a sandbox's traffic.
//!
//! All sandboxes share one nftables table, `inet sandfork`, that nothing else touches.
//! Its base chains drop anything entering a sandbox interface that the sandbox did not
//! start, anything from a sandbox to the host itself, and anything between sandboxes; each
//! sandbox with `internet` gets its own egress chain, reached through a verdict map keyed
//! by its host-side interface, and its address in the masquerade set. The egress chain
//! lets DNS reach the sandbox's resolvers, applies the user's deny list, then the user's
//! allow list, and then denies what no sandbox reaches unless a rule names it
//! ([`GUARDED`]: private and link-local ranges — the cloud metadata address among them —
//! loopback, multicast, and the host's own networks).
//!
//! A sandbox whose lists name hosts ([`ByName`]) has its DNS redirected to the daemon's
//! resolver on the host end of its link (`dns_redirect`, `dns_in`), and two address sets
//! of its own: addresses of allowed names, filled by that resolver as it answers and
//! accepted after the allow list, and addresses of denied names, dropped before anything
//! else. An address no answer put there is not in the allowed set, so a name rule cannot
//! be bypassed by connecting to an address directly.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::spec::Cidr;

/// Where sandboxes' network namespaces are pinned: a directory of sandfork's own, not
/// iproute2's /run/netns (which `ip netns add` re-mounts over itself, after which a pin
/// made before cannot be removed).
pub const NETNS_DIR: &str = "/run/sandfork/netns";

/// Traffic through the interfaces (but loopback) of the network namespace that process
/// `pid` is in; zero when it cannot be read (the process is gone).
pub fn counters(pid: u32) -> crate::NetCounters {
    let devices = procfs::process::Process::new(pid as i32).and_then(|p| p.dev_status());
    let mut sum = crate::NetCounters::default();
    for dev in devices.into_iter().flat_map(|d| d.into_values()) {
        if dev.name == "lo" {
            continue;
        }
        sum.rx_bytes += dev.recv_bytes;
        sum.tx_bytes += dev.sent_bytes;
        sum.rx_packets += dev.recv_packets;
        sum.tx_packets += dev.sent_packets;
    }
    sum
}

/// Connects to TCP `port` on the loopback of the network namespace pinned at `ns`
/// ([`netns_path`]: the file, not a pid, which a dead sandbox's process could hand to
/// another), trying `127.0.0.1`, then `::1`. The socket stays in that namespace; the
/// connect runs on a thread of its own that enters the namespace and ends, so no other
/// thread moves.
pub fn connect_in_netns(
    ns: &Path,
    port: u16,
    timeout: std::time::Duration,
) -> std::io::Result<std::net::TcpStream> {
    let ns = std::fs::File::open(ns)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            let v4 = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            match std::net::TcpStream::connect_timeout(&v4, timeout) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
                    std::net::TcpStream::connect_timeout(&v6, timeout).map_err(|_| e)
                }
                r => r,
            }
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("connect thread panicked")))
    })
}

/// The pin of network namespace `name`.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

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
                addr: Ipv4Addr::new(198, 18, 0, 0),
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

    /// Its set of addresses learned from allowed names.
    pub fn allowed_set(&self) -> String {
        format!("n4_{}", self.host_if)
    }

    /// Its set of addresses learned from denied names.
    pub fn denied_set(&self) -> String {
        format!("d4_{}", self.host_if)
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
/// `host_forwards`: whether the host forwarded packets before sandfork turned forwarding
/// on for its sandboxes. If it did not, the forward chain drops whatever is not a
/// sandbox's traffic, so that the host does not become a router for anything else.
pub fn base_table_script(host_forwards: bool) -> String {
    let others = if host_forwards { "accept" } else { "drop" };
    format!(
        r#"table inet {NFT_TABLE} {{
    set masq {{ type ipv4_addr; }}
    map egress {{ type ifname : verdict; }}
{DNS_OBJECTS}    chain forward {{
        type filter hook forward priority -1; policy {others};
        oifname "sfh*" ct state established,related accept
        oifname "sfh*" drop
        iifname "sfh*" iifname vmap @egress
        iifname "sfh*" drop
    }}
    chain input {{
        type filter hook input priority -1; policy accept;
        iifname "sfh*" ct state established,related accept
        {DNS_INPUT}
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

/// Sets and chain of the DNS redirect (part of the base table).
const DNS_OBJECTS: &str = r#"    map dns_redirect { type ifname : ipv4_addr; }
    set dns_in { type ifname . ipv4_addr; }
    chain prerouting {
        type nat hook prerouting priority -100; policy accept;
        iifname "sfh*" meta l4proto { tcp, udp } th dport 53 dnat ip to iifname map @dns_redirect
    }
"#;

/// The input rule letting a sandbox's redirected DNS reach its resolver, and nothing else
/// on the host.
const DNS_INPUT: &str =
    r#"iifname "sfh*" meta l4proto { tcp, udp } th dport 53 iifname . ip daddr @dns_in accept"#;

/// Brings a table made by an earlier version (without the DNS redirect) up to date; for
/// when the table exists but `dns_redirect` does not.
pub fn base_table_upgrade_script() -> String {
    let t = format!("table inet {NFT_TABLE}");
    format!("{t} {{\n{DNS_OBJECTS}}}\ninsert rule inet {NFT_TABLE} input {DNS_INPUT}\n")
}

/// Destinations no sandbox reaches unless an allow rule names them (RFC 6890 special
/// ranges a sandbox has no business with). The host's own networks are added at runtime.
pub const GUARDED: [&str; 11] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

/// What a sandbox's egress chain needs to know of the host: its resolvers (DNS to them is
/// allowed) and the networks it is attached to (denied like [`GUARDED`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostNet {
    pub resolvers: Vec<Ipv4Addr>,
    pub networks: Vec<Cidr>,
}

impl HostNet {
    /// Read from `/etc/resolv.conf` (the resolvers sandboxes get, see [`resolv_conf`])
    /// and `/proc/net/route` (directly connected IPv4 networks).
    pub fn of_host() -> HostNet {
        let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        HostNet {
            resolvers: resolvers(&resolv_conf(&resolv)),
            networks: connected_networks(&routes),
        }
    }

    /// Everything denied unless named: [`GUARDED`] and the host's networks.
    fn guarded(&self) -> Vec<Cidr> {
        let fixed = GUARDED.iter().filter_map(|c| c.parse().ok());
        fixed.chain(self.networks.iter().copied()).collect()
    }
}

fn resolvers(resolv: &str) -> Vec<Ipv4Addr> {
    resolv
        .lines()
        .filter_map(|l| l.strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse().ok())
        .collect()
}

/// Networks of the routes without a gateway, from `/proc/net/route` (hex, host order).
fn connected_networks(routes: &str) -> Vec<Cidr> {
    let hex = |s: &str| u32::from_str_radix(s, 16).ok().map(u32::from_be);
    routes
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (iface, dest, gateway, mask) = (
                f.first()?,
                hex(f.get(1)?)?,
                hex(f.get(2)?)?,
                hex(f.get(7)?)?,
            );
            let own = iface.starts_with("sfh") || gateway != 0 || mask == 0;
            (!own).then(|| Cidr {
                addr: Ipv4Addr::from(dest),
                prefix: mask.count_ones() as u8,
            })
        })
        .collect()
}

/// Adds one sandbox's egress chain, map entry and masquerade address (one transaction).
pub fn sandbox_rules_script(alloc: &NetAlloc, egress: &Egress<'_>) -> String {
    let t = format!("inet {NFT_TABLE}");
    let mut s = learned_sets(alloc);
    s += &format!("add chain {t} {}\n", alloc.chain());
    s += &egress_rules(alloc, egress);
    s += &dns_redirect(alloc, egress.by_name.is_some());
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
/// Addresses learned under the old lists go with them (a connection to one is cut until
/// the name is resolved again under the new lists).
pub fn sandbox_rules_replace(alloc: &NetAlloc, egress: &Egress<'_>) -> String {
    let t = format!("inet {NFT_TABLE}");
    let mut s = learned_sets(alloc);
    s += &format!("flush chain {t} {}\n", alloc.chain());
    s += &format!("flush set {t} {}\n", alloc.allowed_set());
    s += &format!("flush set {t} {}\n", alloc.denied_set());
    s += &egress_rules(alloc, egress);
    s + &dns_redirect(alloc, egress.by_name.is_some())
}

/// How long an address learned from an allowed name stays after the last packet to it
/// (refreshed by traffic, so a live connection never loses it).
pub const LEARNED_IDLE: &str = "10m";

/// The two learned-address sets of a sandbox (adding an existing set is a no-op).
fn learned_sets(alloc: &NetAlloc) -> String {
    let t = format!("inet {NFT_TABLE}");
    format!(
        "add set {t} {} {{ type ipv4_addr; flags dynamic,timeout; timeout {LEARNED_IDLE}; }}\n\
         add set {t} {} {{ type ipv4_addr; flags timeout; }}\n",
        alloc.allowed_set(),
        alloc.denied_set()
    )
}

/// Turns the redirect of a sandbox's DNS to its resolver on or off. Off is an add then a
/// delete, so that the transaction holds whether or not the element was there.
fn dns_redirect(alloc: &NetAlloc, on: bool) -> String {
    let t = format!("inet {NFT_TABLE}");
    let (i, a) = (&alloc.host_if, alloc.host_addr);
    let mut s = format!(
        "add element {t} dns_redirect {{ \"{i}\" : {a} }}\n\
         add element {t} dns_in {{ \"{i}\" . {a} }}\n"
    );
    if !on {
        s += &format!(
            "delete element {t} dns_redirect {{ \"{i}\" }}\n\
             delete element {t} dns_in {{ \"{i}\" . {a} }}\n"
        );
    }
    s
}

/// Adds addresses a sandbox's resolver learned, each for its time in seconds; an address
/// already there starts its time again.
pub fn learned_script(
    alloc: &NetAlloc,
    allowed: &[(Ipv4Addr, u32)],
    denied: &[(Ipv4Addr, u32)],
) -> String {
    let t = format!("inet {NFT_TABLE}");
    let mut s = String::new();
    for (set, list) in [(alloc.allowed_set(), allowed), (alloc.denied_set(), denied)] {
        if list.is_empty() {
            continue;
        }
        let plain: Vec<String> = list.iter().map(|(a, _)| a.to_string()).collect();
        let timed: Vec<String> = list
            .iter()
            .map(|(a, s)| format!("{a} timeout {s}s"))
            .collect();
        s += &format!("add element {t} {set} {{ {} }}\n", plain.join(", "));
        s += &format!("delete element {t} {set} {{ {} }}\n", plain.join(", "));
        s += &format!("add element {t} {set} {{ {} }}\n", timed.join(", "));
    }
    s
}

/// One sandbox's egress policy: the user's lists and what the host adds.
#[derive(Debug, Clone, Copy)]
pub struct Egress<'a> {
    pub allow: &'a [Cidr],
    pub deny: &'a [Cidr],
    pub host: &'a HostNet,
    pub by_name: Option<crate::spec::ByName>,
}

/// The rules of one sandbox's egress chain, in order: its own source address only, IPv4
/// only, addresses of denied names, the deny list (so denying 0.0.0.0/0 denies DNS too),
/// DNS to its resolvers (unless its DNS goes to the daemon's resolver), the allow list,
/// addresses of allowed names, the guarded ranges, then everything else (or nothing
/// else, with an allow list).
fn egress_rules(alloc: &NetAlloc, e: &Egress<'_>) -> String {
    let t = format!("inet {NFT_TABLE}");
    let chain = alloc.chain();
    let rule = |body: String| format!("add rule {t} {chain} {body}\n");
    let mut s = rule(format!("ip saddr != {} drop", alloc.sandbox_addr));
    s += &rule("meta nfproto != ipv4 drop".into());
    if e.by_name.is_some() {
        s += &rule(format!("ip daddr @{} drop", alloc.denied_set()));
    }
    if !e.deny.is_empty() {
        s += &rule(format!("ip daddr {{ {} }} drop", cidr_list(e.deny)));
    }
    if e.by_name.is_none() && !e.host.resolvers.is_empty() {
        let dns = e
            .host
            .resolvers
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>();
        for proto in ["udp", "tcp"] {
            s += &rule(format!(
                "ip daddr {{ {} }} {proto} dport 53 accept",
                dns.join(", ")
            ));
        }
    }
    if !e.allow.is_empty() {
        s += &rule(format!("ip daddr {{ {} }} accept", cidr_list(e.allow)));
    }
    if e.by_name.is_some() {
        let set = alloc.allowed_set();
        s += &rule(format!(
            "ip daddr @{set} update @{set} {{ ip daddr }} accept"
        ));
    }
    s += &rule(format!(
        "ip daddr {{ {} }} drop",
        cidr_list(&e.host.guarded())
    ));
    let allow_list = !e.allow.is_empty() || e.by_name.is_some_and(|b| b.allow_list);
    s += &rule(if allow_list { "drop" } else { "accept" }.into());
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
        format!("delete set {t} {}", alloc.allowed_set()),
        format!("delete set {t} {}", alloc.denied_set()),
        format!(
            "delete element {t} dns_redirect {{ \"{}\" }}",
            alloc.host_if
        ),
        format!(
            "delete element {t} dns_in {{ \"{}\" . {} }}",
            alloc.host_if, alloc.host_addr
        ),
    ]
}

/// The nameserver a sandbox with `internet` is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nameserver {
    /// The host's own (those it can reach: see [`resolv_conf`]).
    Host,
    /// The daemon's resolver for this sandbox, at the host end of its link.
    Resolver(Ipv4Addr),
}

impl Nameserver {
    /// The sandbox's resolv.conf, from the host's.
    pub fn resolv_conf(self, host: &str) -> String {
        match self {
            Nameserver::Host => resolv_conf(host),
            Nameserver::Resolver(addr) => {
                let rest: String = resolv_conf(host)
                    .lines()
                    .filter(|l| !l.starts_with("nameserver"))
                    .map(|l| format!("{l}\n"))
                    .collect();
                format!("nameserver {addr}\n{rest}")
            }
        }
    }
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

/// An nftables set literal of `list`: networks inside another one of the list are left
/// out (an anonymous set refuses overlapping intervals).
fn cidr_list(list: &[Cidr]) -> String {
    let mut out: Vec<Cidr> = Vec::new();
    for c in list {
        if out.iter().any(|o| o.contains(c)) {
            continue;
        }
        out.retain(|o| !c.contains(o));
        out.push(*c);
    }
    out.iter()
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
    fn a_sandbox_with_a_resolver_is_told_only_of_it() {
        let host = "nameserver 10.1.2.3\nsearch example.org\n";
        assert_eq!(
            Nameserver::Resolver(Ipv4Addr::new(198, 18, 0, 1)).resolv_conf(host),
            "nameserver 198.18.0.1\nsearch example.org\n"
        );
        assert_eq!(Nameserver::Host.resolv_conf(host), resolv_conf(host));
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

    fn host() -> HostNet {
        HostNet {
            resolvers: vec![Ipv4Addr::new(10, 255, 255, 53)],
            networks: vec![
                "192.0.2.0/24".parse().unwrap(),
                "10.9.0.0/16".parse().unwrap(),
            ],
        }
    }

    #[test]
    fn deny_then_dns_then_allow_then_the_guarded_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let a = NetAlloc::new(&config(dir.path()), 0);
        let (host, allow, deny) = (
            host(),
            ["10.0.0.0/8".parse().unwrap()],
            ["10.1.0.0/16".parse().unwrap()],
        );
        let e = Egress {
            allow: &allow,
            deny: &deny,
            host: &host,
            by_name: None,
        };
        let s = sandbox_rules_script(&a, &e);
        let at = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle} in {s}"));
        let dns = at("ip daddr { 10.255.255.53 } udp dport 53 accept");
        let d = at("10.1.0.0/16 } drop");
        let al = at("10.0.0.0/8 } accept");
        let guard = at("169.254.0.0/16");
        assert!(d < dns && dns < al && al < guard, "{s}");
        assert!(s.contains("ip saddr != 10.99.0.2 drop"));
        assert!(s.trim_end().ends_with("masq { 10.99.0.2 }"));
        assert!(
            s.contains("192.0.2.0/24"),
            "the host's network is guarded: {s}"
        );
        assert!(
            !s.contains("10.9.0.0/16"),
            "inside 10.0.0.0/8, left out of the set: {s}"
        );
        assert!(
            s.contains(" drop\nadd element"),
            "an allow list ends in drop"
        );
        let open = sandbox_rules_script(
            &a,
            &Egress {
                allow: &[],
                deny: &[],
                host: &host,
                by_name: None,
            },
        );
        assert!(
            open.contains(" accept\nadd element"),
            "otherwise in accept: {open}"
        );
        let replaced = sandbox_rules_replace(&a, &e);
        assert!(
            replaced.contains("flush chain inet sandfork sb_sfh0\n"),
            "{replaced}"
        );
        assert!(!replaced.contains("add element inet sandfork egress"));
        assert!(
            !replaced.contains("@n4_sfh0"),
            "no names, no learned set: {replaced}"
        );
        assert!(
            replaced
                .trim_end()
                .ends_with("dns_in { \"sfh0\" . 10.99.0.1 }")
                && replaced.contains("delete element inet sandfork dns_redirect"),
            "the redirect is turned off: {replaced}"
        );
    }

    #[test]
    fn names_redirect_dns_and_bracket_the_lists_with_learned_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let a = NetAlloc::new(&config(dir.path()), 0);
        let host = host();
        let deny = ["10.1.0.0/16".parse().unwrap()];
        let e = Egress {
            allow: &[],
            deny: &deny,
            host: &host,
            by_name: Some(crate::spec::ByName { allow_list: true }),
        };
        let s = sandbox_rules_script(&a, &e);
        let at = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle} in {s}"));
        let sets = at("add set inet sandfork n4_sfh0 { type ipv4_addr; flags dynamic,timeout;");
        let denied = at("ip daddr @d4_sfh0 drop");
        let deny_list = at("10.1.0.0/16 } drop");
        let allowed = at("ip daddr @n4_sfh0 update @n4_sfh0 { ip daddr } accept");
        let guard = at("169.254.0.0/16");
        assert!(sets < denied && denied < deny_list && deny_list < allowed && allowed < guard);
        assert!(
            !s.contains("dport 53 accept"),
            "DNS goes to the resolver only: {s}"
        );
        assert!(
            s.contains(" drop\nadd element inet sandfork dns_redirect { \"sfh0\" : 10.99.0.1 }")
        );
        assert!(!s.contains("delete element"));
        let deny_only = Egress {
            by_name: Some(crate::spec::ByName { allow_list: false }),
            ..e
        };
        assert!(sandbox_rules_script(&a, &deny_only).contains(" accept\nadd element"));

        let learned = learned_script(
            &a,
            &[
                (Ipv4Addr::new(203, 0, 113, 5), 60),
                (Ipv4Addr::new(203, 0, 113, 6), 300),
            ],
            &[],
        );
        assert_eq!(
            learned,
            "add element inet sandfork n4_sfh0 { 203.0.113.5, 203.0.113.6 }\n\
             delete element inet sandfork n4_sfh0 { 203.0.113.5, 203.0.113.6 }\n\
             add element inet sandfork n4_sfh0 { 203.0.113.5 timeout 60s, 203.0.113.6 timeout 300s }\n"
        );
        let removal = sandbox_rules_removal(&a);
        let chain = removal
            .iter()
            .position(|c| c.starts_with("delete chain"))
            .unwrap();
        let set = removal
            .iter()
            .position(|c| c.starts_with("delete set"))
            .unwrap();
        assert!(chain < set, "the chain refers to the sets: {removal:?}");
    }

    #[test]
    fn an_older_table_gains_the_dns_redirect() {
        let up = base_table_upgrade_script();
        assert!(up.contains("map dns_redirect"));
        assert!(up.contains("insert rule inet sandfork input iifname \"sfh*\""));
        let base = base_table_script(false);
        let input = &base[base.find("chain input").unwrap()..];
        assert!(
            input.find("@dns_in accept").unwrap() < input.find("iifname \"sfh*\" drop").unwrap()
        );
    }

    #[test]
    fn the_host_becomes_no_router_for_anything_but_sandboxes() {
        let forward_of = |s: String| {
            let at = s.find("chain forward").unwrap();
            s[at..at + s[at..].find('}').unwrap()].to_string()
        };
        assert!(forward_of(base_table_script(false)).contains("policy drop;"));
        assert!(forward_of(base_table_script(true)).contains("policy accept;"));
    }

    #[test]
    fn host_networks_come_from_the_routes_without_gateway() {
        let routes = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
                      eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\n\
                      eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n\
                      sfh1\t040012C6\t00000000\t0001\t0\t0\t0\tFCFFFFFF\n";
        assert_eq!(
            connected_networks(routes),
            vec!["192.0.2.0/24".parse().unwrap()]
        );
        assert_eq!(
            resolvers("nameserver 10.255.255.53\nsearch x\nnameserver ::1\n"),
            vec![Ipv4Addr::new(10, 255, 255, 53)]
        );
    }
}
