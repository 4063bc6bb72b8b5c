//! A disk: a sealed chain of layers plus one writable overlay, served as a block device.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::fsutil::{self, FileLock};
use crate::id::LayerId;
use crate::layer::Layer;
#[cfg(test)]
use crate::layer::Source;
use crate::store::{check_size, Manifest, Store};
use crate::{compact, Error, Result, BLOCK_SIZE};

const BS: u64 = BLOCK_SIZE;
const BSU: usize = BLOCK_SIZE as usize;
/// Chain depth above which the disk server should call `Disk::compact`.
pub const MAX_DEPTH: usize = 16;
/// Number of block-striped write locks.
const STRIPES: usize = 64;

/// The layers of a disk as its readers and writers see them.
pub(crate) struct State {
    pub size: u64,
    pub overlay: Arc<Layer>,
    /// Sealed layers, bottom to top.
    pub chain: Vec<Arc<Layer>>,
}

impl State {
    /// Layer `k` of the resolution order: 0 is the overlay, then the chain top to bottom.
    fn layer(&self, k: usize) -> &Layer {
        if k == 0 {
            &self.overlay
        } else {
            &self.chain[self.chain.len() - k]
        }
    }

    /// The topmost layer holding block `b`, or `Zero` (the per-block reference for
    /// `io::resolve_range`).
    #[cfg(test)]
    fn resolve(&self, b: u64) -> Source {
        let depth = self.chain.len();
        for k in 0..=depth {
            let l = self.layer(k);
            if l.dirty.get(b) {
                return if l.zero.get(b) {
                    Source::Zero
                } else {
                    Source::Layer(k)
                };
            }
        }
        Source::Zero
    }

    /// Whether block `b` reads as zero from the sealed chain alone.
    fn chain_reads_zero(&self, b: u64) -> bool {
        for l in self.chain.iter().rev() {
            if l.dirty.get(b) {
                return l.zero.get(b);
            }
        }
        true
    }

    fn manifest(&self) -> Manifest {
        Manifest {
            version: 1,
            size: self.size,
            chain: self.chain.iter().map(|l| l.id.clone()).collect(),
            overlay: self.overlay.id.clone(),
        }
    }
}

/// An open disk. Many threads may do I/O at once; seal, grow and compact briefly take
/// the chain's write lock.
pub struct Disk {
    name: String,
    store: Store,
    state: RwLock<State>,
    stripes: Box<[Mutex<()>]>,
    flush_lock: Mutex<()>,
    compact_lock: Mutex<()>,
    broken: AtomicBool,
    _lock: FileLock,
}

impl Store {
    /// Opens a disk for reading and writing; only one handle may have it open at a time.
    pub fn open_disk(&self, name: &str) -> Result<Disk> {
        Disk::open(self, name)
    }
}

impl Disk {
    fn open(store: &Store, name: &str) -> Result<Disk> {
        crate::id::validate_name(name)?;
        let lock = fsutil::lock_within(&store.disk_lock_path(name), true, fsutil::LOCK_PATIENCE)?
            .ok_or_else(|| Error::DiskBusy(name.to_owned()))?;
        let m = store.finish_interrupted_seal(name)?;
        let chain = m
            .chain
            .iter()
            .map(|id| store.load_sealed(id))
            .collect::<Result<Vec<_>>>()?;
        check_chain(name, &chain)?;
        let overlay = open_overlay(store, name, &m, &chain)?;
        Ok(Disk {
            name: name.to_owned(),
            store: store.clone(),
            state: RwLock::new(State {
                size: m.size,
                overlay: Arc::new(overlay),
                chain,
            }),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            flush_lock: Mutex::new(()),
            compact_lock: Mutex::new(()),
            broken: AtomicBool::new(false),
            _lock: lock,
        })
    }

    /// The disk's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sealed chain, bottom to top.
    pub fn chain(&self) -> Vec<LayerId> {
        self.state
            .read()
            .chain
            .iter()
            .map(|l| l.id.clone())
            .collect()
    }

    /// Number of sealed layers under the overlay.
    pub fn depth(&self) -> usize {
        self.state.read().chain.len()
    }

    /// The id of the current writable overlay.
    pub fn overlay_id(&self) -> LayerId {
        self.state.read().overlay.id.clone()
    }

    fn check_usable(&self) -> Result<()> {
        if self.broken.load(Ordering::Acquire) {
            return Err(Error::NeedsReopen(self.name.clone()));
        }
        Ok(())
    }

    /// Turns the overlay into a sealed layer and puts a fresh overlay on top. Does not
    /// read data: cost is a data sync plus writing the bitmaps and hash table. The syncs
    /// of the data, the sealed metadata and the new manifest run in parallel; the two
    /// renames that commit them follow in order (metadata, then manifest).
    pub fn seal(&self) -> Result<LayerId> {
        self.check_usable()?;
        let _gc = self.store.gc_shared()?;
        let mut st = self.state.write();
        let ov = st.overlay.clone();
        let fresh = self.store.create_layer(Some(ov.id.clone()), st.size / BS)?;
        let mut m = st.manifest();
        m.chain.push(ov.id.clone());
        m.overlay = fresh.id.clone();
        let enc = ov.encode_sealed();
        let (meta, manifest) = match self.stage_seal(&ov, &enc.bytes, &m) {
            Ok(staged) => staged,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&fresh.dir);
                return Err(e);
            }
        };
        // From the metadata rename on, the on-disk overlay may be sealed; failing now
        // leaves the disk to be completed by the next open (`finish_interrupted_seal`).
        if let Err(e) = meta.commit() {
            manifest.abort();
            self.broken.store(true, Ordering::Release);
            return Err(e);
        }
        let sealed = ov.mark_sealed(enc);
        if let Err(e) = manifest.commit() {
            self.broken.store(true, Ordering::Release);
            return Err(e);
        }
        st.chain.push(self.store.cache_layer(sealed));
        st.overlay = Arc::new(fresh);
        Ok(ov.id.clone())
    }

    /// Syncs the overlay data and writes the sealed metadata and the manifest to temp
    /// files, all at once.
    fn stage_seal(
        &self,
        ov: &Layer,
        meta: &[u8],
        m: &Manifest,
    ) -> Result<(fsutil::Staged, fsutil::Staged)> {
        std::thread::scope(|s| {
            let data = s.spawn(|| ov.sync_data().and_then(|()| ov.sync_parent_dir()));
            let manifest = s.spawn(|| self.store.stage_manifest(&self.name, m));
            let meta = fsutil::stage(&ov.dir, crate::layer::META_FILE, meta);
            match (joined(data), meta, joined(manifest)) {
                (Ok(()), Ok(meta), Ok(manifest)) => Ok((meta, manifest)),
                (data, meta, manifest) => {
                    let mut first = data.err();
                    for staged in [meta, manifest] {
                        match staged {
                            Ok(st) => st.abort(),
                            Err(e) => first = first.or(Some(e)),
                        }
                    }
                    Err(first.unwrap_or_else(|| Error::io("seal", io_other())))
                }
            }
        })
    }

    /// Grows the disk to `new_size` bytes (a multiple of 4096, not smaller than now).
    pub fn grow(&self, new_size: u64) -> Result<()> {
        self.check_usable()?;
        check_size(new_size)?;
        let mut st = self.state.write();
        if new_size < st.size {
            return Err(Error::InvalidSize {
                size: new_size,
                reason: "disks can only grow",
            });
        }
        if new_size == st.size {
            return Ok(());
        }
        let mut m = st.manifest();
        m.size = new_size;
        self.store.write_manifest(&self.name, &m)?;
        let parent = st.overlay.parent.clone();
        st.overlay = Arc::new(st.overlay.reshaped(new_size / BS, parent));
        st.size = new_size;
        Ok(())
    }

    /// Bounds the chain depth: merges every sealed layer above the bottom one (usually
    /// the image, shared by many disks) into one new layer. Returns the new layer, or
    /// `None` when fewer than two layers sit above the bottom. Runs while the disk is in
    /// use; only the final swap takes the write lock.
    pub fn compact(&self) -> Result<Option<LayerId>> {
        self.compact_from(1)
    }

    /// Merges the sealed layers from position `from` (0 = bottom) up to the top of the
    /// chain into one new layer. `None` when that run has fewer than two layers.
    pub fn compact_from(&self, from: usize) -> Result<Option<LayerId>> {
        self.check_usable()?;
        let _one = self.compact_lock.lock();
        let run: Vec<Arc<Layer>> = {
            let st = self.state.read();
            st.chain.get(from..).unwrap_or(&[]).to_vec()
        };
        if run.len() < 2 {
            return Ok(None);
        }
        let _gc = self.store.gc_shared()?;
        let merged = compact::merge(&self.store, &run)?;
        self.swap_in(from, &run, merged).map(Some)
    }

    /// Replaces `run` (now at `from..from + run.len()`) by `merged` and re-parents the
    /// overlay. The manifest is the commit point; an overlay whose parent disagrees with
    /// it is re-parented on the next open.
    fn swap_in(&self, from: usize, run: &[Arc<Layer>], merged: Arc<Layer>) -> Result<LayerId> {
        let mut st = self.state.write();
        let top = run.last().map(|l| &l.id);
        if st.chain.len() != from + run.len() || st.chain.last().map(|l| &l.id) != top {
            return Err(Error::CompactionRaced(self.name.clone()));
        }
        st.chain.truncate(from);
        st.chain.push(merged.clone());
        self.store.write_manifest(&self.name, &st.manifest())?;
        let size = st.overlay.size_blocks;
        st.overlay = Arc::new(st.overlay.reshaped(size, Some(merged.id.clone())));
        let _f = self.flush_lock.lock();
        st.overlay.flush()?;
        Ok(merged.id.clone())
    }
}

fn io_other() -> std::io::Error {
    std::io::ErrorKind::Other.into()
}

/// The result of a scoped thread; a panic becomes an error.
fn joined<T>(h: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    h.join()
        .unwrap_or_else(|_| Err(Error::io("seal worker panicked", io_other())))
}

/// Parent links along the chain must match the manifest order.
fn check_chain(name: &str, chain: &[Arc<Layer>]) -> Result<()> {
    let mut expected: Option<&LayerId> = None;
    for l in chain {
        if l.parent.as_ref() != expected {
            return Err(Error::BadManifest {
                name: name.to_owned(),
                reason: format!("layer {} does not sit on {:?}", l.id, expected),
            });
        }
        expected = Some(&l.id);
    }
    Ok(())
}

/// Opens the overlay writable, re-parenting it onto the manifest's chain top (after an
/// interrupted compaction) and sizing it to the manifest (after an interrupted grow).
fn open_overlay(store: &Store, name: &str, m: &Manifest, chain: &[Arc<Layer>]) -> Result<Layer> {
    let dir = store.layer_dir(&m.overlay);
    let direct = store.opts().direct_io;
    let blocks = m.size / BS;
    let top = chain.last().map(|l| l.id.clone());
    let overlay = match Layer::open(&dir, &m.overlay, true, direct) {
        Err(Error::LayerNotFound(_)) => return recreate_overlay(store, m, top),
        Err(Error::Corrupt { .. }) if never_written(&dir) => {
            return recreate_overlay(store, m, top)
        }
        r => r?,
    };
    if overlay.is_sealed() || overlay.size_blocks > blocks {
        return Err(Error::BadManifest {
            name: name.to_owned(),
            reason: format!("overlay {} is sealed or larger than the disk", overlay.id),
        });
    }
    if overlay.parent == top && overlay.size_blocks == blocks {
        return Ok(overlay);
    }
    let fixed = overlay.reshaped(blocks, top);
    fixed.flush()?;
    Ok(fixed)
}

/// Whether an overlay's data file is missing or empty.
fn never_written(dir: &std::path::Path) -> bool {
    std::fs::metadata(dir.join(crate::layer::DATA_FILE)).map_or(true, |m| m.len() == 0)
}

/// An overlay created by a seal and lost (with the unflushed writes it may have held)
/// before its first flush became durable: recreated empty under the same id.
fn recreate_overlay(store: &Store, m: &Manifest, parent: Option<LayerId>) -> Result<Layer> {
    let dir = store.layer_dir(&m.overlay);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| Error::io(format!("remove {}", dir.display()), e))?;
    }
    let direct = store.opts().direct_io;
    let layer = Layer::create(&dir, m.overlay.clone(), parent, m.size / BS, direct, true)?;
    fsutil::fsync_dir(&store.dir("layers"))?;
    Ok(layer)
}

#[path = "disk_io.rs"]
mod io;

#[cfg(test)]
#[path = "disk_tests.rs"]
mod tests;
