//! serve: the daemon in the foreground until SIGTERM/SIGINT.

use anyhow::{Context, Result};
use server::Config;
use tracing_subscriber::EnvFilter;

/// `sandfork serve`: flags override the config file, which overrides the defaults.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (keys as in the flags, with underscores).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Data directory: state, images, snapshots, sandboxes (default /var/lib/sandfork).
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Unix socket path (default <data-dir>/sandfork.sock).
    #[arg(long)]
    pub socket: Option<std::path::PathBuf>,
    /// Also listen on TCP, e.g. 127.0.0.1:7070 (loopback only unless --allow-remote); its
    /// clients and the console at /ui/ need the token.
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// File holding the TCP listener's token (default <data-dir>/api.token, made with a
    /// random token on first use).
    #[arg(long)]
    pub token_file: Option<std::path::PathBuf>,
    /// Allow --listen on a non-loopback address (then with TLS, see --tls-cert).
    #[arg(long)]
    pub allow_remote: bool,
    /// Most sandboxes alive at once (default 256).
    #[arg(long)]
    pub max_sandboxes: Option<u32>,
    /// Memory limits summed over live sandboxes may reach this, in MiB (default: twice
    /// the host's memory).
    #[arg(long)]
    pub max_memory_mb: Option<u64>,
    /// Image of sandboxes created without one (default python).
    #[arg(long)]
    pub default_image: Option<String>,
    /// Seconds a create waits for room on a full host before 429 (default 30).
    #[arg(long)]
    pub admission_wait_secs: Option<u64>,
    /// Merge equal memory pages across sandboxes, so forks share what they have not
    /// written (default true; starts the kernel's ksmd).
    #[arg(long, value_name = "BOOL")]
    pub memory_merge: Option<bool>,
    /// Turn the cgroup2 mount option favordynmods on, so moving tasks between cgroups
    /// (every create and restore) skips an RCU grace period (default true; host-wide).
    #[arg(long, value_name = "BOOL")]
    pub cgroup_favor_dynmods: Option<bool>,
    /// Serve the web console under /ui/ (default true).
    #[arg(long, value_name = "BOOL")]
    pub ui: Option<bool>,
    /// Restore memory snapshots lazily: pages copied in as the sandbox touches them and
    /// the rest in the background (default true).
    #[arg(long, value_name = "BOOL")]
    pub lazy_restore: Option<bool>,
    /// Ready forks kept at least per hot memory snapshot, restored ahead of demand; a
    /// snapshot forked N at a time gets up to N (default 2; 0 = no pool).
    #[arg(long)]
    pub pool_size: Option<u32>,
    /// Memory the pool's ready forks may hold together, in MiB (default 2048).
    #[arg(long)]
    pub pool_memory_mb: Option<u64>,
    /// A CA (PEM file) trusted for registries beyond the system's roots (repeatable).
    #[arg(long, value_name = "PEM")]
    pub registry_ca: Vec<std::path::PathBuf>,
    /// A registry (host[:port]) pulled from over plain HTTP (repeatable).
    #[arg(long, value_name = "HOST")]
    pub insecure_registry: Vec<String>,
    /// Publish snapshots to, and pull them from, this S3 bucket (s3://BUCKET[/PREFIX]);
    /// credentials from the config file's [object_store] table or AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY.
    #[arg(long, value_name = "URL")]
    pub object_store: Option<String>,
    /// The S3 endpoint (default: AWS's for the region).
    #[arg(long, value_name = "URL")]
    pub object_store_endpoint: Option<String>,
    /// Allow a plain-HTTP object store endpoint.
    #[arg(long)]
    pub object_store_allow_http: bool,
    /// This node's name in what it publishes (default: the host name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Join this Ray cluster (host:port of its head) as a sandfork node (needs --listen
    /// and --object-store).
    #[arg(long, value_name = "HOST:PORT")]
    pub ray_address: Option<String>,
    /// The Ray cluster's token file (the gateway's ray.token, or `sandfork cluster init`'s)
    #[arg(long, value_name = "FILE")]
    pub ray_token_file: Option<std::path::PathBuf>,
}

/// The configuration: defaults, then the config file, then flags.
pub fn config_of(a: ServeArgs) -> Result<Config> {
    let mut c = match &a.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    c.data_dir = a.data_dir.unwrap_or(c.data_dir);
    c.socket = a.socket.or(c.socket);
    c.listen = a.listen.or(c.listen);
    c.token_file = a.token_file.or(c.token_file);
    c.allow_remote |= a.allow_remote;
    c.max_sandboxes = a.max_sandboxes.unwrap_or(c.max_sandboxes);
    c.max_memory_mb = a.max_memory_mb.unwrap_or(c.max_memory_mb);
    c.default_image = a.default_image.unwrap_or(c.default_image);
    c.admission_wait_secs = a.admission_wait_secs.unwrap_or(c.admission_wait_secs);
    c.memory_merge = a.memory_merge.unwrap_or(c.memory_merge);
    c.cgroup_favor_dynmods = a.cgroup_favor_dynmods.unwrap_or(c.cgroup_favor_dynmods);
    c.ui = a.ui.unwrap_or(c.ui);
    c.lazy_restore = a.lazy_restore.unwrap_or(c.lazy_restore);
    c.pool_size = a.pool_size.unwrap_or(c.pool_size);
    c.pool_memory_mb = a.pool_memory_mb.unwrap_or(c.pool_memory_mb);
    c.registry_ca.extend(a.registry_ca);
    c.insecure_registries.extend(a.insecure_registry);
    c.node_name = a.node_name.or(c.node_name);
    c.ray_address = a.ray_address.or(c.ray_address);
    c.ray_token_file = a.ray_token_file.or(c.ray_token_file);
    object_store_flags(
        &mut c,
        a.object_store,
        a.object_store_endpoint,
        a.object_store_allow_http,
    );
    c.validate()?;
    Ok(c)
}

/// The object store flags over the file's `[object_store]`; credentials the file does not
/// give come from the usual AWS variables.
fn object_store_flags(
    c: &mut Config,
    url: Option<String>,
    endpoint: Option<String>,
    allow_http: bool,
) {
    if url.is_none() && c.object_store.is_none() {
        return;
    }
    let b = c.object_store.get_or_insert_with(Default::default);
    b.url = url.unwrap_or(std::mem::take(&mut b.url));
    b.endpoint = endpoint.or(b.endpoint.take());
    b.allow_http |= allow_http;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if b.access_key_id.is_empty() {
        b.access_key_id = env("AWS_ACCESS_KEY_ID").unwrap_or_default();
    }
    if b.secret_access_key.is_empty() {
        b.secret_access_key = env("AWS_SECRET_ACCESS_KEY").unwrap_or_default();
    }
    b.session_token = b.session_token.take().or_else(|| env("AWS_SESSION_TOKEN"));
}

pub fn init_logs() {
    let filter = EnvFilter::try_from_env("SANDFORK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: a redirected log stays plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .try_init();
}

pub async fn serve(a: ServeArgs) -> Result<i32> {
    init_logs();
    let config = config_of(a)?;
    let backend = server::runc::RuncBackend::open(&config).context("cannot set up the runtime")?;
    let daemon = server::Daemon::start(config, backend).await?;
    daemon.serve(server::daemon::shutdown_signal()).await;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "max_sandboxes = 5\nmax_memory_mb = 100\n").unwrap();
        let a = ServeArgs {
            config: Some(file),
            data_dir: Some("/tmp/d".into()),
            socket: None,
            listen: None,
            token_file: None,
            allow_remote: false,
            max_sandboxes: Some(7),
            max_memory_mb: None,
            default_image: None,
            admission_wait_secs: None,
            memory_merge: Some(false),
            cgroup_favor_dynmods: Some(false),
            ui: Some(false),
            lazy_restore: Some(false),
            pool_size: Some(0),
            pool_memory_mb: None,
            registry_ca: Vec::new(),
            insecure_registry: vec!["127.0.0.1:5000".into()],
            object_store: None,
            object_store_endpoint: None,
            object_store_allow_http: false,
            node_name: None,
            ray_address: None,
            ray_token_file: None,
        };
        let c = config_of(a).unwrap();
        assert_eq!((c.pool_size, c.pool_memory_mb), (0, 2048));
        assert_eq!((c.max_sandboxes, c.max_memory_mb), (7, 100));
        assert!(!c.memory_merge && !c.lazy_restore && !c.ui && !c.cgroup_favor_dynmods);
        assert_eq!(c.insecure_registries, ["127.0.0.1:5000"]);
        assert!(c.object_store.is_none(), "local only unless asked");
        assert_eq!(
            c.socket_path(),
            std::path::PathBuf::from("/tmp/d/sandfork.sock")
        );
    }
}
