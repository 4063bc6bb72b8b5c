//! Recovery after a restart: rebuild the registry from the store, remove every host
//! resource nothing should hold, and re-adopt sandboxes that were running (or mark them
//! failed and clean them up).

use std::collections::HashMap;
use std::sync::Arc;

use super::{lock, Entry, Manager};
use crate::error::Result;
use crate::store::SandboxRow;
use model::{interrupted, plan, Op, State};

impl Manager {
    pub(super) async fn recover(&self) -> Result<()> {
        let rows = self.store.sandboxes().await?;
        let _ = self.store.prune_terminated(1000).await;
        let keep: Vec<String> = rows
            .iter()
            .filter(|r| {
                matches!(
                    r.view.state,
                    State::Running | State::Suspended | State::Checkpointing | State::Suspending
                )
            })
            .map(|r| r.view.id.clone())
            .collect();
        // Before the cleanup removes what is left of them: why sandboxes died meanwhile.
        let mut dead = HashMap::new();
        let running = rows
            .iter()
            .filter(|r| matches!(r.view.state, State::Running | State::Checkpointing));
        for id in running.map(|r| &r.view.id) {
            if let Ok(Some(reason)) = self.backend.dead_reason(id).await {
                dead.insert(id.clone(), reason);
            }
        }
        if let Err(e) = self.backend.cleanup_stale(&keep).await {
            tracing::error!(error = %e, "stale resource cleanup failed");
        }
        for row in rows {
            let reason = dead.remove(&row.view.id);
            self.recover_one(row, reason).await?;
        }
        self.roll_back_cut_forks().await;
        if let Err(e) = self.drop_stale_suspend_states().await {
            tracing::error!(error = %e.message(), "dropping stale suspended states failed");
        }
        // After the sandboxes: an interrupted checkpoint's files are complete by then.
        if let Err(e) = self.recover_snapshots().await {
            tracing::error!(error = %e.message(), "snapshot recovery failed");
        }
        if let Err(e) = self.recover_images().await {
            tracing::error!(error = %e.message(), "image recovery failed");
        }
        Ok(())
    }

    /// Recovers one sandbox; `dead` is why its agent or disk server died, if one did. An
    /// operation the restart cut short ends as `model::interrupted` plans it.
    async fn recover_one(&self, row: SandboxRow, dead: Option<String>) -> Result<()> {
        let state = row.view.state;
        let entry = Entry::new(row);
        entry
            .oom_seen
            .store(super::UNSEEN, std::sync::atomic::Ordering::SeqCst);
        let id = entry.view().id;
        self.registry_mut()
            .entries
            .insert(id.clone(), entry.clone());
        let cut_short = interrupted(state);
        match (state, dead) {
            (State::Running | State::Checkpointing, Some(reason)) => {
                let _ = self.backend.destroy(&id).await;
                tracing::warn!(sandbox = %id, %reason, "sandbox died while the daemon was down");
                let failed = plan(State::Running, Op::Fail).map_or(State::Failed, |p| p.success);
                let msg = format!("{reason} while the daemon was down");
                self.set_state(&entry, failed, Some(msg)).await
            }
            (State::Running, None) => self.readopt(&entry).await,
            (State::Suspended, None) => {
                self.registry_mut()
                    .admission
                    .force(&id, entry.row().boot.memory_mb);
                Ok(())
            }
            (State::Suspending | State::Resuming, _) => self.recover_suspend(&entry).await,
            (State::Checkpointing, None) => {
                // The checkpoint is lost (recovery removes its files); the source goes on.
                if let Some((_, p)) = cut_short {
                    self.set_state(&entry, p.failure, None).await?;
                }
                self.readopt(&entry).await
            }
            (State::Terminating, _) => self.finish_terminate(&entry).await,
            (s, _) => match cut_short {
                Some((_, p)) => {
                    let _ = self.backend.destroy(&id).await;
                    let msg = format!("Interrupted while {s} by a daemon restart");
                    tracing::warn!(sandbox = %id, "{msg}");
                    self.set_state(&entry, p.failure, Some(msg)).await
                }
                None => Ok(()),
            },
        }
    }

    /// A terminate cut short by the restart is finished: the sandbox was to go.
    async fn finish_terminate(&self, entry: &Arc<Entry>) -> Result<()> {
        let id = entry.view().id;
        let (success, failure) = interrupted(State::Terminating)
            .map_or((State::Terminated, State::Failed), |(_, p)| {
                (p.success, p.failure)
            });
        match self.backend.destroy(&id).await {
            Ok(()) => {
                self.set_state(entry, success, None).await?;
                self.drop_suspended_state(&id).await;
                tracing::info!(sandbox = %id, "interrupted terminate finished");
                Ok(())
            }
            Err(e) => {
                let msg = format!("Terminate failed: {e}");
                self.set_state(entry, failure, Some(msg)).await
            }
        }
    }

    pub(super) async fn readopt(&self, entry: &Arc<Entry>) -> Result<()> {
        let row = entry.row();
        let id = row.view.id.clone();
        self.registry_mut().admission.force(&id, row.boot.memory_mb);
        match self.backend.adopt(&row.boot).await {
            Ok(booted) => {
                lock(&entry.row).view.network.address = booted.address.or(row.view.network.address);
                tracing::info!(sandbox = %id, "sandbox re-adopted");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "sandbox lost across restart");
                let _ = self.backend.destroy(&id).await;
                let msg = format!("Lost across a daemon restart: {e}");
                self.set_state(entry, State::Failed, Some(msg)).await
            }
        }
    }
}
