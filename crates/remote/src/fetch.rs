//! The chunk service: fetches chunks of partial layers for the node's disk servers (over
//! the store's fetch socket) and for the daemon itself; one fetch per chunk however many
//! readers wait for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use blockstore::remote::{ChunkTable, FetchReply, FetchRequest};
use blockstore::{LayerId, Store};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::OnceCell;

use crate::bucket::Bucket;
use crate::error::{blocking, RemoteError, Result};
use crate::keys;

type Key = (LayerId, u64);
type Done = Arc<OnceCell<Result<(), String>>>;

/// Most chunks one recording keeps.
const MAX_RECORDED: usize = 4096;

/// Most layers whose integrity failure is remembered.
const MAX_FAILURES: usize = 1024;

/// The chunks fetched for one snapshot's layers while a restore of it ran, in order.
struct Recording {
    token: u64,
    layers: Vec<LayerId>,
    seen: Vec<(u32, u64)>,
    until: std::time::Instant,
}

/// Fetches chunks of the store's partial layers from the bucket.
pub struct ChunkService {
    bucket: Arc<Bucket>,
    store: Store,
    tables: Mutex<HashMap<LayerId, Arc<ChunkTable>>>,
    inflight: Mutex<HashMap<Key, Done>>,
    recordings: Mutex<Vec<Recording>>,
    /// The last chunk of each layer that failed its hash, as words naming its object.
    failures: Mutex<HashMap<LayerId, String>>,
    next_token: AtomicU64,
    /// Chunks fetched, and their bytes.
    pub chunks: AtomicU64,
    pub bytes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ChunkService {
    pub fn new(bucket: Arc<Bucket>, store: Store) -> Arc<ChunkService> {
        Arc::new(ChunkService {
            bucket,
            store,
            tables: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            recordings: Mutex::new(Vec::new()),
            failures: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            chunks: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        })
    }

    /// Makes chunk `chunk` of `layer` present (fetching it unless another fetch of it is
    /// under way, which is waited for instead).
    pub async fn fetch(&self, layer: &LayerId, chunk: u64) -> Result<(), String> {
        let key = (layer.clone(), chunk);
        let cell = lock(&self.inflight).entry(key.clone()).or_default().clone();
        let r = cell
            .get_or_init(|| async {
                self.fetch_once(layer, chunk)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
            .clone();
        lock(&self.inflight).remove(&key);
        r
    }

    async fn fetch_once(&self, layer: &LayerId, chunk: u64) -> Result<()> {
        let table = self.table(layer).await?;
        let entry = table
            .get(chunk)
            .ok_or_else(|| {
                RemoteError::invalid(format!("layer {layer} holds nothing in chunk {chunk}"))
            })?
            .clone();
        let (s, l) = (self.store.clone(), layer.clone());
        if !s.missing_chunks(&l)?.contains(&chunk) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let bytes = self
            .bucket
            .get_range(&keys::layer(layer.as_str(), "blocks"), entry.range())
            .await?;
        let n = bytes.len() as u64;
        let filled = blocking(move || Ok(s.fill_chunk(&l, &table, chunk, &bytes)?)).await;
        if let Err(RemoteError::Blocks(blockstore::Error::Corrupt { reason, .. })) = &filled {
            return Err(self.failed_integrity(layer, chunk, reason));
        }
        filled?;
        self.chunks.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(n, Ordering::Relaxed);
        self.note(layer, chunk);
        tracing::debug!(%layer, chunk, bytes = n, ms = started.elapsed().as_millis() as u64, "chunk fetched");
        Ok(())
    }

    /// Remembers that chunk `chunk` of `layer` failed its checks; the error naming it.
    fn failed_integrity(&self, layer: &LayerId, chunk: u64, reason: &str) -> RemoteError {
        let what = format!(
            "object {} (chunk {chunk} of layer {layer}) refused: {reason}",
            self.bucket
                .object_url(&keys::layer(layer.as_str(), "blocks"))
        );
        tracing::warn!(%layer, chunk, "{what}");
        let mut failures = lock(&self.failures);
        if failures.len() >= MAX_FAILURES {
            failures.clear();
        }
        failures.insert(layer.clone(), what.clone());
        RemoteError::integrity(what)
    }

    /// The integrity failure met while fetching any of `layers`, in words naming the
    /// object: what turned a read into an I/O error.
    pub fn integrity_failure<'a>(
        &self,
        layers: impl IntoIterator<Item = &'a LayerId>,
    ) -> Option<String> {
        let failures = lock(&self.failures);
        layers.into_iter().find_map(|l| failures.get(l).cloned())
    }

    /// Starts recording which chunks of `layers` (a snapshot's chain, bottom to top) are
    /// fetched, for at most `max`: what its first restore here reads, in order, is what
    /// later restores elsewhere fetch ahead. Returns the recording's token.
    pub fn record(&self, layers: Vec<LayerId>, max: std::time::Duration) -> u64 {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let until = std::time::Instant::now() + max;
        let mut r = lock(&self.recordings);
        r.retain(|rec| rec.until > std::time::Instant::now());
        r.push(Recording {
            token,
            layers,
            seen: Vec::new(),
            until,
        });
        token
    }

    /// Ends recording `token`: the chunks seen, as (layer index, chunk).
    pub fn finish(&self, token: u64) -> Vec<(u32, u64)> {
        let mut r = lock(&self.recordings);
        let i = r.iter().position(|rec| rec.token == token);
        i.map(|i| r.swap_remove(i).seen).unwrap_or_default()
    }

    fn note(&self, layer: &LayerId, chunk: u64) {
        let now = std::time::Instant::now();
        for rec in lock(&self.recordings).iter_mut().filter(|r| r.until > now) {
            if let Some(i) = rec.layers.iter().position(|l| l == layer) {
                if rec.seen.len() < MAX_RECORDED {
                    rec.seen.push((i as u32, chunk));
                }
            }
        }
    }

    async fn table(&self, layer: &LayerId) -> Result<Arc<ChunkTable>> {
        if let Some(t) = lock(&self.tables).get(layer) {
            return Ok(t.clone());
        }
        let (s, l) = (self.store.clone(), layer.clone());
        let t = blocking(move || Ok(s.chunk_table(&l)?)).await?;
        let t = Arc::new(t);
        lock(&self.tables).insert(layer.clone(), t.clone());
        Ok(t)
    }

    /// Fetches `chunks` ahead of need, `parallel` at a time; failures are left to the
    /// reads that will ask again.
    pub async fn prefetch(&self, chunks: Vec<(LayerId, u64)>, parallel: usize) -> usize {
        futures::stream::iter(chunks)
            .map(|(l, c)| async move { self.fetch(&l, c).await.is_ok() })
            .buffer_unordered(parallel.max(1))
            .filter(|ok| std::future::ready(*ok))
            .count()
            .await
    }

    /// The chunks of `layer` holding at most `max_blocks` blocks, with their block counts.
    pub async fn chunks_up_to(&self, layer: &LayerId, max_blocks: u64) -> Result<Vec<(u64, u64)>> {
        let table = self.table(layer).await?;
        Ok(table
            .entries()
            .iter()
            .filter(|e| e.blocks <= max_blocks)
            .map(|e| (e.chunk, e.blocks))
            .collect())
    }

    /// Every chunk of `layer` still missing, fetched (`parallel` at a time).
    pub async fn complete(&self, layer: &LayerId, parallel: usize) -> Result<()> {
        let (s, l) = (self.store.clone(), layer.clone());
        let missing = blocking(move || Ok(s.missing_chunks(&l)?)).await?;
        let results: Vec<Result<(), String>> = futures::stream::iter(missing)
            .map(|c| async move { self.fetch(layer, c).await })
            .buffer_unordered(parallel.max(1))
            .collect()
            .await;
        match results.into_iter().find_map(|r| r.err()) {
            None => Ok(()),
            Some(e) => Err(RemoteError::invalid(e)),
        }
    }

    /// Answers fetches on `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            match listener.accept().await {
                Ok((conn, _)) => {
                    let me = self.clone();
                    tokio::spawn(async move { me.answer(conn).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "fetch socket: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn answer(&self, conn: UnixStream) {
        let (r, mut w) = conn.into_split();
        let mut line = String::new();
        // One request per connection; a line longer than a request is not one.
        let read = BufReader::new(r).take_line(&mut line, 4096).await;
        let reply = match read.and_then(|()| {
            serde_json::from_str::<FetchRequest>(&line).map_err(std::io::Error::other)
        }) {
            Err(e) => FetchReply {
                error: Some(format!("bad fetch request: {e}")),
            },
            Ok(req) => match req.layer.parse::<LayerId>() {
                Err(e) => FetchReply {
                    error: Some(format!("bad layer id: {e}")),
                },
                Ok(layer) => FetchReply {
                    error: self.fetch(&layer, req.chunk).await.err(),
                },
            },
        };
        if let Some(e) = &reply.error {
            tracing::warn!(error = %e, "a chunk could not be fetched");
        }
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        let _ = w.write_all(&out).await;
    }
}

/// Reads one line of at most `max` bytes.
trait TakeLine {
    async fn take_line(self, line: &mut String, max: u64) -> std::io::Result<()>;
}

impl<R: tokio::io::AsyncRead + Unpin> TakeLine for BufReader<R> {
    async fn take_line(self, line: &mut String, max: u64) -> std::io::Result<()> {
        use tokio::io::AsyncReadExt;
        let mut limited = BufReader::new(self.take(max));
        limited.read_line(line).await?;
        Ok(())
    }
}
