//! Memory pressure: rather than refuse new work or let the kernel kill running sandboxes,
//! suspend the named sandboxes that have been idle longest (a memory checkpoint to disk;
//! they resume with their processes) until the host has room again. Unnamed sandboxes are
//! never suspended behind their owner's back: nothing could address them again by name.

use std::sync::Arc;
use std::time::Duration;

use super::{Entry, Manager};
use model::State;

impl Manager {
    /// Suspends idle named sandboxes, longest idle first, until `need_mb` fits under the
    /// host's available memory less the reserve (or none is left to suspend). Off when
    /// `pressure_suspend_idle_secs` is 0.
    pub(super) async fn relieve_pressure(&self, need_mb: u64) {
        let min_idle = Duration::from_secs(self.config.pressure_suspend_idle_secs);
        if min_idle.is_zero() {
            return;
        }
        let reserve_mb = self.registry().admission.policy().reserve_mb;
        for entry in self.idle_named(min_idle) {
            let room = self
                .backend
                .host_memory()
                .is_none_or(|m| m.available_mb.saturating_sub(reserve_mb) >= need_mb);
            if room {
                return;
            }
            let id = entry.view().id;
            tracing::info!(sandbox = %id, idle_secs = entry.idle_for().as_secs(), "suspending an idle sandbox to relieve memory pressure");
            self.metrics.pressure_suspends.inc();
            if let Err(e) = self.suspend(&id).await {
                tracing::warn!(sandbox = %id, error = %e.message(), "suspend under memory pressure failed");
            }
        }
    }

    /// Running named sandboxes idle at least `min_idle`, longest idle first.
    fn idle_named(&self, min_idle: Duration) -> Vec<Arc<Entry>> {
        let mut idle: Vec<(Duration, Arc<Entry>)> = self
            .registry()
            .entries
            .values()
            .filter(|e| {
                let v = e.view();
                v.state == State::Running && v.name.is_some()
            })
            .map(|e| (e.idle_for(), e.clone()))
            .filter(|(d, _)| *d >= min_idle)
            .collect();
        idle.sort_by_key(|(d, _)| std::cmp::Reverse(*d));
        idle.into_iter().map(|(_, e)| e).collect()
    }
}
