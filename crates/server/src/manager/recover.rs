//! Recovery after a restart: rebuild the registry from the store, remove every host
//! resource nothing should hold, and re-adopt sandboxes that were running (or mark them
//! failed and clean them up).

use std::sync::Arc;

use super::{lock, Entry, Manager};
use crate::error::Result;
use crate::lifecycle::State;
use crate::store::SandboxRow;

impl Manager {
    pub(super) async fn recover(&self) -> Result<()> {
        let rows = self.store.sandboxes().await?;
        let _ = self.store.prune_terminated(1000).await;
        let keep: Vec<String> = rows
            .iter()
            .filter(|r| {
                matches!(
                    r.view.state,
                    State::Running | State::Suspended | State::Checkpointing
                )
            })
            .map(|r| r.view.id.clone())
            .collect();
        if let Err(e) = self.backend.cleanup_stale(&keep).await {
            tracing::error!(error = %e, "stale resource cleanup failed");
        }
        for row in rows {
            self.recover_one(row).await?;
        }
        // After the sandboxes: an interrupted checkpoint's files are complete by then.
        if let Err(e) = self.recover_snapshots().await {
            tracing::error!(error = %e.message(), "snapshot recovery failed");
        }
        Ok(())
    }

    async fn recover_one(&self, row: SandboxRow) -> Result<()> {
        let state = row.view.state;
        let entry = Entry::new(row);
        let id = entry.view().id;
        self.registry_mut()
            .entries
            .insert(id.clone(), entry.clone());
        match state {
            State::Running => self.readopt(&entry).await,
            State::Suspended => {
                self.registry_mut()
                    .admission
                    .force(&id, entry.row().boot.memory_mb);
                Ok(())
            }
            State::Suspending | State::Resuming => self.recover_suspend(&entry).await,
            State::Checkpointing => {
                // The checkpoint is lost (recovery removes its files); the source goes on.
                lock(&entry.row).view.state = State::Running;
                self.store.put_sandbox(entry.row()).await?;
                self.readopt(&entry).await
            }
            s if s.is_transitional() => {
                let _ = self.backend.destroy(&id).await;
                let msg = format!("Interrupted while {s} by a daemon restart");
                tracing::warn!(sandbox = %id, "{msg}");
                self.set_state(&entry, State::Failed, Some(msg)).await
            }
            _ => Ok(()),
        }
    }

    async fn readopt(&self, entry: &Arc<Entry>) -> Result<()> {
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
