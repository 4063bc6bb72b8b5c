//! Refs, reference counts, layer facts and garbage collection.

use std::collections::HashSet;
use std::fs;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::fsutil;
use crate::id::{validate_name, LayerId};
use crate::layer::Layer;
use crate::store::{read_dir, Store};
use crate::{Error, Result, BLOCK_SIZE};

/// What `Store::layer_info` reports about a layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    pub id: LayerId,
    pub parent: Option<LayerId>,
    /// Size in bytes.
    pub size: u64,
    /// Blocks the layer holds (data and zero).
    pub held_blocks: u64,
    /// Held blocks known to be zero.
    pub zero_blocks: u64,
    /// Bytes the data file occupies on disk.
    pub bytes_on_disk: u64,
    /// Hex blake3 checksum of the metadata, for sealed layers.
    pub checksum: Option<String>,
    pub sealed: bool,
}

/// What `Store::gc` removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcStats {
    pub layers_deleted: usize,
    pub bytes_freed: u64,
    pub tmp_entries_deleted: usize,
}

impl Store {
    /// Pins a sealed layer (and so its whole chain) under `name`.
    pub fn set_ref(&self, name: &str, layer: &LayerId) -> Result<()> {
        validate_name(name)?;
        let _gc = self.gc_shared()?;
        self.set_ref_locked(name, layer)
    }

    /// `set_ref` for callers that already hold the gc lock.
    pub(crate) fn set_ref_locked(&self, name: &str, layer: &LayerId) -> Result<()> {
        let header = Layer::read_header(&self.layer_dir(layer), layer)?;
        if !header.sealed {
            return Err(Error::NotSealed(layer.to_string()));
        }
        fsutil::atomic_write(&self.dir("refs"), name, format!("{layer}\n").as_bytes())
    }

    /// The layer a ref points to.
    pub fn get_ref(&self, name: &str) -> Result<LayerId> {
        validate_name(name)?;
        let path = self.dir("refs").join(name);
        match fs::read_to_string(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(Error::RefNotFound(name.to_owned()))
            }
            Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
            Ok(s) => s.trim().parse(),
        }
    }

    /// Removes a ref; the layers it pinned stay until `gc`.
    pub fn delete_ref(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let path = self.dir("refs").join(name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(Error::RefNotFound(name.to_owned()))
            }
            Err(e) => Err(Error::io(format!("remove {}", path.display()), e)),
            Ok(()) => fsutil::fsync_dir(&self.dir("refs")),
        }
    }

    /// All refs, sorted by name.
    pub fn list_refs(&self) -> Result<Vec<(String, LayerId)>> {
        let mut out = Vec::new();
        for entry in read_dir(&self.dir("refs"))? {
            let Some(name) = entry.file_name().to_str().map(String::from) else {
                continue;
            };
            if validate_name(&name).is_ok() {
                out.push((name.clone(), self.get_ref(&name)?));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Facts about one layer.
    pub fn layer_info(&self, id: &LayerId) -> Result<LayerInfo> {
        let layer = match self.load_sealed(id) {
            Err(Error::NotSealed(_)) => {
                Arc::new(Layer::open(&self.layer_dir(id), id, false, false)?)
            }
            r => r?,
        };
        Ok(LayerInfo {
            id: id.clone(),
            parent: layer.parent.clone(),
            size: layer.size_blocks * BLOCK_SIZE,
            held_blocks: layer.dirty.count_ones(),
            zero_blocks: layer.zero.count_ones(),
            bytes_on_disk: layer.bytes_on_disk(),
            checksum: layer
                .checksum()
                .map(|c| blake3::Hash::from(c).to_hex().to_string()),
            sealed: layer.is_sealed(),
        })
    }

    /// The chain ending at `top`, bottom to top, following parent ids.
    pub fn chain_of(&self, top: &LayerId) -> Result<Vec<LayerId>> {
        let mut chain = vec![top.clone()];
        let mut current = top.clone();
        while let Some(parent) = Layer::read_header(&self.layer_dir(&current), &current)?.parent {
            if chain.contains(&parent) || chain.len() > 100_000 {
                return Err(Error::corrupt(&current, "parent chain has a cycle"));
            }
            chain.push(parent.clone());
            current = parent;
        }
        chain.reverse();
        Ok(chain)
    }

    /// Number of disks and refs whose chain contains `id`.
    pub fn refcount(&self, id: &LayerId) -> Result<usize> {
        Layer::read_header(&self.layer_dir(id), id)?;
        let mut n = 0;
        for name in self.list_disks()? {
            let m = match self.read_manifest(&name) {
                // Deleted since it was listed (no gc lock is held here).
                Err(Error::DiskNotFound(_)) => continue,
                r => r?,
            };
            n += usize::from(m.chain.contains(id) || &m.overlay == id);
        }
        for (_, top) in self.list_refs()? {
            n += usize::from(self.chain_of(&top)?.contains(id));
        }
        Ok(n)
    }

    /// Every layer some disk or ref references.
    fn live_layers(&self) -> Result<HashSet<LayerId>> {
        let mut live = HashSet::new();
        for name in self.list_disks()? {
            let m = self.read_manifest(&name)?;
            live.extend(m.chain);
            live.insert(m.overlay);
        }
        for (_, top) in self.list_refs()? {
            live.extend(self.chain_of(&top)?);
        }
        Ok(live)
    }

    /// Deletes every layer no disk or ref references, and stale staging in tmp/.
    pub fn gc(&self) -> Result<GcStats> {
        let stats = self.gc_locked()?;
        self.empty_trash()?;
        Ok(stats)
    }

    /// The part of [`Store::gc`] that holds the gc lock.
    fn gc_locked(&self) -> Result<GcStats> {
        let _gc = fsutil::lock(&self.dir("gc.lock"), true, true)?;
        let live = self.live_layers()?;
        let mut stats = GcStats::default();
        for entry in read_dir(&self.dir("layers"))? {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|s| s.parse::<LayerId>().ok()) else {
                continue;
            };
            if !live.contains(&id) {
                stats.bytes_freed += self.remove_layer_dir(&id)?;
                stats.layers_deleted += 1;
            }
        }
        stats.tmp_entries_deleted = self.clean_tmp()?;
        Ok(stats)
    }
}
