//! gateway: the cluster's entry point in the foreground until SIGTERM/SIGINT.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

/// `sandfork gateway`: the /v1 API of one node in front of a cluster of them (docs/scale-out.md).
#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// Where clients connect.
    #[arg(long, default_value = "127.0.0.1:7080")]
    pub listen: std::net::SocketAddr,
    /// The bearer token clients present.
    #[arg(long)]
    pub token_file: PathBuf,
    /// The nodes' API token (their --token-file).
    #[arg(long)]
    pub node_token_file: PathBuf,
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve a non-loopback --listen without TLS anyway (the token then crosses the network in clear).
    #[arg(long)]
    pub allow_insecure_remote: bool,
    /// Join this existing Ray cluster (host:port of its head); without it the gateway starts the head.
    #[arg(long, value_name = "HOST:PORT")]
    pub ray_address: Option<String>,
    /// This machine's address on the cluster's network.
    #[arg(long, default_value = "127.0.0.1")]
    pub ray_ip: String,
    /// Port of the Ray head the gateway starts.
    #[arg(long, default_value_t = 6379)]
    pub ray_port: u16,
    /// Seconds a silent node is waited for before it counts as lost.
    #[arg(long, default_value_t = 10)]
    pub node_timeout_secs: u64,
    /// Seconds a placement waits for a free sandbox slot.
    #[arg(long, default_value_t = 10)]
    pub place_timeout_secs: u64,
    /// Host-based port routing: {port}-{sandbox}.<domain>.
    #[arg(long, default_value = "localhost")]
    pub domain: String,
    #[arg(long, default_value = "/var/lib/sandfork-gateway")]
    pub state_dir: PathBuf,
    /// The Python with the `ray` package.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// The cluster's authority (`sandfork cluster init`'s ca.pem): nodes are spoken to over
    /// TLS, and only those whose certificate it signed for their node name
    #[arg(long, value_name = "PEM")]
    pub node_ca: Option<PathBuf>,
    /// The gateway's client certificate, which nodes ask for (default: gateway.pem beside --node-ca)
    #[arg(long, value_name = "PEM", requires = "node_client_key")]
    pub node_client_cert: Option<PathBuf>,
    /// The key of --node-client-cert
    #[arg(long, value_name = "PEM", requires = "node_client_cert")]
    pub node_client_key: Option<PathBuf>,
    /// Speak plain HTTP to nodes off this machine (the node token then crosses the network in clear)
    #[arg(long)]
    pub allow_insecure_nodes: bool,
    /// Ray's token file (default: <state-dir>/ray.token, made when the gateway starts the head)
    #[arg(long, value_name = "FILE")]
    pub ray_token_file: Option<PathBuf>,
}

/// `sandfork cluster`: the cluster's authority, tokens and node certificates.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Make a cluster's authority (ca.pem, ca.key) and tokens (ray.token, node.token) in DIR
    Init {
        /// Where they go (created, mode 0700)
        dir: PathBuf,
    },
    /// Issue node NAME's certificate (NAME.pem, NAME.key in DIR), signed by DIR's authority
    Issue {
        /// The cluster directory of `cluster init`
        dir: PathBuf,
        /// The node's name (its --node-name)
        name: String,
        /// An address the node's API is reached at (repeatable)
        #[arg(long = "ip", value_name = "IP")]
        ips: Vec<std::net::IpAddr>,
    },
}

pub fn cluster(c: ClusterCommand) -> Result<i32> {
    match c {
        ClusterCommand::Init { dir } => {
            gateway::trust::init(&dir)?;
            println!(
                "{}: ca.pem (give it to the gateway: --node-ca, and to every node: cluster_ca), \
                 ca.key (keep it here), gateway.pem/.key (the gateway's client certificate, \
                 found beside ca.pem), ray.token (the gateway's and every node's --ray-token-file), node.token (the \
                 gateway's --node-token-file, every node's --token-file)",
                dir.display()
            );
        }
        ClusterCommand::Issue { dir, name, ips } => {
            let (cert, key) = gateway::trust::issue(&dir, &name, &ips)?;
            println!("{} {}", cert.display(), key.display());
        }
    }
    Ok(0)
}

pub async fn run(a: GatewayArgs) -> Result<i32> {
    crate::serve::init_logs();
    let config = gateway::GatewayConfig {
        listen: a.listen,
        token_file: a.token_file,
        node_token_file: a.node_token_file,
        tls_cert: a.tls_cert,
        tls_key: a.tls_key,
        allow_insecure_remote: a.allow_insecure_remote,
        ray_address: a.ray_address,
        ray_ip: a.ray_ip,
        ray_port: a.ray_port,
        node_timeout: Duration::from_secs(a.node_timeout_secs),
        place_timeout: Duration::from_secs(a.place_timeout_secs),
        domain: a.domain,
        state_dir: a.state_dir,
        python: a.python,
        node_ca: a.node_ca,
        allow_insecure_nodes: a.allow_insecure_nodes,
        node_client_cert: a
            .node_client_cert
            .zip(a.node_client_key)
            .map(|(cert, key)| gateway::trust::ClientCert { cert, key }),
        ray_token_file: a.ray_token_file,
    };
    gateway::run(config, server::daemon::shutdown_signal()).await?;
    Ok(0)
}
