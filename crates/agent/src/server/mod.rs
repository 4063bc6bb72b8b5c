//! The agent: init duties (reaping, signal forwarding) and the request server.

mod clock;
mod conn;
mod errors;
mod exec;
mod files;
mod group;
mod identity;
mod logbook;
mod procs;
pub mod pty;
mod pump;
mod reaper;
mod ring;
mod spawn;
mod supervise;
mod supervisor;
mod user;
mod wire;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use proto::agent::{HelloInfo, Identity, PROTOCOL_VERSION};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Semaphore;

use procs::ProcTable;
use reaper::Reaper;

pub use procs::RING_CAPACITY;

/// PATH for processes when the agent's own environment has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Environment variables of the agent itself, not passed to processes.
const OWN_ENV_PREFIX: &str = "SANDFORK_AGENT_";
/// Concurrent connections served; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 512;
/// How long children get to exit after SIGTERM/SIGINT is forwarded.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
pub struct Config {
    /// Path of the listening socket.
    pub socket: PathBuf,
    /// Where the fork identity file is written (`/etc/sandfork` in a sandbox).
    pub identity_dir: PathBuf,
    /// Largest file read or write, in bytes.
    pub max_transfer: u64,
    /// User of processes whose request names none (the image's `User`); else root.
    pub default_user: Option<String>,
    /// Working directory of processes whose request names none (the image's
    /// `WorkingDir`); else the user's home, else `/`.
    pub default_cwd: Option<String>,
}

impl Config {
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            identity_dir: PathBuf::from("/etc/sandfork"),
            max_transfer: 1 << 30,
            default_user: None,
            default_cwd: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {path}")]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    #[error("cannot make a boot id")]
    BootId(#[source] model::IdError),
}

pub struct Agent {
    config: Config,
    reaper: Reaper,
    procs: ProcTable,
    started: Instant,
    boot_id: String,
    base_env: Vec<(String, String)>,
    identity: Mutex<Option<Identity>>,
}

impl Agent {
    fn new(config: Config) -> Result<Self, ServeError> {
        Ok(Self {
            config,
            reaper: Reaper::default(),
            procs: ProcTable::default(),
            started: Instant::now(),
            boot_id: boot_id()?,
            base_env: own_base_env(),
            identity: Mutex::new(None),
        })
    }

    fn identity(&self) -> Option<Identity> {
        self.identity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_identity(&self, id: Identity) {
        *self.identity.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
    }

    /// What new processes start from: environment, default user and working directory.
    fn base(&self) -> spawn::Base {
        let extra = self
            .identity()
            .map(|id| identity::env_of(&id))
            .unwrap_or_default();
        spawn::Base {
            env: self.base_env.iter().cloned().chain(extra).collect(),
            user: self.config.default_user.clone(),
            cwd: self.config.default_cwd.clone(),
        }
    }

    fn hello(&self) -> HelloInfo {
        HelloInfo {
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            protocol_version: PROTOCOL_VERSION,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            boot_id: self.boot_id.clone(),
            pid: std::process::id(),
            identity: self.identity(),
        }
    }
}

fn own_base_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| !k.starts_with(OWN_ENV_PREFIX))
        .collect();
    for (k, v) in [("PATH", DEFAULT_PATH), ("HOME", "/root")] {
        if !env.iter().any(|(name, _)| name == k) {
            env.push((k.to_string(), v.to_string()));
        }
    }
    env
}

/// 128 random bits naming this run of the agent (a restored copy keeps its parent's).
fn boot_id() -> Result<String, ServeError> {
    let bytes = model::ids::random_bytes::<16>().map_err(ServeError::BootId)?;
    Ok(bytes.iter().map(|x| format!("{x:02x}")).collect())
}

fn listen(path: &std::path::Path) -> std::io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            std::fs::remove_file(path)?
        }
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    // Only root inside the sandbox (and the host) may drive the agent.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves until SIGTERM or SIGINT, then forwards it to every child and returns.
pub async fn run(config: Config) -> Result<(), ServeError> {
    if std::process::id() != 1 {
        // Orphans of our children come back to us, as they would to init.
        let _ = nix::sys::prctl::set_child_subreaper(true);
    }
    if let Some(dir) = &config.default_cwd {
        // As a container runtime does: the image's working directory exists.
        let _ = std::fs::create_dir_all(dir);
    }
    let mut sigchld = signal(SignalKind::child()).map_err(ServeError::Signals)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(ServeError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(ServeError::Signals)?;
    let listener = listen(&config.socket).map_err(|source| ServeError::Listen {
        path: config.socket.clone(),
        source,
    })?;
    let agent = Arc::new(Agent::new(config)?);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tracing::info!(socket = %agent.config.socket.display(), "agent listening");
    let sig = loop {
        tokio::select! {
            _ = sigchld.recv() => agent.reaper.reap(),
            _ = sigterm.recv() => break Signal::SIGTERM,
            _ = sigint.recv() => break Signal::SIGINT,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors, most likely: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let (agent, slots) = (agent.clone(), slots.clone());
                tokio::spawn(async move {
                    let Ok(_permit) = slots.acquire_owned().await else { return };
                    conn::serve(agent, stream).await;
                });
            }
        }
    };
    shutdown(&agent, sig, &mut sigchld).await;
    let _ = std::fs::remove_file(&agent.config.socket);
    Ok(())
}

/// Pids whose parent is the agent: its own children and the orphans it adopted.
fn children() -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.flatten()
        .filter_map(|p| (p.stat().ok()?.ppid == me).then_some(p.pid))
        .collect()
}

/// Sends `sig` to every child and its process group (as PID 1: to every process).
fn signal_all(agent: &Agent, sig: Signal) {
    if std::process::id() == 1 {
        let _ = kill(Pid::from_raw(-1), sig);
    }
    for pid in agent.reaper.live_pids().into_iter().chain(children()) {
        let _ = killpg(Pid::from_raw(pid), sig);
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

/// Forwards `sig` to every child, waits a grace period for them all (adopted orphans
/// included) to exit, then kills what is left.
async fn shutdown(agent: &Agent, sig: Signal, sigchld: &mut tokio::signal::unix::Signal) {
    tracing::info!("{sig} received, stopping children");
    signal_all(agent, sig);
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    loop {
        agent.reaper.reap();
        if children().is_empty() {
            return;
        }
        tokio::select! {
            _ = sigchld.recv() => {}
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    signal_all(agent, Signal::SIGKILL);
    agent.reaper.reap();
}
