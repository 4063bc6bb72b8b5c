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
use model::{plan, Op, State};

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

    /// Fails and tears down the sandbox of `entry` if a part of it died.
    async fn probe(&self, entry: &Entry) {
        let Ok(_op) = entry.op.try_lock() else {
            return;
        };
        let id = entry.view().id;
        let Some(p) = plan(entry.state(), Op::Fail) else {
            return;
        };
        let reason = match self.backend.dead_reason(&id).await {
            Ok(Some(reason)) => reason,
            Ok(None) => return self.check_oom(entry, &id).await,
            Err(e) => {
                tracing::debug!(sandbox = %id, error = %e, "liveness probe failed");
                return;
            }
        };
        tracing::warn!(sandbox = %id, %reason, "sandbox failed");
        if let Err(e) = self.set_state(entry, p.during, Some(reason.clone())).await {
            tracing::error!(sandbox = %id, error = %e.message(), "recording a failure failed");
        }
        if let Err(e) = self.backend.destroy(&id).await {
            tracing::error!(sandbox = %id, error = %e, "cleanup of a failed sandbox failed");
            let msg = format!("{reason}; its cleanup failed: {e}");
            let _ = self.set_state(entry, p.failure, Some(msg)).await;
            return;
        }
        tracing::info!(sandbox = %id, "failed sandbox cleaned up");
    }
}
