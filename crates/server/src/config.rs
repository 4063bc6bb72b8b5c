//! The daemon's configuration: one struct, read from an optional TOML file and overridden
//! by command-line flags. It is the single truth for every option and its default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/sandfork";

/// Socket file name inside the data directory.
pub const SOCKET_NAME: &str = "sandfork.sock";

/// Errors reading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("Cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Config file {path} is invalid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("Invalid configuration: {0}")]
    Invalid(String),
}

/// Free space an import, a pull or an unpack leaves on the host disk at least: files are
/// unpacked next to themselves, and sandboxes' disks grow into the same filesystem.
pub const IMPORT_SPACE_FLOOR: u64 = 512 << 20;

/// Everything `sandfork serve` can be told.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Data directory: `state.db`, layers, images, sandboxes.
    pub data_dir: PathBuf,
    /// Unix socket path; default `<data_dir>/sandfork.sock`.
    pub socket: Option<PathBuf>,
    /// Optional TCP listener; its clients need the token.
    pub listen: Option<SocketAddr>,
    /// File holding the bearer token for the TCP listener; default
    /// `<data_dir>/api.token`, made with a random token on first use.
    pub token_file: Option<PathBuf>,
    /// Allow `listen` on a non-loopback address (with TLS, unless `allow_insecure_remote`).
    pub allow_remote: bool,
    /// PEM certificate chain for the TCP listener: with it (and `tls_key`) the listener
    /// speaks HTTPS. Required for a non-loopback listener.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Serve a non-loopback listener over plain HTTP anyway (the bearer token then
    /// crosses the network in clear text).
    pub allow_insecure_remote: bool,
    /// Most connections each listener serves at once; more wait.
    pub max_connections: usize,
    /// Of `max_connections` on the TCP listener, how many (at most half) are kept for
    /// clients that present the token: the others may all be held by clients that do not.
    pub reserved_connections: usize,
    /// How long a client may take to send a request's headers (or a TLS handshake).
    pub header_timeout_secs: u64,
    /// A connection with no request or response in flight this long is closed.
    pub idle_timeout_secs: u64,
    /// The image of sandboxes created without one (built on first use when built-in).
    pub default_image: String,
    /// Most sandboxes alive at once (not terminated or failed).
    pub max_sandboxes: u32,
    /// Cap, in MiB, on the summed `memory_mb` limits of live sandboxes (the overcommit
    /// cap); 0 = `memory_overcommit` × the host's memory. Limits are caps, not
    /// reservations: what sandboxes really use is checked against the host's available
    /// memory (docs/operations.md, admission).
    pub max_memory_mb: u64,
    /// With `max_memory_mb` = 0: how many times the host's memory the summed limits may be.
    pub memory_overcommit: f64,
    /// Host memory, in MiB, admission keeps free; 0 = 5% of the host's, at least 512 MiB.
    pub memory_reserve_mb: u64,
    /// What a child of a memory snapshot (a fork or a warm restore) is charged against
    /// `max_memory_mb`, as a fraction of its limit: its snapshot's pages are shared until
    /// written (with `memory_merge`; without, a copy of them is charged on top). 1 = its
    /// whole limit, as any sandbox. docs/operations.md, admission.
    pub fork_memory_charge: f64,
    /// Free space, in MiB, the data directory's disk keeps: new sandboxes are refused below.
    pub disk_reserve_mb: u64,
    /// How long a create, restore or fork waits for room when the host is full before it
    /// is refused (429 naming what is full), in seconds.
    pub admission_wait_secs: u64,
    /// Under memory pressure, named sandboxes idle this long are suspended (memory
    /// checkpoint to disk) to make room for new work; 0 = never.
    pub pressure_suspend_idle_secs: u64,
    /// How often idle timeouts are checked, in milliseconds.
    pub reaper_interval_ms: u64,
    /// How long graceful shutdown waits for in-flight work, in seconds.
    pub shutdown_grace_secs: u64,
    /// Largest JSON request body, in bytes.
    pub max_json_bytes: usize,
    /// Largest file upload, in bytes.
    pub max_upload_bytes: u64,
    /// Largest snapshot file an import takes, in bytes.
    pub max_import_bytes: u64,
    /// Cap on each of stdout and stderr collected by a non-streaming exec, in bytes of the
    /// JSON answer (escapes and base64 included).
    pub max_exec_output_bytes: usize,
    /// What a flush inside a sandbox waits for: `writeback` (the host syncs at checkpoints,
    /// suspend and stop) or `durable` (every flush is a host fsync). docs/disk-path.md.
    pub disk_flush: disk::fuse::FlushMode,
    /// Merge equal memory pages across sandboxes (the kernel's KSM): forks of one memory
    /// snapshot then share what none of them has written. Starts `ksmd` if it is stopped.
    /// docs/checkpoints.md, memory sharing.
    pub memory_merge: bool,
    /// Turn the cgroup2 mount option `favordynmods` on at start: moving a task between
    /// cgroups then costs ≈ 0.1 ms instead of an RCU grace period (7–16 ms here), which
    /// every create and restore does several times. Host-wide; docs/checkpoints.md.
    pub cgroup_favor_dynmods: bool,
    /// Serve the web console under `/ui/` (on the Unix socket and the TCP listener; the
    /// TCP one asks for the API token before it shows anything). docs/console.md.
    pub ui: bool,
    /// Restore memory snapshots lazily: a restored sandbox runs before its memory is
    /// read back, pages copied in as it touches them and the rest in the background
    /// (CRIU's lazy pages over userfaultfd; off by itself where the host lacks them).
    /// docs/checkpoints.md, lazy restores.
    pub lazy_restore: bool,
    /// Ready forks kept at least per hot memory snapshot (one restored or forked from
    /// lately): restored ahead of demand and frozen, handed over with their own identity;
    /// a snapshot forked N at a time gets up to N (within `pool_memory_mb`); 0 = no pool.
    /// docs/checkpoints.md, the pool of ready forks.
    pub pool_size: u32,
    /// Memory, in MiB, the pool's forks may hold together (each is charged its
    /// snapshot's size).
    pub pool_memory_mb: u64,
    /// A snapshot's ready forks go once it has not been used for this long, in seconds.
    pub pool_idle_secs: u64,
    /// PEM files of CAs trusted for registries beyond the system's roots.
    pub registry_ca: Vec<PathBuf>,
    /// Registries (`host[:port]`) pulled from over plain HTTP; all others over verified TLS.
    pub insecure_registries: Vec<String>,
    /// Pulls that name no credentials use the Docker config file's
    /// (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`).
    pub registry_docker_config: bool,
    /// The URL browsers and remote clients reach this daemon at (behind a proxy, a tunnel
    /// or a TLS terminator), e.g. `https://sandfork.example`; default: the TCP listener's.
    /// Port URLs given to clients on the Unix socket start with it.
    pub public_url: Option<String>,
    /// Host-based port routing: `{port}-{sandbox id}.<gateway_domain>` reaches the
    /// sandbox's port (point a wildcard DNS name at the daemon; `*.localhost` needs none).
    pub gateway_domain: String,
    /// Most gateway connections one sandbox's ports take at once; more are refused (503),
    /// so one flooded sandbox cannot take every connection of the listener.
    pub gateway_connections_per_sandbox: usize,
    /// Resolvers that sandboxes' DNS is forwarded to when their egress lists name hosts
    /// (`host:port`); empty = the host's `/etc/resolv.conf` nameservers, on port 53.
    pub dns_upstreams: Vec<SocketAddr>,
    /// Private ranges (CIDRs) a name allowed by an egress rule may resolve to. Answers in
    /// any other private, link-local or host range are dropped: a public name pointed at
    /// them is DNS rebinding. Loopback and link-local ranges cannot be listed.
    pub dns_trusted_ranges: Vec<String>,
    /// Guarded ranges (private, link-local with the cloud metadata address, loopback,
    /// CGNAT, the test ranges, the host's own networks) that an API caller may open with
    /// an explicit `allow_out`: an entry is accepted only inside one of these (default
    /// none: an `allow_out` that reaches into a guarded range is refused).
    pub allow_out_guarded: Vec<String>,
    /// The cluster's authority (`sandfork cluster init`'s ca.pem): snapshots this node
    /// publishes are signed with its own key (`tls_key`, certified by the authority for
    /// its name), and it restores only snapshots signed by such a node that is not revoked
    /// (docs/scale-out.md). Without it, the nodes share `snapshot.key`.
    pub cluster_ca: Option<PathBuf>,
    /// Node names whose snapshots are refused from now on, one a line (read at every
    /// check; with `cluster_ca`).
    pub cluster_revoked: Option<PathBuf>,
    /// Publish snapshots to this S3-compatible object store and pull from it the ones
    /// this node lacks (an `[object_store]` table: url, endpoint, region, allow_http,
    /// access_key_id, secret_access_key; none = snapshots stay on this node).
    /// docs/scale-out.md.
    pub object_store: Option<remote::BucketConfig>,
    /// With `object_store`: every snapshot (but a suspend's own) is published once
    /// taken, in the background.
    pub publish_snapshots: bool,
    /// Space, in MiB, that snapshots pulled from the object store may take here (their
    /// memory images and fetched blocks) before the least recently used go.
    pub remote_cache_mb: u64,
    /// This node's name in what it publishes and in the cluster (default: the host name).
    pub node_name: Option<String>,
    /// Join the Ray cluster whose head is here (`host:port`) as a sandfork node: its
    /// sandbox slots (`max_sandboxes`) and memory become Ray resources that the gateway
    /// places sandboxes on, its `listen` address a node label. Needs `listen` and
    /// `object_store`. docs/scale-out.md.
    pub ray_address: Option<String>,
    /// The Ray cluster's token (Ray's token authentication is always on in a sandfork
    /// cluster): the gateway's `ray.token`, or `sandfork cluster init`'s.
    pub ray_token_file: Option<PathBuf>,
    /// The Python that runs Ray (with the `ray` package installed).
    pub python: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            socket: None,
            listen: None,
            token_file: None,
            allow_remote: false,
            tls_cert: None,
            tls_key: None,
            allow_insecure_remote: false,
            max_connections: 1024,
            reserved_connections: 64,
            header_timeout_secs: 10,
            idle_timeout_secs: 120,
            default_image: "python".into(),
            max_sandboxes: 256,
            max_memory_mb: 0,
            memory_overcommit: 2.0,
            memory_reserve_mb: 0,
            fork_memory_charge: 0.25,
            disk_reserve_mb: 1024,
            admission_wait_secs: 30,
            pressure_suspend_idle_secs: 120,
            reaper_interval_ms: 1000,
            shutdown_grace_secs: 10,
            max_json_bytes: 1 << 20,
            max_upload_bytes: 4 << 30,
            max_import_bytes: 64 << 30,
            max_exec_output_bytes: 64 << 20,
            disk_flush: disk::fuse::FlushMode::default(),
            memory_merge: true,
            cgroup_favor_dynmods: true,
            ui: true,
            lazy_restore: true,
            pool_size: 2,
            pool_memory_mb: 2048,
            pool_idle_secs: 300,
            registry_ca: Vec::new(),
            insecure_registries: Vec::new(),
            registry_docker_config: true,
            public_url: None,
            gateway_domain: "localhost".into(),
            gateway_connections_per_sandbox: 256,
            dns_upstreams: Vec::new(),
            dns_trusted_ranges: Vec::new(),
            allow_out_guarded: Vec::new(),
            cluster_ca: None,
            cluster_revoked: None,
            object_store: None,
            publish_snapshots: true,
            remote_cache_mb: 10_240,
            node_name: None,
            ray_address: None,
            ray_token_file: None,
            python: "python3".into(),
        }
    }
}

impl Config {
    /// Reads a TOML config file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Invalid(message) => ConfigError::Parse {
                path: path.into(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML text (unknown keys are refused).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Invalid(e.message().to_string()))
    }

    /// The Unix socket path in effect.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join(SOCKET_NAME))
    }

    /// Checks combinations a single field cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(addr) = self.listen {
            if !addr.ip().is_loopback() && !self.allow_remote {
                return Err(ConfigError::Invalid(format!(
                    "listen address {addr} is not loopback (set allow_remote to permit it)"
                )));
            }
            if !addr.ip().is_loopback() && self.tls_cert.is_none() && !self.allow_insecure_remote {
                return Err(ConfigError::Invalid(format!(
                    "listen address {addr} is not loopback and no tls_cert is set: the token \
                     would cross the network in clear text (set tls_cert and tls_key, or \
                     allow_insecure_remote to force it)"
                )));
            }
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid(
                "tls_cert and tls_key go together".into(),
            ));
        }
        if self.max_connections == 0 || self.header_timeout_secs == 0 || self.idle_timeout_secs == 0
        {
            return Err(ConfigError::Invalid(
                "max_connections, header_timeout_secs and idle_timeout_secs must be at least 1"
                    .into(),
            ));
        }
        if !(self.memory_overcommit.is_finite() && self.memory_overcommit > 0.0) {
            return Err(ConfigError::Invalid(format!(
                "memory_overcommit must be a positive number, not {}",
                self.memory_overcommit
            )));
        }
        if !(self.fork_memory_charge > 0.0 && self.fork_memory_charge <= 1.0) {
            return Err(ConfigError::Invalid(format!(
                "fork_memory_charge must be above 0 and at most 1, not {}",
                self.fork_memory_charge
            )));
        }
        if self.max_sandboxes == 0 {
            return Err(ConfigError::Invalid(
                "max_sandboxes must be at least 1".into(),
            ));
        }
        self.dns_trusted()?;
        self.guarded_allowed()?;
        if let Some(b) = &self.object_store {
            remote::Bucket::open(b).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        if self.ray_address.is_some() {
            let listen = self.listen.ok_or_else(|| {
                ConfigError::Invalid(
                    "ray_address needs listen: the gateway reaches nodes over TCP".into(),
                )
            })?;
            if listen.ip().is_unspecified() {
                return Err(ConfigError::Invalid(format!(
                    "ray_address needs listen on the address other nodes reach, not {listen}"
                )));
            }
            if self.object_store.is_none() {
                return Err(ConfigError::Invalid(
                    "ray_address needs object_store: nodes restore each other's snapshots from it"
                        .into(),
                ));
            }
            if self.ray_token_file.is_none() {
                return Err(ConfigError::Invalid(
                    "ray_address needs ray_token_file: Ray's token authentication is always on \
                     (the gateway's ray.token, or `sandfork cluster init`'s)"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// This node's name: `node_name`, else the host name.
    pub fn node(&self) -> String {
        self.node_name.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "sandfork".into())
        })
    }

    /// `allow_out_guarded`, parsed.
    pub fn guarded_allowed(&self) -> Result<Vec<runtime::Cidr>, ConfigError> {
        self.allow_out_guarded
            .iter()
            .map(|c| {
                c.parse().map_err(|_| {
                    ConfigError::Invalid(format!(
                        "allow_out_guarded entry {c:?}: not an IPv4 CIDR (a.b.c.d/n, n up to 32)"
                    ))
                })
            })
            .collect()
    }

    /// `dns_trusted_ranges`, parsed; loopback and link-local (the metadata service) are
    /// refused.
    pub fn dns_trusted(&self) -> Result<Vec<runtime::Cidr>, ConfigError> {
        let reserved = [
            ("127.0.0.0/8", "loopback"),
            ("169.254.0.0/16", "link-local (metadata service)"),
        ];
        self.dns_trusted_ranges
            .iter()
            .map(|c| {
                let bad = |why: String| {
                    ConfigError::Invalid(format!("dns_trusted_ranges entry {c:?}: {why}"))
                };
                let net: runtime::Cidr = c
                    .parse()
                    .map_err(|_| bad("not an IPv4 CIDR (a.b.c.d/n, n up to 32)".into()))?;
                for (range, what) in reserved {
                    let range: runtime::Cidr = range.parse().expect("literal CIDR");
                    if range.contains(&net) || net.contains(&range) {
                        return Err(bad(format!(
                            "overlaps the {what} range, which sandboxes never reach"
                        )));
                    }
                }
                Ok(net)
            })
            .collect()
    }

    /// The file of the TCP listener's token, if there is a listener or a token file.
    pub fn token_path(&self) -> Option<PathBuf> {
        self.token_file.clone().or_else(|| {
            self.listen
                .map(|_| self.data_dir.join(GENERATED_TOKEN_FILE))
        })
    }

    /// Reads the bearer token (trimmed); an empty token is refused. Without a
    /// `token_file`, a listener's token is `<data_dir>/api.token`, made (0600, a random
    /// 256-bit token) when missing.
    pub fn read_token(&self) -> Result<Option<String>, ConfigError> {
        let Some(path) = &self.token_path() else {
            return Ok(None);
        };
        if self.token_file.is_none() && !path.exists() {
            make_token_file(path)?;
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let token = text.trim().to_string();
        if token.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "token file {} is empty",
                path.display()
            )));
        }
        Ok(Some(token))
    }
}

/// The listener's token file in the data directory when none is configured.
pub const GENERATED_TOKEN_FILE: &str = "api.token";

fn make_token_file(path: &std::path::Path) -> Result<(), ConfigError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let bytes =
        model::ids::random_bytes::<32>().map_err(|e| err(std::io::Error::other(e.to_string())))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| writeln!(f, "{token}"))
        .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides_parse() {
        let c = Config::from_toml("data_dir = \"/tmp/x\"\nmax_sandboxes = 3\n").unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.max_sandboxes, 3);
        assert_eq!(c.max_memory_mb, Config::default().max_memory_mb);
        assert_eq!(c.socket_path(), PathBuf::from("/tmp/x/sandfork.sock"));
    }

    #[test]
    fn disk_flush_is_writeback_unless_asked() {
        assert_eq!(
            Config::default().disk_flush,
            disk::fuse::FlushMode::Writeback
        );
        let c = Config::from_toml("disk_flush = \"durable\"").unwrap();
        assert_eq!(c.disk_flush, disk::fuse::FlushMode::Durable);
        let err = Config::from_toml("disk_flush = \"sometimes\"").unwrap_err();
        assert!(err.to_string().contains("sometimes"), "{err}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = Config::from_toml("data_dri = \"/tmp\"").unwrap_err();
        assert!(err.to_string().contains("data_dri"), "{err}");
    }

    #[test]
    fn listen_needs_token_and_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Config {
            listen: Some("127.0.0.1:9000".parse().unwrap()),
            data_dir: dir.path().into(),
            ..Config::default()
        };
        assert!(c.validate().is_ok());
        // No token file given: one is made, private, and kept across starts.
        let token = c.read_token().unwrap().unwrap();
        assert_eq!(token.len(), 64);
        let file = dir.path().join(GENERATED_TOKEN_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(c.read_token().unwrap().unwrap(), token);
        c.token_file = Some("/tmp/t".into());
        assert!(c.validate().is_ok());
        c.listen = Some("0.0.0.0:9000".parse().unwrap());
        assert!(c.validate().is_err());
        c.allow_remote = true;
        let err = c.validate().unwrap_err();
        assert!(err.to_string().contains("clear text"), "{err}");
        c.tls_cert = Some("/tmp/cert.pem".into());
        assert!(c.validate().is_err(), "a certificate needs its key");
        c.tls_key = Some("/tmp/key.pem".into());
        assert!(c.validate().is_ok());
        c.tls_cert = None;
        c.tls_key = None;
        c.allow_insecure_remote = true;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn trusted_dns_ranges_never_cover_loopback_or_link_local() {
        let with = |ranges: &[&str]| Config {
            dns_trusted_ranges: ranges.iter().map(|r| r.to_string()).collect(),
            ..Config::default()
        };
        assert_eq!(
            with(&["198.19.1.0/24", "10.0.0.0/8"])
                .dns_trusted()
                .unwrap()
                .len(),
            2
        );
        for (bad, why) in [
            ("169.254.169.254/32", "link-local"),
            ("169.0.0.0/8", "link-local"),
            ("0.0.0.0/0", "loopback"),
            ("127.0.0.53", "loopback"),
            ("10.0.0.0/40", "IPv4 CIDR"),
            ("example.com", "IPv4 CIDR"),
        ] {
            let err = with(&[bad]).validate().unwrap_err().to_string();
            assert!(err.contains(why) && err.contains(bad), "{bad}: {err}");
        }
    }
}
