//! Layer metadata: the binary encoding of a layer's header, bitmaps and hash table.
//!
//! Layout (little-endian), followed by a blake3 checksum of all preceding bytes:
//! `magic "SFLAYER1" | version u32 | flags u32 (bit 0 = sealed) | id [16] |
//!  has_parent u8 | parent [16] | size_blocks u64 |
//!  dirty: nchunks u32, nchunks × (index u32, nwords u16, nwords × (word u16, bits u64)) |
//!  zero: same |
//!  nhashes u64, nhashes × u64 (one per held non-zero block, in block order)`.

use std::io::{self, Read};

use crate::bitmap::{Bitmap, ChunkSnap, HashTable, SetBits, Words, CHUNK_BITS, CHUNK_WORDS};
use crate::id::LayerId;

/// Magic at the start of every layer metadata record.
pub const MAGIC: &[u8; 8] = b"SFLAYER1";
/// Version of the metadata encoding.
pub const VERSION: u32 = 2;
/// Largest supported disk: 1 TiB, i.e. 2^28 blocks.
pub const MAX_BLOCKS: u64 = 1 << 28;
const FLAG_SEALED: u32 = 1;
/// Bytes of the fixed header before the bitmaps.
pub const HEADER_LEN: usize = 8 + 4 + 4 + 16 + 1 + 16 + 8;

/// The fixed part of a layer's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub id: LayerId,
    pub parent: Option<LayerId>,
    pub size_blocks: u64,
    pub sealed: bool,
}

/// A decoded layer metadata record.
pub struct Meta {
    pub header: Header,
    pub dirty: Bitmap,
    pub zero: Bitmap,
    pub hashes: HashTable,
    /// Whether the record carried the hash table (sealed layers always do).
    pub has_hashes: bool,
    pub checksum: [u8; 32],
}

/// Why a metadata record could not be decoded.
#[derive(Debug)]
pub enum MetaError {
    Io(io::Error),
    Invalid(String),
}

impl MetaError {
    /// A readable reason for the failure.
    pub fn reason(&self) -> String {
        match self {
            MetaError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => "truncated".into(),
            MetaError::Io(e) => format!("read failed: {e}"),
            MetaError::Invalid(s) => s.clone(),
        }
    }
}

impl From<io::Error> for MetaError {
    fn from(e: io::Error) -> Self {
        MetaError::Io(e)
    }
}

fn invalid(s: impl Into<String>) -> MetaError {
    MetaError::Invalid(s.into())
}

/// An encoded metadata record.
pub struct Encoded {
    /// The record, checksum included.
    pub bytes: Vec<u8>,
    pub checksum: [u8; 32],
    /// Per chunk, the words of held data blocks (with hashes only).
    pub data: Vec<ChunkSnap>,
    /// Hashes of the held data blocks in block order (with hashes only).
    pub values: Vec<u64>,
}

/// Encodes a layer's metadata; the hash table is included when `with_hashes`.
pub fn encode(
    header: &Header,
    dirty: &Bitmap,
    zero: &Bitmap,
    hashes: &HashTable,
    with_hashes: bool,
) -> Encoded {
    let mut out = Vec::with_capacity(4096);
    encode_header(header, &mut out);
    let dirty_chunks = snapshot(dirty);
    let zero_chunks = snapshot(zero);
    put_chunks(&dirty_chunks, &mut out);
    put_chunks(&zero_chunks, &mut out);
    let (data, values) = if with_hashes {
        let data = data_snap(&dirty_chunks, &zero_chunks);
        let values: Vec<u64> = snap_bits(&data).map(|b| hashes.get(b)).collect();
        (data, values)
    } else {
        (Vec::new(), Vec::new())
    };
    out.reserve(8 + values.len() * 8 + 32);
    out.extend_from_slice(&(values.len() as u64).to_le_bytes());
    for v in &values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let checksum: [u8; 32] = blake3::hash(&out).into();
    out.extend_from_slice(&checksum);
    Encoded {
        bytes: out,
        checksum,
        data,
        values,
    }
}

fn encode_header(h: &Header, out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    let flags = if h.sealed { FLAG_SEALED } else { 0 };
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&h.id.to_bytes());
    out.push(h.parent.is_some() as u8);
    out.extend_from_slice(&h.parent.as_ref().map_or([0; 16], |p| p.to_bytes()));
    out.extend_from_slice(&h.size_blocks.to_le_bytes());
}

type Snap = Vec<ChunkSnap>;

fn snapshot(b: &Bitmap) -> Snap {
    b.snapshot()
}

/// Each non-empty chunk is written as its index and its non-zero words only, so the
/// record follows the number of changed extents, not their spread over the disk.
fn put_chunks(chunks: &Snap, out: &mut Vec<u8>) {
    out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
    for (c, words) in chunks {
        out.extend_from_slice(&(*c as u32).to_le_bytes());
        out.extend_from_slice(&(words.len() as u16).to_le_bytes());
        for (wi, w) in words {
            out.extend_from_slice(&wi.to_le_bytes());
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
}

/// Per chunk, `dirty & !zero`, keeping the non-zero words.
fn data_snap(dirty: &Snap, zero: &Snap) -> Snap {
    let mut zi = zero.iter().peekable();
    let mut out = Vec::new();
    for (c, words) in dirty {
        while zi.peek().is_some_and(|(zc, _)| zc < c) {
            zi.next();
        }
        let data: Words = match zi.peek().filter(|(zc, _)| zc == c) {
            Some((_, z)) => and_not(words, z),
            None => words.clone(),
        };
        if !data.is_empty() {
            out.push((*c, data));
        }
    }
    out
}

/// `a & !b` over two sparse word lists, keeping non-zero results.
fn and_not(a: &Words, b: &Words) -> Words {
    let mut bi = b.iter().peekable();
    let mut out = Vec::with_capacity(a.len());
    for &(i, w) in a {
        while bi.peek().is_some_and(|(j, _)| *j < i) {
            bi.next();
        }
        let z = bi.peek().filter(|(j, _)| *j == i).map_or(0, |(_, z)| *z);
        if w & !z != 0 {
            out.push((i, w & !z));
        }
    }
    out
}

/// The set bits of a chunk snapshot, ascending.
pub fn snap_bits(snap: &[ChunkSnap]) -> impl Iterator<Item = u64> + '_ {
    snap.iter().flat_map(|(c, words)| {
        let base = *c as u64 * CHUNK_BITS;
        words
            .iter()
            .flat_map(move |&(wi, w)| SetBits(w).map(move |b| base + wi as u64 * 64 + b))
    })
}

/// A reader that feeds every byte it yields into a blake3 hasher.
pub struct HashingReader<R> {
    pub inner: R,
    pub hasher: blake3::Hasher,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: blake3::Hasher::new(),
        }
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Reads and checks the fixed header.
pub fn decode_header(r: &mut impl Read) -> Result<Header, MetaError> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(invalid("bad magic"));
    }
    let version = read_u32(r)?;
    if version != VERSION {
        return Err(invalid(format!("unsupported metadata version {version}")));
    }
    let flags = read_u32(r)?;
    if flags & !FLAG_SEALED != 0 {
        return Err(invalid(format!("unknown flags {flags:#x}")));
    }
    let mut id = [0u8; 16];
    r.read_exact(&mut id)?;
    let mut has_parent = [0u8; 1];
    r.read_exact(&mut has_parent)?;
    let mut parent = [0u8; 16];
    r.read_exact(&mut parent)?;
    let size_blocks = read_u64(r)?;
    if size_blocks > MAX_BLOCKS {
        return Err(invalid(format!(
            "size of {size_blocks} blocks is too large"
        )));
    }
    let parent = match has_parent[0] {
        0 => None,
        1 => Some(LayerId::from_bytes(&parent)),
        _ => return Err(invalid("bad parent flag")),
    };
    Ok(Header {
        id: LayerId::from_bytes(&id),
        parent,
        size_blocks,
        sealed: flags & FLAG_SEALED != 0,
    })
}

/// Reads a whole record and checks its checksum and internal consistency.
pub fn decode(r: &mut impl Read) -> Result<Meta, MetaError> {
    let mut r = HashingReader::new(r);
    let header = decode_header(&mut r)?;
    let size = header.size_blocks;
    let dirty = decode_bitmap(&mut r, size)?;
    let zero = decode_bitmap(&mut r, size)?;
    check_subset(&zero, &dirty)?;
    let (hashes, has_hashes) = decode_hashes(&mut r, &header, &dirty, &zero)?;
    let computed: [u8; 32] = r.hasher.finalize().into();
    let mut stored = [0u8; 32];
    r.inner.read_exact(&mut stored)?;
    if stored != computed {
        return Err(invalid("metadata checksum mismatch"));
    }
    Ok(Meta {
        header,
        dirty,
        zero,
        hashes,
        has_hashes,
        checksum: stored,
    })
}

fn decode_bitmap(r: &mut impl Read, size: u64) -> Result<Bitmap, MetaError> {
    let bitmap = Bitmap::new(size);
    let max = size.div_ceil(CHUNK_BITS);
    let count = read_u32(r)? as u64;
    if count > max {
        return Err(invalid(format!("{count} bitmap chunks for {size} blocks")));
    }
    let mut prev: Option<u64> = None;
    for _ in 0..count {
        let c = read_u32(r)? as u64;
        if c >= max || prev.is_some_and(|p| c <= p) {
            return Err(invalid(format!("bad bitmap chunk index {c}")));
        }
        prev = Some(c);
        for (wi, w) in decode_words(r)? {
            check_tail(c * CHUNK_BITS + wi as u64 * 64, w, size)?;
            bitmap.set_word(c as usize, wi as usize, w);
        }
    }
    Ok(bitmap)
}

/// Reads one chunk's non-zero words: `n u16`, then `n × (index u16, word u64)`.
fn decode_words(r: &mut impl Read) -> Result<Words, MetaError> {
    let mut n = [0u8; 2];
    r.read_exact(&mut n)?;
    let n = u16::from_le_bytes(n) as usize;
    if n == 0 || n > CHUNK_WORDS {
        return Err(invalid(format!("bad bitmap word count {n}")));
    }
    let mut words = Vec::with_capacity(n);
    let mut entry = [0u8; 10];
    for _ in 0..n {
        r.read_exact(&mut entry)?;
        let wi = u16::from_le_bytes([entry[0], entry[1]]);
        let w = u64::from_le_bytes(entry[2..].try_into().unwrap_or([0; 8]));
        let ordered = words.last().is_none_or(|&(p, _)| wi > p);
        if wi as usize >= CHUNK_WORDS || !ordered || w == 0 {
            return Err(invalid(format!("bad bitmap word {wi}")));
        }
        words.push((wi, w));
    }
    Ok(words)
}

/// Bits past the end of the layer must be clear; `start` is the word's first bit.
fn check_tail(start: u64, w: u64, size: u64) -> Result<(), MetaError> {
    let valid = size.saturating_sub(start).min(64);
    let mask = if valid == 64 {
        u64::MAX
    } else {
        (1u64 << valid) - 1
    };
    if w & !mask != 0 {
        return Err(invalid("bitmap bits set past the end of the layer"));
    }
    Ok(())
}

fn check_subset(zero: &Bitmap, dirty: &Bitmap) -> Result<(), MetaError> {
    for (c, words) in zero.snapshot() {
        if words
            .iter()
            .any(|&(wi, z)| z & !dirty.word_at(c, wi as usize) != 0)
        {
            return Err(invalid("zero bitmap marks blocks the layer does not hold"));
        }
    }
    Ok(())
}

fn decode_hashes(
    r: &mut impl Read,
    header: &Header,
    dirty: &Bitmap,
    zero: &Bitmap,
) -> Result<(HashTable, bool), MetaError> {
    let size = header.size_blocks;
    let count = read_u64(r)?;
    if !header.sealed {
        // An overlay's hashes are recomputed from its data when it is opened.
        if count != 0 {
            return Err(invalid("unsealed layer metadata carries hashes"));
        }
        // Left empty: whoever opens the overlay sizes the table (no allocation from
        // an untrusted size field here).
        return Ok((HashTable::new(0), false));
    }
    let data = data_chunks(dirty, zero);
    let held: u64 = data
        .iter()
        .flat_map(|(_, w)| w)
        .map(|(_, w)| w.count_ones() as u64)
        .sum();
    if count != held {
        return Err(invalid(format!(
            "{count} block hashes for {held} held data blocks"
        )));
    }
    // Grows only as hashes actually arrive, whatever the header claims.
    let mut values = Vec::with_capacity(count.min(1 << 16) as usize);
    for _ in 0..count {
        values.push(read_u64(r)?);
    }
    Ok((HashTable::packed(size, &data, values), true))
}

/// Per chunk, the non-zero words of blocks held as data (dirty and not zero).
pub fn data_chunks(dirty: &Bitmap, zero: &Bitmap) -> Vec<ChunkSnap> {
    data_snap(&dirty.snapshot(), &zero.snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sealed: bool) -> (Header, Bitmap, Bitmap, HashTable) {
        let header = Header {
            id: LayerId::random().unwrap(),
            parent: Some(LayerId::random().unwrap()),
            size_blocks: 100_000,
            sealed,
        };
        let (dirty, zero, hashes) = (
            Bitmap::new(100_000),
            Bitmap::new(100_000),
            HashTable::new(100_000),
        );
        for b in [0, 5, 40_000, 99_999] {
            dirty.set(b);
            hashes.set(b, b * 7 + 1);
        }
        zero.set(5);
        (header, dirty, zero, hashes)
    }

    #[test]
    fn round_trip() {
        let (h, d, z, hs) = sample(true);
        let Encoded {
            bytes,
            checksum: sum,
            ..
        } = encode(&h, &d, &z, &hs, true);
        let m = decode(&mut &bytes[..]).unwrap();
        assert_eq!(m.header, h);
        assert_eq!(m.checksum, sum);

        assert_eq!(
            m.dirty.iter_ones().collect::<Vec<_>>(),
            vec![0, 5, 40_000, 99_999]
        );
        assert_eq!(m.zero.iter_ones().collect::<Vec<_>>(), vec![5]);
        assert_eq!(m.hashes.get(40_000), 280_001);
        let mut hr = &bytes[..];
        assert_eq!(decode_header(&mut hr).unwrap(), h);
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let (h, d, z, hs) = sample(true);
        let bytes = encode(&h, &d, &z, &hs, true).bytes;
        for i in (0..bytes.len()).step_by(97) {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&mut &bad[..]).is_err(), "flip at {i}");
        }
        for len in [0, 10, HEADER_LEN, bytes.len() - 1] {
            assert!(decode(&mut &bytes[..len]).is_err(), "truncated to {len}");
        }
    }

    #[test]
    fn unsealed_may_omit_hashes() {
        let (h, d, z, hs) = sample(false);
        let bytes = encode(&h, &d, &z, &hs, false).bytes;
        let m = decode(&mut &bytes[..]).unwrap();
        assert!(!m.has_hashes);
        let (h, ..) = sample(true);
        let bytes = encode(&h, &d, &z, &hs, false).bytes;
        assert!(decode(&mut &bytes[..]).is_err());
    }

    #[test]
    fn garbage_is_refused() {
        let mut seed = 1u64;
        for len in 0..300 {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (seed >> 33) as u8
                })
                .collect();
            assert!(decode(&mut &data[..]).is_err());
        }
    }
}
