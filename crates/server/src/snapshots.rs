//! Snapshots: what the daemon records about each one, their rows in the state database
//! (`snapshots` table: id, kind, source, record JSON, created_at). Their API shapes are in
//! `api_types`; what the backend reports of a checkpoint is in `backend`.

use std::path::PathBuf;

use api_types::Snapshot;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::backend::BootSpec;
use crate::store::{Store, StoreResult};

/// Everything the daemon keeps about a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub view: Snapshot,
    /// The sealed disk layer; pinned in the block store under [`SnapshotRecord::pin`].
    pub layer_id: String,
    /// CRIU images of a memory snapshot.
    pub memory_dir: Option<PathBuf>,
    /// What restores start from: image, resources, env and network of the source.
    pub boot: BootSpec,
    /// After-restore hooks, as agent requests.
    pub hooks: Vec<proto::agent::ExecRequest>,
    /// Taken to suspend a sandbox: hidden from the snapshot list.
    #[serde(default)]
    pub internal: bool,
    /// What a restore maps back, in bytes: the whole memory images, pages read from a
    /// parent snapshot included (`view.size_bytes` is what this snapshot stores itself).
    /// 0 in records written before it was kept.
    #[serde(default)]
    pub restore_bytes: u64,
    /// A copy of a snapshot published by another node, pulled from the object store: a
    /// cache entry, dropped when the cache is full (docs/scale-out.md).
    #[serde(default)]
    pub pulled: bool,
    /// A pulled memory snapshot's pages files, each served from a block-store disk over
    /// its partial layer (their chunks come from the object store as they are read).
    #[serde(default)]
    pub pages: Vec<ServedPages>,
}

/// One memory image file served from a block-store disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedPages {
    /// Its name in the image directory (a symlink to the served file).
    pub file: String,
    /// The block-store disk serving it, forked from `layer`.
    pub disk: String,
    pub layer: String,
    pub size: u64,
}

impl SnapshotRecord {
    /// What a restore of this snapshot maps back, in MiB.
    pub fn restore_mb(&self) -> u64 {
        self.restore_bytes.max(self.view.size_bytes) >> 20
    }

    /// The block-store ref pinning this snapshot's layer.
    pub fn pin(&self) -> String {
        pin_name(&self.view.id)
    }
}

/// The block-store ref of snapshot `id`.
pub fn pin_name(id: &str) -> String {
    format!("snapshot-{id}")
}

impl Store {
    /// Inserts or replaces a snapshot.
    pub async fn put_snapshot(&self, rec: SnapshotRecord) -> StoreResult<()> {
        self.call(move |c| put_snapshot(c, &rec)).await
    }

    pub async fn snapshot(&self, id: String) -> StoreResult<Option<SnapshotRecord>> {
        self.call(move |c| get_snapshot(c, &id)).await
    }

    /// Every snapshot, oldest first.
    pub async fn snapshots(&self) -> StoreResult<Vec<SnapshotRecord>> {
        self.call(list_snapshots).await
    }

    /// Removes a snapshot; returns whether it existed.
    pub async fn delete_snapshot(&self, id: String) -> StoreResult<bool> {
        self.call(move |c| Ok(c.execute("DELETE FROM snapshots WHERE id = ?1", [id])? > 0))
            .await
    }
}

fn put_snapshot(c: &Connection, r: &SnapshotRecord) -> StoreResult<()> {
    c.execute(
        "INSERT OR REPLACE INTO snapshots (id, kind, source_sandbox_id, record, created_at)
         VALUES (?1,?2,?3,?4,?5)",
        params![
            r.view.id,
            r.view.kind.as_str(),
            r.view.source_sandbox_id,
            serde_json::to_string(r)?,
            r.view.created_at,
        ],
    )?;
    Ok(())
}

fn get_snapshot(c: &Connection, id: &str) -> StoreResult<Option<SnapshotRecord>> {
    let rec: Option<String> = c
        .query_row("SELECT record FROM snapshots WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(rec.map(|r| serde_json::from_str(&r)).transpose()?)
}

fn list_snapshots(c: &Connection) -> StoreResult<Vec<SnapshotRecord>> {
    let mut stmt = c.prepare("SELECT record FROM snapshots ORDER BY created_at, id")?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    let mut out = Vec::new();
    for row in rows {
        out.push(serde_json::from_str(&row?)?);
    }
    Ok(out)
}
