//! The pool of ready forks.
//!
//! A memory snapshot that is restored or forked from is *hot*: the daemon keeps sandboxes
//! restored from it ahead of demand, frozen (no CPU) and invisible to the API. How many
//! sizes itself: at least `pool_size`, and as many as the largest burst of children asked
//! of that snapshot lately (a fork of 32 has 32 ready for the next one), within the
//! memory budget below. A request for a child of that snapshot takes one and only hands it over: the
//! fork is thawed, gets its own identity (id, fork index, seed, env) and runs the
//! snapshot's after-restore hooks, exactly the steps a restore runs after CRIU, so a
//! pooled fork cannot be told from a fresh one. The pool is refilled in the background
//! while the daemon is otherwise quiet.
//!
//! Bounds: `pool_memory_mb` caps what parked forks may hold (each is charged its
//! snapshot's size; page merging makes the real cost far lower); the shelf used longest
//! ago gives way to a hotter one; a shelf unused for `pool_idle_secs` is emptied, and one
//! unused for a quarter of that halves what it keeps beyond `pool_size`; parked
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
    demand: Demand,
}

/// The most ready forks one shelf wants: what one fork request may ask for at most
/// (`MAX_FORK` of the fork module).
pub(super) const MAX_READY: usize = 256;

/// Children of one snapshot asked for within [`BURST`] of each other count as one burst.
const BURST: Duration = Duration::from_secs(2);

/// How many ready forks a shelf wants: the largest burst of children asked of it lately.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Demand {
    /// Children in the burst under way, and when it started.
    burst: usize,
    since: Option<Instant>,
    /// The largest burst seen (halved while the shelf stays unused).
    peak: usize,
    /// When the peak was last halved.
    halved: Option<Instant>,
}

impl Demand {
    /// One child asked for at `now`.
    fn ask(&mut self, now: Instant) {
        if self
            .since
            .is_none_or(|t| now.saturating_duration_since(t) > BURST)
        {
            self.burst = 0;
            self.since = Some(now);
        }
        self.burst += 1;
        self.peak = self.peak.max(self.burst);
    }

    /// Ready forks to keep: `floor` at least, the peak at most [`MAX_READY`].
    fn target(&self, floor: usize) -> usize {
        self.peak.min(MAX_READY).max(floor)
    }
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
            let now = Instant::now();
            shelf.last_used = Some(now);
            shelf.demand.ask(now);
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
                if shelf.ready.len() >= shelf.demand.target(self.config.pool_size as usize) {
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

    /// Empties the shelves unused for `pool_idle_secs`, and shrinks those unused for a
    /// quarter of that (the reaper calls it).
    pub(super) async fn pool_expire(&self) {
        let idle = Duration::from_secs(self.config.pool_idle_secs);
        self.pool_shrink(idle / 4).await;
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

    /// Halves what each shelf unused for `quiet` wants beyond `pool_size` (at most once per
    /// `quiet`), discarding the forks it no longer wants.
    async fn pool_shrink(&self, quiet: Duration) {
        let floor = self.config.pool_size as usize;
        let surplus: Vec<Parked> = {
            let mut shelves = lock(&self.pool.shelves);
            let now = Instant::now();
            let mut out = Vec::new();
            for shelf in shelves.values_mut() {
                // Its last use stays what it was: the shelf still empties after
                // `pool_idle_secs` and stays cold to pool_room's eviction.
                let since = |t: Option<Instant>| {
                    t.is_none_or(|t| now.saturating_duration_since(t) >= quiet)
                };
                let due = since(shelf.last_used) && since(shelf.demand.halved);
                if shelf.filling || !due || shelf.demand.peak <= floor {
                    continue;
                }
                shelf.demand.peak = (shelf.demand.peak / 2).max(floor);
                shelf.demand.halved = Some(now);
                let keep = shelf.demand.target(floor);
                while shelf.ready.len() > keep {
                    out.extend(shelf.ready.pop());
                }
            }
            out
        };
        for p in surplus {
            self.discard(p).await;
        }
    }

    /// What the pool holds (for metrics).
    pub fn pool_gauge(&self) -> PoolGauge {
        self.pool.gauge()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_children_sets_what_the_shelf_wants() {
        let mut d = Demand::default();
        assert_eq!(d.target(2), 2, "no demand yet: the floor");
        let t = Instant::now();
        for i in 0..32 {
            d.ask(t + Duration::from_millis(i));
        }
        assert_eq!(d.target(2), 32);
        // A later, smaller burst does not lower the peak; one past BURST starts anew.
        let later = t + BURST * 3;
        d.ask(later);
        d.ask(later);
        assert_eq!((d.burst, d.target(2)), (2, 32));
        d.peak = 1000;
        assert_eq!(d.target(2), MAX_READY);
        assert_eq!(
            Demand::default().target(0),
            0,
            "pool_size 0 and no demand: nothing"
        );
    }
}
