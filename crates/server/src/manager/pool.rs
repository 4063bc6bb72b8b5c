//! The pool of ready forks.
//!
//! A memory snapshot that is restored or forked from is *hot*: the daemon keeps up to
//! `pool_size` sandboxes restored from it ahead of demand, frozen (no CPU) and invisible to
//! the API. A request for a child of that snapshot takes one and only hands it over: the
//! fork is thawed, gets its own identity (id, fork index, seed, env) and runs the
//! snapshot's after-restore hooks, exactly the steps a restore runs after CRIU, so a
//! pooled fork cannot be told from a fresh one. The pool is refilled in the background
//! while the daemon is otherwise quiet.
//!
//! Bounds: `pool_memory_mb` caps what parked forks may hold (each is charged its
//! snapshot's size; page merging makes the real cost far lower); the shelf used longest
//! ago gives way to a hotter one; a shelf unused for `pool_idle_secs` is emptied; parked
//! forks hold admission room like any sandbox, and are the first to go when a request
//! needs that room. Parked forks are never recorded: a daemon that dies leaves them to
//! the next one's cleanup of unknown sandboxes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::admission::{Want, BASELINE_NEED_MB};
use super::child::Child;
use super::new_id;
use super::{lock, Manager};
use crate::backend::{BootSpec, RestoreFrom};
use crate::error::{Error, Result};
use crate::metrics::PoolGauge;
use crate::snapshots::SnapshotRecord;

/// A restored, frozen sandbox waiting for a request.
#[derive(Debug)]
pub(super) struct Parked {
    pub id: String,
    pub address: Option<String>,
    /// What it is charged against the pool's memory budget, in MiB.
    pub cost_mb: u64,
}

/// The ready forks of one snapshot.
#[derive(Debug, Default)]
struct Shelf {
    ready: Vec<Parked>,
    last_used: Option<Instant>,
    filling: bool,
}

/// Every shelf, by snapshot id.
#[derive(Debug, Default)]
pub(super) struct Pool {
    shelves: std::sync::Mutex<HashMap<String, Shelf>>,
    /// Refill tasks running (shutdown waits for them: a fork parked mid-shutdown would
    /// outlive the daemon).
    fills: std::sync::atomic::AtomicUsize,
}

impl Pool {
    fn held_mb(shelves: &HashMap<String, Shelf>) -> u64 {
        shelves
            .values()
            .flat_map(|s| &s.ready)
            .map(|p| p.cost_mb)
            .sum()
    }

    pub(super) fn gauge(&self) -> PoolGauge {
        let shelves = lock(&self.shelves);
        PoolGauge {
            forks: shelves.values().map(|s| s.ready.len() as u64).sum(),
            memory_bytes: Self::held_mb(&shelves) << 20,
            snapshots: shelves.values().filter(|s| !s.ready.is_empty()).count() as u64,
        }
    }
}

/// Whether a child of `rec` can come from the pool: a warm restore with nothing changed
/// that the restore itself would set (the network).
fn poolable(rec: &SnapshotRecord, c: &Child) -> bool {
    rec.memory_dir.is_some() && !rec.internal && c.network.is_none()
}

/// What a parked fork of `rec` is charged, in MiB (what its restore maps).
fn cost_mb(rec: &SnapshotRecord) -> u64 {
    rec.restore_mb().max(BASELINE_NEED_MB)
}

/// How long the daemon must have had no create or restore in flight before a refill
/// starts one of its own.
const QUIET: Duration = Duration::from_millis(100);

impl Manager {
    fn pool_on(&self) -> bool {
        self.config.pool_size > 0
    }

    /// A ready fork for child `c` of `rec`, if the pool has one; marks `rec` hot and has
    /// its shelf refilled either way.
    pub(super) fn pool_take(&self, rec: &SnapshotRecord, c: &Child) -> Option<Parked> {
        if !self.pool_on() || !poolable(rec, c) {
            return None;
        }
        let taken = {
            let mut shelves = lock(&self.pool.shelves);
            let shelf = shelves.entry(rec.view.id.clone()).or_default();
            shelf.last_used = Some(Instant::now());
            shelf.ready.pop()
        };
        match &taken {
            Some(_) => self.metrics.pool_hits.inc(),
            None => self.metrics.pool_misses.inc(),
        }
        self.pool_refill(rec);
        taken
    }

    /// Starts filling `rec`'s shelf in the background unless that is already under way.
    fn pool_refill(&self, rec: &SnapshotRecord) {
        {
            let mut shelves = lock(&self.pool.shelves);
            let Some(shelf) = shelves.get_mut(&rec.view.id) else {
                return;
            };
            if shelf.filling {
                return;
            }
            shelf.filling = true;
        }
        let Some(me) = self.weak_self().upgrade() else {
            return;
        };
        let rec = rec.clone();
        self.pool.fills.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            me.pool_fill(&rec).await;
            if let Some(shelf) = lock(&me.pool.shelves).get_mut(&rec.view.id) {
                shelf.filling = false;
            }
            me.pool.fills.fetch_sub(1, Ordering::SeqCst);
        });
    }

    async fn pool_fill(&self, rec: &SnapshotRecord) {
        let id = &rec.view.id;
        loop {
            if self.shutting_down.load(Ordering::SeqCst) || !self.pool_room(rec).await {
                return;
            }
            self.wait_quiet().await;
            if self.shutting_down.load(Ordering::SeqCst) {
                return;
            }
            let parked = match self.park_one(rec).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::info!(snapshot = %id, error = %e.message(), "pool refill stopped");
                    return;
                }
            };
            let stray = {
                let mut shelves = lock(&self.pool.shelves);
                match shelves.get_mut(id) {
                    // Kept only while the shelf is still wanted (not evicted meanwhile).
                    Some(shelf) if !self.shutting_down.load(Ordering::SeqCst) => {
                        shelf.ready.push(parked);
                        None
                    }
                    _ => Some(parked),
                }
            };
            if let Some(p) = stray {
                self.discard(p).await;
                return;
            }
        }
    }

    /// Whether `rec`'s shelf wants one more fork, making room in the budget by taking
    /// forks from shelves used longer ago.
    async fn pool_room(&self, rec: &SnapshotRecord) -> bool {
        let want = cost_mb(rec);
        let budget = self.config.pool_memory_mb;
        loop {
            let victim = {
                let mut shelves = lock(&self.pool.shelves);
                let Some(shelf) = shelves.get(&rec.view.id) else {
                    return false;
                };
                if shelf.ready.len() >= self.config.pool_size as usize {
                    return false;
                }
                if Pool::held_mb(&shelves) + want <= budget {
                    return true;
                }
                let mine = shelf.last_used;
                let colder = shelves
                    .iter_mut()
                    .filter(|(_, s)| !s.ready.is_empty() && s.last_used < mine)
                    .min_by_key(|(_, s)| s.last_used)
                    .and_then(|(_, s)| s.ready.pop());
                match colder {
                    Some(p) => p,
                    None => return false,
                }
            };
            self.discard(victim).await;
        }
    }

    /// Waits until no create or restore has been in flight for [`QUIET`].
    async fn wait_quiet(&self) {
        while !self.shutting_down.load(Ordering::SeqCst) {
            if self.busy.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(QUIET).await;
                if self.busy.load(Ordering::SeqCst) == 0 {
                    return;
                }
            }
            tokio::time::sleep(QUIET).await;
        }
    }

    /// Restores one frozen fork of `rec`, holding admission room for it.
    async fn park_one(&self, rec: &SnapshotRecord) -> Result<Parked> {
        let id = new_id()?;
        let boot = BootSpec {
            id: id.clone(),
            ..rec.boot.without_secrets()
        };
        let cost_mb = cost_mb(rec);
        let want = Want {
            limit_mb: boot.memory_mb,
            need_mb: cost_mb,
        };
        let (host, disk) = (self.backend.host_memory(), self.backend.host_disk());
        self.registry_mut()
            .admission
            .reserve(&id, want, host, disk, Instant::now())
            .map_err(|r| Error::OverCapacity(r.message().to_string()))?;
        let from = RestoreFrom {
            layer_id: rec.layer_id.clone(),
            memory_dir: rec.memory_dir.clone(),
            identity: None,
            hooks: Vec::new(),
        };
        match self.backend.park(&boot, from).await {
            Ok(booted) => {
                tracing::debug!(sandbox = %id, snapshot = %rec.view.id, "fork parked");
                Ok(Parked {
                    id,
                    address: booted.address,
                    cost_mb,
                })
            }
            Err(e) => {
                self.registry_mut().admission.release(&id);
                self.released.notify_waiters();
                Err(e.into())
            }
        }
    }

    /// Destroys a parked fork and frees its room.
    pub(super) async fn discard(&self, p: Parked) {
        if let Err(e) = self.backend.destroy(&p.id).await {
            tracing::warn!(sandbox = %p.id, error = %e, "removing a parked fork failed");
        }
        self.metrics.pool_evictions.inc();
        self.registry_mut().admission.release(&p.id);
        self.released.notify_waiters();
    }

    /// Empties the shelves of `snapshot`, or all of them; returns how many forks went.
    pub(super) async fn pool_evict(&self, snapshot: Option<&str>) -> usize {
        let taken: Vec<Parked> = {
            let mut shelves = lock(&self.pool.shelves);
            let ids: Vec<String> = match snapshot {
                Some(s) => vec![s.to_string()],
                None => shelves.keys().cloned().collect(),
            };
            ids.iter()
                .filter_map(|s| shelves.remove(s))
                .flat_map(|s| s.ready)
                .collect()
        };
        let n = taken.len();
        for p in taken {
            self.discard(p).await;
        }
        n
    }

    /// On shutdown: waits (up to `grace`) for refills in flight, then destroys every
    /// parked fork. Parked forks are not recorded: nothing would adopt them.
    pub(super) async fn pool_close(&self, grace: Duration) {
        let deadline = Instant::now() + grace;
        while self.pool.fills.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.pool_evict(None).await;
    }

    /// Empties the shelves unused for `pool_idle_secs` (the reaper calls it).
    pub(super) async fn pool_expire(&self) {
        let idle = Duration::from_secs(self.config.pool_idle_secs);
        let stale: Vec<String> = lock(&self.pool.shelves)
            .iter()
            .filter(|(_, s)| !s.filling && s.last_used.is_none_or(|t| t.elapsed() >= idle))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            let n = self.pool_evict(Some(&id)).await;
            if n > 0 {
                tracing::info!(snapshot = %id, forks = n, "idle pool emptied");
            }
        }
    }

    /// What the pool holds (for metrics).
    pub fn pool_gauge(&self) -> PoolGauge {
        self.pool.gauge()
    }
}
