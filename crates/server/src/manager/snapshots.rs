//! Checkpoints and snapshots as objects: take one, list, get, delete, and put the
//! snapshot directory and block-store pins back in line with the database after a crash.
//!
//! A checkpoint writes its memory images to `<data>/snapshots/<id>/memory`, pins its
//! sealed layer under a block-store ref, and only then records the snapshot row: a
//! crash before the row leaves no visible snapshot, and recovery removes the files and pin.

use std::path::PathBuf;
use std::time::Instant;

use api_types::{Snapshot, SnapshotQuery};
use model::ids::{new_snapshot_id, valid_snapshot_id};
use model::{Op, SnapshotType};

use super::{now_rfc3339, Manager};
use crate::error::{is_storage_full, Error, Result};
use crate::snapshots::{pin_name, SnapshotRecord};

/// What to capture, as the manager takes it.
#[derive(Debug, Clone)]
pub struct CheckpointArgs {
    pub kind: SnapshotType,
    pub name: Option<String>,
    pub hooks: Vec<proto::agent::ExecRequest>,
    pub labels: std::collections::BTreeMap<String, String>,
}

impl Manager {
    /// Directory of snapshot files (`<data>/snapshots`).
    pub(super) fn snapshots_dir(&self) -> PathBuf {
        self.config.data_dir.join("snapshots")
    }

    /// Creates the directory of snapshot `id`, which the caller then owns (and may remove
    /// if it fails). `AlreadyExists` when one is there: it is someone else's, e.g. a
    /// deleted snapshot's kept because a later snapshot reads its memory images.
    pub(super) fn new_snapshot_dir(&self, id: &str) -> std::io::Result<PathBuf> {
        let root = self.snapshots_dir();
        std::fs::create_dir_all(&root)?;
        let dir = root.join(id);
        std::fs::create_dir(&dir)?;
        Ok(dir)
    }

    /// Checkpoints a running sandbox; it keeps running. The snapshot is visible only once
    /// complete.
    pub async fn checkpoint(&self, id_or_name: &str, args: CheckpointArgs) -> Result<Snapshot> {
        self.check_open()?;
        model::labels::check(&args.labels)?;
        let entry = self.find(id_or_name)?;
        let t = self.transition(&entry, Op::Checkpoint).await?;
        let _drained = match args.kind {
            SnapshotType::Memory => Some(self.drain(&entry).await?),
            SnapshotType::Filesystem => None,
        };
        let snap_id = new_snapshot_id()?;
        t.begin().await?;
        let started = Instant::now();
        let result = self.take_snapshot(&entry, &snap_id, args, false).await;
        self.metrics.checkpoint.observe(started.elapsed());
        // The sandbox runs on either way (the plan's failure state is its success state).
        let view = match &result {
            Ok(_) => t.succeed().await?,
            Err(_) => {
                t.to(t.plan.failure, None).await?;
                entry.view()
            }
        };
        entry.touch();
        let rec = result?;
        self.publish_later(&rec);
        self.events.emit(
            api_types::EventKind::Checkpointed,
            &view,
            Some(snap_id.clone()),
            None,
        );
        tracing::info!(sandbox = %view.id, snapshot = %snap_id, kind = ?rec.view.kind, "checkpoint");
        Ok(rec.view)
    }

    /// Checkpoints the sandbox of `entry` (its op lock held, state checked) as snapshot
    /// `snap_id`. On failure no files, pin or row are left.
    pub(super) async fn take_snapshot(
        &self,
        entry: &super::Entry,
        snap_id: &str,
        args: CheckpointArgs,
        internal: bool,
    ) -> Result<SnapshotRecord> {
        let row = entry.row();
        let dir = self.snapshots_dir().join(snap_id);
        let memory_dir = (args.kind == SnapshotType::Memory).then(|| dir.join("memory"));
        let pin = pin_name(snap_id);
        let made = async {
            self.refuse_while_disk_full(entry, &row.view.id).await?;
            // Made first, even without memory images, so recovery finds a torn checkpoint.
            std::fs::create_dir_all(&dir).map_err(|e| match is_storage_full(&e) {
                true => Error::from(e),
                false => Error::Unsupported(format!("{}: {e}", dir.display())),
            })?;
            let cp = self
                .backend
                .checkpoint(&row.view.id, args.kind, memory_dir.clone())
                .await?;
            self.backend.pin_layer(&pin, &cp.layer_id).await?;
            let saved = match &cp.memory_dir {
                Some(mem) => self.share_with_parent(&row, snap_id, mem).await?,
                None => 0,
            };
            let rec = SnapshotRecord {
                view: Snapshot {
                    id: snap_id.to_string(),
                    kind: args.kind,
                    name: args.name,
                    source_sandbox_id: Some(row.view.id.clone()),
                    image: row.view.image.clone(),
                    size_bytes: cp.size_bytes.saturating_sub(saved),
                    created_at: now_rfc3339(),
                    cpus: row.boot.cpus,
                    memory_mb: row.boot.memory_mb,
                    disk_mb: row.boot.disk_mb,
                    labels: args.labels,
                    published: false,
                },
                layer_id: cp.layer_id,
                memory_dir: cp.memory_dir,
                boot: row.boot.without_secrets(),
                hooks: args.hooks,
                internal,
                restore_bytes: cp.size_bytes,
                pulled: false,
                pages: Vec::new(),
            };
            self.store.put_snapshot(rec.clone()).await?;
            Ok::<_, Error>(rec)
        }
        .await;
        if let Err(e) = &made {
            tracing::warn!(sandbox = %row.view.id, error = %e.message(), "checkpoint failed");
            let _ = self.backend.unpin_layer(&pin).await;
            // With the retained parents only it kept alive.
            self.drop_snapshot_dir(snap_id).await;
            let _ = std::fs::remove_dir_all(&dir);
        }
        made
    }

    /// A snapshot's record; 404 for unknown, malformed and internal ids.
    pub(super) async fn snapshot_record(&self, id: &str) -> Result<SnapshotRecord> {
        let missing = || Error::NotFound(format!("Snapshot {id} not found"));
        if !valid_snapshot_id(id) {
            return Err(missing());
        }
        match self.store.snapshot(id.to_string()).await? {
            Some(r) if !r.internal => Ok(r),
            _ => Err(missing()),
        }
    }

    /// A snapshot: this node's, else the object store's.
    pub async fn get_snapshot(&self, id: &str) -> Result<Snapshot> {
        self.any_snapshot(id).await
    }

    /// Snapshots, oldest first, optionally of one source sandbox or one type; with
    /// `published`, also those only the object store holds.
    pub async fn list_snapshots(&self, q: &SnapshotQuery) -> Result<Vec<Snapshot>> {
        let all = self.store.snapshots().await?;
        let mut views: Vec<Snapshot> = all
            .into_iter()
            .filter(|r| !r.internal)
            .map(|r| r.view)
            .collect();
        if q.published == Some(true) && self.has_remote() {
            let local: Vec<String> = views.iter().map(|v| v.id.clone()).collect();
            views.extend(self.bucket_snapshots(&local).await?);
            views.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        }
        Ok(views
            .into_iter()
            .filter(|v| q.kind.is_none_or(|k| v.kind == k))
            .filter(|v| q.source.is_none() || v.source_sandbox_id.as_deref() == q.source.as_deref())
            .collect())
    }

    /// Deletes a snapshot. Sandboxes restored from it keep working (their disks hold the
    /// layers); storage is freed when nothing uses it any more. With `everywhere`, its
    /// manifest leaves the object store first, so no node pulls it again.
    pub async fn delete_snapshot(&self, id: &str, everywhere: bool) -> Result<()> {
        if everywhere {
            self.any_snapshot(id).await?;
            self.unpublish(id).await?;
        }
        match self.snapshot_record(id).await {
            Ok(rec) => self.remove_snapshot(&rec).await,
            Err(Error::NotFound(_)) if everywhere => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes a snapshot's row, then its pin and files.
    pub(super) async fn remove_snapshot(&self, rec: &SnapshotRecord) -> Result<()> {
        self.store.delete_snapshot(rec.view.id.clone()).await?;
        self.pool_evict(Some(&rec.view.id)).await;
        if let Err(e) = self.backend.unpin_layer(&rec.pin()).await {
            tracing::warn!(snapshot = %rec.view.id, error = %e, "unpin failed");
        }
        self.release_snapshot_pages(rec).await;
        self.drop_snapshot_dir(&rec.view.id).await;
        tracing::info!(snapshot = %rec.view.id, "snapshot deleted");
        Ok(())
    }

    /// Removes snapshot directories no row describes and no recorded snapshot reads from
    /// (a checkpoint interrupted by a crash, or a deleted parent no longer needed).
    pub(super) async fn recover_snapshots(&self) -> Result<()> {
        self.store.snapshots().await?;
        let _ = std::fs::remove_dir_all(self.transfer_dir());
        self.sweep_snapshot_dirs().await;
        Ok(())
    }
}
