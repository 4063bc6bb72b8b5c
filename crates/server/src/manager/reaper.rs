//! Idle timeouts: a sandbox with `timeout_secs > 0` and no API activity for that long is
//! terminated or suspended, as its `on_timeout` says (see [`on_timeout`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Entry, Manager};
use api_types::{OnTimeout, Sandbox};
use model::State;

/// Terminated sandboxes kept in memory (for `GET` and idempotent `DELETE`).
pub const KEEP_TERMINATED: usize = 1000;

/// The action asked for, or by default: named sandboxes suspend (keeping their state, found
/// again by name), unnamed ones terminate.
pub fn on_timeout(asked: Option<OnTimeout>, name: Option<&str>) -> OnTimeout {
    asked.unwrap_or(if name.is_some() {
        OnTimeout::Suspend
    } else {
        OnTimeout::Terminate
    })
}

/// When a running sandbox's idle timeout passes, as things stand.
pub(super) fn expires_at(view: &Sandbox, idle_for: Duration) -> Option<String> {
    if view.state != State::Running || view.timeout_secs == 0 {
        return None;
    }
    let left = Duration::from_secs(view.timeout_secs).saturating_sub(idle_for);
    SystemTime::now()
        .checked_add(left)
        .map(model::timestamp::rfc3339_millis)
}

/// The longest idle timeout: ten years.
pub const MAX_TIMEOUT_SECS: u64 = 10 * 366 * 24 * 3600;

/// A timeout is at most [`MAX_TIMEOUT_SECS`] (0 is never).
pub(super) fn check_timeout(secs: Option<u64>) -> crate::error::Result<()> {
    match secs {
        Some(s) if s > MAX_TIMEOUT_SECS => Err(crate::error::Error::InvalidArgument(format!(
            "timeout_secs {s} is out of range (0 = never, at most {MAX_TIMEOUT_SECS})"
        ))),
        _ => Ok(()),
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
        let action = on_timeout(view.on_timeout, view.name.as_deref());
        tracing::info!(sandbox = %view.id, ?action, timeout_secs = view.timeout_secs, "idle timeout");
        let done = match action {
            OnTimeout::Suspend => self.suspend(&view.id).await.map(drop),
            OnTimeout::Terminate => self.terminate(&view.id).await.map(drop),
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
