//! Partial layers: sealed layers whose metadata is here and whose blocks arrive from an
//! object store chunk by chunk, as reads need them (docs/scale-out.md).
//!
//! In the object store a layer's held blocks are packed in block order, as in an
//! artifact. A **chunk** is [`CHUNK_BLOCKS`] consecutive blocks of the layer's address
//! space, so its held blocks are one contiguous byte range of the packed object: one
//! ranged GET. The **chunk table** lists, for every chunk holding blocks, how many it
//! holds and the blake3 of their packed bytes.
//!
//! A partial layer's directory holds, beside `meta` and the sparse `data`:
//!
//! ```text
//! chunks    the chunk table (format below), checked against `meta` when the layer came
//! present   one bit per chunk, set once the chunk's blocks are in `data` and synced
//! ```
//!
//! Reads of a block whose chunk is not present ask the store's [`Fetch`] for it and wait.
//! Whoever fetches writes the blocks with [`Store::fill_chunk`], which checks them against
//! the table's blake3 and each block against its hash in `meta` before a bit is set. Once
//! every chunk is present both files go and the layer is an ordinary one.
//!
//! What a loaded layer reads through — its present bitmap and the [`Fetch`] — is
//! `crate::partial`, so that the store and the layers need nothing of this module.
//!
//! Chunk table (little-endian): `"SFCHUNK1" | chunk blocks u32 | count u32 | count ×
//! (chunk u32, blocks u16, blake3 32) | blake3 of everything before`.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::fsutil;
use crate::id::LayerId;
use crate::layer::{self, runs, Layer, MAX_RUN};
use crate::meta::{self, Meta};
use crate::partial::chunks_of;
use crate::store::Store;
use crate::{Error, Result, BLOCK_SIZE};

pub use crate::partial::{Fetch, CHUNK_BLOCKS, PRESENT_FILE};

/// The chunk table inside a partial layer's directory.
pub const CHUNKS_FILE: &str = "chunks";
/// The socket in a store's root where the store's owner answers fetches.
pub const FETCH_SOCKET: &str = "fetch.sock";

const MAGIC: &[u8; 8] = b"SFCHUNK1";
const ENTRY_LEN: usize = 4 + 2 + 32;
const BS: usize = BLOCK_SIZE as usize;

/// One chunk holding blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    /// Index of the chunk in the layer's address space.
    pub chunk: u64,
    /// Index of its first block in the packed object.
    pub first: u64,
    /// Held blocks in it.
    pub blocks: u64,
    /// blake3 of those blocks' packed bytes.
    pub hash: [u8; 32],
}

impl ChunkEntry {
    /// The chunk's byte range in the packed object.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.first * BLOCK_SIZE..(self.first + self.blocks) * BLOCK_SIZE
    }
}

/// Every chunk of a layer that holds blocks, in chunk order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkTable {
    entries: Vec<ChunkEntry>,
}

impl ChunkTable {
    /// The entries, in chunk order.
    pub fn entries(&self) -> &[ChunkEntry] {
        &self.entries
    }

    /// The entry of chunk `chunk`, if it holds blocks.
    pub fn get(&self, chunk: u64) -> Option<&ChunkEntry> {
        let i = self
            .entries
            .binary_search_by_key(&chunk, |e| e.chunk)
            .ok()?;
        Some(&self.entries[i])
    }

    /// Bytes of the packed object.
    pub fn packed_bytes(&self) -> u64 {
        self.entries.last().map_or(0, |e| e.range().end)
    }

    fn push(&mut self, chunk: u64, blocks: u64, hash: [u8; 32]) {
        let first = self.entries.last().map_or(0, |e| e.first + e.blocks);
        self.entries.push(ChunkEntry {
            chunk,
            first,
            blocks,
            hash,
        });
    }

    /// The table's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.entries.len() * ENTRY_LEN + 32);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(CHUNK_BLOCKS as u32).to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&(e.chunk as u32).to_le_bytes());
            out.extend_from_slice(&(e.blocks as u16).to_le_bytes());
            out.extend_from_slice(&e.hash);
        }
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }

    /// Decodes a table, checking its structure and checksum (not yet against a layer).
    pub fn decode(bytes: &[u8]) -> Result<ChunkTable> {
        let bad = |why: &str| Error::artifact(format!("chunk table: {why}"));
        if bytes.len() < 16 + 32 || &bytes[..8] != MAGIC {
            return Err(bad("bad magic or truncated"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if blake3::hash(body).as_bytes()[..] != sum[..] {
            return Err(bad("checksum mismatch"));
        }
        let word =
            |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        if u64::from(word(8)) != CHUNK_BLOCKS {
            return Err(bad("unsupported chunk size"));
        }
        let count = word(12) as usize;
        if body.len() != 16 + count * ENTRY_LEN {
            return Err(bad("length does not match its entry count"));
        }
        let mut table = ChunkTable::default();
        for e in body[16..].chunks_exact(ENTRY_LEN) {
            let chunk = u64::from(u32::from_le_bytes([e[0], e[1], e[2], e[3]]));
            let blocks = u64::from(u16::from_le_bytes([e[4], e[5]]));
            if table.entries.last().is_some_and(|l| l.chunk >= chunk) {
                return Err(bad("chunks out of order"));
            }
            if blocks == 0 || blocks > CHUNK_BLOCKS || chunk >= meta::MAX_BLOCKS / CHUNK_BLOCKS {
                return Err(bad("entry out of range"));
            }
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&e[6..]);
            table.push(chunk, blocks, hash);
        }
        Ok(table)
    }

    /// Checks that the table lists exactly the held blocks of `m`, chunk by chunk.
    fn check_against(&self, m: &Meta) -> Result<()> {
        let mut counts = self.entries.iter();
        let mut current: Option<(u64, u64)> = None;
        let mismatch =
            || Error::artifact(format!("chunk table does not match layer {}", m.header.id));
        let mut close = |c: Option<(u64, u64)>| -> Result<()> {
            let Some((chunk, n)) = c else { return Ok(()) };
            match counts.next() {
                Some(e) if e.chunk == chunk && e.blocks == n => Ok(()),
                _ => Err(mismatch()),
            }
        };
        for b in held(m) {
            let chunk = b / CHUNK_BLOCKS;
            match &mut current {
                Some((c, n)) if *c == chunk => *n += 1,
                _ => {
                    close(current.take())?;
                    current = Some((chunk, 1));
                }
            }
        }
        close(current)?;
        match counts.next() {
            None => Ok(()),
            Some(_) => Err(mismatch()),
        }
    }
}

/// Held (non-zero) blocks of a decoded layer, ascending.
fn held(m: &Meta) -> impl Iterator<Item = u64> + '_ {
    m.dirty.iter_ones().filter(|&b| !m.zero.get(b))
}

/// A layer to add as partial: its metadata record and chunk table, as published.
#[derive(Clone, Debug)]
pub struct RemoteLayer {
    pub meta: Vec<u8>,
    pub chunks: Vec<u8>,
}

impl Store {
    /// Sets what fetches the chunks of partial layers for this store's readers.
    pub fn set_fetcher(&self, fetch: Arc<dyn Fetch>) {
        let _ = self.inner.fetch.set(fetch);
    }

    pub(crate) fn fetcher(&self) -> Option<Arc<dyn Fetch>> {
        self.inner.fetch.get().cloned()
    }

    /// Adds `layers` (bottom to top, each on the one before; the bottom one's parent must
    /// be here) as partial layers and pins the top one under `pin`. Layers already here
    /// are kept as they are. Everything is checked before anything is visible: each
    /// record's checksum, that it is sealed, its chain links and its chunk table.
    pub fn add_remote_chain(&self, layers: &[RemoteLayer], pin: &str) -> Result<LayerId> {
        crate::id::validate_name(pin)?;
        let _gc = self.gc_shared()?;
        let mut top: Option<LayerId> = None;
        for l in layers {
            let m = meta::decode(&mut &l.meta[..])
                .map_err(|e| Error::artifact(format!("layer metadata: {}", e.reason())))?;
            let h = &m.header;
            if !h.sealed || !m.has_hashes {
                return Err(Error::artifact(format!("layer {} is not sealed", h.id)));
            }
            match (&top, &h.parent) {
                (Some(below), p) if p.as_ref() != Some(below) => {
                    return Err(Error::artifact(format!("layer {} breaks the chain", h.id)))
                }
                (None, Some(p)) if Layer::read_header(&self.layer_dir(p), p).is_err() => {
                    return Err(Error::MissingParent {
                        layer: h.id.to_string(),
                        parent: p.to_string(),
                    })
                }
                _ => {}
            }
            let table = ChunkTable::decode(&l.chunks)?;
            table.check_against(&m)?;
            if !self.layer_dir(&h.id).join(layer::META_FILE).exists() {
                self.stage_partial(&m, l)?;
            }
            top = Some(h.id.clone());
        }
        let top = top.ok_or_else(|| Error::artifact("no layers"))?;
        self.set_ref_locked(pin, &top)?;
        Ok(top)
    }

    fn stage_partial(&self, m: &Meta, l: &RemoteLayer) -> Result<()> {
        let id = &m.header.id;
        let dir = self
            .dir("tmp")
            .join(format!("remote-{}", LayerId::random()?));
        fs::create_dir(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let staged = (|| {
            fsutil::open_data(&dir.join(layer::DATA_FILE), true, true, false)?;
            let bits = vec![0u8; chunks_of(m.header.size_blocks).div_ceil(8) as usize];
            fsutil::atomic_write(&dir, PRESENT_FILE, &bits)?;
            fsutil::atomic_write(&dir, CHUNKS_FILE, &l.chunks)?;
            fsutil::atomic_write(&dir, layer::META_FILE, &l.meta)?;
            self.publish_layer(&dir, id)
        })();
        if staged.is_err() {
            let _ = fs::remove_dir_all(&dir);
        }
        staged
    }

    /// Whether layer `id` still misses chunks.
    pub fn is_partial(&self, id: &LayerId) -> bool {
        self.layer_dir(id).join(PRESENT_FILE).exists()
    }

    /// The chunk table of partial layer `id`.
    pub fn chunk_table(&self, id: &LayerId) -> Result<ChunkTable> {
        let path = self.layer_dir(id).join(CHUNKS_FILE);
        let bytes = fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::LayerNotFound(id.to_string()),
            _ => Error::io(format!("read {}", path.display()), e),
        })?;
        ChunkTable::decode(&bytes)
    }

    /// The chunks partial layer `id` still misses (none for a whole layer).
    pub fn missing_chunks(&self, id: &LayerId) -> Result<Vec<u64>> {
        let dir = self.layer_dir(id);
        let bits = match fs::read(dir.join(PRESENT_FILE)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            r => r.map_err(|e| Error::io(format!("read the present bitmap of {id}"), e))?,
        };
        let table = self.chunk_table(id)?;
        Ok(missing(&table, &bits))
    }

    /// Fetches every chunk partial layer `id` still misses, through the store's fetcher.
    pub fn complete(&self, id: &LayerId) -> Result<()> {
        let missing = self.missing_chunks(id)?;
        if missing.is_empty() {
            return Ok(());
        }
        let Some(fetch) = self.fetcher() else {
            return Err(Error::io(
                format!("layer {id} is only partly here and nothing fetches its chunks"),
                std::io::ErrorKind::NotConnected.into(),
            ));
        };
        for chunk in missing {
            fetch
                .fetch(id, chunk)
                .map_err(|e| Error::io(format!("fetch chunk {chunk} of layer {id}"), e))?;
        }
        Ok(())
    }

    /// Writes chunk `chunk` of partial layer `id` from `packed` (its held blocks, packed):
    /// checked against the table's blake3 and each block against its hash, written and
    /// synced, then marked present. The last chunk makes the layer whole.
    pub fn fill_chunk(
        &self,
        id: &LayerId,
        table: &ChunkTable,
        chunk: u64,
        packed: &[u8],
    ) -> Result<()> {
        let entry = table
            .get(chunk)
            .ok_or_else(|| Error::artifact(format!("layer {id} holds nothing in chunk {chunk}")))?;
        if packed.len() as u64 != entry.blocks * BLOCK_SIZE
            || blake3::hash(packed).as_bytes() != &entry.hash
        {
            return Err(Error::corrupt(
                id,
                format!("fetched chunk {chunk} does not match its hash"),
            ));
        }
        let dir = self.layer_dir(id);
        let m = read_meta(&dir, id)?;
        let blocks: Vec<u64> = held(&m)
            .skip_while(|&b| b < chunk * CHUNK_BLOCKS)
            .take_while(|&b| b < (chunk + 1) * CHUNK_BLOCKS)
            .collect();
        if blocks.len() as u64 != entry.blocks {
            return Err(Error::corrupt(
                id,
                format!("chunk {chunk} does not match the layer"),
            ));
        }
        for (block, bytes) in blocks.iter().zip(packed.chunks_exact(BS)) {
            if xxh3_64(bytes) != m.hashes.get(*block) {
                return Err(Error::corrupt(
                    id,
                    format!("fetched block {block} does not match its hash"),
                ));
            }
        }
        let data = File::options()
            .write(true)
            .open(dir.join(layer::DATA_FILE))
            .map_err(|e| Error::io(format!("open data of layer {id}"), e))?;
        let mut at = 0;
        for (first, count) in runs(blocks.into_iter()) {
            let len = (count * BLOCK_SIZE) as usize;
            data.write_all_at(&packed[at..at + len], first * BLOCK_SIZE)
                .map_err(|e| Error::io(format!("write data of layer {id}"), e))?;
            at += len;
        }
        data.sync_data()
            .map_err(|e| Error::io(format!("sync data of layer {id}"), e))?;
        self.mark_present(&dir, id, table, chunk)
    }

    fn mark_present(&self, dir: &Path, id: &LayerId, table: &ChunkTable, chunk: u64) -> Result<()> {
        let path = dir.join(PRESENT_FILE);
        let _lock = fsutil::lock(&dir.join(".present.lock"), true, true)?;
        let mut bits = match fs::read(&path) {
            // Made whole by another filler meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            r => r.map_err(|e| Error::io(format!("read the present bitmap of {id}"), e))?,
        };
        let byte = (chunk / 8) as usize;
        if byte >= bits.len() {
            return Err(Error::corrupt(
                id,
                format!("chunk {chunk} is past the present bitmap"),
            ));
        }
        bits[byte] |= 1 << (chunk % 8);
        let file = File::options()
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        // Not synced: the chunk's data is (before its bit is set), so a bit lost to a
        // power cut only means the chunk is fetched again; a set bit never names data
        // that is not on disk.
        file.write_all_at(&bits[byte..=byte], byte as u64)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        if missing(table, &bits).is_empty() {
            // Whole now: an ordinary layer from here on (readers that opened it partial
            // keep their open bitmap, every bit of which is set).
            for name in [PRESENT_FILE, CHUNKS_FILE, ".present.lock"] {
                let _ = fs::remove_file(dir.join(name));
            }
            fsutil::fsync_dir(dir)?;
        }
        Ok(())
    }

    /// Writes the held blocks of sealed layer `id` to `out`, packed in block order (a
    /// partial layer is completed first), and returns its chunk table.
    pub fn pack_layer(&self, id: &LayerId, out: &mut dyn Write) -> Result<ChunkTable> {
        self.complete(id)?;
        let layer = self.load_sealed(id)?;
        let mut table = ChunkTable::default();
        let mut current: Option<(u64, u64, blake3::Hasher)> = None;
        let mut buf = fsutil::AlignedBuf::new((MAX_RUN * BLOCK_SIZE) as usize);
        for (first, count) in layer.data_runs().collect::<Vec<_>>() {
            let bytes = &mut buf[..(count * BLOCK_SIZE) as usize];
            layer.read_blocks(first, bytes)?;
            for (i, block) in bytes.chunks_exact(BS).enumerate() {
                let chunk = (first + i as u64) / CHUNK_BLOCKS;
                if current.as_ref().is_some_and(|(c, _, _)| *c != chunk) {
                    let (c, n, h) = current.take().unwrap_or_else(|| unreachable!());
                    table.push(c, n, *h.finalize().as_bytes());
                }
                let (_, n, h) = current.get_or_insert_with(|| (chunk, 0, blake3::Hasher::new()));
                *n += 1;
                h.update(block);
            }
            out.write_all(bytes)
                .map_err(|e| Error::io(format!("write packed layer {id}"), e))?;
        }
        if let Some((c, n, h)) = current {
            table.push(c, n, *h.finalize().as_bytes());
        }
        Ok(table)
    }

    /// The metadata record of layer `id`, byte for byte as stored.
    pub fn layer_meta(&self, id: &LayerId) -> Result<Vec<u8>> {
        let path = self.layer_dir(id).join(layer::META_FILE);
        fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::LayerNotFound(id.to_string()),
            _ => Error::io(format!("read {}", path.display()), e),
        })
    }
}

fn read_meta(dir: &Path, id: &LayerId) -> Result<Meta> {
    let path = dir.join(layer::META_FILE);
    let bytes = fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::LayerNotFound(id.to_string()),
        _ => Error::io(format!("read {}", path.display()), e),
    })?;
    meta::decode(&mut &bytes[..]).map_err(|e| Error::corrupt(id, e.reason()))
}

fn missing(table: &ChunkTable, bits: &[u8]) -> Vec<u64> {
    let set = |c: u64| {
        bits.get((c / 8) as usize)
            .is_some_and(|b| b & (1 << (c % 8)) != 0)
    };
    table
        .entries()
        .iter()
        .map(|e| e.chunk)
        .filter(|&c| !set(c))
        .collect()
}

/// One fetch asked of the store's owner over [`FETCH_SOCKET`]: one JSON line each way.
#[derive(Debug, Serialize, Deserialize)]
pub struct FetchRequest {
    pub layer: String,
    pub chunk: u64,
}

/// The answer to a [`FetchRequest`]: `error` is None once the chunk is present.
#[derive(Debug, Serialize, Deserialize)]
pub struct FetchReply {
    pub error: Option<String>,
}

/// A [`Fetch`] that asks the process listening on a Unix socket (the daemon owning the
/// store), waiting up to `patience` for it to be there (it may be restarting).
pub struct SocketFetch {
    path: PathBuf,
    patience: Duration,
}

impl SocketFetch {
    pub fn new(path: PathBuf, patience: Duration) -> SocketFetch {
        SocketFetch { path, patience }
    }

    fn connect(&self) -> std::io::Result<UnixStream> {
        let deadline = Instant::now() + self.patience;
        loop {
            match UnixStream::connect(&self.path) {
                Ok(s) => return Ok(s),
                Err(e) if Instant::now() >= deadline => {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("no fetch service at {}: {e}", self.path.display()),
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

impl Fetch for SocketFetch {
    fn fetch(&self, layer: &LayerId, chunk: u64) -> std::io::Result<()> {
        let deadline = Instant::now() + self.patience;
        loop {
            match self.ask(layer, chunk) {
                // The service went away mid-answer (a restart): ask again.
                Err(e)
                    if Instant::now() < deadline
                        && e.kind() == std::io::ErrorKind::UnexpectedEof =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                r => return r,
            }
        }
    }
}

impl SocketFetch {
    fn ask(&self, layer: &LayerId, chunk: u64) -> std::io::Result<()> {
        let mut stream = self.connect()?;
        let req = FetchRequest {
            layer: layer.to_string(),
            chunk,
        };
        let mut line = serde_json::to_vec(&req)?;
        line.push(b'\n');
        stream.write_all(&line)?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer)?;
        if answer.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let reply: FetchReply = serde_json::from_str(&answer)?;
        match reply.error {
            None => Ok(()),
            Some(e) => Err(std::io::Error::other(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_round_trips_and_refuses_damage() {
        let mut t = ChunkTable::default();
        t.push(0, 3, [1; 32]);
        t.push(7, 256, [2; 32]);
        let bytes = t.encode();
        let back = ChunkTable::decode(&bytes).unwrap();
        assert_eq!(back, t);
        assert_eq!(
            back.get(7).unwrap().range(),
            3 * BLOCK_SIZE..259 * BLOCK_SIZE
        );
        assert_eq!(back.packed_bytes(), 259 * BLOCK_SIZE);
        assert!(back.get(1).is_none());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(ChunkTable::decode(&bad).is_err(), "flipped byte {i}");
        }
        for len in 0..bytes.len() {
            assert!(
                ChunkTable::decode(&bytes[..len]).is_err(),
                "truncated to {len}"
            );
        }
    }
}
