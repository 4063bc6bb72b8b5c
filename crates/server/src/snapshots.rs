//! Snapshots: their API shapes, what the daemon records about each one, and their rows in
//! the state database (`snapshots` table: id, kind, source, record JSON, created_at).

use std::collections::BTreeMap;
use std::path::PathBuf;

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::types::{ExecRequest, Sandbox};
use crate::backend::BootSpec;
use crate::store::{Store, StoreResult};

/// What a snapshot captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotType {
    /// The disk only: sandboxes start from it by a cold boot.
    Filesystem,
    /// Disk, memory and processes: sandboxes resume warm.
    Memory,
}

impl SnapshotType {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotType::Filesystem => "filesystem",
            SnapshotType::Memory => "memory",
        }
    }
}

/// `POST /v1/sandboxes/{id}/checkpoint`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRequest {
    /// `filesystem` (default) or `memory`.
    #[serde(rename = "type")]
    pub kind: Option<SnapshotType>,
    pub name: Option<String>,
    /// Commands run, in order, in every sandbox started from the snapshot, right after it
    /// resumes and before it is handed out.
    #[serde(default)]
    pub hooks: Vec<ExecRequest>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    /// The persistent snapshot id (`snap-…`).
    pub id: String,
    #[serde(rename = "type")]
    pub kind: SnapshotType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub source_sandbox_id: Option<String>,
    pub image: String,
    /// Bytes the snapshot's own disk layer and memory images occupy.
    pub size_bytes: u64,
    /// RFC 3339.
    pub created_at: String,
    pub cpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub labels: BTreeMap<String, String>,
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

/// Query of `GET /v1/snapshots`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SnapshotQuery {
    /// Only snapshots of this sandbox.
    pub source: Option<String>,
    /// Only snapshots of this type.
    #[serde(rename = "type")]
    pub kind: Option<SnapshotType>,
}

/// Settings of one child of a fork.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChildSpec {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `POST /v1/snapshots/{id}/fork` and `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    pub count: u32,
    /// For every child's new processes.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Per child, by index: added to `env` and `labels`.
    #[serde(default)]
    pub per_child: Vec<ChildSpec>,
    /// Children are named `<prefix>-<index>`.
    pub name_prefix: Option<String>,
    /// Idle timeout of every child.
    pub timeout_secs: Option<u64>,
}

/// Why one child of a fork failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChildError {
    pub code: String,
    pub message: String,
}

/// One child of a fork: its sandbox, or why it failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForkChild {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ChildError>,
}

/// The answer to a fork.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForkResult {
    /// The snapshot the children started from.
    pub snapshot_id: String,
    pub children: Vec<ForkChild>,
}

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
}

impl SnapshotRecord {
    /// The block-store ref pinning this snapshot's layer.
    pub fn pin(&self) -> String {
        pin_name(&self.view.id)
    }
}

/// The block-store ref of snapshot `id`.
pub fn pin_name(id: &str) -> String {
    format!("snapshot-{id}")
}

/// A new snapshot id: `snap-` and 16 random hex digits.
pub fn new_snapshot_id() -> String {
    crate::ids::random_id("snap")
}

/// Whether `id` looks like a snapshot id (so it can name files and refs safely).
pub fn valid_snapshot_id(id: &str) -> bool {
    id.len() <= 64
        && id.starts_with("snap-")
        && id[5..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && id.len() > 5
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_ids_are_valid() {
        let id = new_snapshot_id();
        assert!(valid_snapshot_id(&id), "{id}");
        assert_ne!(id, new_snapshot_id());
        for bad in [
            "",
            "snap-",
            "sb-1",
            "snap-../x",
            "snap-a/b",
            &"snap-x".repeat(20),
        ] {
            assert!(!valid_snapshot_id(bad), "{bad}");
        }
    }
}

/// A checkpoint as the backend reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpointed {
    pub layer_id: String,
    pub memory_dir: Option<PathBuf>,
    /// Bytes of the new layer plus the memory images.
    pub size_bytes: u64,
}

/// What a restore starts from and what happens in the child before it is handed out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreFrom {
    pub layer_id: String,
    pub memory_dir: Option<PathBuf>,
    pub identity: Option<proto::agent::Identity>,
    pub hooks: Vec<proto::agent::ExecRequest>,
}
