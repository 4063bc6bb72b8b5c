//! Pulling: a snapshot's manifest, its layers' records and its memory files, each checked.

use std::os::unix::fs::FileExt;
use std::path::Path;

use blockstore::remote::RemoteLayer;
use futures::{StreamExt, TryStreamExt};

use crate::bucket::Bucket;
use crate::error::{RemoteError, Result};
use crate::keys;
use crate::manifest::{self, blake3_hex, FileEntry, Manifest, Signer, PART};

/// Largest layer metadata record read (its hash table holds 8 bytes per held block).
const MAX_META: u64 = 256 << 20;
/// Largest chunk table read (38 bytes per MiB of layer).
const MAX_TABLE: u64 = 64 << 20;
/// Parts of one memory file fetched at once.
const PARALLEL_PARTS: usize = 4;

impl Bucket {
    /// The manifest of snapshot `id`, its signature and contents checked.
    pub async fn manifest(&self, id: &str, signer: &dyn Signer) -> Result<Manifest> {
        if !manifest::safe_name(id) {
            return Err(RemoteError::invalid(format!("{id:?} is not a snapshot id")));
        }
        let bytes = self
            .get(&keys::manifest(id), manifest::MAX_MANIFEST)
            .await?;
        let m = manifest::open(&bytes, signer)?;
        if m.snapshot_id != id {
            return Err(RemoteError::invalid(format!(
                "the manifest of {id} names snapshot {}",
                m.snapshot_id
            )));
        }
        Ok(m)
    }

    /// Ids of the snapshots the bucket holds.
    pub async fn snapshot_ids(&self) -> Result<Vec<String>> {
        let mut ids: Vec<String> = self
            .list(keys::MANIFESTS)
            .await?
            .into_iter()
            .filter_map(|k| {
                k.strip_prefix("snapshots/")?
                    .strip_suffix(".json")
                    .map(String::from)
            })
            .filter(|id| manifest::safe_name(id))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Removes snapshot `id`'s manifest: it is no longer in the bucket (its layers and
    /// files stay for other snapshots that share them).
    pub async fn unpublish(&self, id: &str) -> Result<()> {
        if !manifest::safe_name(id) {
            return Err(RemoteError::invalid(format!("{id:?} is not a snapshot id")));
        }
        self.delete(&keys::manifest(id)).await
    }

    /// The metadata records and chunk tables of `m`'s layers, each checked against the
    /// manifest (the block store checks them against each other when they are added).
    pub async fn layer_records(&self, m: &Manifest) -> Result<Vec<RemoteLayer>> {
        self.records(&m.layers).await
    }

    /// The records of `layers`, each checked against its entry.
    pub async fn records(&self, layers: &[crate::LayerEntry]) -> Result<Vec<RemoteLayer>> {
        futures::stream::iter(layers.to_vec())
            .map(|l| async move {
                let (meta_key, chunks_key) =
                    (keys::layer(&l.id, "meta"), keys::layer(&l.id, "chunks"));
                let (meta, chunks) = futures::try_join!(
                    self.get(&meta_key, MAX_META),
                    self.get(&chunks_key, MAX_TABLE)
                )?;
                if blake3_hex(&meta) != l.meta || blake3_hex(&chunks) != l.chunks {
                    return Err(RemoteError::invalid(format!(
                        "layer {} does not match the manifest",
                        l.id
                    )));
                }
                Ok(RemoteLayer {
                    meta: meta.to_vec(),
                    chunks: chunks.to_vec(),
                })
            })
            .buffered(4)
            .try_collect()
            .await
    }

    /// Fetches memory file `e` into `dest` (created), every part checked as it arrives.
    pub async fn fetch_file(&self, e: &FileEntry, dest: &Path) -> Result<()> {
        let ctx = |err| RemoteError::io(format!("write {}", dest.display()), err);
        let file = std::sync::Arc::new(std::fs::File::create_new(dest).map_err(ctx)?);
        let key = keys::memory(&e.blake3);
        let owned: Vec<(usize, String)> = e.parts.iter().cloned().enumerate().collect();
        let parts = owned.into_iter().map(|(i, want)| {
            let (key, file) = (&key, file.clone());
            async move {
                let start = i as u64 * PART;
                let end = (start + PART).min(e.size);
                let bytes = match end > start {
                    true => self.get_range(key, start..end).await?,
                    false => bytes::Bytes::new(),
                };
                // Hashing 8 MiB is CPU work: off the async threads, with the write.
                let (name, object) = (e.name.clone(), self.object_url(key));
                crate::error::blocking(move || {
                    if blake3_hex(&bytes) != want {
                        return Err(RemoteError::integrity(format!(
                            "object {object} (part {i} of memory file {name}) fails its hash"
                        )));
                    }
                    file.write_all_at(&bytes, start)
                        .map_err(|err| RemoteError::io(format!("write memory file {name}"), err))
                })
                .await
            }
        });
        futures::stream::iter(parts)
            .buffer_unordered(PARALLEL_PARTS)
            .try_collect::<Vec<()>>()
            .await?;
        file.sync_all().map_err(ctx)
    }
}
