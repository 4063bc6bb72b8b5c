//! The liveness watch: every running sandbox's agent and disk server are probed every
//! [`WATCH_EVERY`]; a sandbox whose part died is failed with the reason (row `Fail` of the
//! lifecycle table) and its host resources are torn down, without waiting for a request
//! to fail first.
//!
//! A probe holds the sandbox's operation lock (taken with `try_lock`, so it never waits
//! behind a checkpoint, suspend or terminate, and skips sandboxes busy with one) and acts
//! only on `running` ones: a deliberate stop, suspend or checkpoint is never mistaken for
//! a death. A failing data-plane request asks for a probe at once.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::Ordering;

use super::{Entry, Manager, UNSEEN};
use model::{Op, State};

/// Free space of the data directory under which the probe asks disk servers whether
/// they hold writes.
const LOW_SPACE_MB: u64 = 64;

/// How often every running sandbox is probed.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

impl Manager {
    pub(super) fn start_watch(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                let Some(m) = weak.upgrade() else { return };
                m.watch_once().await;
            }
        });
    }

    /// Probes every running sandbox once.
    pub async fn watch_once(&self) {
        let running: Vec<Arc<Entry>> = self
            .registry()
            .entries
            .values()
            .filter(|e| e.state() == State::Running)
            .cloned()
            .collect();
        for entry in running {
            if self.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            self.probe(&entry).await;
        }
    }

    /// Probes one sandbox soon (after a data-plane request found its agent unreachable).
    pub(super) fn probe_soon(&self, id: &str) {
        let Some(entry) = self.registry().entries.get(id).cloned() else {
            return;
        };
        let weak = self.weak_self();
        tokio::spawn(async move {
            if let Some(m) = weak.upgrade() {
                m.probe(&entry).await;
            }
        });
    }

    /// Tells the events feed when the OOM killer has killed in the sandbox since the last
    /// probe (for a sandbox adopted from a previous daemon, the first reading only sets
    /// the mark).
    async fn check_oom(&self, entry: &Entry, id: &str) {
        let Ok(kills) = self.backend.oom_kills(id).await else {
            return;
        };
        let seen = entry.oom_seen.swap(kills, Ordering::SeqCst);
        if seen != UNSEEN && kills > seen {
            let killed = kills - seen;
            self.events.emit(
                api_types::EventKind::Oom,
                &entry.view(),
                None,
                Some(format!(
                    "{killed} process(es) killed for want of memory ({kills} since it started)"
                )),
            );
        }
    }

    /// Tells the events feed (and the sandbox's `disk_full`) when its disk server starts
    /// or stops holding writes for want of host space. The disk server is asked only
    /// while the data directory is nearly full, or was for this sandbox.
    async fn check_disk(&self, entry: &Entry, id: &str) {
        let was = entry.disk_full.load(Ordering::Relaxed);
        let low = self
            .backend
            .host_disk()
            .is_some_and(|d| d.free_mb < LOW_SPACE_MB);
        if !low && !was {
            return;
        }
        let Ok(held) = self.backend.disk_held_writes(id).await else {
            return;
        };
        let full = held > 0;
        if entry.disk_full.swap(full, Ordering::Relaxed) == full {
            return;
        }
        let (kind, msg) = if full {
            tracing::warn!(sandbox = %id, held, "the host's data directory is full: the sandbox's disk writes wait for space");
            let msg = "The host's data directory is full: its disk writes wait (kept, not dropped) until space is freed";
            (api_types::EventKind::DiskFull, msg)
        } else {
            tracing::info!(sandbox = %id, "space is back: the sandbox's held disk writes went through");
            (
                api_types::EventKind::DiskRecovered,
                "Space is back: its held disk writes went through",
            )
        };
        self.events
            .emit(kind, &entry.view(), None, Some(msg.to_string()));
    }

    /// A 507 while the sandbox's disk server holds writes for want of host space: a seal
    /// freezes the filesystem, and the freeze would wait for those writes.
    pub(super) async fn refuse_while_disk_full(
        &self,
        entry: &Entry,
        id: &str,
    ) -> crate::error::Result<()> {
        self.check_disk(entry, id).await;
        if !entry.disk_full.load(Ordering::Relaxed) {
            return Ok(());
        }
        Err(crate::error::Error::InsufficientStorage(
            "Out of disk space: the host's data directory is full and the sandbox's disk writes \
             wait for space; free space on the host, then try again"
                .into(),
        ))
    }

    /// Fails and tears down the sandbox of `entry` if a part of it died.
    async fn probe(&self, entry: &Arc<Entry>) {
        let Some(t) = self.try_transition(entry, Op::Fail) else {
            return;
        };
        let id = t.id();
        let reason = match self.backend.dead_reason(&id).await {
            Ok(Some(reason)) => reason,
            Ok(None) => {
                self.check_oom(entry, &id).await;
                return self.check_disk(entry, &id).await;
            }
            Err(e) => {
                tracing::debug!(sandbox = %id, error = %e, "liveness probe failed");
                return;
            }
        };
        tracing::warn!(sandbox = %id, %reason, "sandbox failed");
        if let Err(e) = t.to(t.plan.during, Some(reason.clone())).await {
            tracing::error!(sandbox = %id, error = %e.message(), "recording a failure failed");
        }
        if let Err(e) = self.backend.destroy(&id).await {
            tracing::error!(sandbox = %id, error = %e, "cleanup of a failed sandbox failed");
            let msg = format!("{reason}; its cleanup failed: {e}");
            let _ = t.to(t.plan.failure, Some(msg)).await;
            return;
        }
        tracing::info!(sandbox = %id, "failed sandbox cleaned up");
    }
}
