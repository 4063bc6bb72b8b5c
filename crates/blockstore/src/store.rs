//! The store: a directory of layers, disk manifests and refs.
//!
//! ```text
//! <root>/layers/<id>/{meta,data}   one directory per layer
//! <root>/disks/<name>.json         disk manifest: size, sealed chain, overlay
//! <root>/disks/<name>.lock         flock held by the process that has the disk open
//! <root>/refs/<name>               a layer id pinned by name
//! <root>/tmp/                      staging for compaction, import and gc
//! <root>/trash/                    stale staging, moved out of tmp/ to be deleted unlocked
//! <root>/gc.lock                   gc holds it exclusively; publishers hold it shared
//! ```

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FileLock};
use crate::id::{validate_name, LayerId};
use crate::layer::Layer;
use crate::partial::{Fetch, Partial};
use crate::{Error, Result, BLOCK_SIZE};

/// Options for opening a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreOptions {
    /// Open layer data files with O_DIRECT (bypassing the host page cache).
    pub direct_io: bool,
}

/// A disk manifest, `disks/<name>.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    pub version: u32,
    pub size: u64,
    /// Sealed layers, bottom to top.
    pub chain: Vec<LayerId>,
    pub overlay: LayerId,
}

pub(crate) struct Inner {
    pub root: PathBuf,
    pub opts: StoreOptions,
    cache: Mutex<HashMap<LayerId, Weak<Layer>>>,
    /// What fetches the chunks of partial layers (`crate::partial`).
    pub(crate) fetch: std::sync::OnceLock<Arc<dyn Fetch>>,
}

/// A block store rooted at a directory. Cheap to clone; safe to share between threads.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

impl Store {
    /// Opens the store at `root` with default options, creating it if missing.
    pub fn open(root: &Path) -> Result<Store> {
        Store::open_with(root, StoreOptions::default())
    }

    /// Opens the store at `root`, creating its directories if missing, and recovers from
    /// interrupted operations (see `docs/blockstore.md`).
    pub fn open_with(root: &Path, opts: StoreOptions) -> Result<Store> {
        let store = Store::open_unrecovered(root, opts)?;
        store.recover()?;
        Ok(store)
    }

    /// Opens the store at `root` like [`Store::open_with`] but leaves recovery to the
    /// store's owner: for a process that serves one disk of a store another process owns
    /// (opening a disk still completes that disk's interrupted seal). Sweeping `tmp/` can
    /// take long — a compaction cut short leaves a disk-sized staging file — and would
    /// otherwise sit on the path of every disk mount.
    pub fn open_unrecovered(root: &Path, opts: StoreOptions) -> Result<Store> {
        for sub in ["", "layers", "disks", "refs", "tmp", "trash"] {
            let dir = root.join(sub);
            fs::create_dir_all(&dir)
                .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        }
        let store = Store {
            inner: Arc::new(Inner {
                root: root.to_owned(),
                opts,
                cache: Mutex::new(HashMap::new()),
                fetch: std::sync::OnceLock::new(),
            }),
        };
        Ok(store)
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    pub(crate) fn opts(&self) -> StoreOptions {
        self.inner.opts
    }

    pub(crate) fn dir(&self, sub: &str) -> PathBuf {
        self.inner.root.join(sub)
    }

    pub(crate) fn layer_dir(&self, id: &LayerId) -> PathBuf {
        self.dir("layers").join(id.as_str())
    }

    fn manifest_path(&self, name: &str) -> PathBuf {
        self.dir("disks").join(format!("{name}.json"))
    }

    pub(crate) fn disk_lock_path(&self, name: &str) -> PathBuf {
        self.dir("disks").join(format!("{name}.lock"))
    }

    /// Takes the shared side of the gc lock: held from creating a layer until a
    /// reference to it is published.
    pub(crate) fn gc_shared(&self) -> Result<FileLock> {
        let lock = fsutil::lock(&self.dir("gc.lock"), false, true)?;
        lock.ok_or_else(|| Error::io("lock gc.lock", std::io::ErrorKind::WouldBlock.into()))
    }

    fn recover(&self) -> Result<()> {
        if let Some(_gc) = fsutil::lock(&self.dir("gc.lock"), true, false)? {
            self.clean_tmp()?;
        }
        self.empty_trash()?;
        for name in self.list_disks()? {
            if let Some(_lock) = fsutil::lock(&self.disk_lock_path(&name), true, false)? {
                match self.finish_interrupted_seal(&name) {
                    // Deleted by another process since it was listed: the lock file
                    // taken here goes too, as `delete_disk` leaves none.
                    Err(Error::DiskNotFound(_)) => {
                        let _ = fs::remove_file(self.disk_lock_path(&name));
                    }
                    r => drop(r?),
                }
            }
        }
        Ok(())
    }

    /// Empties tmp/ of everything staged there. Callers hold the gc lock exclusively, and
    /// publishers wait for it, so the entries are only moved to trash/ here (a rename
    /// each); [`Store::empty_trash`] deletes them once the lock is released — a staging
    /// file as large as a disk (a compaction cut short) takes long to delete.
    pub(crate) fn clean_tmp(&self) -> Result<usize> {
        let trash = self.dir("trash");
        let mut n = 0;
        for entry in read_dir(&self.dir("tmp"))? {
            let (from, name) = (entry.path(), entry.file_name());
            let to = trash.join(format!("{}-{}", trash_prefix(), name.to_string_lossy()));
            fs::rename(&from, &to)
                .map_err(|e| Error::io(format!("move {} to the trash", from.display()), e))?;
            n += 1;
        }
        Ok(n)
    }

    /// Deletes what trash/ holds. Needs no lock: only [`Store::clean_tmp`] puts entries
    /// there and nothing reads them; of two callers racing on an entry, the one that finds
    /// it gone goes on.
    pub(crate) fn empty_trash(&self) -> Result<()> {
        for entry in read_dir(&self.dir("trash"))? {
            let path = entry.path();
            let res = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            match res {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => r.map_err(|e| Error::io(format!("remove {}", path.display()), e))?,
            }
        }
        Ok(())
    }

    /// A seal that wrote the sealed overlay metadata but not the manifest is completed:
    /// the sealed overlay joins the chain under a fresh overlay. Callers hold the disk lock.
    pub(crate) fn finish_interrupted_seal(&self, name: &str) -> Result<Manifest> {
        let mut m = self.read_manifest(name)?;
        match Layer::read_header(&self.layer_dir(&m.overlay), &m.overlay) {
            Ok(h) if h.sealed => {}
            // Not sealed, or never made durable (recreated by `Disk::open`).
            Ok(_) | Err(Error::LayerNotFound(_)) => return Ok(m),
            Err(e) => return Err(e),
        }
        let _gc = self.gc_shared()?;
        let fresh = self.create_layer(Some(m.overlay.clone()), m.size / BLOCK_SIZE)?;
        m.chain
            .push(std::mem::replace(&mut m.overlay, fresh.id.clone()));
        self.write_manifest(name, &m)?;
        Ok(m)
    }

    /// Creates an empty overlay layer in layers/. Callers hold the gc lock shared until
    /// they publish a reference to it. Nothing is synced: the layer becomes durable with
    /// its first flush or seal, and `Disk::open` recreates it (empty, as it was) if a
    /// power cut lost it before then.
    pub(crate) fn create_layer(&self, parent: Option<LayerId>, blocks: u64) -> Result<Layer> {
        let id = LayerId::random()?;
        let direct = self.opts().direct_io;
        Layer::create(&self.layer_dir(&id), id, parent, blocks, direct, false)
    }

    /// Moves a fully written layer from staging into layers/ (an atomic rename).
    pub(crate) fn publish_layer(&self, staging: &Path, id: &LayerId) -> Result<()> {
        let target = self.layer_dir(id);
        fs::rename(staging, &target)
            .map_err(|e| Error::io(format!("move layer {id} into place"), e))?;
        fsutil::fsync_dir(&self.dir("layers"))?;
        fsutil::fsync_dir(&self.dir("tmp"))
    }

    pub(crate) fn read_manifest(&self, name: &str) -> Result<Manifest> {
        validate_name(name)?;
        let path = self.manifest_path(name);
        let bytes = match fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::DiskNotFound(name.to_owned()))
            }
            r => r.map_err(|e| Error::io(format!("read {}", path.display()), e))?,
        };
        let bad = |reason: String| Error::BadManifest {
            name: name.to_owned(),
            reason,
        };
        let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if m.version != 1 || !m.size.is_multiple_of(BLOCK_SIZE) {
            return Err(bad(format!("version {} size {}", m.version, m.size)));
        }
        Ok(m)
    }

    pub(crate) fn write_manifest(&self, name: &str, m: &Manifest) -> Result<()> {
        self.stage_manifest(name, m)?.commit()
    }

    /// Writes and syncs a new manifest for `name` without putting it in place yet.
    pub(crate) fn stage_manifest(&self, name: &str, m: &Manifest) -> Result<fsutil::Staged> {
        let bytes = serde_json::to_vec_pretty(m).map_err(|e| Error::BadManifest {
            name: name.to_owned(),
            reason: e.to_string(),
        })?;
        fsutil::stage(&self.dir("disks"), &format!("{name}.json"), &bytes)
    }

    /// Loads a sealed layer, sharing one in-memory copy per store.
    pub(crate) fn load_sealed(&self, id: &LayerId) -> Result<Arc<Layer>> {
        if let Some(layer) = self.inner.cache.lock().get(id).and_then(Weak::upgrade) {
            return Ok(layer);
        }
        let layer = self.open_sealed(id)?;
        Ok(self.cache_layer(layer))
    }

    /// Opens sealed layer `id` (not shared), with what a partial one still misses.
    fn open_sealed(&self, id: &LayerId) -> Result<Layer> {
        let dir = self.layer_dir(id);
        let mut layer = Layer::open(&dir, id, false, self.opts().direct_io)?;
        if !layer.is_sealed() {
            return Err(Error::NotSealed(id.to_string()));
        }
        layer.partial = Partial::open(&dir, layer.size_blocks, self.fetcher())?;
        Ok(layer)
    }

    pub(crate) fn cache_layer(&self, layer: Layer) -> Arc<Layer> {
        let layer = Arc::new(layer);
        self.cache_arc(&layer);
        layer
    }

    pub(crate) fn cache_arc(&self, layer: &Arc<Layer>) {
        let mut cache = self.inner.cache.lock();
        cache.retain(|_, w| w.strong_count() > 0);
        cache.insert(layer.id.clone(), Arc::downgrade(layer));
    }

    /// Creates a disk of `size` bytes: an empty overlay over `base`'s chain (a fork) or
    /// over nothing. O(1): no data is copied.
    pub fn create_disk(&self, name: &str, size: u64, base: Option<&LayerId>) -> Result<()> {
        validate_name(name)?;
        check_size(size)?;
        let _disk = fsutil::lock_within(&self.disk_lock_path(name), true, fsutil::LOCK_PATIENCE)?
            .ok_or_else(|| Error::DiskBusy(name.to_owned()))?;
        if self.manifest_path(name).exists() {
            return Err(Error::DiskExists(name.to_owned()));
        }
        let _gc = self.gc_shared()?;
        let chain = match base {
            Some(b) => self.checked_base(b, size)?,
            None => Vec::new(),
        };
        let overlay = self.create_layer(base.cloned(), size / BLOCK_SIZE)?;
        let m = Manifest {
            version: 1,
            size,
            chain,
            overlay: overlay.id.clone(),
        };
        self.write_manifest(name, &m)
    }

    fn checked_base(&self, base: &LayerId, size: u64) -> Result<Vec<LayerId>> {
        let header = Layer::read_header(&self.layer_dir(base), base)?;
        if !header.sealed {
            return Err(Error::NotSealed(base.to_string()));
        }
        if header.size_blocks * BLOCK_SIZE > size {
            return Err(Error::InvalidSize {
                size,
                reason: "smaller than the base layer",
            });
        }
        self.chain_of(base)
    }

    /// Deletes a disk that no one has open; its overlay goes with it, sealed layers stay
    /// until `gc`.
    pub fn delete_disk(&self, name: &str) -> Result<()> {
        let _disk = fsutil::lock_within(&self.disk_lock_path(name), true, fsutil::LOCK_PATIENCE)?
            .ok_or_else(|| Error::DiskBusy(name.to_owned()))?;
        let _gc = self.gc_shared()?;
        let m = self.read_manifest(name)?;
        let path = self.manifest_path(name);
        fs::remove_file(&path).map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
        fsutil::fsync_dir(&self.dir("disks"))?;
        let header = Layer::read_header(&self.layer_dir(&m.overlay), &m.overlay);
        if header.is_ok_and(|h| !h.sealed) {
            self.remove_layer_dir(&m.overlay)?;
        }
        let _ = fs::remove_file(self.disk_lock_path(name));
        Ok(())
    }

    /// Moves a layer directory to tmp/ (atomically leaving layers/) and deletes it there.
    pub(crate) fn remove_layer_dir(&self, id: &LayerId) -> Result<u64> {
        let from = self.layer_dir(id);
        let to = self.dir("tmp").join(format!("gc-{id}"));
        let bytes = dir_bytes(&from);
        match fs::rename(&from, &to) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            r => r.map_err(|e| Error::io(format!("remove layer {id}"), e))?,
        }
        fsutil::fsync_dir(&self.dir("layers"))?;
        fs::remove_dir_all(&to).map_err(|e| Error::io(format!("remove {}", to.display()), e))?;
        self.inner.cache.lock().remove(id);
        Ok(bytes)
    }

    /// The sealed chain of a disk, bottom to top, as its manifest records it.
    pub fn disk_chain(&self, name: &str) -> Result<Vec<LayerId>> {
        Ok(self.read_manifest(name)?.chain)
    }

    /// The size in bytes of a disk, as its manifest records it.
    pub fn disk_size(&self, name: &str) -> Result<u64> {
        Ok(self.read_manifest(name)?.size)
    }

    /// Names of all disks, sorted.
    pub fn list_disks(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = read_dir(&self.dir("disks"))?
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".json")
                    .map(String::from)
            })
            .filter(|n| validate_name(n).is_ok())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Re-reads every data block of a layer and checks it and the metadata checksum.
    pub fn verify(&self, id: &LayerId) -> Result<()> {
        self.open_sealed(id)?.verify()
    }
}

/// Checks a disk size: positive, block aligned, at most the supported maximum.
pub(crate) fn check_size(size: u64) -> Result<()> {
    if !size.is_multiple_of(BLOCK_SIZE) {
        return Err(Error::Unaligned {
            what: "disk size",
            value: size,
        });
    }
    if size == 0 || size / BLOCK_SIZE > crate::meta::MAX_BLOCKS {
        return Err(Error::InvalidSize {
            size,
            reason: "must be between 4 KiB and 1 TiB",
        });
    }
    Ok(())
}

pub(crate) fn read_dir(dir: &Path) -> Result<impl Iterator<Item = fs::DirEntry>> {
    let rd = fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    Ok(rd.filter_map(|e| e.ok()))
}

/// A prefix no other trash entry has: this process's id, a count and the time.
fn trash_prefix() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{n}-{nanos}", std::process::id())
}

fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(dir).map_or(0, |rd| {
        rd.filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.blocks() * 512)
            .sum()
    })
}
