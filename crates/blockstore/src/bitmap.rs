//! Sparse, lock-free bitmaps and per-block hash tables.
//!
//! Both are arrays of lazily allocated chunks of atomic words: a 64 GiB disk has 16M
//! blocks, but a layer that holds a few blocks allocates only the chunks it touches.
//! Reads are plain atomic loads; the first write to a chunk allocates it once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Bits per bitmap chunk (one 4 KiB chunk of words).
pub const CHUNK_BITS: u64 = 32768;
/// 64-bit words per bitmap chunk.
pub const CHUNK_WORDS: usize = (CHUNK_BITS / 64) as usize;
/// Entries per hash-table chunk.
const HASH_CHUNK: u64 = 1024;

type Slot = OnceLock<Arc<[AtomicU64]>>;

/// A growable array of lazily allocated chunks of atomic words.
pub struct Chunks {
    chunk_len: usize,
    slots: Box<[Slot]>,
}

impl Chunks {
    fn new(chunk_len: usize, nslots: usize) -> Chunks {
        Chunks {
            chunk_len,
            slots: (0..nslots).map(|_| OnceLock::new()).collect(),
        }
    }

    fn get(&self, slot: usize) -> Option<&Arc<[AtomicU64]>> {
        self.slots.get(slot)?.get()
    }

    fn get_or_alloc(&self, slot: usize) -> &Arc<[AtomicU64]> {
        let len = self.chunk_len;
        self.slots[slot].get_or_init(|| (0..len).map(|_| AtomicU64::new(0)).collect())
    }

    /// A copy with `nslots` slots sharing the existing chunks.
    fn grown(&self, nslots: usize) -> Chunks {
        let grown = Chunks::new(self.chunk_len, nslots.max(self.slots.len()));
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(chunk) = slot.get() {
                let _ = grown.slots[i].set(chunk.clone());
            }
        }
        grown
    }
}

/// A fixed-length bitmap with lazily allocated 32768-bit chunks.
pub struct Bitmap {
    len: u64,
    chunks: Chunks,
}

fn nchunks(len: u64, per: u64) -> usize {
    len.div_ceil(per) as usize
}

impl Bitmap {
    /// An all-clear bitmap of `len` bits.
    pub fn new(len: u64) -> Bitmap {
        Bitmap {
            len,
            chunks: Chunks::new(CHUNK_WORDS, nchunks(len, CHUNK_BITS)),
        }
    }

    fn word(&self, bit: u64) -> Option<&AtomicU64> {
        let chunk = self.chunks.get((bit / CHUNK_BITS) as usize)?;
        Some(&chunk[((bit % CHUNK_BITS) / 64) as usize])
    }

    fn word_mut(&self, bit: u64) -> &AtomicU64 {
        let chunk = self.chunks.get_or_alloc((bit / CHUNK_BITS) as usize);
        &chunk[((bit % CHUNK_BITS) / 64) as usize]
    }

    /// Whether bit `i` is set; bits past the end read as clear.
    pub fn get(&self, i: u64) -> bool {
        i < self.len
            && self
                .word(i)
                .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (i % 64)) != 0)
    }

    /// The aligned 64-bit word holding bit `i` (bit `i % 64` of the result).
    pub fn word_of(&self, i: u64) -> u64 {
        if i >= self.len {
            return 0;
        }
        self.word(i).map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Sets bit `i` (which must be below `len`).
    pub fn set(&self, i: u64) {
        debug_assert!(i < self.len);
        if i < self.len {
            self.word_mut(i).fetch_or(1 << (i % 64), Ordering::Release);
        }
    }

    /// Clears bit `i`; a no-op for bits in unallocated chunks.
    pub fn clear(&self, i: u64) {
        if let Some(w) = self.word(i) {
            w.fetch_and(!(1 << (i % 64)), Ordering::Release);
        }
    }

    /// Number of set bits.
    pub fn count_ones(&self) -> u64 {
        self.chunk_indices()
            .map(|c| {
                self.chunk_words(c)
                    .iter()
                    .map(|w| w.count_ones() as u64)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Indices of allocated chunks, ascending.
    pub fn chunk_indices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.chunks.slots.len()).filter(|&c| self.chunks.get(c).is_some())
    }

    /// A snapshot of the words of chunk `c` (all zero when unallocated).
    pub fn chunk_words(&self, c: usize) -> Vec<u64> {
        match self.chunks.get(c) {
            Some(chunk) => chunk.iter().map(|w| w.load(Ordering::Acquire)).collect(),
            None => vec![0; CHUNK_WORDS],
        }
    }

    /// The word `wi` of chunk `c` (0 when unallocated or out of range).
    pub fn word_at(&self, c: usize, wi: usize) -> u64 {
        self.chunks
            .get(c)
            .and_then(|chunk| chunk.get(wi))
            .map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Stores word `wi` of chunk `c`; returns false if that is past the end.
    pub fn set_word(&self, c: usize, wi: usize, w: u64) -> bool {
        if c >= self.chunks.slots.len() || wi >= CHUNK_WORDS {
            return false;
        }
        self.chunks.get_or_alloc(c)[wi].store(w, Ordering::Release);
        true
    }

    /// The non-zero words of chunk `c`, ascending.
    pub fn chunk_nonzero(&self, c: usize) -> Words {
        let Some(chunk) = self.chunks.get(c) else {
            return Vec::new();
        };
        chunk
            .iter()
            .enumerate()
            .map(|(i, w)| (i as u16, w.load(Ordering::Acquire)))
            .filter(|&(_, w)| w != 0)
            .collect()
    }

    /// A snapshot of every chunk with a bit set, as its non-zero words.
    pub fn snapshot(&self) -> Vec<ChunkSnap> {
        self.chunk_indices()
            .map(|c| (c, self.chunk_nonzero(c)))
            .filter(|(_, w)| !w.is_empty())
            .collect()
    }

    /// Set bits in ascending order.
    pub fn iter_ones(&self) -> impl Iterator<Item = u64> + '_ {
        self.chunk_indices().flat_map(move |c| {
            let base = c as u64 * CHUNK_BITS;
            let words = self.chunk_words(c);
            words.into_iter().enumerate().flat_map(move |(wi, w)| {
                let wbase = base + wi as u64 * 64;
                SetBits(w).map(move |b| wbase + b)
            })
        })
    }

    /// A copy of `new_len` bits (at least the current length) sharing the chunks.
    pub fn grown(&self, new_len: u64) -> Bitmap {
        let len = new_len.max(self.len);
        Bitmap {
            len,
            chunks: self.chunks.grown(nchunks(len, CHUNK_BITS)),
        }
    }
}

/// Iterator over the set bit positions of one word.
pub struct SetBits(pub u64);

impl Iterator for SetBits {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.0 == 0 {
            return None;
        }
        let bit = self.0.trailing_zeros() as u64;
        self.0 &= self.0 - 1;
        Some(bit)
    }
}

/// Per-block 64-bit content hashes.
///
/// The overlay uses a dense table of lazily allocated 1024-entry chunks (written
/// concurrently); sealed layers use a packed table: one entry per held data block plus a
/// rank index, so memory follows the data held, not its spread over the disk.
pub enum HashTable {
    Dense(Chunks),
    Packed(Packed),
}

/// The non-zero data-block words of one bitmap chunk and the rank of each word's
/// first bit.
struct RankChunk {
    words: Words,
    ranks: Vec<u32>,
}

/// A read-only hash table indexed by rank among the held data blocks.
pub struct Packed {
    values: Vec<u64>,
    chunks: Vec<Option<RankChunk>>,
}

/// The non-zero words of one bitmap chunk: `(word index, bits)`, ascending.
pub type Words = Vec<(u16, u64)>;
/// Snapshot of one bitmap chunk: its index and non-zero words.
pub type ChunkSnap = (usize, Words);

impl HashTable {
    /// An empty dense table for `blocks` blocks.
    pub fn new(blocks: u64) -> HashTable {
        HashTable::Dense(Chunks::new(
            HASH_CHUNK as usize,
            nchunks(blocks, HASH_CHUNK),
        ))
    }

    /// A packed table: `values[i]` is the hash of the i-th set bit of `data` (ascending
    /// chunks of the held-data bitmap of a layer of `blocks` blocks).
    pub fn packed(blocks: u64, data: &[ChunkSnap], values: Vec<u64>) -> HashTable {
        let mut chunks: Vec<Option<RankChunk>> =
            (0..nchunks(blocks, CHUNK_BITS)).map(|_| None).collect();
        let mut rank = 0u32;
        for (c, words) in data {
            let ranks = words
                .iter()
                .map(|(_, w)| {
                    let r = rank;
                    rank = rank.saturating_add(w.count_ones());
                    r
                })
                .collect();
            if let Some(slot) = chunks.get_mut(*c) {
                *slot = Some(RankChunk {
                    words: words.clone(),
                    ranks,
                });
            }
        }
        HashTable::Packed(Packed { values, chunks })
    }

    /// The hash stored for `block` (0 when none).
    pub fn get(&self, block: u64) -> u64 {
        match self {
            HashTable::Dense(chunks) => chunks.get((block / HASH_CHUNK) as usize).map_or(0, |c| {
                c[(block % HASH_CHUNK) as usize].load(Ordering::Acquire)
            }),
            HashTable::Packed(p) => p.get(block),
        }
    }

    /// Stores the hash of `block`, which must lie within a dense table.
    pub fn set(&self, block: u64, hash: u64) {
        let HashTable::Dense(chunks) = self else {
            debug_assert!(false, "packed hash tables are read-only");
            return;
        };
        let slot = (block / HASH_CHUNK) as usize;
        if slot < chunks.slots.len() {
            let chunk = chunks.get_or_alloc(slot);
            chunk[(block % HASH_CHUNK) as usize].store(hash, Ordering::Release);
        }
    }

    /// A dense copy covering `blocks` blocks sharing the stored chunks.
    pub fn grown(&self, blocks: u64) -> HashTable {
        match self {
            HashTable::Dense(chunks) => HashTable::Dense(chunks.grown(nchunks(blocks, HASH_CHUNK))),
            HashTable::Packed(_) => {
                debug_assert!(false, "packed hash tables belong to sealed layers");
                HashTable::new(blocks)
            }
        }
    }
}

impl Packed {
    fn get(&self, block: u64) -> u64 {
        let Some(Some(chunk)) = self.chunks.get((block / CHUNK_BITS) as usize) else {
            return 0;
        };
        let wi = ((block % CHUNK_BITS) / 64) as u16;
        let bit = block % 64;
        let Ok(k) = chunk.words.binary_search_by_key(&wi, |&(i, _)| i) else {
            return 0;
        };
        let w = chunk.words[k].1;
        if w & (1 << bit) == 0 {
            return 0;
        }
        let rank = chunk.ranks[k] as usize + (w & ((1u64 << bit) - 1)).count_ones() as usize;
        self.values.get(rank).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_clear() {
        let b = Bitmap::new(100_000);
        assert!(!b.get(5));
        b.set(5);
        b.set(99_999);
        b.set(64);
        assert!(b.get(5) && b.get(64) && b.get(99_999));
        assert!(!b.get(6) && !b.get(100_000) && !b.get(u64::MAX));
        assert_eq!(b.count_ones(), 3);
        assert_eq!(b.iter_ones().collect::<Vec<_>>(), vec![5, 64, 99_999]);
        b.clear(64);
        b.clear(70_000);
        assert_eq!(b.iter_ones().collect::<Vec<_>>(), vec![5, 99_999]);
        assert_eq!(b.chunk_indices().collect::<Vec<_>>(), vec![0, 3]);
    }

    #[test]
    fn large_bitmaps_are_sparse() {
        let blocks = 64 << 18; // 64 GiB of 4 KiB blocks
        let b = Bitmap::new(blocks);
        b.set(blocks - 1);
        assert_eq!(b.chunk_indices().count(), 1);
        assert_eq!(b.iter_ones().collect::<Vec<_>>(), vec![blocks - 1]);
    }

    #[test]
    fn growing_keeps_bits() {
        let b = Bitmap::new(10);
        b.set(9);
        let g = b.grown(1_000_000);
        assert!(g.get(9));
        g.set(999_999);
        assert_eq!(g.count_ones(), 2);
        assert_eq!(g.len, 1_000_000);
    }

    #[test]
    fn sparse_words() {
        let b = Bitmap::new(70_000);
        b.set(40_000);
        b.set(32_768);
        assert_eq!(b.snapshot(), vec![(1, vec![(0, 1), (113, 1)])]);
        assert_eq!(b.word_at(1, 113), 1);
        assert!(b.set_word(2, 3, 5) && !b.set_word(3, 0, 1) && !b.set_word(0, 512, 1));
        assert!(b.get(2 * CHUNK_BITS + 3 * 64) && b.get(2 * CHUNK_BITS + 3 * 64 + 2));
    }

    #[test]
    fn hash_table() {
        let h = HashTable::new(10_000);
        assert_eq!(h.get(5), 0);
        h.set(5, 42);
        h.set(9_999, 7);
        h.set(20_000, 1); // out of range: ignored
        assert_eq!(h.get(5), 42);
        let g = h.grown(30_000);
        assert_eq!(g.get(9_999), 7);
        g.set(20_000, 1);
        assert_eq!(g.get(20_000), 1);
    }

    #[test]
    fn packed_hash_table() {
        let data = vec![
            (0, vec![(0, 0b1010), (3, 1 << 63)]),
            (2, vec![(511, 1 << 63)]),
        ];
        let h = HashTable::packed(3 * CHUNK_BITS, &data, vec![10, 11, 12, 13]);
        assert_eq!(h.get(1), 10);
        assert_eq!(h.get(3), 11);
        assert_eq!(h.get(3 * 64 + 63), 12);
        assert_eq!(h.get(3 * CHUNK_BITS - 1), 13);
        assert_eq!(h.get(2), 0);
        assert_eq!(h.get(CHUNK_BITS), 0);
        assert_eq!(h.get(u64::MAX), 0);
    }
}
