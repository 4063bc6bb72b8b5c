//! sandfork on Ray (docs/scale-out.md).
//!
//! - [`RayNode`]: a Ray node process started and supervised by its owner: a daemon joins
//!   the cluster with its sandbox slots as the custom resource `sandfork_slot` and its API
//!   address as node labels; the gateway runs the head (or a node without slots).
//! - [`Helper`]: the gateway's Ray driver, the embedded `helper.py`, asked over JSON lines:
//!   nodes, placement (one placement group per sandbox, soft-targeted at the nodes that
//!   cache its snapshot), and the cluster directory in Ray's key-value store.
//!
//! Ray is Python; its driver API is what places work, so the helper is Python too, and
//! everything else stays in Rust.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

/// The helper's source, written next to the gateway's state when it starts.
pub const HELPER: &str = include_str!("helper.py");
/// The custom resource a node offers per sandbox it may run.
pub const SLOT: &str = "sandfork_slot";
/// How long the helper may take to connect to the cluster.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Why Ray could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum RayError {
    #[error("Ray: cannot start {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("Ray: {0}")]
    Failed(String),
    #[error("Ray's helper is gone: {0}")]
    Gone(String),
}

pub type Result<T, E = RayError> = std::result::Result<T, E>;

/// The environment every Ray process gets: no usage reports leave the machine, and with
/// `token` (the cluster's token file) Ray's token authentication is on: a process without
/// the token can neither join the cluster nor use it.
fn quiet(cmd: &mut Command, token: Option<&Path>) {
    cmd.env("RAY_USAGE_STATS_ENABLED", "0")
        .env("RAY_DISABLE_DOCKER_CPU_WARNING", "1")
        .env("PYTHONUNBUFFERED", "1")
        .env_remove("RAY_AUTH_TOKEN");
    match token {
        Some(t) => cmd
            .env("RAY_AUTH_MODE", "token")
            .env("RAY_AUTH_TOKEN_PATH", t),
        None => cmd
            .env_remove("RAY_AUTH_MODE")
            .env_remove("RAY_AUTH_TOKEN_PATH"),
    };
}

/// What a node offers and how it is reached.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The Ray head's address (`host:port`); `None` starts a head here.
    pub address: Option<String>,
    /// This node's address on the cluster's network.
    pub ip: String,
    /// Port of a head started here.
    pub head_port: u16,
    /// Sandbox slots (0 for the gateway's own node).
    pub slots: u32,
    /// Memory offered to sandboxes, in MiB (0: Ray's own count).
    pub memory_mb: u64,
    /// The node's API: scheme, host and port, and its name.
    pub api: Option<(String, String, u16)>,
    pub name: String,
    /// Head only: how long a silent node is waited for before Ray declares it dead.
    pub node_timeout: Duration,
    pub python: String,
    /// Where the node's logs go.
    pub log: PathBuf,
    /// The cluster's Ray token (token authentication on); `None` only for a test head.
    pub token_file: Option<PathBuf>,
    /// Ray's directory for this node (sessions, logs, sockets): one per node, as several
    /// nodes on one machine would collide in a shared one. Kept short: Unix socket paths
    /// live below it.
    pub temp_dir: PathBuf,
}

impl NodeSpec {
    /// A short, per-node Ray directory for a node whose state is in `state`:
    /// `/tmp/sfray-<FNV-1a of the path, 48 bits in hex>`.
    pub fn temp_dir_for(state: &Path) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in state.as_os_str().as_bytes() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        PathBuf::from(format!("/tmp/sfray-{:012x}", h & 0xffff_ffff_ffff))
    }
}

/// A Ray node process (`ray start --block`), stopped when dropped.
pub struct RayNode {
    child: Child,
    temp_dir: PathBuf,
}

impl RayNode {
    /// Starts the node and returns once its process runs (Ray connects in the background).
    pub fn start(spec: &NodeSpec) -> Result<RayNode> {
        let mut cmd = Command::new(&spec.python);
        cmd.args([
            "-c",
            "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()",
            "start",
            "--block",
        ]);
        cmd.args([
            "--node-ip-address",
            &spec.ip,
            "--num-cpus",
            "0",
            "--disable-usage-stats",
        ]);
        // The object store holds nothing of sandfork's: its smallest size.
        cmd.args(["--object-store-memory", "78643200"]);
        // Whatever a node killed before could stop left there is stale: the owner of the
        // state (a daemon holds its data directory alone) starts one node at a time.
        let _ = std::fs::remove_dir_all(&spec.temp_dir);
        std::fs::create_dir_all(&spec.temp_dir).map_err(|source| RayError::Spawn {
            what: format!("its directory {}", spec.temp_dir.display()),
            source,
        })?;
        cmd.arg("--temp-dir").arg(&spec.temp_dir);
        match &spec.address {
            Some(a) => {
                cmd.args(["--address", a]);
            }
            None => {
                let ms = spec.node_timeout.as_millis().max(1000) / 4;
                cmd.args([
                    "--head",
                    "--port",
                    &spec.head_port.to_string(),
                    "--include-dashboard",
                    "false",
                ]);
                cmd.env("RAY_health_check_period_ms", ms.to_string())
                    .env("RAY_health_check_timeout_ms", ms.to_string())
                    .env("RAY_health_check_failure_threshold", "4");
            }
        }
        cmd.args(["--resources", &json!({ SLOT: spec.slots }).to_string()]);
        if spec.memory_mb > 0 {
            cmd.args(["--memory", &(spec.memory_mb << 20).to_string()]);
        }
        if let Some((scheme, host, port)) = &spec.api {
            cmd.args([
                "--labels",
                &format!(
                    "sandfork.io/api-scheme={scheme},sandfork.io/api-host={host},sandfork.io/api-port={port},sandfork.io/node={}",
                    spec.name
                ),
            ]);
        }
        quiet(&mut cmd, spec.token_file.as_deref());
        let log = std::fs::File::create(&spec.log).map_err(|source| RayError::Spawn {
            what: format!("its log {}", spec.log.display()),
            source,
        })?;
        let err = log.try_clone().map_err(|source| RayError::Spawn {
            what: "its log".into(),
            source,
        })?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .process_group(0);
        let child = cmd.spawn().map_err(|source| RayError::Spawn {
            what: format!("a Ray node with {}", spec.python),
            source,
        })?;
        Ok(RayNode {
            child,
            temp_dir: spec.temp_dir.clone(),
        })
    }

    /// Whether the node process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the node: SIGTERM to its process group (Ray then stops what it started),
    /// SIGKILL after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) takes no pointers; it signals the node's own process group,
            // which the node leads (process_group(0) at spawn).
            unsafe { libc::kill(-(pid as i32), libc::SIGTERM) };
            if tokio::time::timeout(grace, self.child.wait())
                .await
                .is_err()
            {
                // SAFETY: as above.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
                let _ = self.child.wait().await;
            }
        }
        let _ = std::fs::remove_dir_all(&self.temp_dir);
    }
}

/// A sandfork node as Ray sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Ray's node id.
    pub id: String,
    pub alive: bool,
    pub ip: String,
    pub name: String,
    /// Its API's base URL.
    pub api: String,
    pub slots: u32,
    pub free: u32,
}

/// Where Ray put one sandbox: its placement group and node, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub pg: Option<String>,
    pub node: Option<String>,
    pub error: Option<String>,
}

/// A placement group's state and node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub state: Option<String>,
    pub node: Option<String>,
}

type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value>>>>>;

/// The gateway's Ray driver: requests over its stdin, answers demultiplexed by id.
pub struct Helper {
    stdin: tokio::sync::Mutex<ChildStdin>,
    waiting: Waiting,
    next: AtomicU64,
    _child: Child,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Helper {
    /// Writes the helper into `dir`, starts it against the cluster at `address` from this
    /// node's `ip`, and waits until it is connected.
    pub async fn start(
        python: &str,
        address: &str,
        ip: &str,
        dir: &Path,
        token: &Path,
    ) -> Result<Helper> {
        let script = dir.join("sandfork_ray_helper.py");
        std::fs::write(&script, HELPER).map_err(|source| RayError::Spawn {
            what: format!("the helper at {}", script.display()),
            source,
        })?;
        let log = std::fs::File::create(dir.join("ray-helper.log")).map_err(|source| {
            RayError::Spawn {
                what: "the helper's log".into(),
                source,
            }
        })?;
        let mut cmd = Command::new(python);
        cmd.arg(&script).args([address, ip]);
        quiet(&mut cmd, Some(token));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| RayError::Spawn {
            what: format!("the helper with {python}"),
            source,
        })?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| RayError::Gone("no stdin".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| RayError::Gone("no stdout".into()))?;
        let waiting: Waiting = Arc::default();
        let (ready_tx, ready_rx) = oneshot::channel();
        tokio::spawn(read_answers(
            BufReader::new(stdout),
            waiting.clone(),
            ready_tx,
        ));
        match tokio::time::timeout(READY_TIMEOUT, ready_rx).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(RayError::Gone(format!(
                    "it exited before it connected to {address} (see {})",
                    dir.join("ray-helper.log").display()
                )))
            }
            Err(_) => {
                return Err(RayError::Failed(format!(
                    "no connection to {address} within {READY_TIMEOUT:?}"
                )))
            }
        }
        Ok(Helper {
            stdin: tokio::sync::Mutex::new(stdin),
            waiting,
            next: AtomicU64::new(1),
            _child: child,
        })
    }

    /// One request; its answer's `result`.
    pub async fn call(&self, op: &str, mut args: Value) -> Result<Value> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        args["id"] = json!(id);
        args["op"] = json!(op);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(id, tx);
        let mut line = args.to_string();
        line.push('\n');
        let sent = self.stdin.lock().await.write_all(line.as_bytes()).await;
        if let Err(e) = sent {
            lock(&self.waiting).remove(&id);
            return Err(RayError::Gone(e.to_string()));
        }
        rx.await.map_err(|_| RayError::Gone("it exited".into()))?
    }

    pub async fn nodes(&self) -> Result<Vec<NodeInfo>> {
        decode(self.call("nodes", json!({})).await?)
    }

    /// Places `count` sandboxes of `memory_mb` each, preferring (in turn) `prefer`'s nodes.
    /// One placement group per sandbox, each on one of the nodes `only` (Ray's node ids:
    /// those the caller trusts), soft-targeted at `prefer`.
    pub async fn place(
        &self,
        count: u32,
        prefer: &[String],
        only: &[String],
        memory_mb: u64,
        timeout: Duration,
    ) -> Result<Vec<Placement>> {
        let args = json!({"count": count, "prefer": prefer, "only": only, "memory_mb": memory_mb, "timeout": timeout.as_secs_f64()});
        decode(self.call("place", args).await?)
    }

    pub async fn release(&self, pgs: &[String]) -> Result<()> {
        self.call("release", json!({ "pgs": pgs })).await.map(drop)
    }

    pub async fn groups(&self) -> Result<HashMap<String, Group>> {
        decode(self.call("groups", json!({})).await?)
    }

    pub async fn put(&self, key: &str, value: &str) -> Result<()> {
        self.call("kv_put", json!({"key": key, "value": value}))
            .await
            .map(drop)
    }

    pub async fn get(&self, key: &str) -> Result<Option<String>> {
        decode(self.call("kv_get", json!({ "key": key })).await?)
    }

    pub async fn delete(&self, key: &str) -> Result<()> {
        self.call("kv_del", json!({ "key": key })).await.map(drop)
    }

    pub async fn list(&self, prefix: &str) -> Result<HashMap<String, String>> {
        decode(self.call("kv_list", json!({ "prefix": prefix })).await?)
    }
}

fn decode<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| RayError::Failed(format!("unexpected answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_ray_directory_is_short_and_its_own() {
        let a = NodeSpec::temp_dir_for(Path::new("/var/lib/sandfork"));
        let b = NodeSpec::temp_dir_for(Path::new("/var/lib/sandfork2"));
        assert_ne!(a, b);
        assert_eq!(a, NodeSpec::temp_dir_for(Path::new("/var/lib/sandfork")));
        // The test harness computes the same name (tests/cluster/_ray_cluster.py).
        assert_eq!(a, PathBuf::from("/tmp/sfray-eacd2997892a"));
        assert!(a.as_os_str().len() < 24);
    }
}

#[derive(Deserialize)]
struct Answer {
    id: Option<u64>,
    ok: bool,
    #[serde(default)]
    result: Value,
    #[serde(default)]
    error: Option<String>,
}

async fn read_answers(
    mut out: BufReader<tokio::process::ChildStdout>,
    waiting: Waiting,
    ready: oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut line = String::new();
    loop {
        line.clear();
        match out.read_line(&mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(a) = serde_json::from_str::<Answer>(&line) else {
            tracing::warn!(line = line.trim(), "Ray helper: not an answer");
            continue;
        };
        let Some(id) = a.id else {
            if a.ok {
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
            } else {
                tracing::warn!(error = a.error.as_deref().unwrap_or(""), "Ray helper");
            }
            continue;
        };
        if let Some(tx) = lock(&waiting).remove(&id) {
            let _ = tx.send(match a.ok {
                true => Ok(a.result),
                false => Err(RayError::Failed(a.error.unwrap_or_default())),
            });
        }
    }
    // Everyone still waiting learns the helper is gone (the senders drop).
    lock(&waiting).clear();
}
