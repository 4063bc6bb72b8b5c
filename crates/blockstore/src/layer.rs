//! One layer: its metadata in memory and its sparse data file.
//!
//! Block `i` of a layer lives at byte `i * 4096` of `data`. A sealed layer is immutable and
//! every read from it is checked against its per-block hash; the overlay (the one unsealed
//! layer of a disk) is written in place.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use xxhash_rust::xxh3::xxh3_64;

use crate::bitmap::{Bitmap, HashTable};
use crate::fsutil::{self, AlignedBuf};
use crate::id::LayerId;
use crate::meta::{self, Header};
use crate::partial::Partial;
use crate::{Error, Result, BLOCK_SIZE};

const BS: usize = BLOCK_SIZE as usize;
/// Name of the metadata file inside a layer directory.
pub const META_FILE: &str = "meta";
/// Name of the data file inside a layer directory.
pub const DATA_FILE: &str = "data";
/// Largest single read or write issued to a data file, in blocks.
pub const MAX_RUN: u64 = 256;

/// A layer loaded in memory.
pub struct Layer {
    pub id: LayerId,
    pub parent: Option<LayerId>,
    pub size_blocks: u64,
    pub dirty: Bitmap,
    pub zero: Bitmap,
    pub hashes: HashTable,
    pub dir: PathBuf,
    data: Arc<File>,
    direct: bool,
    sealed: AtomicBool,
    checksum: OnceLock<[u8; 32]>,
    /// Set when the bitmaps changed since the metadata was last written.
    pub changed: AtomicBool,
    /// Set while the layer's own directory entry has not been synced.
    unsynced_dir: AtomicBool,
    /// For a partial layer (its blocks still arriving from an object store): what is here.
    pub(crate) partial: Option<Partial>,
}

/// What a block of a disk resolves to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Source {
    Zero,
    /// Index into the resolution order of the disk (0 = overlay, 1 = top sealed layer, …).
    Layer(usize),
}

impl Layer {
    /// Creates an empty unsealed layer in `dir` (which must not exist yet).
    /// With `durable` false nothing is synced: the layer becomes durable with its first
    /// flush (an overlay nobody has flushed may be lost by a power cut, as its writes may).
    pub fn create(
        dir: &Path,
        id: LayerId,
        parent: Option<LayerId>,
        size_blocks: u64,
        direct: bool,
        durable: bool,
    ) -> Result<Layer> {
        fs::create_dir(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let data = fsutil::open_data(&dir.join(DATA_FILE), true, true, direct)?;
        let layer = Layer::from_parts(dir, id, parent, size_blocks, data, direct);
        if durable {
            layer.write_meta()?;
        } else {
            let bytes = meta::encode(
                &layer.header(false),
                &layer.dirty,
                &layer.zero,
                &layer.hashes,
                false,
            )
            .bytes;
            // Renamed into place so a killed process leaves no partial file.
            let (tmp, path) = (dir.join(".meta.tmp"), dir.join(META_FILE));
            fs::write(&tmp, bytes)
                .and_then(|()| fs::rename(&tmp, &path))
                .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
            layer.changed.store(true, Ordering::Release);
            layer.unsynced_dir.store(true, Ordering::Release);
        }
        Ok(layer)
    }

    fn from_parts(
        dir: &Path,
        id: LayerId,
        parent: Option<LayerId>,
        size_blocks: u64,
        data: File,
        direct: bool,
    ) -> Layer {
        Layer {
            id,
            parent,
            size_blocks,
            dirty: Bitmap::new(size_blocks),
            zero: Bitmap::new(size_blocks),
            hashes: HashTable::new(size_blocks),
            dir: dir.to_owned(),
            data: Arc::new(data),
            direct,
            sealed: AtomicBool::new(false),
            checksum: OnceLock::new(),
            changed: AtomicBool::new(false),
            unsynced_dir: AtomicBool::new(false),
            partial: None,
        }
    }

    /// Opens the layer stored in `dir`, checking its metadata checksum and id.
    pub fn open(dir: &Path, id: &LayerId, writable: bool, direct: bool) -> Result<Layer> {
        let meta_path = dir.join(META_FILE);
        let bytes = match fs::read(&meta_path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::LayerNotFound(id.to_string()))
            }
            r => r.map_err(|e| Error::io(format!("read {}", meta_path.display()), e))?,
        };
        let m = meta::decode(&mut &bytes[..]).map_err(|e| Error::corrupt(id, e.reason()))?;
        if &m.header.id != id {
            return Err(Error::corrupt(
                id,
                format!("metadata names layer {}", m.header.id),
            ));
        }
        let data = fsutil::open_data(&dir.join(DATA_FILE), false, writable, direct)?;
        let layer = Layer {
            id: m.header.id,
            parent: m.header.parent,
            size_blocks: m.header.size_blocks,
            dirty: m.dirty,
            zero: m.zero,
            hashes: match m.has_hashes {
                true => m.hashes,
                false => HashTable::new(m.header.size_blocks),
            },
            dir: dir.to_owned(),
            data: Arc::new(data),
            direct,
            sealed: AtomicBool::new(m.header.sealed),
            checksum: OnceLock::new(),
            changed: AtomicBool::new(false),
            unsynced_dir: AtomicBool::new(false),
            partial: None,
        };
        if m.header.sealed {
            let _ = layer.checksum.set(m.checksum);
        } else if writable && !m.has_hashes {
            layer.recompute_hashes()?;
        }
        Ok(layer)
    }

    /// Reads only the header of the layer stored in `dir`.
    pub fn read_header(dir: &Path, id: &LayerId) -> Result<Header> {
        let path = dir.join(META_FILE);
        let file = match File::open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::LayerNotFound(id.to_string()))
            }
            r => r.map_err(|e| Error::io(format!("open {}", path.display()), e))?,
        };
        let mut r = std::io::BufReader::with_capacity(meta::HEADER_LEN, file);
        meta::decode_header(&mut r).map_err(|e| Error::corrupt(id, e.reason()))
    }

    /// A copy of this (unsealed) layer covering `size_blocks` with parent `parent`,
    /// sharing its data file and bits. Marked changed so the next flush records it.
    pub fn reshaped(&self, size_blocks: u64, parent: Option<LayerId>) -> Layer {
        Layer {
            id: self.id.clone(),
            parent,
            size_blocks: size_blocks.max(self.size_blocks),
            dirty: self.dirty.grown(size_blocks),
            zero: self.zero.grown(size_blocks),
            hashes: self.hashes.grown(size_blocks),
            dir: self.dir.clone(),
            data: self.data.clone(),
            direct: self.direct,
            sealed: AtomicBool::new(self.is_sealed()),
            checksum: self.checksum.clone(),
            changed: AtomicBool::new(true),
            unsynced_dir: AtomicBool::new(self.unsynced_dir.load(Ordering::Acquire)),
            partial: None,
        }
    }

    /// The data file.
    pub fn data_file(&self) -> &File {
        &self.data
    }

    /// Whether the layer is sealed (immutable).
    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }

    /// The layer checksum (blake3 of its metadata), once sealed.
    pub fn checksum(&self) -> Option<[u8; 32]> {
        self.checksum.get().copied()
    }

    /// Writes the (unsealed) metadata file atomically.
    fn write_meta(&self) -> Result<()> {
        let header = self.header(false);
        let enc = meta::encode(&header, &self.dirty, &self.zero, &self.hashes, false);
        fsutil::atomic_write(&self.dir, META_FILE, &enc.bytes)
    }

    /// Seals the layer: writes its metadata with the hash table and checksum atomically.
    /// Callers have synced the data and stopped writing. Returns a read-only copy whose
    /// hash table is packed, so a sealed layer's memory follows the blocks it holds.
    pub fn seal(&self) -> Result<Layer> {
        let enc = self.encode_sealed();
        fsutil::atomic_write(&self.dir, META_FILE, &enc.bytes)?;
        self.sync_parent_dir()?;
        Ok(self.mark_sealed(enc))
    }

    /// The sealed metadata record of this layer as it is now.
    pub fn encode_sealed(&self) -> meta::Encoded {
        let header = self.header(true);
        meta::encode(&header, &self.dirty, &self.zero, &self.hashes, true)
    }

    /// Records that `enc` (from `encode_sealed`) is durably in place; returns the
    /// read-only copy with a packed hash table.
    pub fn mark_sealed(&self, enc: meta::Encoded) -> Layer {
        let _ = self.checksum.set(enc.checksum);
        self.sealed.store(true, Ordering::Release);
        let mut copy = self.reshaped(self.size_blocks, self.parent.clone());
        copy.hashes = HashTable::packed(self.size_blocks, &enc.data, enc.values);
        copy.changed = AtomicBool::new(false);
        copy
    }

    /// Syncs the directory holding this layer's directory, once.
    pub fn sync_parent_dir(&self) -> Result<()> {
        if self.unsynced_dir.swap(false, Ordering::AcqRel) {
            if let Some(parent) = self.dir.parent() {
                fsutil::fsync_dir(parent)?;
            }
        }
        Ok(())
    }

    fn header(&self, sealed: bool) -> Header {
        Header {
            id: self.id.clone(),
            parent: self.parent.clone(),
            size_blocks: self.size_blocks,
            sealed,
        }
    }

    /// Makes flushed writes durable: the bitmaps are snapshotted first, the data synced,
    /// then the snapshot written, so the metadata never names blocks whose data is not
    /// durable.
    pub fn flush(&self) -> Result<()> {
        let snapshot = self.changed.swap(false, Ordering::AcqRel).then(|| {
            let header = self.header(false);
            meta::encode(&header, &self.dirty, &self.zero, &self.hashes, false).bytes
        });
        self.sync_data()?;
        if let Some(bytes) = snapshot {
            let res = fsutil::atomic_write(&self.dir, META_FILE, &bytes)
                .and_then(|()| self.sync_parent_dir());
            if let Err(e) = res {
                self.changed.store(true, Ordering::Release);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Syncs the data file.
    pub fn sync_data(&self) -> Result<()> {
        self.data
            .sync_data()
            .map_err(|e| Error::io(format!("sync data of layer {}", self.id), e))
    }

    /// Reads whole blocks starting at `first` into `buf` (a multiple of 4096 bytes).
    /// Blocks of a sealed layer are checked against their hashes.
    pub fn read_blocks(&self, first: u64, buf: &mut [u8]) -> Result<()> {
        if let Some(p) = &self.partial {
            p.ensure(&self.id, first, (buf.len() / BS) as u64)?;
        }
        let res = if self.direct && !fsutil::is_aligned(buf) {
            let mut bounce = AlignedBuf::new(buf.len());
            let r = fsutil::read_exact_at(&self.data, &mut bounce[..buf.len()], first * BLOCK_SIZE);
            buf.copy_from_slice(&bounce[..buf.len()]);
            r
        } else {
            fsutil::read_exact_at(&self.data, buf, first * BLOCK_SIZE)
        };
        res.map_err(|e| self.read_error(first, buf.len(), e))?;
        if self.is_sealed() {
            self.check_hashes(first, buf)?;
        }
        Ok(())
    }

    fn read_error(&self, first: u64, len: usize, e: std::io::Error) -> Error {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            let last = first + (len / BS) as u64 - 1;
            let reason = format!("data file is truncated (blocks {first}..={last})");
            Error::corrupt(&self.id, reason)
        } else {
            Error::io(format!("read data of layer {}", self.id), e)
        }
    }

    fn check_hashes(&self, first: u64, buf: &[u8]) -> Result<()> {
        for (i, block) in buf.chunks_exact(BS).enumerate() {
            let b = first + i as u64;
            if xxh3_64(block) != self.hashes.get(b) {
                let reason = format!("block {b} does not match its hash");
                return Err(Error::corrupt(&self.id, reason));
            }
        }
        Ok(())
    }

    /// Writes whole blocks starting at `first` from `buf` into the data file.
    pub fn write_blocks(&self, first: u64, buf: &[u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let res = if self.direct && !fsutil::is_aligned(buf) {
            let mut bounce = AlignedBuf::new(buf.len());
            bounce[..buf.len()].copy_from_slice(buf);
            self.data
                .write_all_at(&bounce[..buf.len()], first * BLOCK_SIZE)
        } else {
            self.data.write_all_at(buf, first * BLOCK_SIZE)
        };
        res.map_err(|e| Error::io(format!("write data of layer {}", self.id), e))
    }

    /// Frees the data of `count` blocks from `first`.
    pub fn punch(&self, first: u64, count: u64) -> Result<()> {
        fsutil::punch_hole(&self.data, first * BLOCK_SIZE, count * BLOCK_SIZE)
            .map_err(|e| Error::io(format!("punch hole in layer {}", self.id), e))
    }

    /// Runs of consecutive held data blocks, each at most `MAX_RUN` long.
    pub fn data_runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        runs(self.dirty.iter_ones().filter(|&b| !self.zero.get(b)))
    }

    /// Recomputes the hashes of every held data block (recovery of an overlay).
    fn recompute_hashes(&self) -> Result<()> {
        let mut buf = AlignedBuf::new((MAX_RUN * BLOCK_SIZE) as usize);
        for (first, count) in self.data_runs().collect::<Vec<_>>() {
            let bytes = &mut buf[..(count * BLOCK_SIZE) as usize];
            self.read_blocks(first, bytes)?;
            for (i, block) in bytes.chunks_exact(BS).enumerate() {
                self.hashes.set(first + i as u64, xxh3_64(block));
            }
        }
        Ok(())
    }

    /// Re-reads every held data block and checks it against its hash, and the metadata
    /// file against the recorded checksum.
    pub fn verify(&self) -> Result<()> {
        let mut buf = AlignedBuf::new((MAX_RUN * BLOCK_SIZE) as usize);
        for (first, count) in self.data_runs().collect::<Vec<_>>() {
            self.read_blocks(first, &mut buf[..(count * BLOCK_SIZE) as usize])?;
        }
        let on_disk = Layer::open(&self.dir, &self.id, false, false)?;
        if on_disk.checksum() != self.checksum() {
            return Err(Error::corrupt(
                &self.id,
                "metadata changed since it was loaded",
            ));
        }
        Ok(())
    }

    /// Bytes the data file occupies on disk.
    pub fn bytes_on_disk(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.data.metadata().map_or(0, |m| m.blocks() * 512)
    }
}

/// Groups ascending block numbers into runs `(first, count)` of at most `MAX_RUN`.
pub fn runs(blocks: impl Iterator<Item = u64>) -> impl Iterator<Item = (u64, u64)> {
    let mut blocks = blocks.peekable();
    std::iter::from_fn(move || {
        let first = blocks.next()?;
        let mut count = 1;
        while count < MAX_RUN && blocks.peek() == Some(&(first + count)) {
            blocks.next();
            count += 1;
        }
        Some((first, count))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_group_and_split() {
        let v: Vec<_> = runs([1, 2, 3, 7, 8].into_iter()).collect();
        assert_eq!(v, vec![(1, 3), (7, 2)]);
        let v: Vec<_> = runs(0..600).collect();
        assert_eq!(v, vec![(0, 256), (256, 256), (512, 88)]);
    }

    #[test]
    fn sealed_layer_detects_flipped_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let id = LayerId::random().unwrap();
        let ldir = dir.path().join(id.as_str());
        let layer = Layer::create(&ldir, id.clone(), None, 4, false, true).unwrap();
        let block = vec![7u8; BS];
        layer.write_blocks(1, &block).unwrap();
        layer.dirty.set(1);
        layer.hashes.set(1, xxh3_64(&block));
        layer.seal().unwrap();
        let opened = Layer::open(&ldir, &id, false, true).unwrap();
        opened.verify().unwrap();
        let f = File::options()
            .write(true)
            .open(ldir.join(DATA_FILE))
            .unwrap();
        std::os::unix::fs::FileExt::write_at(&f, &[8], BLOCK_SIZE + 5).unwrap();
        assert!(matches!(opened.verify(), Err(Error::Corrupt { .. })));
        f.set_len(100).unwrap();
        let err = opened.read_blocks(1, &mut vec![0; BS]).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}
