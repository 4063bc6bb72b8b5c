//! Publishing: layers the bucket lacks, memory files by content, then the manifest.

use std::io::Read;
use std::path::{Path, PathBuf};

use blockstore::remote::ChunkTable;
use blockstore::{LayerId, Store};
use bytes::Bytes;

use crate::bucket::Bucket;
use crate::error::{blocking, RemoteError, Result};
use crate::keys;
use crate::manifest::{self, blake3_hex, FileEntry, LayerEntry, Manifest, Signer, PART};

/// Chunk tables this node computed or checked, by layer (`<dir>/<layer id>`), so that a
/// layer published once is never packed again to learn its table.
#[derive(Clone, Debug)]
pub struct Tables {
    dir: PathBuf,
}

impl Tables {
    pub fn open(dir: PathBuf) -> Result<Tables> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| RemoteError::io(format!("create {}", dir.display()), e))?;
        Ok(Tables { dir })
    }

    fn get(&self, id: &LayerId) -> Option<ChunkTable> {
        let bytes = std::fs::read(self.dir.join(id.as_str())).ok()?;
        ChunkTable::decode(&bytes).ok()
    }

    fn put(&self, id: &LayerId, table: &ChunkTable) -> Result<()> {
        let (tmp, path) = (
            self.dir.join(format!(".{id}.tmp")),
            self.dir.join(id.as_str()),
        );
        std::fs::write(&tmp, table.encode())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| RemoteError::io(format!("write {}", path.display()), e))
    }

    /// Forgets tables of layers not in `keep`.
    pub fn retain(&self, keep: &dyn Fn(&str) -> bool) {
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !keep(&name) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// What a publish is of.
pub struct Publication<'a> {
    pub snapshot_id: &'a str,
    pub publisher: &'a str,
    pub published_at: String,
    pub record: serde_json::Value,
    /// The snapshot's top layer (its whole chain goes).
    pub top: &'a LayerId,
    /// Memory image files (flat) published whole, for a memory snapshot.
    pub memory: Vec<PathBuf>,
    /// Memory image files published as sealed layers of `store` (name, size, layer):
    /// the pages files, which restores read lazily.
    pub memory_layers: Vec<(String, u64, LayerId)>,
    /// Scratch space for packing layers.
    pub scratch: &'a Path,
}

impl Bucket {
    /// Publishes a snapshot: its chain's layers the bucket lacks, its memory files, then
    /// its manifest in one PUT. Returns the manifest.
    pub async fn publish(
        &self,
        store: &Store,
        tables: &Tables,
        p: Publication<'_>,
        signer: &dyn Signer,
    ) -> Result<Manifest> {
        let (s, top) = (store.clone(), p.top.clone());
        let chain = blocking(move || Ok(s.chain_of(&top)?)).await?;
        let mut layers = Vec::with_capacity(chain.len());
        for id in &chain {
            layers.push(self.publish_layer(store, tables, id, p.scratch).await?);
        }
        let mut memory = Vec::with_capacity(p.memory.len());
        for file in &p.memory {
            memory.push(self.publish_file(file).await?);
        }
        let mut memory_layers = Vec::with_capacity(p.memory_layers.len());
        for (name, size, id) in &p.memory_layers {
            let layer = self.publish_layer(store, tables, id, p.scratch).await?;
            memory_layers.push(manifest::MemoryLayer {
                name: name.clone(),
                size: *size,
                layer,
            });
        }
        let m = Manifest {
            version: manifest::VERSION,
            snapshot_id: p.snapshot_id.to_string(),
            publisher: p.publisher.to_string(),
            published_at: p.published_at,
            record: p.record,
            layers,
            memory,
            memory_layers,
            prefetch: Vec::new(),
        };
        self.put_manifest(&m, signer).await?;
        Ok(m)
    }

    /// Writes `m` (signed) as its snapshot's manifest: the snapshot's commit point.
    pub async fn put_manifest(&self, m: &Manifest, signer: &dyn Signer) -> Result<()> {
        let bytes = manifest::seal(m, signer)?;
        self.put(&keys::manifest(&m.snapshot_id), bytes.into())
            .await
    }

    /// Publishes layer `id` unless the bucket has it already (with the table we know).
    async fn publish_layer(
        &self,
        store: &Store,
        tables: &Tables,
        id: &LayerId,
        scratch: &Path,
    ) -> Result<LayerEntry> {
        let (s, l) = (store.clone(), id.clone());
        let meta = blocking(move || Ok(s.layer_meta(&l)?)).await?;
        let known = match store.is_partial(id) {
            true => Some(store.chunk_table(id)?),
            false => tables.get(id),
        };
        let there = self.exists(&keys::layer(id.as_str(), "meta")).await?;
        let table = match (there, known) {
            (true, Some(t)) => t,
            (true, None) => {
                let (s, l) = (store.clone(), id.clone());
                let t = blocking(move || Ok(s.pack_layer(&l, &mut std::io::sink())?)).await?;
                let theirs = self
                    .get(&keys::layer(id.as_str(), "chunks"), 64 << 20)
                    .await?;
                let their_meta = self
                    .get(&keys::layer(id.as_str(), "meta"), 256 << 20)
                    .await?;
                if theirs[..] != t.encode()[..] || their_meta[..] != meta[..] {
                    // Not what this layer holds: publish it again, whole.
                    tracing::warn!(layer = %id, "the bucket's copy of a layer differs: publishing it again");
                    self.upload_layer(store, id, &meta, scratch).await?
                } else {
                    t
                }
            }
            (false, _) => self.upload_layer(store, id, &meta, scratch).await?,
        };
        tables.put(id, &table)?;
        Ok(LayerEntry {
            id: id.to_string(),
            meta: blake3_hex(&meta),
            chunks: blake3_hex(&table.encode()),
            packed_bytes: table.packed_bytes(),
        })
    }

    /// Packs layer `id` into scratch and uploads blocks, chunk table, then metadata.
    async fn upload_layer(
        &self,
        store: &Store,
        id: &LayerId,
        meta: &[u8],
        scratch: &Path,
    ) -> Result<ChunkTable> {
        let file = scratch.join(format!("pack-{id}"));
        let (s, l, f) = (store.clone(), id.clone(), file.clone());
        let packed = blocking(move || {
            let mut out = std::io::BufWriter::with_capacity(
                1 << 20,
                std::fs::File::create(&f)
                    .map_err(|e| RemoteError::io(format!("create {}", f.display()), e))?,
            );
            let t = s.pack_layer(&l, &mut out)?;
            std::io::Write::flush(&mut out)
                .map_err(|e| RemoteError::io(format!("write {}", f.display()), e))?;
            Ok(t)
        })
        .await;
        let uploaded = async {
            let table = packed?;
            self.put_file(&keys::layer(id.as_str(), "blocks"), &file)
                .await?;
            self.put(&keys::layer(id.as_str(), "chunks"), table.encode().into())
                .await?;
            self.put(
                &keys::layer(id.as_str(), "meta"),
                Bytes::copy_from_slice(meta),
            )
            .await?;
            Ok(table)
        }
        .await;
        let _ = std::fs::remove_file(&file);
        uploaded
    }

    /// Publishes a memory image file by its content (skipped when the bucket has it).
    async fn publish_file(&self, file: &Path) -> Result<FileEntry> {
        let f = file.to_path_buf();
        let entry = blocking(move || hash_file(&f)).await?;
        let key = keys::memory(&entry.blake3);
        if !self.exists(&key).await? {
            self.put_file(&key, file).await?;
        }
        Ok(entry)
    }
}

/// The entry of a memory file: its name, size, blake3 and its parts' blake3.
fn hash_file(path: &Path) -> Result<FileEntry> {
    let ctx = |e| RemoteError::io(format!("read {}", path.display()), e);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| manifest::safe_name(n))
        .ok_or_else(|| {
            RemoteError::invalid(format!(
                "memory file {} has a name that cannot travel",
                path.display()
            ))
        })?;
    let mut f = std::fs::File::open(path).map_err(ctx)?;
    let (mut whole, mut parts, mut size) = (blake3::Hasher::new(), Vec::new(), 0u64);
    let mut buf = vec![0u8; PART as usize];
    loop {
        let mut n = 0;
        while n < buf.len() {
            match f.read(&mut buf[n..]).map_err(ctx)? {
                0 => break,
                k => n += k,
            }
        }
        if n == 0 && size > 0 {
            break;
        }
        whole.update(&buf[..n]);
        parts.push(blake3_hex(&buf[..n]));
        size += n as u64;
        if n < buf.len() {
            break;
        }
    }
    Ok(FileEntry {
        name,
        size,
        blake3: whole.finalize().to_hex().to_string(),
        parts,
    })
}
