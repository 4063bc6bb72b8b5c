//! Snapshots in the cluster's object store (docs/scale-out.md): published once taken,
//! pulled by any node that is asked for one it lacks, and the pulled copies kept as a
//! bounded cache.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use api_types::Snapshot;
use blockstore::LayerId;
use model::SnapshotType;
use remote::{Bucket, ChunkService, RemoteError, Tables};
use subtle::ConstantTimeEq;

use super::{lock, Manager};
use crate::backend::BackendError;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::snapkey::SnapshotKey;
use crate::snapshots::SnapshotRecord;

/// Chunks of a pulled snapshot fetched at once ahead of its restore.
const PREFETCH_PARALLEL: usize = 8;
/// Memory files of one pull fetched at once.
const FILES_PARALLEL: usize = 6;
/// Longest a first restore's fetches are recorded.
const TRACE_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// Signs manifests with a key derived from the daemon's snapshot key: nodes that share
/// the key file (a cluster) trust each other's snapshots, as they do each other's exports.
struct ManifestKey(SnapshotKey);

const PURPOSE: &str = "object store manifest";

impl remote::Signer for ManifestKey {
    fn sign(&self, body: &[u8]) -> [u8; 32] {
        self.0.derive(PURPOSE, body)
    }
    fn verify(&self, body: &[u8], signature: &[u8; 32]) -> bool {
        self.0.derive(PURPOSE, body).ct_eq(signature).into()
    }
}

/// This node's side of the object store.
pub(crate) struct Remote {
    pub bucket: Arc<Bucket>,
    pub chunks: Arc<ChunkService>,
    tables: Tables,
    store: blockstore::Store,
    key: ManifestKey,
    node: String,
    /// One publish or pull of a snapshot at a time.
    busy: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// When each pulled snapshot was last used (the cache's order).
    used: Mutex<HashMap<String, Instant>>,
    /// Recordings of the chunks a pulled snapshot's first restore here fetches, by
    /// snapshot: published as its manifest's prefetch list.
    traces: Mutex<HashMap<String, u64>>,
    serving: tokio::task::JoinHandle<()>,
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

fn unavailable(m: String) -> Error {
    Error::Backend(BackendError::Unavailable(m))
}

fn remote_err(e: RemoteError) -> Error {
    match e {
        RemoteError::NotFound(what) => Error::NotFound(format!("Not in the object store: {what}")),
        RemoteError::Invalid(m) => Error::Conflict(format!("Refused from the object store: {m}")),
        RemoteError::Config(m) => Error::InvalidArgument(m),
        other => unavailable(other.to_string()),
    }
}

impl Remote {
    /// The object store side of this node, when `object_store` is configured; starts the
    /// fetch socket that disk servers ask for chunks.
    pub async fn start(
        config: &Config,
        store: Option<blockstore::Store>,
        key: SnapshotKey,
    ) -> Result<Option<Arc<Remote>>> {
        let Some(bc) = &config.object_store else {
            return Ok(None);
        };
        let store = store.ok_or_else(|| {
            Error::Unsupported(
                "object_store: this backend has no block-store disks to publish".into(),
            )
        })?;
        let bucket = Arc::new(Bucket::open(bc).map_err(remote_err)?);
        let chunks = ChunkService::new(bucket.clone(), store.clone());
        let socket = store.root().join(blockstore::remote::FETCH_SOCKET);
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)
            .map_err(|e| unavailable(format!("fetch socket {}: {e}", socket.display())))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
        let serving = tokio::spawn(chunks.clone().serve(listener));
        let tables =
            Tables::open(config.data_dir.join("remote").join("tables")).map_err(remote_err)?;
        tracing::info!(
            bucket = bucket.url(),
            "snapshots go to and come from the object store"
        );
        Ok(Some(Arc::new(Remote {
            bucket,
            chunks,
            tables,
            store,
            key: ManifestKey(key),
            node: config.node(),
            busy: Mutex::new(HashMap::new()),
            used: Mutex::new(HashMap::new()),
            traces: Mutex::new(HashMap::new()),
            serving,
        })))
    }

    fn busy(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.busy).entry(id.to_string()).or_default().clone()
    }

    fn touch(&self, id: &str) {
        lock(&self.used).insert(id.to_string(), Instant::now());
    }

    /// Bytes read from and written to the bucket, and chunks fetched.
    pub fn counters(&self) -> [(&'static str, &'static str, u64); 4] {
        let s = &self.bucket.stats;
        [
            (
                "sandfork_object_store_bytes_in_total",
                "Bytes read from the object store",
                s.bytes_in.load(Ordering::Relaxed),
            ),
            (
                "sandfork_object_store_bytes_out_total",
                "Bytes written to the object store",
                s.bytes_out.load(Ordering::Relaxed),
            ),
            (
                "sandfork_object_store_errors_total",
                "Object store requests that failed after their retries",
                s.errors.load(Ordering::Relaxed),
            ),
            (
                "sandfork_object_store_chunks_fetched_total",
                "Disk chunks fetched for partial layers",
                self.chunks.chunks.load(Ordering::Relaxed),
            ),
        ]
    }
}

impl Manager {
    pub(super) fn remote(&self) -> Result<&Arc<Remote>> {
        self.remote.get().and_then(|r| r.as_ref()).ok_or_else(|| {
            Error::Unsupported(
                "No object store is configured: set object_store (docs/scale-out.md) to publish \
                 snapshots and restore those of other nodes"
                    .into(),
            )
        })
    }

    pub(super) fn has_remote(&self) -> bool {
        self.remote.get().is_some_and(|r| r.is_some())
    }

    /// A snapshot this node can start sandboxes from: its own, or one pulled from the
    /// object store now (404 when neither has it).
    pub(super) async fn usable_snapshot(&self, id: &str) -> Result<SnapshotRecord> {
        match self.snapshot_record(id).await {
            Err(Error::NotFound(_)) if self.has_remote() && remote::manifest::safe_name(id) => {
                self.pull_snapshot(id).await
            }
            Ok(rec) => {
                if let (true, Ok(r)) = (rec.pulled, self.remote()) {
                    r.touch(id);
                }
                Ok(rec)
            }
            other => other,
        }
    }

    /// `POST /v1/snapshots/{id}/publish`: puts snapshot `id` in the object store (its
    /// layers the bucket lacks, its memory images, then its manifest). Returns once it is
    /// there; a publish already under way is waited for.
    pub async fn publish_snapshot(&self, id: &str) -> Result<Snapshot> {
        let r = self.remote()?.clone();
        let busy = r.busy(id);
        let _one = busy.lock().await;
        let mut rec = self.snapshot_record(id).await?;
        if rec.view.published {
            return Ok(rec.view);
        }
        let work = self.scratch("publish")?;
        let memory = match &rec.memory_dir {
            Some(mem) => {
                let flat = work.0.join("memory");
                std::fs::create_dir(&flat)?;
                // Pages read from parent snapshots travel too: the copy stands alone.
                self.backend.flatten_memory(mem, &flat).await?;
                let mut files: Vec<PathBuf> = std::fs::read_dir(&flat)?
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .map(|e| e.path())
                    .collect();
                files.sort();
                files
            }
            None => Vec::new(),
        };
        let mut shared = rec.clone();
        shared.memory_dir = None;
        shared.pulled = false;
        shared.view.published = true;
        let top: LayerId = rec
            .layer_id
            .parse()
            .map_err(|_| Error::Conflict(format!("snapshot {id} has a bad layer id")))?;
        let started = Instant::now();
        let publication = remote::publish::Publication {
            snapshot_id: id,
            publisher: &r.node,
            published_at: super::now_rfc3339(),
            record: serde_json::to_value(&shared).map_err(|e| Error::Conflict(e.to_string()))?,
            top: &top,
            memory,
            scratch: &work.0,
        };
        let m = r
            .bucket
            .publish(&r.store, &r.tables, publication, &r.key)
            .await
            .map_err(remote_err)?;
        rec.view.published = true;
        self.store.put_snapshot(rec.clone()).await?;
        tracing::info!(snapshot = %id, bytes = m.total_bytes(), ms = started.elapsed().as_millis() as u64, "snapshot published");
        Ok(rec.view)
    }

    /// Publishes a fresh snapshot in the background (`publish_snapshots`).
    pub(super) fn publish_later(&self, rec: &SnapshotRecord) {
        if rec.internal || !self.config.publish_snapshots || !self.has_remote() {
            return;
        }
        let (me, id) = (self.weak_self(), rec.view.id.clone());
        tokio::spawn(async move {
            let Some(m) = me.upgrade() else { return };
            if let Err(e) = m.publish_snapshot(&id).await {
                tracing::warn!(snapshot = %id, error = %e.message(), "publishing the snapshot failed");
            }
        });
    }

    /// Pulls snapshot `id` from the object store: its manifest (signature checked), its
    /// layers as partial layers (their blocks come as reads need them) and its memory
    /// images; then the chunks its restores read first are fetched ahead.
    async fn pull_snapshot(&self, id: &str) -> Result<SnapshotRecord> {
        let r = self.remote()?.clone();
        let busy = r.busy(id);
        let _one = busy.lock().await;
        if let Ok(rec) = self.snapshot_record(id).await {
            return Ok(rec);
        }
        let started = Instant::now();
        let m = match r.bucket.manifest(id, &r.key).await {
            Err(RemoteError::NotFound(_)) => {
                return Err(Error::NotFound(format!("Snapshot {id} not found")))
            }
            other => other.map_err(remote_err)?,
        };
        let rec: SnapshotRecord = serde_json::from_value(m.record.clone()).map_err(|e| {
            Error::Conflict(format!(
                "the manifest of {id} holds no snapshot record: {e}"
            ))
        })?;
        let top = m.layers.last().map(|l| l.id.as_str()).unwrap_or_default();
        if rec.view.id != id
            || rec.layer_id != top
            || rec.internal
            || (rec.view.kind == SnapshotType::Memory) == m.memory.is_empty()
        {
            return Err(Error::Conflict(format!(
                "the manifest of {id} does not describe it"
            )));
        }
        super::transfer::check_boot(&rec.boot)?;
        let dir = self.snapshots_dir().join(id);
        std::fs::create_dir_all(&dir)?;
        let pin = rec.pin();
        // In a task of its own: what the bucket is asked runs to its end (or error) even
        // if the request that wanted the snapshot goes away.
        let (r2, m2, dir2) = (r.clone(), m.clone(), dir.clone());
        let placed = tokio::spawn(async move { materialize(&r2, &m2, rec, &dir2).await })
            .await
            .map_err(|e| unavailable(e.to_string()))
            .and_then(|r| r);
        let rec = match placed {
            Ok(rec) => rec,
            Err(e) => {
                let _ = self.backend.unpin_layer(&pin).await;
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        if let Err(e) = self.store.put_snapshot(rec.clone()).await {
            let _ = self.backend.unpin_layer(&pin).await;
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
        r.touch(id);
        if m.prefetch.is_empty() {
            // No restore has told yet what it reads first: this node's first one will.
            let layers = m.layers.iter().filter_map(|l| l.id.parse().ok()).collect();
            let token = r.chunks.record(layers, TRACE_FOR);
            lock(&r.traces).insert(id.to_string(), token);
        }
        self.prefetch(&r, &m);
        tracing::info!(snapshot = %id, publisher = %m.publisher, ms = started.elapsed().as_millis() as u64, "snapshot pulled");
        let me = self.weak_self();
        tokio::spawn(async move {
            if let Some(m) = me.upgrade() {
                m.trim_cache().await;
            }
        });
        Ok(rec)
    }

    /// After a restore from `rec`: if it was the first of a pulled snapshot here, what it
    /// fetched becomes the manifest's prefetch list (in the background; a failure only
    /// means later restores fetch as they read).
    pub(super) fn restored_from(&self, rec: &SnapshotRecord) {
        let Ok(r) = self.remote() else { return };
        let Some(token) = lock(&r.traces).remove(&rec.view.id) else {
            return;
        };
        let chunks = r.chunks.finish(token);
        if chunks.is_empty() {
            return;
        }
        let (r, id) = (r.clone(), rec.view.id.clone());
        tokio::spawn(async move {
            let updated = async {
                let mut m = r.bucket.manifest(&id, &r.key).await?;
                if !m.prefetch.is_empty() {
                    return Ok(());
                }
                m.prefetch = chunks;
                r.bucket.put_manifest(&m, &r.key).await
            };
            match updated.await {
                Ok(()) => tracing::debug!(snapshot = %id, "recorded what a restore reads first"),
                Err(e) => tracing::warn!(snapshot = %id, error = %e, "recording a restore's reads"),
            }
        });
    }

    /// Fetches, in the background, the chunks the manifest says a restore reads first.
    fn prefetch(&self, r: &Arc<Remote>, m: &remote::Manifest) {
        let chunks: Vec<(LayerId, u64)> = m
            .prefetch
            .iter()
            .filter_map(|(l, c)| Some((m.layers.get(*l as usize)?.id.parse().ok()?, *c)))
            .collect();
        if chunks.is_empty() {
            return;
        }
        let service = r.chunks.clone();
        tokio::spawn(async move {
            let n = service.prefetch(chunks, PREFETCH_PARALLEL).await;
            tracing::debug!(chunks = n, "prefetched");
        });
    }

    /// Drops the least recently used pulled snapshots while pulled copies take more than
    /// `remote_cache_mb` (sandboxes started from them keep their disks' layers).
    async fn trim_cache(&self) {
        let Ok(r) = self.remote() else { return };
        let budget = self.config.remote_cache_mb << 20;
        let Ok(all) = self.store.snapshots().await else {
            return;
        };
        let mut pulled: Vec<(Instant, SnapshotRecord, u64)> = all
            .into_iter()
            .filter(|rec| rec.pulled)
            .map(|rec| {
                let when = lock(&r.used)
                    .get(&rec.view.id)
                    .copied()
                    .unwrap_or_else(Instant::now);
                let bytes = self.cached_bytes(&rec);
                (when, rec, bytes)
            })
            .collect();
        let mut total: u64 = pulled.iter().map(|(_, _, b)| b).sum();
        if total <= budget {
            return;
        }
        pulled.sort_by_key(|(when, _, _)| *when);
        for (_, rec, bytes) in pulled {
            if total <= budget {
                break;
            }
            tracing::info!(snapshot = %rec.view.id, bytes, "dropping a pulled snapshot from the cache");
            if self.remove_snapshot(&rec).await.is_ok() {
                total = total.saturating_sub(bytes);
                lock(&r.used).remove(&rec.view.id);
                self.metrics.remote_evictions.inc();
            }
        }
        if let Err(e) = self.backend.collect_garbage().await {
            tracing::warn!(error = %e, "freeing dropped snapshots' layers");
        }
    }

    /// What a pulled snapshot holds here: its memory images (its fetched blocks are
    /// counted with the layers, shared between snapshots).
    fn cached_bytes(&self, rec: &SnapshotRecord) -> u64 {
        rec.memory_dir.as_ref().map_or(0, |d| dir_bytes(d))
    }

    /// `DELETE /v1/snapshots/{id}?everywhere=true`: out of the object store too.
    pub(super) async fn unpublish(&self, id: &str) -> Result<()> {
        let r = self.remote()?;
        r.bucket.unpublish(id).await.map_err(remote_err)
    }

    /// Snapshots only the object store holds, as views.
    pub(super) async fn bucket_snapshots(&self, local: &[String]) -> Result<Vec<Snapshot>> {
        let r = self.remote()?;
        let mut out = Vec::new();
        for id in r.bucket.snapshot_ids().await.map_err(remote_err)? {
            if local.contains(&id) {
                continue;
            }
            match r.bucket.manifest(&id, &r.key).await {
                Ok(m) => match serde_json::from_value::<SnapshotRecord>(m.record) {
                    Ok(rec) if rec.view.id == id => out.push(rec.view),
                    _ => tracing::warn!(snapshot = %id, "a manifest without a usable record"),
                },
                Err(e) => {
                    tracing::warn!(snapshot = %id, error = %e, "a manifest that does not check")
                }
            }
        }
        Ok(out)
    }

    /// A snapshot's view: this node's record, else the object store's manifest.
    pub(super) async fn any_snapshot(&self, id: &str) -> Result<Snapshot> {
        match self.snapshot_record(id).await {
            Err(Error::NotFound(msg)) if self.has_remote() && remote::manifest::safe_name(id) => {
                let r = self.remote()?;
                match r.bucket.manifest(id, &r.key).await {
                    Err(RemoteError::NotFound(_)) => Err(Error::NotFound(msg)),
                    Err(e) => Err(remote_err(e)),
                    Ok(m) => serde_json::from_value::<SnapshotRecord>(m.record)
                        .map(|r| r.view)
                        .map_err(|e| Error::Conflict(format!("the manifest of {id}: {e}"))),
                }
            }
            other => other.map(|r| r.view),
        }
    }
}

/// Adds a pulled snapshot's layers (partial, pinned under its name) and fetches its memory
/// images into `dir`; returns its record as this node keeps it.
async fn materialize(
    r: &Remote,
    m: &remote::Manifest,
    mut rec: SnapshotRecord,
    dir: &std::path::Path,
) -> Result<SnapshotRecord> {
    use futures::{StreamExt, TryStreamExt};
    // The layers' records and the memory images come at once.
    let mem = dir.join("memory");
    let memory = rec.view.kind == SnapshotType::Memory;
    let t0 = Instant::now();
    let files = async {
        if !memory {
            return Ok(());
        }
        std::fs::create_dir(&mem)?;
        let jobs: Vec<(remote::FileEntry, PathBuf)> = m
            .memory
            .iter()
            .map(|f| (f.clone(), mem.join(&f.name)))
            .collect();
        futures::stream::iter(jobs)
            .map(|(f, dest)| async move { r.bucket.fetch_file(&f, &dest).await })
            .buffer_unordered(FILES_PARALLEL)
            .try_collect::<Vec<()>>()
            .await
            .map_err(remote_err)?;
        tracing::debug!(
            ms = t0.elapsed().as_millis() as u64,
            "pulled the memory images"
        );
        Ok::<_, Error>(())
    };
    let layers = async {
        let records = r.bucket.layer_records(m).await.map_err(remote_err)?;
        tracing::debug!(
            ms = t0.elapsed().as_millis() as u64,
            "pulled the layer records"
        );
        let (store, pin) = (r.store.clone(), rec.pin());
        tokio::task::spawn_blocking(move || store.add_remote_chain(&records, &pin))
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .map_err(|e| Error::Conflict(format!("Refused from the object store: {e}")))
    };
    let (files, layers) = tokio::join!(files, layers);
    layers?;
    files?;
    rec.memory_dir = None;
    if memory {
        rec.restore_bytes = m.memory.iter().map(|f| f.size).sum();
        rec.memory_dir = Some(mem);
    }
    rec.pulled = true;
    rec.view.published = true;
    Ok(rec)
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.blocks() * 512)
            .sum()
    })
}
