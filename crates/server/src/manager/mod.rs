//! The manager: the one owner of sandbox lifecycles.
//!
//! Every lifecycle operation on a sandbox holds that sandbox's operation lock, so concurrent
//! requests on one sandbox are serialized while different sandboxes proceed in parallel.
//! An operation that moves a sandbox through the state machine is a
//! [`transition::Transition`]: the lock, [`model::plan`]'s check, and each state set
//! (persisted before and after the backend acts, so a crash at any point leaves a record
//! recovery can act on, then announced as an event) in one place.

mod admission;
mod child;
mod create;
mod data;
pub mod events;
mod fork;
mod forkmark;
mod images;
mod lineage;
mod logs;
mod pages;
mod pool;
mod ports;
mod pressure;
mod pty;
mod reaper;
mod recover;
mod remote;
mod snapshots;
mod suspend;
#[cfg(test)]
mod tests;
mod transfer;
mod transition;
mod update;
mod usage;
mod volumes;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::logs::RateLimit;
use crate::metrics::Metrics;
use crate::store::{SandboxRow, Store};
use api_types::{ListQuery, Sandbox};
use model::{Op, State};

pub use admission::{Admission, Policy};
pub use events::{Events, KEEP_EVENTS};
pub use images::{is_image_name, validate_build, BUILDERS};
pub use ports::{unix_now, PortConnection, PortCredentials, PORT_FORBIDDEN, PORT_UNAUTHORIZED};
pub use reaper::on_timeout;
pub use snapshots::CheckpointArgs;

/// One sandbox known to the manager.
pub(crate) struct Entry {
    /// Held for the whole of a lifecycle operation.
    op: tokio::sync::Mutex<()>,
    /// Data-plane requests hold it shared for as long as they talk to the agent (a stream
    /// until it ends); a memory checkpoint holds it exclusively, so it starts once they
    /// have drained and new ones wait for it (see [`data::DRAIN`]).
    plane: Arc<tokio::sync::RwLock<()>>,
    /// Bumped when a memory checkpoint wants the plane: sessions that would otherwise
    /// hold it indefinitely (terminals) end, and their clients reconnect after.
    preempt: tokio::sync::watch::Sender<u64>,
    /// Room for gateway connections to its ports (`gateway_connections_per_sandbox`).
    gateway: std::sync::OnceLock<Arc<tokio::sync::Semaphore>>,
    row: Mutex<SandboxRow>,
    last_active: Mutex<Instant>,
    /// OOM kills counted at the last liveness probe ([`UNSEEN`] for a sandbox adopted
    /// from a previous daemon, until its first probe).
    oom_seen: std::sync::atomic::AtomicU64,
    /// Its disk server held writes for want of host space at the last probe.
    disk_full: std::sync::atomic::AtomicBool,
}

/// No reading yet.
const UNSEEN: u64 = u64::MAX;

impl Entry {
    fn new(row: SandboxRow) -> Arc<Entry> {
        Arc::new(Entry {
            op: tokio::sync::Mutex::new(()),
            plane: Arc::new(tokio::sync::RwLock::new(())),
            preempt: tokio::sync::watch::Sender::new(0),
            gateway: std::sync::OnceLock::new(),
            row: Mutex::new(row),
            last_active: Mutex::new(Instant::now()),
            // A new sandbox's cgroup has seen no OOM kill.
            oom_seen: std::sync::atomic::AtomicU64::new(0),
            disk_full: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn row(&self) -> SandboxRow {
        lock(&self.row).clone()
    }

    /// The sandbox as reported: its record, with when its idle timeout passes.
    fn view(&self) -> Sandbox {
        let mut view = lock(&self.row).view.clone();
        view.expires_at = reaper::expires_at(&view, self.idle_for());
        view.disk_full = self.disk_full.load(std::sync::atomic::Ordering::Relaxed);
        view
    }

    fn state(&self) -> State {
        lock(&self.row).view.state
    }

    fn touch(&self) {
        *lock(&self.last_active) = Instant::now();
        lock(&self.row).view.last_active_at = now_rfc3339();
    }

    fn idle_for(&self) -> Duration {
        lock(&self.last_active).elapsed()
    }
}

/// The labels a listing asks for: a JSON object of strings.
fn label_filter(raw: Option<&str>) -> Result<BTreeMap<String, String>> {
    let Some(raw) = raw else {
        return Ok(BTreeMap::new());
    };
    serde_json::from_str(raw).map_err(|e| {
        Error::InvalidArgument(format!(
            "labels must be a JSON object of strings, e.g. {{\"team\":\"rl\"}}: {e}"
        ))
    })
}

/// Locks a std mutex, recovering the data if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new sandbox id: `sb-` and 16 random hex digits.
pub fn new_id() -> Result<String> {
    Ok(model::ids::new_sandbox_id()?)
}

/// Counts a create or restore in flight while it lives (refills wait for none).
pub(super) struct Busy<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Busy<'a> {
    pub(super) fn new(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Busy(n)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The current time in RFC 3339 (UTC, milliseconds).
pub fn now_rfc3339() -> String {
    model::timestamp::now()
}

/// Sandboxes by id, and the admission ledger, under one lock so that name checks and
/// reservations are atomic.
struct Registry {
    entries: HashMap<String, Arc<Entry>>,
    admission: Admission,
}

/// The lifecycle manager.
pub struct Manager {
    backend: Arc<dyn Backend>,
    store: Store,
    config: Config,
    metrics: Arc<Metrics>,
    guest_logs: RateLimit,
    registry: RwLock<Registry>,
    shutting_down: AtomicBool,
    /// Serializes image builds (and the default image's first build).
    image_builds: tokio::sync::Mutex<()>,
    /// Builds of built-in images in flight, by name (see `Manager::ensure_image`).
    shared_builds: Mutex<HashMap<String, Arc<images::SharedBuild>>>,
    /// Woken whenever a sandbox stops holding resources (requests wait on it for room).
    released: tokio::sync::Notify,
    /// Ready forks of hot memory snapshots.
    pool: pool::Pool,
    /// Orders memory images sharing pages with a parent against removing directories.
    lineage: tokio::sync::Mutex<()>,
    /// Creates and restores in flight (pool refills wait for none).
    busy: std::sync::atomic::AtomicUsize,
    /// What happened to sandboxes, for `GET /v1/events`.
    events: events::Events,
    /// The daemon's secret as the gateway derives port tokens from it, read on first use.
    port_key: std::sync::OnceLock<crate::snapkey::SnapshotKey>,
    /// The object store side (`object_store`), set once at start.
    remote: std::sync::OnceLock<Option<Arc<remote::Remote>>>,
    me: Weak<Manager>,
}

impl Manager {
    /// Creates the manager and recovers the sandboxes a previous daemon left.
    pub async fn start(
        config: Config,
        backend: Arc<dyn Backend>,
        store: Store,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Manager>> {
        let host_total_mb = backend.host_memory().map_or(0, |m| m.total_mb);
        let admission = Admission::new(Policy::from_config(&config, host_total_mb));
        let manager = Arc::new_cyclic(|me| Manager {
            backend,
            store,
            config,
            metrics,
            guest_logs: RateLimit::new(Duration::from_secs(10), 20),
            registry: RwLock::new(Registry {
                entries: HashMap::new(),
                admission,
            }),
            shutting_down: AtomicBool::new(false),
            image_builds: tokio::sync::Mutex::new(()),
            shared_builds: Mutex::new(HashMap::new()),
            released: tokio::sync::Notify::new(),
            pool: pool::Pool::default(),
            lineage: tokio::sync::Mutex::new(()),
            busy: std::sync::atomic::AtomicUsize::new(0),
            events: events::Events::default(),
            port_key: std::sync::OnceLock::new(),
            remote: std::sync::OnceLock::new(),
            me: me.clone(),
        });
        let remote = remote::Remote::start(
            &manager.config,
            manager.backend.block_store(),
            manager.read_secret_key()?,
        )
        .await?;
        let _ = manager.remote.set(remote);
        manager.recover().await?;
        manager.reserve_pages().await;
        manager.start_reaper();
        manager.start_watch();
        Ok(manager)
    }

    /// The events feed.
    pub fn events(&self) -> &events::Events {
        &self.events
    }

    /// The daemon's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Object store counters (name, help, value), when one is configured.
    pub fn remote_counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.remote()
            .map(|r| r.counters().to_vec())
            .unwrap_or_default()
    }

    /// The daemon's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn weak_self(&self) -> Weak<Manager> {
        self.me.clone()
    }

    fn registry(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }

    fn registry_mut(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Finds a sandbox by id, or by the name of a live one.
    fn find(&self, id_or_name: &str) -> Result<Arc<Entry>> {
        let reg = self.registry();
        if let Some(e) = reg.entries.get(id_or_name) {
            return Ok(e.clone());
        }
        reg.entries
            .values()
            .find(|e| {
                let r = lock(&e.row);
                r.view.state.is_live() && r.view.name.as_deref() == Some(id_or_name)
            })
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("Sandbox {id_or_name} not found")))
    }

    fn check_open(&self) -> Result<()> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }

    /// One sandbox.
    pub fn get(&self, id_or_name: &str) -> Result<Sandbox> {
        Ok(self.find(id_or_name)?.view())
    }

    /// Sandboxes matching the query, oldest first; terminated ones only when asked for.
    pub fn list(&self, q: &ListQuery) -> Result<Vec<Sandbox>> {
        let state = match &q.state {
            Some(s) => Some(
                State::parse(s)
                    .ok_or_else(|| Error::InvalidArgument(format!("Unknown state {s:?}")))?,
            ),
            None => None,
        };
        let wanted = label_filter(q.labels.as_deref())?;
        let mut out: Vec<Sandbox> = self
            .registry()
            .entries
            .values()
            .map(|e| e.view())
            .filter(|v| state.map_or(v.state != State::Terminated, |s| v.state == s))
            .filter(|v| q.name.is_none() || v.name == q.name)
            .filter(|v| wanted.iter().all(|(k, val)| v.labels.get(k) == Some(val)))
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// What page merging across sandboxes has done (for metrics); `None` when it is off.
    pub fn host_merge(&self) -> Option<crate::backend::HostMerge> {
        self.backend.host_merge()
    }

    /// Number of sandboxes per state (for metrics).
    pub fn state_counts(&self) -> BTreeMap<State, u64> {
        let mut counts = BTreeMap::new();
        for e in self.registry().entries.values() {
            *counts.entry(e.state()).or_insert(0) += 1;
        }
        counts
    }

    /// Sets the state (and error) of an entry and persists the row. Entering an
    /// operation's transitional state is undone when it cannot be persisted (e.g. the
    /// disk is full), so the operation is refused and the sandbox stays as it was.
    async fn set_state(&self, entry: &Entry, state: State, error: Option<String>) -> Result<()> {
        let (before, row) = {
            let mut r = lock(&entry.row);
            let before = r.view.clone();
            r.view.state = state;
            if error.is_some() || state == State::Running {
                r.view.error = error;
            }
            if state == State::Terminated {
                // Nothing boots a terminated sandbox again: its secrets go.
                r.boot.secrets.clear();
            }
            (before, r.clone())
        };
        if !state.is_live() {
            self.registry_mut().admission.release(&row.view.id);
            self.released.notify_waiters();
        }
        let view = row.view.clone();
        if let Err(e) = self.store.put_sandbox(row).await {
            if state.is_transitional() && before.state.is_live() {
                let mut r = lock(&entry.row);
                r.view.state = before.state;
                r.view.error = before.error;
            }
            return Err(e.into());
        }
        if let Some(kind) = events::of_transition(before.state, state) {
            let message = (kind == api_types::EventKind::Failed)
                .then(|| view.error.clone())
                .flatten();
            self.events.emit(kind, &view, None, message);
        }
        Ok(())
    }

    /// Terminates a sandbox (idempotent on terminated ones).
    pub async fn terminate(&self, id_or_name: &str) -> Result<Sandbox> {
        let entry = self.find(id_or_name)?;
        let t = match self.transition(&entry, Op::Terminate).await {
            Err(Error::WrongState {
                state: State::Terminated,
                ..
            }) => return Ok(entry.view()),
            other => other?,
        };
        let id = t.id();
        match t.begin().await {
            // A full host disk must not keep a sandbox alive: removing it frees space
            // (a restart meanwhile finds it gone and marks it failed).
            Err(Error::InsufficientStorage(m)) => {
                tracing::warn!(sandbox = %id, error = %m, "terminating without recording it first: the host disk is full");
            }
            other => other?,
        }
        if let Err(e) = self.backend.destroy(&id).await {
            tracing::error!(sandbox = %id, error = %e, "terminate failed");
            let msg = format!("Terminate failed: {e}");
            return Err(t.fail(Some(msg), e).await);
        }
        let view = t.succeed().await?;
        self.drop_suspended_state(&id).await;
        tracing::info!(sandbox = %id, "sandbox terminated");
        Ok(view)
    }

    /// Stops accepting new work and waits (up to the grace period) for lifecycle
    /// operations in flight. Running sandboxes stay running for the next daemon to adopt.
    pub async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.events.close();
        let grace = Duration::from_secs(self.config.shutdown_grace_secs);
        self.pool_close(grace).await;
        let entries: Vec<Arc<Entry>> = self.registry().entries.values().cloned().collect();
        let wait_all = async {
            for e in entries {
                let _ = e.op.lock().await;
            }
        };
        if tokio::time::timeout(grace, wait_all).await.is_err() {
            tracing::warn!("shutdown grace period passed with operations still in flight");
        }
        self.release_volumes().await;
        self.stop_pages().await;
    }
}
