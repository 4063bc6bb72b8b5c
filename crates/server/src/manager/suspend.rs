//! Suspend and resume: a memory checkpoint of the sandbox into an internal snapshot, then
//! every host resource released (no CPU, memory or disk server while suspended); resume
//! restores that snapshot under the same id and name, then drops the snapshot.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::snapshots::CheckpointArgs;
use super::{lock, Manager};
use crate::backend::RestoreFrom;
use crate::error::{Error, Result};
use crate::snapshots::SnapshotRecord;
use api_types::Sandbox;
use model::SnapshotType;
use model::{interrupted, Op, State};

/// The internal snapshot holding a suspended sandbox.
pub fn suspend_snapshot_id(sandbox_id: &str) -> String {
    format!("snap-suspend-{}", sandbox_id.trim_start_matches("sb-"))
}

impl Manager {
    /// Suspends a running sandbox (keeping its id, name, files and processes).
    pub async fn suspend(&self, id_or_name: &str) -> Result<Sandbox> {
        self.check_open()?;
        let entry = self.find(id_or_name)?;
        let t = self.transition(&entry, Op::Suspend).await?;
        let id = t.id();
        let _drained = self.drain(&entry).await?;
        t.begin().await?;
        let snap_id = suspend_snapshot_id(&id);
        // A leftover of an earlier, interrupted suspend would block the new one.
        if let Ok(Some(old)) = self.store.snapshot(snap_id.clone()).await {
            self.remove_snapshot(&old).await?;
        }
        let args = CheckpointArgs {
            kind: SnapshotType::Memory,
            name: None,
            hooks: Vec::new(),
            labels: BTreeMap::new(),
        };
        if let Err(e) = self.take_snapshot(&entry, &snap_id, args, true).await {
            return Err(t.fail(None, e).await);
        }
        if let Err(e) = self.backend.destroy(&id).await {
            let msg = format!("Suspend could not stop the sandbox: {e}");
            return Err(t.fail_as(State::Failed, Some(msg), e).await);
        }
        lock(&entry.row).view.network.address = None;
        let view = t.succeed().await?;
        tracing::info!(sandbox = %id, "sandbox suspended");
        Ok(view)
    }

    /// Resumes a suspended sandbox from its internal snapshot.
    pub async fn resume(&self, id_or_name: &str) -> Result<Sandbox> {
        self.check_open()?;
        let entry = self.find(id_or_name)?;
        let t = self.transition(&entry, Op::Resume).await?;
        let row = entry.row();
        let id = row.view.id.clone();
        let rec = self
            .store
            .snapshot(suspend_snapshot_id(&id))
            .await?
            .ok_or_else(|| Error::Conflict(format!("Sandbox {id} has no suspended state")))?;
        t.begin().await?;
        let from = RestoreFrom {
            layer_id: rec.layer_id.clone(),
            memory_dir: rec.memory_dir.clone(),
            identity: None,
            hooks: Vec::new(),
        };
        match self.backend.restore(&row.boot, from).await {
            Ok(booted) => {
                lock(&entry.row).view.network.address = booted.address;
                // Its restored cgroup counts OOM kills from zero again.
                entry.oom_seen.store(0, std::sync::atomic::Ordering::SeqCst);
                let view = t.succeed().await?;
                entry.touch();
                self.remove_suspended_state_later(entry.clone(), rec);
                tracing::info!(sandbox = %id, "sandbox resumed");
                Ok(view)
            }
            Err(e) => {
                let msg = format!("Resume failed: {e}");
                Err(t.fail(Some(msg), e).await)
            }
        }
    }

    /// Removes the suspended state of a resumed sandbox off the resume's path (its memory
    /// images take time to delete, and a request resumed on access is waiting). The
    /// sandbox's next lifecycle operation waits for it: a new suspend reuses the id. Left
    /// behind by a crash, the row is replaced by the next suspend and its files swept.
    fn remove_suspended_state_later(&self, entry: Arc<super::Entry>, rec: SnapshotRecord) {
        let manager = self.weak_self();
        tokio::spawn(async move {
            let _op = entry.op.lock().await;
            let Some(m) = manager.upgrade() else {
                return;
            };
            if let Err(e) = m.remove_snapshot(&rec).await {
                tracing::warn!(snapshot = %rec.view.id, error = %e.message(), "removing the suspended state failed");
            }
        });
    }

    /// A suspend or resume cut short by a daemon restart. A suspend whose state was not
    /// saved yet had not stopped anything: the sandbox is re-adopted and runs on (the
    /// runtime resumes it if the checkpoint had paused it). Otherwise whatever runs is
    /// removed; the sandbox is suspended again if its suspended state was saved, failed
    /// otherwise.
    pub(super) async fn recover_suspend(&self, entry: &Arc<super::Entry>) -> Result<()> {
        let view = entry.view();
        let Some((op, p)) = interrupted(view.state) else {
            return Ok(());
        };
        let saved = self
            .store
            .snapshot(suspend_snapshot_id(&view.id))
            .await?
            .is_some();
        if !saved && op == Op::Suspend {
            tracing::warn!(sandbox = %view.id, "suspend interrupted before its state was saved; running on");
            self.set_state(entry, p.failure, None).await?;
            return self.readopt(entry).await;
        }
        let _ = self.backend.destroy(&view.id).await;
        if saved {
            // A suspend whose state was saved is done; a resume cut short failed back to
            // its suspended state. Either way the sandbox is suspended.
            let suspended = if op == Op::Suspend {
                p.success
            } else {
                p.failure
            };
            tracing::warn!(sandbox = %view.id, state = %view.state, "interrupted; suspended again");
            self.registry_mut()
                .admission
                .force(&view.id, entry.row().boot.memory_mb);
            lock(&entry.row).view.network.address = None;
            return self.set_state(entry, suspended, None).await;
        }
        let msg = format!("Interrupted while {} by a daemon restart", view.state);
        self.set_state(entry, State::Failed, Some(msg)).await
    }

    /// Drops suspended states no suspended sandbox owns: a resume that finished as the
    /// daemon died, before it dropped the state, leaves the memory images and the pinned
    /// layers of a sandbox that runs again.
    pub(super) async fn drop_stale_suspend_states(&self) -> Result<()> {
        for rec in self.store.snapshots().await? {
            let owner = rec.view.source_sandbox_id.clone().unwrap_or_default();
            let state = self.registry().entries.get(&owner).map(|e| e.state());
            if rec.internal && state != Some(State::Suspended) {
                tracing::info!(sandbox = %owner, snapshot = %rec.view.id, "dropping a stale suspended state");
                self.remove_snapshot(&rec).await?;
            }
        }
        Ok(())
    }

    /// Drops the suspended state of a terminated sandbox and frees the disk layers
    /// nothing uses any more.
    pub(super) async fn drop_suspended_state(&self, id: &str) {
        if let Ok(Some(rec)) = self.store.snapshot(suspend_snapshot_id(id)).await {
            let _ = self.remove_snapshot(&rec).await;
        }
        if let Err(e) = self.backend.collect_garbage().await {
            tracing::warn!(error = %e, "garbage collection failed");
        }
    }
}
