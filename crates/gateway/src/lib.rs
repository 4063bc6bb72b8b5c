//! `sandfork gateway`: the cluster's one entry point (docs/scale-out.md).
//!
//! It serves the `/v1` API of a single node in front of many: sandboxes are placed by Ray
//! (a placement group per sandbox holding one of its node's `sandfork_slot`s, soft-targeted
//! at the nodes that hold its snapshot), every call of a sandbox (its files, processes,
//! ports and terminals) goes to the node that runs it, and a fork of N is spread over the
//! nodes Ray gives it. Which node runs which sandbox is kept in Ray's own store; snapshots
//! travel between nodes through the object store. SDKs need only the gateway's URL and
//! token.

mod directory;
mod fanout;
pub mod node;
mod routes;
pub mod trust;
mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ray::{Helper, NodeInfo, RayNode};
use sandfork_http::listen;
use sandfork_http::token::Token;
use tokio::sync::watch;

/// Everything `sandfork gateway` can be told.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// The bearer token clients present.
    pub token_file: PathBuf,
    /// The nodes' API token (their `token_file`).
    pub node_token_file: PathBuf,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Serve a non-loopback listener without TLS anyway.
    pub allow_insecure_remote: bool,
    /// An existing Ray cluster to join (as a node without sandbox slots); none: the
    /// gateway starts the cluster's head.
    pub ray_address: Option<String>,
    /// This machine's address on the cluster's network (Ray's node address).
    pub ray_ip: String,
    /// The head's port, when the gateway starts it.
    pub ray_port: u16,
    /// How long a silent node is waited for before Ray declares it dead (head only).
    pub node_timeout: Duration,
    /// How long a placement waits for a free slot.
    pub place_timeout: Duration,
    /// Host-based port routing: `{port}-{sandbox}.<domain>`.
    pub domain: String,
    pub state_dir: PathBuf,
    pub python: String,
    /// The cluster's authority (PEM): nodes are spoken to over TLS, and only those whose
    /// certificate it signed for their node name (see [`trust`]).
    pub node_ca: Option<PathBuf>,
    /// Speak plain HTTP to nodes off this machine (the node token then crosses the
    /// network in clear).
    pub allow_insecure_nodes: bool,
    /// The gateway's client certificate for nodes (default: `gateway.pem`/`.key` beside
    /// `node_ca`).
    pub node_client_cert: Option<trust::ClientCert>,
    /// Ray's token (its token authentication is always on); made in `state_dir` when the
    /// gateway starts the head and none is given.
    pub ray_token_file: Option<PathBuf>,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("Gateway configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Ray(#[from] ray::RayError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] listen::TlsError),
}

/// Counters of `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub placed: AtomicU64,
    pub placement_failures: AtomicU64,
    pub forwarded: AtomicU64,
    pub retried_children: AtomicU64,
}

/// The gateway's state.
pub struct Gateway {
    pub(crate) config: GatewayConfig,
    pub(crate) ray: Helper,
    pub(crate) token: Token,
    pub(crate) node_token: String,
    pub(crate) links: Arc<node::Links>,
    nodes: RwLock<Vec<NodeInfo>>,
    /// Nodes refused, already logged.
    refused: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    pub(crate) counters: Counters,
}

fn read_token(path: &PathBuf) -> Result<String, GatewayError> {
    let t = std::fs::read_to_string(path).map_err(|source| GatewayError::Io {
        context: format!("read {}", path.display()),
        source,
    })?;
    let t = t.trim().to_string();
    if t.is_empty() {
        return Err(GatewayError::Config(format!("{} is empty", path.display())));
    }
    Ok(t)
}

impl Gateway {
    /// The nodes as last seen (refreshed every second).
    pub(crate) fn nodes(&self) -> Vec<NodeInfo> {
        self.nodes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn alive(&self) -> Vec<NodeInfo> {
        self.nodes().into_iter().filter(|n| n.alive).collect()
    }

    /// Ray's ids of the live nodes this gateway trusts: where placements may go.
    pub(crate) fn trusted_ids(&self) -> Vec<String> {
        self.alive().into_iter().map(|n| n.id).collect()
    }

    pub(crate) fn node(&self, id: &str) -> Option<NodeInfo> {
        self.nodes().into_iter().find(|n| n.id == id)
    }

    /// Asks Ray for the nodes now; keeps those found trustworthy (`node::Links::admit`).
    pub(crate) async fn refresh(&self) {
        let all = match self.ray.nodes().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the cluster's nodes");
                return;
            }
        };
        let mut trusted = Vec::with_capacity(all.len());
        for n in all {
            match self.links.admit(&n.api, &n.name).await {
                Ok(()) => trusted.push(n),
                // A node that went away is kept (as dead) once it was admitted.
                Err(e) if e.is_unreachable() && self.node(&n.id).is_some() => trusted.push(n),
                Err(e) => {
                    let mut warned = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                    if warned.insert((n.id.clone(), n.api.clone())) {
                        tracing::warn!(node = %n.name, id = %n.id, error = %e, "a Ray node labelled as a sandfork node is not used");
                    }
                }
            }
        }
        *self.nodes.write().unwrap_or_else(|e| e.into_inner()) = trusted;
    }
}

/// The TLS client for nodes: the cluster's authority (`node_ca`) and the gateway's client
/// certificate (`node_client_cert`, else `gateway.pem` beside the authority), which nodes
/// of the cluster ask for.
fn node_connector(
    config: &GatewayConfig,
) -> Result<Option<tokio_rustls::TlsConnector>, GatewayError> {
    let Some(ca) = config.node_ca.as_deref() else {
        return Ok(None);
    };
    let client = config
        .node_client_cert
        .clone()
        .or_else(|| trust::ClientCert::beside(ca))
        .ok_or_else(|| {
            GatewayError::Config(format!(
                "--node-ca {}: no client certificate for the nodes, which ask for one \
                 (--node-client-cert/--node-client-key, or {} and {} beside it, as \
                 `sandfork cluster init` makes them)",
                ca.display(),
                trust::GATEWAY_CERT,
                trust::GATEWAY_KEY
            ))
        })?;
    trust::connector(ca, Some(&client))
        .map(Some)
        .map_err(|e| GatewayError::Config(e.to_string()))
}

/// Runs the gateway until `stop` resolves.
pub async fn run(
    config: GatewayConfig,
    stop: impl std::future::Future<Output = ()> + Send,
) -> Result<(), GatewayError> {
    if !config.listen.ip().is_loopback()
        && config.tls_cert.is_none()
        && !config.allow_insecure_remote
    {
        return Err(GatewayError::Config(format!(
            "listen address {} is not loopback and no tls_cert is set: the token would cross the \
             network in clear text (give --tls-cert and --tls-key, or --allow-insecure-remote)",
            config.listen
        )));
    }
    std::fs::create_dir_all(&config.state_dir).map_err(|source| GatewayError::Io {
        context: format!("create {}", config.state_dir.display()),
        source,
    })?;
    let token = Token::new(read_token(&config.token_file)?);
    let node_token = read_token(&config.node_token_file)?;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(c), Some(k)) => Some(listen::tls_acceptor(c, k, None)?),
        (None, None) => None,
        _ => {
            return Err(GatewayError::Config(
                "tls_cert and tls_key go together".into(),
            ))
        }
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| GatewayError::Io {
            context: format!("listen on {}", config.listen),
            source,
        })?;
    let spec = ray::NodeSpec {
        address: config.ray_address.clone(),
        ip: config.ray_ip.clone(),
        head_port: config.ray_port,
        slots: 0,
        memory_mb: 0,
        api: None,
        name: "gateway".into(),
        node_timeout: config.node_timeout,
        python: config.python.clone(),
        log: config.state_dir.join("ray-node.log"),
        temp_dir: ray::NodeSpec::temp_dir_for(&config.state_dir),
        token_file: None,
    };
    let links = Arc::new(node::Links::new(
        node_connector(&config)?,
        config.allow_insecure_nodes,
    ));
    let ray_token = ray_token(&config)?;
    let spec = ray::NodeSpec {
        token_file: Some(ray_token.clone()),
        ..spec
    };
    let ray_node = RayNode::start(&spec)?;
    let address = config
        .ray_address
        .clone()
        .unwrap_or_else(|| format!("{}:{}", config.ray_ip, config.ray_port));
    let helper = Helper::start(
        &config.python,
        &address,
        &config.ray_ip,
        &config.state_dir,
        &ray_token,
    )
    .await?;
    let g = Arc::new(Gateway {
        config,
        ray: helper,
        token,
        node_token,
        links,
        nodes: RwLock::new(Vec::new()),
        refused: Default::default(),
        counters: Counters::default(),
    });
    g.refresh().await;
    let watcher = tokio::spawn(watch_nodes(Arc::downgrade(&g)));
    tracing::info!(listen = %g.config.listen, ray = %address, "gateway serving");
    let (tx, rx) = watch::channel(false);
    let limits = listen::Limits {
        max_connections: 4096,
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
    };
    let app = routes::router(g.clone());
    let serving = tokio::spawn(listen::serve(listener, app, limits, tls, rx));
    stop.await;
    let _ = tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), serving).await;
    watcher.abort();
    drop(g);
    ray_node.stop(Duration::from_secs(10)).await;
    Ok(())
}

/// Ray's token file: the one given, else (when the gateway starts the head) one made in
/// its state directory, which the nodes then need too.
fn ray_token(config: &GatewayConfig) -> Result<PathBuf, GatewayError> {
    if let Some(t) = &config.ray_token_file {
        read_token(t)?;
        return Ok(t.clone());
    }
    if config.ray_address.is_some() {
        return Err(GatewayError::Config(
            "joining an existing Ray cluster needs its token: --ray-token-file".into(),
        ));
    }
    let path = config.state_dir.join(trust::RAY_TOKEN);
    if !path.exists() {
        trust::new_token(&path).map_err(|e| GatewayError::Config(e.to_string()))?;
        tracing::info!(path = %path.display(), "made Ray's token: nodes join with --ray-token-file set to a copy of it");
    }
    Ok(path)
}

/// Keeps the node list current (a node's death shows within a second of Ray's verdict).
async fn watch_nodes(g: std::sync::Weak<Gateway>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(g) = g.upgrade() else { return };
        g.refresh().await;
    }
}

/// An error answer in the API's shape.
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = api_types::ErrorBody {
        code: code.into(),
        message: message.into(),
    };
    let mut r = (status, Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    r
}

/// A node's failure as the client sees it.
pub(crate) fn node_error(e: node::NodeError) -> Response {
    match e {
        node::NodeError::Refused {
            status, message, ..
        } => error(status, "node", message),
        node::NodeError::Unreachable { .. } => {
            error(StatusCode::BAD_GATEWAY, "node_unreachable", e.to_string())
        }
        node::NodeError::Protocol { .. } => {
            error(StatusCode::BAD_GATEWAY, "node_protocol", e.to_string())
        }
        node::NodeError::Answer { .. } => {
            error(StatusCode::BAD_GATEWAY, "node_protocol", e.to_string())
        }
        node::NodeError::Untrusted { .. } => {
            error(StatusCode::BAD_GATEWAY, "node_untrusted", e.to_string())
        }
    }
}

/// An answer of the gateway's own, from the API's type for it.
pub(crate) fn json_response<T: serde::Serialize>(status: StatusCode, v: &T) -> Response<Body> {
    match serde_json::to_vec(v) {
        Ok(bytes) => node::respond(status, bytes.into()),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("Cannot write the answer: {e}"),
        ),
    }
}
