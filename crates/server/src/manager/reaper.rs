//! Idle timeouts: a sandbox with `timeout_secs > 0` and no API activity for that long is
//! terminated when unnamed; named ones are suspended (see [`idle_action`]).

use std::sync::Arc;
use std::time::Duration;

use super::{Entry, Manager};
use api_types::Sandbox;
use model::State;

/// Terminated sandboxes kept in memory (for `GET` and idempotent `DELETE`).
pub const KEEP_TERMINATED: usize = 1000;

/// What to do with a sandbox whose idle timeout passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleAction {
    Terminate,
    Suspend,
}

/// The policy: named sandboxes suspend (keeping their state), unnamed ones terminate.
pub fn idle_action(view: &Sandbox) -> IdleAction {
    if view.name.is_some() {
        IdleAction::Suspend
    } else {
        IdleAction::Terminate
    }
}

fn expired(entry: &Entry) -> Option<Sandbox> {
    let view = entry.view();
    let timeout = Duration::from_secs(view.timeout_secs);
    let idle = view.state == State::Running && view.timeout_secs > 0 && entry.idle_for() >= timeout;
    idle.then_some(view)
}

impl Manager {
    pub(super) fn start_reaper(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let every = Duration::from_millis(self.config.reaper_interval_ms.max(10));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(m) = weak.upgrade() else { return };
                m.reap_once().await;
            }
        });
    }

    /// Forgets the oldest terminated sandboxes past [`KEEP_TERMINATED`] (the store
    /// keeps its own bounded history).
    fn prune_terminated(&self) {
        let mut reg = self.registry_mut();
        let mut done: Vec<(String, String)> = reg
            .entries
            .values()
            .map(|e| e.view())
            .filter(|v| v.state == State::Terminated)
            .map(|v| (v.created_at, v.id))
            .collect();
        if done.len() <= KEEP_TERMINATED {
            return;
        }
        done.sort();
        for (_, id) in &done[..done.len() - KEEP_TERMINATED] {
            reg.entries.remove(id);
        }
    }

    /// Acts on every sandbox whose idle timeout passed.
    pub async fn reap_once(&self) {
        self.prune_terminated();
        self.pool_expire().await;
        let due: Vec<Sandbox> = self
            .registry()
            .entries
            .values()
            .filter_map(|e| expired(e))
            .collect();
        for view in due {
            if self.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            self.on_idle(view).await;
        }
    }

    async fn on_idle(&self, view: Sandbox) {
        let action = idle_action(&view);
        tracing::info!(sandbox = %view.id, ?action, timeout_secs = view.timeout_secs, "idle timeout");
        let done = match action {
            IdleAction::Suspend => self.suspend(&view.id).await.map(drop),
            IdleAction::Terminate => self.terminate(&view.id).await.map(drop),
        };
        if let Err(e) = done {
            // Try again after another idle period, not on every tick (a failing suspend is
            // a full memory dump, and a guest can make it fail).
            if let Some(entry) = self.registry().entries.get(&view.id) {
                entry.touch();
            }
            crate::guest_warn!(self.guest_logs, &view.id, sandbox = %view.id, ?action,
                error = %e.message(), "idle action failed");
        }
    }
}
