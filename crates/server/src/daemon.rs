//! `sandfork serve`: open the state, recover, serve the API on the Unix socket (and
//! optionally TCP with a token) until SIGTERM/SIGINT, then shut down gracefully.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use sandfork_http::listen::{self, Limits};
use sandfork_http::token::Token;

use crate::api;
use crate::backend::Backend;
use crate::config::{Config, ConfigError};
use crate::manager::Manager;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("Cannot prepare {path}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Cannot listen on {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("Another daemon is already serving {0}")]
    AlreadyRunning(std::path::PathBuf),
    #[error("Cannot open the state database")]
    Store(#[from] StoreError),
    #[error("Recovery failed: {0}")]
    Recover(String),
    #[error("Cannot set up TLS")]
    Tls(#[from] listen::TlsError),
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> DaemonError + '_ {
    move |source| DaemonError::Io {
        path: path.into(),
        source,
    }
}

/// A daemon ready to serve.
pub struct Daemon {
    manager: Arc<Manager>,
    unix: UnixListener,
    tcp: Option<(TcpListener, Token, Option<tokio_rustls::TlsAcceptor>)>,
    socket: std::path::PathBuf,
    /// This node's Ray process, in cluster mode (`ray_address`).
    ray: Option<ray::RayNode>,
}

impl Daemon {
    /// Prepares the data dir, opens the state, recovers sandboxes and binds the listeners.
    pub async fn start(config: Config, backend: Arc<dyn Backend>) -> Result<Daemon, DaemonError> {
        config.validate()?;
        private_dir(&config.data_dir)?;
        let token = config.read_token()?.map(Token::new);
        let db = config.data_dir.join("state.db");
        // SQLite gives its -wal and -shm files the database's mode: 0600 for all three
        // (the state holds sandboxes' secrets).
        for file in ["state.db", "state.db-wal", "state.db-shm"].map(|f| config.data_dir.join(f)) {
            if file.exists() || file == db {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&file);
                f.map_err(io_at(&file))?;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                    .map_err(io_at(&file))?;
            }
        }
        let store = Store::open(&db)?;
        let socket = config.socket_path();
        let unix = bind_unix(&socket).await?;
        let tls = match (&config.tls_cert, &config.tls_key) {
            // A cluster's node answers only the cluster's gateway (its client certificate).
            (Some(cert), Some(key)) => Some(listen::tls_acceptor(
                cert,
                key,
                config.cluster_ca.as_deref(),
            )?),
            _ => None,
        };
        let tcp = match (config.listen, token) {
            (Some(addr), Some(token)) => {
                let l = TcpListener::bind(addr)
                    .await
                    .map_err(|source| DaemonError::Bind { addr, source })?;
                Some((l, token, tls))
            }
            _ => None,
        };
        let metrics = Arc::new(Metrics::default());
        let ray = join_ray(&config)?;
        let manager = Manager::start(config, backend, store, metrics)
            .await
            .map_err(|e| DaemonError::Recover(e.message()))?;
        Ok(Daemon {
            manager,
            unix,
            tcp,
            socket,
            ray,
        })
    }

    /// The manager (for in-process front ends and tests).
    pub fn manager(&self) -> &Arc<Manager> {
        &self.manager
    }

    /// The bound TCP address, if any.
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp.as_ref().and_then(|(l, _, _)| l.local_addr().ok())
    }

    /// Serves until `stop` resolves, then shuts down gracefully.
    pub async fn serve(self, stop: impl std::future::Future<Output = ()> + Send) {
        let (tx, rx) = watch::channel(false);
        let config = self.manager.config();
        let limits = Limits {
            max_connections: config.max_connections,
            header_timeout: std::time::Duration::from_secs(config.header_timeout_secs),
            idle_timeout: std::time::Duration::from_secs(config.idle_timeout_secs),
        };
        let unix_app = api::router(self.manager.clone(), None);
        let unix = tokio::spawn(listen::serve(self.unix, unix_app, limits, None, rx.clone()));
        let tcp = self.tcp.map(|(listener, token, tls)| {
            if let Ok(addr) = listener.local_addr() {
                let scheme = if tls.is_some() { "https" } else { "http" };
                let token = config.token_path().unwrap_or_default();
                tracing::info!(url = %format!("{scheme}://{addr}"), console = %format!("{scheme}://{addr}/ui/"), token_file = %token.display(), "serving over TCP");
            }
            let gate = listen::Gate {
                reserve: config
                    .reserved_connections
                    .min(config.max_connections / 2),
                authenticates: authenticates(token.clone()),
            };
            let app = api::router(self.manager.clone(), Some(token));
            tokio::spawn(listen::serve_gated(listener, app, limits, tls, Some(gate), rx.clone()))
        });
        tracing::info!(socket = %self.socket.display(), "serving");
        stop.await;
        tracing::info!("shutting down");
        self.manager.shutdown().await;
        let _ = tx.send(true);
        let grace = std::time::Duration::from_secs(self.manager.config().shutdown_grace_secs);
        let _ = tokio::time::timeout(grace, unix).await;
        if let Some(t) = tcp {
            let _ = tokio::time::timeout(grace, t).await;
        }
        let _ = std::fs::remove_file(&self.socket);
        if let Some(node) = self.ray {
            // Leaving the cluster: the gateway sees the node gone and places elsewhere.
            node.stop(grace).await;
        }
        tracing::info!("stopped");
    }
}

/// In cluster mode, this node joins the Ray cluster: its sandbox slots and memory as
/// resources, its API address as labels.
fn join_ray(config: &Config) -> Result<Option<ray::RayNode>, DaemonError> {
    let (Some(address), Some(listen)) = (&config.ray_address, config.listen) else {
        return Ok(None);
    };
    let scheme = if config.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    let spec = ray::NodeSpec {
        address: Some(address.clone()),
        ip: listen.ip().to_string(),
        head_port: 0,
        slots: config.max_sandboxes,
        memory_mb: config.max_memory_mb,
        api: Some((scheme.into(), listen.ip().to_string(), listen.port())),
        name: config.node(),
        node_timeout: std::time::Duration::from_secs(10),
        python: config.python.clone(),
        log: config.data_dir.join("ray-node.log"),
        temp_dir: ray::NodeSpec::temp_dir_for(&config.data_dir),
        // Checked by the configuration: a node never joins Ray without its token.
        token_file: config.ray_token_file.clone(),
    };
    let node = ray::RayNode::start(&spec).map_err(|e| DaemonError::Recover(e.to_string()))?;
    tracing::info!(%address, node = %spec.name, slots = spec.slots, "joined the Ray cluster");
    Ok(Some(node))
}

/// Binds the socket (mode 0660), replacing a stale one but never a live daemon's.
async fn bind_unix(path: &Path) -> Result<UnixListener, DaemonError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_at(dir))?;
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(DaemonError::AlreadyRunning(path.into()));
        }
        std::fs::remove_file(path).map_err(io_at(path))?;
    }
    // Created with its final permissions: no instant where another user could connect.
    let listener = with_umask(0o117, || UnixListener::bind(path)).map_err(io_at(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(io_at(path))?;
    Ok(listener)
}

/// Makes `dir` (the data directory) and keeps it private to root: sandbox disks are
/// mounted below it, and nothing there is any other host user's business.
fn private_dir(dir: &Path) -> Result<(), DaemonError> {
    std::fs::create_dir_all(dir).map_err(io_at(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io_at(dir))
}

/// Runs `f` with the process umask set to `mask`, then restores it.
fn with_umask<T>(mask: libc::mode_t, f: impl FnOnce() -> T) -> T {
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail. The daemon
    // creates no other files while binding, at start, before it serves.
    let old = unsafe { libc::umask(mask) };
    let out = f();
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    out
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

/// Whether a request carries `token`: as `Authorization: Bearer`, or (a WebSocket) as
/// `access_token` in its query.
fn authenticates(token: Token) -> listen::Authenticates {
    std::sync::Arc::new(move |parts: &axum::http::request::Parts| {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if token.accepts(header) {
            return true;
        }
        let pairs: Vec<(String, String)> = parts
            .uri
            .query()
            .map(|q| serde_urlencoded::from_str(q).unwrap_or_default())
            .unwrap_or_default();
        pairs
            .iter()
            .any(|(k, v)| k == "access_token" && token.accepts(Some(&format!("Bearer {v}"))))
    })
}
