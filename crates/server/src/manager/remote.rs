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
use crate::snapshots::{ServedPages, SnapshotRecord};

/// Chunks of a pulled snapshot fetched at once ahead of its restore.
const PREFETCH_PARALLEL: usize = 8;
/// Pages files from this size up are published as layers and served lazily.
const LAZY_PAGES_MIN: u64 = 4 << 20;
/// Disk layers up to this packed size are fetched whole ahead of a first restore.
const SMALL_LAYER: u64 = 4 << 20;
/// Chunks of larger layers holding at most this many blocks are fetched ahead too.
const SPARSE_BLOCKS: u64 = 64;
/// At most this much is fetched ahead of a first restore.
const AHEAD_TOTAL: u64 = 16 << 20;
/// Memory files of one pull fetched at once.
const FILES_PARALLEL: usize = 6;
/// Longest a first restore's fetches are recorded.
const TRACE_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// Signs manifests with a key derived from the daemon's snapshot key: nodes that share
/// the key file trust each other's snapshots, as they do each other's exports. A cluster
/// with an authority signs with each node's own key instead ([`crate::nodekey`]).
struct ManifestKey(SnapshotKey);

const PURPOSE: &str = "object store manifest";

impl remote::Signer for ManifestKey {
    fn sign(&self, body: &[u8]) -> Result<remote::Signature, String> {
        Ok(remote::Signature {
            bytes: self.0.derive(PURPOSE, body).to_vec(),
            signer: None,
        })
    }
    fn verify(&self, body: &[u8], signature: &remote::Signature) -> Result<(), String> {
        if signature.signer.is_some() {
            return Err(
                "signed by a node's own key, and this daemon has no cluster authority \
                        to check it (cluster_ca)"
                    .into(),
            );
        }
        let ok: bool = self.0.derive(PURPOSE, body)[..]
            .ct_eq(&signature.bytes[..])
            .into();
        ok.then_some(())
            .ok_or_else(|| "not signed with this cluster's snapshot key".into())
    }
}

/// This node's side of the object store.
pub(crate) struct Remote {
    pub bucket: Arc<Bucket>,
    pub chunks: Arc<ChunkService>,
    tables: Tables,
    store: blockstore::Store,
    key: Box<dyn remote::Signer>,
    node: String,
    /// One publish or pull of a snapshot at a time.
    busy: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// When each pulled snapshot was last used (the cache's order).
    used: Mutex<HashMap<String, Instant>>,
    /// Recordings of the chunks a pulled snapshot's first restore here fetches, by
    /// snapshot: published as its manifest's prefetch list.
    traces: Mutex<HashMap<String, u64>>,
    /// The pages files of pulled memory snapshots, served lazily.
    pub(super) pages: Arc<super::pages::PagesServers>,
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
        RemoteError::Integrity(m) => {
            Error::Integrity(format!("Refused from the object store: {m}"))
        }
        RemoteError::Config(m) => Error::InvalidArgument(m),
        other => unavailable(other.to_string()),
    }
}

/// Who signs and whose manifests are trusted: each node itself under the cluster's
/// authority when `cluster_ca` is set, else the snapshot key the nodes share.
fn manifest_signer(config: &Config, key: SnapshotKey) -> Result<Box<dyn remote::Signer>> {
    let Some(ca) = &config.cluster_ca else {
        return Ok(Box::new(ManifestKey(key)));
    };
    let (Some(cert), Some(tls_key)) = (&config.tls_cert, &config.tls_key) else {
        return Err(Error::InvalidArgument(
            "cluster_ca needs the node's certificate and key (tls_cert, tls_key)".into(),
        ));
    };
    let node = crate::nodekey::NodeKey::load(cert, tls_key, ca, config.cluster_revoked.as_deref())
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    Ok(Box::new(node))
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
            store: store.clone(),
            key: manifest_signer(config, key)?,
            node: config.node(),
            busy: Mutex::new(HashMap::new()),
            used: Mutex::new(HashMap::new()),
            traces: Mutex::new(HashMap::new()),
            pages: Arc::new(super::pages::PagesServers::new(
                store.clone(),
                &config.data_dir,
            )),
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
        shared.pages = Vec::new();
        shared.view.published = true;
        let top: LayerId = rec
            .layer_id
            .parse()
            .map_err(|_| Error::Conflict(format!("snapshot {id} has a bad layer id")))?;
        let started = Instant::now();
        // The large pages files go as layers: a restore elsewhere reads them chunk by
        // chunk. Small ones come whole with the other images (one disk server each would
        // cost more than it saves).
        let (pages, memory): (Vec<PathBuf>, Vec<PathBuf>) =
            memory.into_iter().partition(|f| served_lazily(f));
        let record = serde_json::to_value(&shared).map_err(|e| Error::Conflict(e.to_string()))?;
        let mut pins = Vec::new();
        let published = match import_pages(&r, id, pages, &mut pins).await {
            Ok(memory_layers) => {
                let publication = remote::publish::Publication {
                    snapshot_id: id,
                    publisher: &r.node,
                    published_at: super::now_rfc3339(),
                    record,
                    top: &top,
                    memory,
                    memory_layers,
                    scratch: &work.0,
                };
                let published = r
                    .bucket
                    .publish(&r.store, &r.tables, publication, r.key.as_ref());
                published.await.map_err(remote_err)
            }
            Err(e) => Err(e),
        };
        // The pages layers were for the bucket: this node keeps the snapshot's own files.
        for pin in pins {
            let _ = r.store.delete_ref(&pin);
        }
        let m = published?;
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

    /// The pull's own directory for `id` ([`Manager::new_snapshot_dir`]). One already
    /// there holds a deleted snapshot's memory images that a later one still reads: it is
    /// never touched, and the pull is refused.
    fn claim_pull_dir(&self, id: &str) -> Result<PathBuf> {
        match self.new_snapshot_dir(id) {
            Ok(dir) => Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(Error::Conflict(format!(
                "Snapshot {id} was deleted on this node while a later snapshot still reads its \
                 memory images; delete that snapshot first, then pull {id} again"
            )))
            }
            Err(e) => Err(e.into()),
        }
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
        let m = match r.bucket.manifest(id, r.key.as_ref()).await {
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
        // Nothing host-side in the record is taken from the bucket.
        let mut rec = rec;
        rec.memory_dir = None;
        rec.pages = Vec::new();
        let dir = self.claim_pull_dir(id)?;
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
            // The disk's chain, then the pages layers: the prefetch list's index space.
            let layers = m
                .layers
                .iter()
                .chain(m.memory_layers.iter().map(|l| &l.layer))
                .filter_map(|l| l.id.parse().ok())
                .collect();
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
                let mut m = r.bucket.manifest(&id, r.key.as_ref()).await?;
                if !m.prefetch.is_empty() {
                    return Ok(());
                }
                m.prefetch = chunks;
                r.bucket.put_manifest(&m, r.key.as_ref()).await
            };
            match updated.await {
                Ok(()) => tracing::debug!(snapshot = %id, "recorded what a restore reads first"),
                Err(e) => tracing::warn!(snapshot = %id, error = %e, "recording a restore's reads"),
            }
        });
    }

    /// Fetches, in the background, the chunks the manifest says a restore reads first.
    fn prefetch(&self, r: &Arc<Remote>, m: &remote::Manifest) {
        let layers: Vec<&remote::LayerEntry> = m
            .layers
            .iter()
            .chain(m.memory_layers.iter().map(|l| &l.layer))
            .collect();
        let chunks: Vec<(LayerId, u64)> = m
            .prefetch
            .iter()
            .filter_map(|(l, c)| Some((layers.get(*l as usize)?.id.parse().ok()?, *c)))
            .collect();
        if chunks.is_empty() {
            fetch_ahead(r, m);
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

    /// What a pulled snapshot holds here: its memory images, its served pages files
    /// counted whole (their chunks are its own; its disk's fetched blocks are counted with
    /// the layers, shared between snapshots).
    fn cached_bytes(&self, rec: &SnapshotRecord) -> u64 {
        let files = rec.memory_dir.as_ref().map_or(0, |d| dir_bytes(d));
        files + rec.pages.iter().map(|p| p.size).sum::<u64>()
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
            match r.bucket.manifest(&id, r.key.as_ref()).await {
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
                match r.bucket.manifest(id, r.key.as_ref()).await {
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
    if memory {
        std::fs::create_dir(&mem)?;
    }
    let files = async {
        if !memory {
            return Ok(());
        }
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
    let (files, layers, pages) = tokio::join!(files, layers, serve_pages(r, m, &rec, &mem));
    let pages = match (files.and(layers.map(drop)), pages) {
        (Ok(()), pages) => pages?,
        (Err(e), Ok(served)) => {
            release_pages(r, None, served).await;
            return Err(e);
        }
        (Err(e), Err(_)) => return Err(e),
    };
    rec.memory_dir = None;
    if memory {
        rec.pages = pages;
        let pages: u64 = m.memory_layers.iter().map(|l| l.size).sum();
        rec.restore_bytes = m.memory.iter().map(|f| f.size).sum::<u64>() + pages;
        rec.memory_dir = Some(mem);
    }
    rec.pulled = true;
    rec.view.published = true;
    Ok(rec)
}

/// Imports the pages files `pages` of snapshot `id` into the block store as sealed layers
/// (name, size, layer), each pinned under a ref pushed to `pins` before it is made, so
/// the caller drops every pin whatever happens.
async fn import_pages(
    r: &Remote,
    id: &str,
    pages: Vec<PathBuf>,
    pins: &mut Vec<String>,
) -> Result<Vec<(String, u64, LayerId)>> {
    let mut layers = Vec::new();
    for f in pages {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let size = std::fs::metadata(&f)?.len();
        let pin = format!("{}{id}.{name}", super::pages::PUBLISH_PREFIX);
        pins.push(pin.clone());
        let store = r.store.clone();
        let layer = tokio::task::spawn_blocking(move || store.import_image_as(&f, &pin))
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .map_err(|e| unavailable(format!("the pages file {name} as a layer: {e}")))?;
        layers.push((name, size, layer));
    }
    Ok(layers)
}

/// With no prefetch list yet (the snapshot's first restore away from its publisher),
/// fetches ahead, in the background and in parallel, what a restore's first reads most
/// likely go to, one chunk at a time otherwise: small disk layers whole (an image's small
/// layers, seals that changed little), and the sparse chunks of large ones (a seal leaves
/// a chunk sparse where it wrote scattered small things: file system metadata, small
/// files; bulk data fills its chunks, and stays lazy). At most [`AHEAD_TOTAL`] bytes.
fn fetch_ahead(r: &Arc<Remote>, m: &remote::Manifest) {
    let layers: Vec<(LayerId, bool)> = m
        .layers
        .iter()
        .rev()
        .filter_map(|l| Some((l.id.parse().ok()?, l.packed_bytes <= SMALL_LAYER)))
        .collect();
    let service = r.chunks.clone();
    tokio::spawn(async move {
        let mut chunks = Vec::new();
        let mut budget = AHEAD_TOTAL;
        for (layer, small) in layers {
            let max_blocks = if small { u64::MAX } else { SPARSE_BLOCKS };
            let Ok(found) = service.chunks_up_to(&layer, max_blocks).await else {
                continue;
            };
            for (chunk, blocks) in found {
                let bytes = blocks * blockstore::BLOCK_SIZE;
                if bytes > budget {
                    break;
                }
                budget -= bytes;
                chunks.push((layer.clone(), chunk));
            }
        }
        let n = service.prefetch(chunks, PREFETCH_PARALLEL).await;
        tracing::debug!(chunks = n, "fetched ahead of a first restore");
    });
}

/// Whether a memory image file is a pages file (`pages-<n>.img`) large enough to be
/// published as a layer and served lazily where it is pulled.
fn served_lazily(path: &std::path::Path) -> bool {
    let pages = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("pages-") && n.ends_with(".img"));
    pages && std::fs::metadata(path).is_ok_and(|m| m.len() >= LAZY_PAGES_MIN)
}

/// Adds the manifest's pages layers (partial, each pinned under its disk's name) and
/// serves each as a file the image directory links to, all at once. On failure, what was
/// made is released again.
async fn serve_pages(
    r: &Remote,
    m: &remote::Manifest,
    rec: &SnapshotRecord,
    mem: &std::path::Path,
) -> Result<Vec<ServedPages>> {
    let mut made = Vec::new();
    match add_and_serve(r, m, &rec.view.id, mem, &mut made).await {
        Ok(()) => Ok(made),
        Err(e) => {
            release_pages(r, None, made).await;
            Err(e)
        }
    }
}

/// [`serve_pages`]' work; each pages disk goes into `made` before anything of it exists,
/// so that a release takes whatever part of it was made (its pin, its disk, its server).
async fn add_and_serve(
    r: &Remote,
    m: &remote::Manifest,
    id: &str,
    mem: &std::path::Path,
    made: &mut Vec<ServedPages>,
) -> Result<()> {
    if m.memory_layers.is_empty() {
        return Ok(());
    }
    let entries: Vec<remote::LayerEntry> =
        m.memory_layers.iter().map(|l| l.layer.clone()).collect();
    let records = r.bucket.records(&entries).await.map_err(remote_err)?;
    for (i, (ml, record)) in m.memory_layers.iter().zip(records).enumerate() {
        // A disk name of this pull's own: a release of an earlier pull of the same
        // snapshot still waiting for its readers never takes this one.
        let disk = super::pages::disk_name(id, i)?;
        let (store, pin) = (r.store.clone(), super::pages::pin_of(&disk));
        made.push(ServedPages {
            file: ml.name.clone(),
            disk,
            layer: ml.layer.id.clone(),
            size: ml.size,
        });
        tokio::task::spawn_blocking(move || store.add_remote_chain(&[record], &pin))
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .map_err(|e| Error::Conflict(format!("Refused from the object store: {e}")))?;
    }
    let serving = made.iter().map(|p| {
        let (servers, p) = (r.pages.clone(), p.clone());
        async move {
            tokio::task::spawn_blocking(move || servers.serve(&p))
                .await
                .map_err(|e| unavailable(e.to_string()))?
        }
    });
    let paths = futures::future::join_all(serving).await;
    for (path, p) in paths.into_iter().zip(made.iter()) {
        super::pages::link_pages(&path?, &mem.join(&p.file))?;
    }
    Ok(())
}

/// Stops serving `pages` and unpins their layers: at once when no lazy restore reads the
/// image directory `images` any more, else in the background once none does (a server
/// stopped under a lazy-pages daemon would leave its sandbox's uncopied pages unreadable).
async fn release_pages(r: &Remote, images: Option<PathBuf>, pages: Vec<ServedPages>) {
    let read = images.as_deref().is_some_and(runtime::host::lazy::reading);
    let servers = r.pages.clone();
    let release = move || {
        if let Some(dir) = &images {
            super::pages::wait_unread(dir);
        }
        for p in pages {
            servers.release(&p.disk);
        }
    };
    if read {
        tracing::info!(
            "a lazy restore still reads a pulled snapshot's pages: released once it is done"
        );
        drop(tokio::task::spawn_blocking(release));
    } else {
        let _ = tokio::task::spawn_blocking(release).await;
    }
}

impl Manager {
    /// Why a restore from `rec` failed, when a chunk of its disk or pages layers fetched
    /// from the bucket failed its hash (the restore itself only saw an I/O error).
    pub(super) fn integrity_failure(&self, rec: &SnapshotRecord) -> Option<Error> {
        let r = self.remote().ok()?;
        let top: LayerId = rec.layer_id.parse().ok()?;
        let mut layers = r.store.chain_of(&top).unwrap_or_else(|_| vec![top]);
        layers.extend(rec.pages.iter().filter_map(|p| p.layer.parse().ok()));
        let what = r.chunks.integrity_failure(&layers)?;
        Some(Error::Integrity(format!(
            "Snapshot {} failed its integrity check: {what}",
            rec.view.id
        )))
    }

    /// What a pulled snapshot's pages files hold here goes with it.
    pub(super) async fn release_snapshot_pages(&self, rec: &SnapshotRecord) {
        if rec.pages.is_empty() {
            return;
        }
        if let Ok(r) = self.remote() {
            release_pages(r, rec.memory_dir.clone(), rec.pages.clone()).await;
        }
    }

    /// After a restart: the pulled snapshots' pages files are served again (a server that
    /// outlived the daemon is taken over), and what no snapshot names any more (a pull or
    /// a release cut short) goes.
    pub(super) async fn reserve_pages(&self) {
        let Ok(r) = self.remote() else { return };
        let Ok(all) = self.store.snapshots().await else {
            return;
        };
        let mut named = std::collections::HashSet::new();
        for rec in all.into_iter().filter(|r| !r.pages.is_empty()) {
            let (servers, rec2) = (r.pages.clone(), rec.clone());
            let done =
                tokio::task::spawn_blocking(move || super::pages::reserve(&servers, &rec2)).await;
            if matches!(done, Ok(Ok(()))) {
                named.extend(rec.pages.iter().map(|p| p.disk.clone()));
            } else {
                tracing::warn!(snapshot = %rec.view.id, "cannot serve a pulled snapshot's pages again: dropping it");
                let _ = self.remove_snapshot(&rec).await;
            }
        }
        let servers = r.pages.clone();
        let _ = tokio::task::spawn_blocking(move || servers.sweep(&named)).await;
    }

    /// At a graceful stop: the pages servers end, unless a lazy restore still reads.
    pub(super) async fn stop_pages(&self) {
        if let Ok(r) = self.remote() {
            let servers = r.pages.clone();
            let _ = tokio::task::spawn_blocking(move || servers.stop_all_if_unread()).await;
        }
    }
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
