//! Layer metadata: the binary encoding of a layer's header, bitmaps and hash table.
//!
//! Layout (little-endian), followed by a blake3 checksum of all preceding bytes:
//! `magic "SFLAYER1" | version u32 | flags u32 (bit 0 = sealed) | id [16] |
//!  has_parent u8 | parent [16] | size_blocks u64 |
//!  dirty: nchunks u32, nchunks × (index u32, 512 × u64) | zero: same |
//!  nhashes u64, nhashes × u64 (one per held non-zero block, in block order)`.

use std::io::{self, Read};

use crate::bitmap::{Bitmap, ChunkSnap, HashTable, CHUNK_BITS, CHUNK_WORDS};
use crate::id::LayerId;

/// Magic at the start of every layer metadata record.
pub const MAGIC: &[u8; 8] = b"SFLAYER1";
/// Version of the metadata encoding.
pub const VERSION: u32 = 1;
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

/// Encodes a layer's metadata; the hash table is included when `with_hashes`.
/// Returns the bytes (checksum included) and the checksum.
pub fn encode(
    header: &Header,
    dirty: &Bitmap,
    zero: &Bitmap,
    hashes: &HashTable,
    with_hashes: bool,
) -> (Vec<u8>, [u8; 32]) {
    let mut out = Vec::with_capacity(4096);
    encode_header(header, &mut out);
    let dirty_chunks = snapshot(dirty);
    let zero_chunks = snapshot(zero);
    put_chunks(&dirty_chunks, &mut out);
    put_chunks(&zero_chunks, &mut out);
    if with_hashes {
        let held = data_block_list(&dirty_chunks, &zero_chunks);
        out.extend_from_slice(&(held.len() as u64).to_le_bytes());
        for b in held {
            out.extend_from_slice(&hashes.get(b).to_le_bytes());
        }
    } else {
        out.extend_from_slice(&0u64.to_le_bytes());
    }
    let sum: [u8; 32] = blake3::hash(&out).into();
    out.extend_from_slice(&sum);
    (out, sum)
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
    b.chunk_indices()
        .map(|c| (c, b.chunk_words(c)))
        .filter(|(_, w)| w.iter().any(|&x| x != 0))
        .collect()
}

fn put_chunks(chunks: &Snap, out: &mut Vec<u8>) {
    out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
    for (c, words) in chunks {
        out.extend_from_slice(&(*c as u32).to_le_bytes());
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
}

/// Blocks that are dirty and not zero, in ascending order.
fn data_block_list(dirty: &Snap, zero: &Snap) -> Vec<u64> {
    let mut out = Vec::new();
    let mut zi = zero.iter().peekable();
    for (c, words) in dirty {
        while zi.peek().is_some_and(|(zc, _)| zc < c) {
            zi.next();
        }
        let zwords = zi.peek().filter(|(zc, _)| zc == c).map(|(_, w)| w);
        for (wi, w) in words.iter().enumerate() {
            let mut bits = w & !zwords.map_or(0, |z| z[wi]);
            while bits != 0 {
                let b = bits.trailing_zeros() as u64;
                bits &= bits - 1;
                out.push(*c as u64 * CHUNK_BITS + wi as u64 * 64 + b);
            }
        }
    }
    out
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
    let mut bytes = vec![0u8; CHUNK_WORDS * 8];
    for _ in 0..count {
        let c = read_u32(r)? as u64;
        if c >= max || prev.is_some_and(|p| c <= p) {
            return Err(invalid(format!("bad bitmap chunk index {c}")));
        }
        prev = Some(c);
        r.read_exact(&mut bytes)?;
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect();
        check_tail(&words, c, size)?;
        bitmap.set_chunk_words(c as usize, &words);
    }
    Ok(bitmap)
}

/// Bits past the end of the layer must be clear.
fn check_tail(words: &[u64], chunk: u64, size: u64) -> Result<(), MetaError> {
    let base = chunk * CHUNK_BITS;
    for (wi, &w) in words.iter().enumerate() {
        let start = base + wi as u64 * 64;
        let valid = size.saturating_sub(start).min(64);
        let mask = if valid == 64 {
            u64::MAX
        } else {
            (1u64 << valid) - 1
        };
        if w & !mask != 0 {
            return Err(invalid("bitmap bits set past the end of the layer"));
        }
    }
    Ok(())
}

fn check_subset(zero: &Bitmap, dirty: &Bitmap) -> Result<(), MetaError> {
    for c in zero.chunk_indices() {
        let z = zero.chunk_words(c);
        let d = dirty.chunk_words(c);
        if z.iter().zip(&d).any(|(z, d)| z & !d != 0) {
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
    if count == 0 && !header.sealed {
        return Ok((HashTable::new(size), false));
    }
    let data = data_chunks(dirty, zero);
    let held: u64 = data
        .iter()
        .flat_map(|(_, w)| w)
        .map(|w| w.count_ones() as u64)
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

/// Per chunk, the words of blocks held as data (dirty and not zero).
pub fn data_chunks(dirty: &Bitmap, zero: &Bitmap) -> Vec<ChunkSnap> {
    dirty
        .chunk_indices()
        .map(|c| {
            let z = zero.chunk_words(c);
            let words = dirty
                .chunk_words(c)
                .iter()
                .zip(&z)
                .map(|(d, z)| d & !z)
                .collect();
            (c, words)
        })
        .filter(|(_, w): &ChunkSnap| w.iter().any(|&x| x != 0))
        .collect()
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
        let (bytes, sum) = encode(&h, &d, &z, &hs, true);
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
        let (bytes, _) = encode(&h, &d, &z, &hs, true);
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
        let (bytes, _) = encode(&h, &d, &z, &hs, false);
        let m = decode(&mut &bytes[..]).unwrap();
        assert!(!m.has_hashes);
        let (h, ..) = sample(true);
        let (bytes, _) = encode(&h, &d, &z, &hs, false);
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
