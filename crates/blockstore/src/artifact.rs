//! Export and import of a chain segment as one packed artifact.
//!
//! Layout: `magic "SFARTIF1" | version u32 | nlayers u32`, then per layer, bottom to top,
//! its metadata record exactly as stored (see `meta`), zero padding to the next multiple
//! of 4096 bytes of the artifact, then its held non-zero blocks (4096 bytes each) in
//! block order; then `"SFAEND\0\0"` and a blake3 checksum of
//! every byte before the trailer except the data blocks. The blocks need no second
//! checksum: each is checked against its hash in the (checksummed) metadata.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::fsutil::{self, AlignedBuf};
use crate::id::LayerId;
use crate::layer::{self, runs, Layer, MAX_RUN};
use crate::meta::{self, HashingReader, Meta};
use crate::store::Store;
use crate::{Error, Result, BLOCK_SIZE};

const MAGIC: &[u8; 8] = b"SFARTIF1";
const TRAILER: &[u8; 8] = b"SFAEND\0\0";
/// Version of the artifact format.
pub const VERSION: u32 = 1;
/// Most layers one artifact may carry.
pub const MAX_LAYERS: u32 = 4096;
const BS: usize = BLOCK_SIZE as usize;
/// Bytes of the artifact header.
const HEADER_LEN: u64 = 16;

/// What an export wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportStats {
    pub layers: usize,
    /// Data blocks written.
    pub blocks: u64,
    /// Total bytes written.
    pub bytes: u64,
}

/// Where an artifact goes: any stream, or a file (data blocks then move in-kernel).
enum Out<'a> {
    Stream(&'a mut dyn Write),
    File(&'a File),
}

/// A writer that hashes the structure (not the data blocks) and counts bytes.
struct HashingWriter<'a> {
    out: Out<'a>,
    hasher: blake3::Hasher,
    bytes: u64,
}

impl HashingWriter<'_> {
    fn put(&mut self, buf: &[u8]) -> Result<()> {
        self.hasher.update(buf);
        self.put_data(buf)
    }

    fn put_data(&mut self, buf: &[u8]) -> Result<()> {
        self.bytes += buf.len() as u64;
        let res = match &mut self.out {
            Out::Stream(w) => w.write_all(buf),
            Out::File(mut f) => f.write_all(buf),
        };
        res.map_err(|e| Error::io("write artifact", e))
    }

    fn flush(&mut self) -> Result<()> {
        let res = match &mut self.out {
            Out::Stream(w) => w.flush(),
            Out::File(_) => Ok(()),
        };
        res.map_err(|e| Error::io("write artifact", e))
    }
}

impl Store {
    /// Writes the layers above `base` (or from the bottom) up to `top` as one artifact.
    pub fn export(
        &self,
        top: &LayerId,
        base: Option<&LayerId>,
        out: &mut dyn Write,
    ) -> Result<ExportStats> {
        self.export_to(top, base, Out::Stream(out))
    }

    /// Like `export`, writing at the current position of `out`; data blocks are copied
    /// in the kernel (copy_file_range) without being read into memory. They are not
    /// re-checked on the way out: `import` checks every block.
    pub fn export_file(
        &self,
        top: &LayerId,
        base: Option<&LayerId>,
        out: &File,
    ) -> Result<ExportStats> {
        self.export_to(top, base, Out::File(out))
    }

    fn export_to(&self, top: &LayerId, base: Option<&LayerId>, out: Out) -> Result<ExportStats> {
        let segment = self.segment(top, base)?;
        let mut w = HashingWriter {
            out,
            hasher: blake3::Hasher::new(),
            bytes: 0,
        };
        w.put(MAGIC)?;
        w.put(&VERSION.to_le_bytes())?;
        w.put(&(segment.len() as u32).to_le_bytes())?;
        let mut stats = ExportStats::default();
        for id in &segment {
            stats.blocks += self.export_layer(id, &mut w)?;
        }
        let sum = w.hasher.finalize();
        w.put(TRAILER)?;
        w.put(sum.as_bytes())?;
        w.flush()?;
        stats.layers = segment.len();
        stats.bytes = w.bytes;
        Ok(stats)
    }

    /// The chain from just above `base` up to `top`.
    fn segment(&self, top: &LayerId, base: Option<&LayerId>) -> Result<Vec<LayerId>> {
        let chain = self.chain_of(top)?;
        let Some(base) = base else {
            return Ok(chain);
        };
        match chain.iter().position(|l| l == base) {
            Some(i) if i + 1 < chain.len() => Ok(chain[i + 1..].to_vec()),
            _ => Err(Error::NotAncestor {
                base: base.to_string(),
                top: top.to_string(),
            }),
        }
    }

    fn export_layer(&self, id: &LayerId, w: &mut HashingWriter<'_>) -> Result<u64> {
        // A partial layer's data file has holes where chunks are still to come.
        self.complete(id)?;
        let layer = self.load_sealed(id)?;
        let meta_path = self.layer_dir(id).join(layer::META_FILE);
        let bytes = fs::read(&meta_path)
            .map_err(|e| Error::io(format!("read {}", meta_path.display()), e))?;
        if blake3::hash(&bytes[..bytes.len().saturating_sub(32)]).as_bytes()[..]
            != layer.checksum().unwrap_or_default()[..]
        {
            return Err(Error::corrupt(id, "metadata file changed on disk"));
        }
        w.put(&bytes)?;
        w.put(&[0u8; BS][..padding(w.bytes)])?;
        if let Out::File(f) = w.out {
            if copy_layer(&layer, f)? {
                let n = layer.data_runs().map(|(_, count)| count).sum::<u64>();
                w.bytes += n * BLOCK_SIZE;
                return Ok(n);
            }
        }
        stream_layer(&layer, w)
    }

    /// Reads an artifact, verifies every block hash, layer checksum and the trailer, and
    /// only then moves its layers into the store (layers already present are kept).
    /// Returns the top layer.
    pub fn import(&self, input: &mut dyn Read) -> Result<LayerId> {
        let _gc = self.gc_shared()?;
        self.import_locked(input)
    }

    pub(crate) fn import_locked(&self, input: &mut dyn Read) -> Result<LayerId> {
        let mut importer = Importer {
            store: self,
            staging: Staging::new(self)?,
            fresh: Vec::new(),
        };
        let layers = walk(input, &mut importer)?;
        for id in &importer.fresh {
            let dir = importer.staging.dir.join(id.as_str());
            self.publish_layer(&dir, id)?;
        }
        layers
            .last()
            .map(|l| l.id.clone())
            .ok_or_else(|| Error::artifact("no layers"))
    }
}

/// One layer of an artifact, as `verify_artifact` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactLayer {
    pub id: LayerId,
    pub parent: Option<LayerId>,
    /// Size in bytes.
    pub size: u64,
    /// Data blocks the artifact carries for this layer.
    pub data_blocks: u64,
}

/// Reads a whole artifact and checks everything that does not need a store: structure,
/// chain links, every block hash, every layer checksum and the trailer. Returns the
/// layers bottom to top.
pub fn verify_artifact(input: &mut dyn Read) -> Result<Vec<ArtifactLayer>> {
    walk(input, &mut NoSink)
}

/// Decides, layer by layer, where an artifact's blocks go.
trait Sink {
    /// Called with each layer's metadata before its blocks; returns the file to write
    /// them to, or None to only check them.
    fn begin(&mut self, m: &Meta, bottom: bool) -> Result<Option<File>>;
    /// Called once the layer's blocks were read and checked.
    fn end(&mut self, m: &Meta, raw: &[u8], data: Option<File>) -> Result<()>;
}

struct NoSink;

impl Sink for NoSink {
    fn begin(&mut self, _: &Meta, _: bool) -> Result<Option<File>> {
        Ok(None)
    }

    fn end(&mut self, _: &Meta, _: &[u8], _: Option<File>) -> Result<()> {
        Ok(())
    }
}

/// Stages new layers under tmp/ for `Store::import`.
struct Importer<'a> {
    store: &'a Store,
    staging: Staging,
    fresh: Vec<LayerId>,
}

impl Sink for Importer<'_> {
    fn begin(&mut self, m: &Meta, bottom: bool) -> Result<Option<File>> {
        let h = &m.header;
        if let Some(p) = h.parent.as_ref().filter(|_| bottom) {
            if Layer::read_header(&self.store.layer_dir(p), p).is_err() {
                return Err(Error::MissingParent {
                    layer: h.id.to_string(),
                    parent: p.to_string(),
                });
            }
        }
        if self.store.layer_dir(&h.id).join(layer::META_FILE).exists() {
            return Ok(None);
        }
        let dir = self.staging.dir.join(h.id.as_str());
        fs::create_dir(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        fsutil::open_data(&dir.join(layer::DATA_FILE), true, true, false).map(Some)
    }

    fn end(&mut self, m: &Meta, raw: &[u8], data: Option<File>) -> Result<()> {
        let Some(data) = data else {
            return Ok(());
        };
        data.sync_all()
            .map_err(|e| Error::io("sync imported data", e))?;
        let dir = self.staging.dir.join(m.header.id.as_str());
        fsutil::atomic_write(&dir, layer::META_FILE, raw)?;
        self.fresh.push(m.header.id.clone());
        Ok(())
    }
}

/// Reads an artifact from start to trailer, checking each layer and handing it to `sink`.
fn walk(input: &mut dyn Read, sink: &mut dyn Sink) -> Result<Vec<ArtifactLayer>> {
    let mut r = HashingReader::new(input);
    let count = read_header(&mut r)?;
    let mut pos = HEADER_LEN;
    let mut layers: Vec<ArtifactLayer> = Vec::new();
    for _ in 0..count {
        let (m, raw) = read_meta(&mut r)?;
        check_links(&m, &layers)?;
        pos += raw.len() as u64;
        read_padding(&mut r, padding(pos))?;
        pos += padding(pos) as u64;
        let out = sink.begin(&m, layers.is_empty())?;
        let data_blocks = read_blocks(&mut r.inner, &m, out.as_ref())?;
        pos += data_blocks * BLOCK_SIZE;
        sink.end(&m, &raw, out)?;
        layers.push(ArtifactLayer {
            id: m.header.id.clone(),
            parent: m.header.parent.clone(),
            size: m.header.size_blocks * BLOCK_SIZE,
            data_blocks,
        });
    }
    read_trailer(&mut r)?;
    Ok(layers)
}

/// Zero bytes after a metadata record up to the next multiple of 4096 from the start of
/// the artifact, so data blocks sit at aligned offsets (in-kernel copies stay fast).
fn padding(pos: u64) -> usize {
    ((BLOCK_SIZE - pos % BLOCK_SIZE) % BLOCK_SIZE) as usize
}

fn read_padding(r: &mut impl Read, len: usize) -> Result<()> {
    let mut pad = [0u8; BS];
    r.read_exact(&mut pad[..len]).map_err(artifact_io)?;
    if pad[..len].iter().any(|&b| b != 0) {
        return Err(Error::artifact("non-zero padding"));
    }
    Ok(())
}

/// Decodes one metadata record, keeping its raw bytes.
fn read_meta(r: &mut HashingReader<&mut dyn Read>) -> Result<(Meta, Vec<u8>)> {
    let mut tee = Tee {
        inner: r,
        seen: Vec::new(),
    };
    let m = meta::decode(&mut tee).map_err(|e| match e {
        meta::MetaError::Io(e) => artifact_io(e),
        e => Error::artifact(format!("layer metadata: {}", e.reason())),
    })?;
    Ok((m, tee.seen))
}

/// Each layer is sealed, appears once, and sits on the previous one.
fn check_links(m: &Meta, below: &[ArtifactLayer]) -> Result<()> {
    let h = &m.header;
    if !h.sealed || !m.has_hashes {
        return Err(Error::artifact(format!("layer {} is not sealed", h.id)));
    }
    if below.iter().any(|l| l.id == h.id) {
        return Err(Error::artifact(format!("layer {} appears twice", h.id)));
    }
    match below.last() {
        Some(prev) if h.parent.as_ref() != Some(&prev.id) => {
            Err(Error::artifact(format!("layer {} breaks the chain", h.id)))
        }
        _ => Ok(()),
    }
}

/// Writes every data block of `layer` to `w`; a second thread reads (and checks) the
/// next runs while this one writes.
fn stream_layer(layer: &Layer, w: &mut HashingWriter<'_>) -> Result<u64> {
    let runs: Vec<(u64, u64)> = layer.data_runs().collect();
    let (full_tx, full_rx) = mpsc::sync_channel::<Result<(AlignedBuf, usize)>>(2);
    let (free_tx, free_rx) = mpsc::channel::<AlignedBuf>();
    for _ in 0..3 {
        let _ = free_tx.send(AlignedBuf::new((MAX_RUN * BLOCK_SIZE) as usize));
    }
    std::thread::scope(|s| {
        s.spawn(move || {
            for (first, count) in runs {
                let Ok(mut buf) = free_rx.recv() else { return };
                let n = count as usize * BS;
                let res = layer.read_blocks(first, &mut buf[..n]).map(|()| (buf, n));
                let failed = res.is_err();
                if full_tx.send(res).is_err() || failed {
                    return;
                }
            }
        });
        // Dropping both channel ends on return (early or not) ends the reader.
        let (full_rx, free_tx) = (full_rx, free_tx);
        let mut blocks = 0;
        for item in full_rx {
            let (buf, n) = item?;
            w.put_data(&buf[..n])?;
            blocks += (n / BS) as u64;
            let _ = free_tx.send(buf);
        }
        Ok(blocks)
    })
}

/// Copies every data block of `layer` to `out` in-kernel, merging adjacent runs.
/// Returns false, having copied nothing, when the file systems cannot do it.
fn copy_layer(layer: &Layer, out: &File) -> Result<bool> {
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (first, count) in layer.data_runs() {
        match merged.last_mut() {
            Some((f, c)) if *f + *c == first => *c += count,
            _ => merged.push((first, count)),
        }
    }
    for (i, (first, count)) in merged.into_iter().enumerate() {
        if !copy_range(layer, out, first, count)? {
            if i == 0 {
                return Ok(false);
            }
            return Err(Error::io(
                "copy layer data",
                std::io::ErrorKind::Unsupported.into(),
            ));
        }
    }
    Ok(true)
}

/// Copies blocks `first..first + count` of `layer` to the current position of `out`.
/// Returns false, having copied nothing, when the file systems cannot do it in-kernel.
fn copy_range(layer: &Layer, out: &File, first: u64, count: u64) -> Result<bool> {
    use nix::errno::Errno;
    let mut off = (first * BLOCK_SIZE) as i64;
    let mut left = count * BLOCK_SIZE;
    while left > 0 {
        let done = left == count * BLOCK_SIZE;
        let n = match nix::fcntl::copy_file_range(
            layer.data_file(),
            Some(&mut off),
            out,
            None,
            left as usize,
        ) {
            Err(Errno::EINVAL | Errno::EXDEV | Errno::ENOSYS | Errno::EOPNOTSUPP) if done => {
                return Ok(false)
            }
            r => r.map_err(|e| Error::io(format!("copy data of layer {}", layer.id), e.into()))?,
        };
        if n == 0 {
            return Err(Error::corrupt(&layer.id, "data file is truncated"));
        }
        left -= n as u64;
    }
    Ok(true)
}

fn artifact_io(e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Error::artifact("truncated")
    } else {
        Error::io("read artifact", e)
    }
}

fn read_header(r: &mut impl Read) -> Result<u32> {
    let mut head = [0u8; 16];
    r.read_exact(&mut head).map_err(artifact_io)?;
    if &head[..8] != MAGIC {
        return Err(Error::artifact("bad magic"));
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if version != VERSION {
        return Err(Error::artifact(format!("unsupported version {version}")));
    }
    let count = u32::from_le_bytes([head[12], head[13], head[14], head[15]]);
    if count == 0 || count > MAX_LAYERS {
        return Err(Error::artifact(format!("bad layer count {count}")));
    }
    Ok(count)
}

fn read_trailer(r: &mut HashingReader<&mut dyn Read>) -> Result<()> {
    let expected = r.hasher.finalize();
    let mut trailer = [0u8; 40];
    r.inner.read_exact(&mut trailer).map_err(artifact_io)?;
    if &trailer[..8] != TRAILER || trailer[8..] != expected.as_bytes()[..] {
        return Err(Error::artifact("trailer checksum mismatch"));
    }
    Ok(())
}

/// Reads a layer's data blocks, checks each against its hash and writes it to `out`.
fn read_blocks(r: &mut impl Read, m: &Meta, out: Option<&fs::File>) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; (MAX_RUN * BLOCK_SIZE) as usize];
    let held = m.dirty.iter_ones().filter(|&b| !m.zero.get(b));
    let mut total = 0;
    for (first, count) in runs(held) {
        total += count;
        let part = &mut buf[..count as usize * BS];
        r.read_exact(part).map_err(artifact_io)?;
        for (i, block) in part.chunks_exact(BS).enumerate() {
            let b = first + i as u64;
            if xxh3_64(block) != m.hashes.get(b) {
                let id = &m.header.id;
                return Err(Error::artifact(format!(
                    "block {b} of layer {id} fails its hash"
                )));
            }
        }
        if let Some(f) = out {
            f.write_all_at(part, first * BLOCK_SIZE)
                .map_err(|e| Error::io("write imported data", e))?;
        }
    }
    Ok(total)
}

/// A reader that records what it yields (the raw metadata bytes).
struct Tee<'a, R> {
    inner: &'a mut R,
    seen: Vec<u8>,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.seen.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

/// A staging directory under tmp/, removed when dropped.
struct Staging {
    dir: PathBuf,
}

impl Staging {
    fn new(store: &Store) -> Result<Staging> {
        let dir = store
            .dir("tmp")
            .join(format!("import-{}", LayerId::random()?));
        fs::create_dir(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        Ok(Staging { dir })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
