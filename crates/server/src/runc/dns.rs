//! Egress rules by name on the runc backend: a sandbox's lists split into what nftables
//! enforces alone (addresses, CIDRs) and names, and one [`egress::Resolver`] per running
//! sandbox with `internet`, bound to the host end of its link. The addresses it learns
//! go into the sandbox's nftables sets through the runtime.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use egress::{Entry, NameRules, Policy, Resolver, ResolverConfig};
use runtime::net::NetAlloc;
use runtime::{ByName, Cidr, ContainerRuntime};

use crate::backend::{BackendError, BackendResult};
use crate::config::Config;

/// A sandbox's egress lists, split.
#[derive(Debug, Default)]
pub(super) struct Lists {
    pub allow: Vec<Cidr>,
    pub deny: Vec<Cidr>,
    pub names: NameRules,
}

impl Lists {
    /// Splits and parses both lists; an entry that is neither is refused with the reason.
    pub fn parse(allow_out: &[String], deny_out: &[String]) -> BackendResult<Lists> {
        let mut lists = Lists::default();
        for (raw, cidrs, names) in [
            (allow_out, &mut lists.allow, &mut lists.names.allow),
            (deny_out, &mut lists.deny, &mut lists.names.deny),
        ] {
            for entry in raw {
                match egress::parse_entry(entry)
                    .map_err(|e| BackendError::InvalidInput(e.to_string()))?
                {
                    Entry::Address(c) => cidrs.push(c.parse().map_err(|_| {
                        BackendError::InvalidInput(format!("Invalid egress entry {c:?}"))
                    })?),
                    Entry::Name(p) => names.push(p),
                }
            }
        }
        Ok(lists)
    }

    /// What the runtime needs to know of the names. Every sandbox the daemon starts with
    /// `internet` has its DNS answered by its resolver, names or not, so that rules by
    /// name can be added live and DNS works where the host's resolver is on loopback.
    pub fn by_name(&self) -> ByName {
        ByName {
            allow_list: !self.names.allow.is_empty(),
        }
    }

    /// With a name in `allow_out`, only allowed names resolve. With an `allow_out` of
    /// addresses alone, none does: the sandbox needs no name, and a query that goes
    /// upstream would be a way out past its addresses (data in the names asked). With
    /// 0.0.0.0/0 denied, none does either; with no `allow_out`, every name not denied.
    fn policy(&self) -> Policy {
        let addresses_only = !self.allow.is_empty() && self.names.allow.is_empty();
        Policy {
            allow_list: !self.names.allow.is_empty(),
            closed: addresses_only || self.deny.iter().any(|c| c.prefix == 0),
            names: self.names.clone(),
        }
    }
}

/// The resolvers of running sandboxes, by sandbox id.
pub(super) struct Resolvers {
    config: Arc<ResolverConfig>,
    runtime: Arc<ContainerRuntime>,
    running: std::sync::Mutex<HashMap<String, Slot>>,
}

/// A running sandbox's link and, when its lists name hosts, its resolver.
struct Slot {
    net: Option<NetAlloc>,
    resolver: Option<Arc<Resolver>>,
}

impl Resolvers {
    pub fn new(config: &Config, runtime: Arc<ContainerRuntime>) -> BackendResult<Resolvers> {
        let net4 = |c: Cidr| egress::Net4 {
            addr: c.addr,
            prefix: c.prefix,
        };
        let trusted = config
            .dns_trusted()
            .map_err(|e| BackendError::InvalidInput(e.to_string()))?
            .into_iter()
            .map(net4)
            .collect();
        let host = runtime::net::HostNet::of_host();
        let guarded = runtime::net::GUARDED
            .iter()
            .filter_map(|c| c.parse::<Cidr>().ok())
            .chain(host.networks.iter().copied())
            .map(net4)
            .collect();
        let upstreams = if config.dns_upstreams.is_empty() {
            host_resolvers()
        } else {
            config.dns_upstreams.clone()
        };
        Ok(Resolvers {
            config: Arc::new(ResolverConfig {
                upstreams,
                guarded,
                trusted,
                ..ResolverConfig::default()
            }),
            runtime,
            running: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Starts the resolver of a sandbox that just started on `net` (none without one).
    /// No lock is held while resolvers start or stop (they wait on the network), so one
    /// sandbox's never holds up another's.
    pub async fn started(
        &self,
        id: &str,
        net: Option<NetAlloc>,
        lists: &Lists,
    ) -> BackendResult<()> {
        // The old one (if any) lets go of its address first.
        let old = self.slots().remove(id);
        if let Some(r) = old.and_then(|s| s.resolver) {
            r.shutdown().await;
        }
        let resolver = match &net {
            Some(alloc) => Some(Arc::new(self.start(id, alloc, lists).await?)),
            None => None,
        };
        self.slots().insert(id.to_owned(), Slot { net, resolver });
        Ok(())
    }

    /// A running sandbox's lists changed: its resolver takes the new policy (or, if it
    /// has none, gets one).
    pub async fn changed(&self, id: &str, lists: &Lists) -> BackendResult<()> {
        let Some((resolver, net)) = self
            .slots()
            .get(id)
            .map(|s| (s.resolver.clone(), s.net.clone()))
        else {
            return Ok(());
        };
        match (resolver, net) {
            (Some(r), _) => r.set_policy(lists.policy()).await,
            (None, Some(alloc)) => {
                let r = Arc::new(self.start(id, &alloc, lists).await?);
                if let Some(slot) = self.slots().get_mut(id) {
                    slot.resolver = Some(r);
                }
            }
            (None, None) => {}
        }
        Ok(())
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn start(&self, id: &str, alloc: &NetAlloc, lists: &Lists) -> BackendResult<Resolver> {
        let learn = Arc::new(NftLearn {
            runtime: self.runtime.clone(),
            alloc: alloc.clone(),
        });
        let bind = SocketAddr::from((alloc.host_addr, 53));
        let r = Resolver::start(bind, lists.policy(), self.config.clone(), learn)
            .await
            .map_err(|e| {
                BackendError::Host(format!(
                    "cannot start the DNS resolver of sandbox {id} on {bind}: {e}"
                ))
            })?;
        Ok(r)
    }

    /// Stops a sandbox's resolver, if it has one, and waits until it let go of its address.
    pub async fn stop(&self, id: &str) {
        let slot = self.slots().remove(id);
        if let Some(r) = slot.and_then(|s| s.resolver) {
            r.shutdown().await;
        }
    }
}

/// The host's nameservers (loopback ones too: the resolver runs on the host).
fn host_resolvers() -> Vec<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// Writes learned addresses into the sandbox's nftables sets.
struct NftLearn {
    runtime: Arc<ContainerRuntime>,
    alloc: NetAlloc,
}

impl egress::Learn for NftLearn {
    fn learn(&self, learned: &egress::Learned) -> std::io::Result<()> {
        self.runtime
            .learn_addresses(&self.alloc, &learned.allowed, &learned.denied)
            .map_err(std::io::Error::other)
    }
}
