//! Memory snapshots that store only what changed since their parent.
//!
//! A memory checkpoint of a sandbox that has a memory snapshot behind it (the one it was
//! restored or forked from, or its own latest checkpoint) shares every unchanged page with
//! it: the new images read those pages from the parent's (CRIU's `parent` link, see
//! `runtime::memory_images`). So a snapshot's directory may be read by later ones, and
//! deleting a snapshot removes its row and pin at once but its directory only once no
//! other snapshot reads from it; removing the last reader removes the retained chain
//! behind it. One lock orders sharing against removal, so a checkpoint never links to a
//! directory that is going away.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use model::SnapshotType;

use super::Manager;
use crate::snapshots::SnapshotRecord;
use crate::store::SandboxRow;

const MEMORY: &str = "memory";

impl Manager {
    /// The snapshot directory of `id`.
    fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.snapshots_dir().join(id)
    }

    /// The memory snapshot a new checkpoint of `row`'s sandbox is most alike: its own
    /// newest, else the one it was started from.
    async fn memory_parent(&self, row: &SandboxRow, except: &str) -> Option<SnapshotRecord> {
        let all = self.store.snapshots().await.ok()?;
        let id = &row.view.id;
        let from = row.view.snapshot_id.as_deref();
        all.into_iter()
            .filter(|r| r.view.kind == SnapshotType::Memory && r.view.id != except)
            .filter(|r| r.memory_dir.as_ref().is_some_and(|d| d.is_dir()))
            // A pulled copy is a cache entry, dropped at will: nothing may read from it.
            .filter(|r| !r.pulled)
            .filter(|r| {
                r.view.source_sandbox_id.as_ref() == Some(id) || Some(r.view.id.as_str()) == from
            })
            .max_by(|a, b| {
                let own = |r: &SnapshotRecord| r.view.source_sandbox_id.as_ref() == Some(id);
                (own(a), &a.view.created_at).cmp(&(own(b), &b.view.created_at))
            })
    }

    /// Makes the fresh memory images in `dir` (snapshot `snap_id` of `row`, not recorded
    /// yet) share their unchanged pages with a parent snapshot; returns the bytes saved.
    pub(super) async fn share_with_parent(
        &self,
        row: &SandboxRow,
        snap_id: &str,
        dir: &Path,
    ) -> crate::error::Result<u64> {
        let _order = self.lineage.lock().await;
        let Some(parent) = self.memory_parent(row, snap_id).await else {
            return Ok(0);
        };
        let Some(parent_dir) = parent.memory_dir else {
            return Ok(0);
        };
        let saved = self.backend.share_memory(dir, &parent_dir).await?;
        tracing::info!(snapshot = %snap_id, parent = %parent.view.id, saved_mb = saved >> 20, "memory images share pages with their parent");
        Ok(saved)
    }

    /// Removes the directory of deleted snapshot `id` unless a later snapshot reads from
    /// it; then the retained directories behind it that nothing reads any more.
    pub(super) async fn drop_snapshot_dir(&self, id: &str) {
        let _order = self.lineage.lock().await;
        let known = self.recorded().await;
        let mut next = Some(id.to_string());
        while let Some(id) = next.take() {
            if known.contains(&id) || self.is_read_from(&id) {
                return;
            }
            let dir = self.snapshot_dir(&id);
            next = runtime::memory_images::parent_of(&dir.join(MEMORY))
                .and_then(|p| snapshot_of(&p, &self.snapshots_dir()));
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// After a crash: removes every snapshot directory that no row describes and no
    /// recorded snapshot reads from (through its parents), with its pin.
    pub(super) async fn sweep_snapshot_dirs(&self) {
        let _order = self.lineage.lock().await;
        let known = self.recorded().await;
        let mut needed: HashSet<String> = HashSet::new();
        for id in &known {
            let mut at = Some(id.clone());
            while let Some(id) = at.take() {
                if !needed.insert(id.clone()) {
                    break;
                }
                at = runtime::memory_images::parent_of(&self.snapshot_dir(&id).join(MEMORY))
                    .and_then(|p| snapshot_of(&p, &self.snapshots_dir()));
            }
        }
        let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if needed.contains(&name) {
                continue;
            }
            tracing::info!(snapshot = %name, "removing an interrupted checkpoint or unread snapshot files");
            let _ = self
                .backend
                .unpin_layer(&crate::snapshots::pin_name(&name))
                .await;
            let _ = std::fs::remove_dir_all(e.path());
        }
    }

    async fn recorded(&self) -> HashSet<String> {
        match self.store.snapshots().await {
            Ok(all) => all.into_iter().map(|r| r.view.id).collect(),
            // Unknown: keep everything.
            Err(_) => std::fs::read_dir(self.snapshots_dir())
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
        }
    }

    /// Whether any snapshot directory's memory images name `id`'s as their parent.
    fn is_read_from(&self, id: &str) -> bool {
        let root = self.snapshots_dir();
        let Ok(entries) = std::fs::read_dir(&root) else {
            return false;
        };
        entries.flatten().any(|e| {
            runtime::memory_images::parent_of(&e.path().join(MEMORY))
                .and_then(|p| snapshot_of(&p, &root))
                .is_some_and(|p| p == id)
        })
    }
}

/// The snapshot id whose memory directory `memory_dir` is (`<root>/<id>/memory`).
fn snapshot_of(memory_dir: &Path, root: &Path) -> Option<String> {
    let dir = memory_dir.parent()?;
    let id = dir.file_name()?.to_string_lossy().into_owned();
    let same_root = dir
        .parent()
        .and_then(|p| p.canonicalize().ok())
        .zip(root.canonicalize().ok())
        .is_some_and(|(a, b)| a == b);
    same_root.then_some(id)
}
