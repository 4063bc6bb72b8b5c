//! The I/O path of a disk: read resolution, block writes, zeroing, striped locks.

use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;
use xxhash_rust::xxh3::xxh3_64;

use super::{Disk, State, BS, BSU, STRIPES};
use crate::bitmap::SetBits;
use crate::device::{check_range, BlockDevice};
use crate::fsutil::{is_zero, AlignedBuf};
use crate::layer::{Source, MAX_RUN};
use crate::{Error, Result};

impl Disk {
    /// Locks the stripes covering blocks `first..=last`, in ascending order.
    fn lock_stripes(&self, first: u64, last: u64) -> Vec<MutexGuard<'_, ()>> {
        if last - first + 1 >= STRIPES as u64 {
            return self.stripes.iter().map(|m| m.lock()).collect();
        }
        let mut idx: Vec<usize> = (first..=last)
            .map(|b| (b % STRIPES as u64) as usize)
            .collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.stripes[i].lock()).collect()
    }

    /// Reads the whole blocks from `first` into `dst`, one read per run of blocks that
    /// resolve to the same layer.
    fn read_full(&self, st: &State, first: u64, dst: &mut [u8]) -> Result<()> {
        let sources = resolve_range(st, first, dst.len() / BSU);
        let n = sources.len();
        let mut i = 0;
        while i < n {
            let src = sources[i];
            let mut j = i + 1;
            while j < n && j - i < MAX_RUN as usize && sources[j] == src {
                j += 1;
            }
            let part = &mut dst[i * BSU..j * BSU];
            match src {
                Source::Zero => part.fill(0),
                Source::Layer(k) => st.layer(k).read_blocks(first + i as u64, part)?,
            }
            i = j;
        }
        Ok(())
    }

    fn read_locked(&self, st: &State, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut pos = 0usize;
        while pos < buf.len() {
            let off = offset + pos as u64;
            let (b, in_off) = (off / BS, (off % BS) as usize);
            let rest = buf.len() - pos;
            if in_off != 0 || rest < BSU {
                let n = (BSU - in_off).min(rest);
                let mut blk = AlignedBuf::new(BSU);
                self.read_full(st, b, &mut blk)?;
                buf[pos..pos + n].copy_from_slice(&blk[in_off..in_off + n]);
                pos += n;
            } else {
                let n = rest / BSU * BSU;
                self.read_full(st, b, &mut buf[pos..pos + n])?;
                pos += n;
            }
        }
        Ok(())
    }

    /// Writes (`src` = Some) or zeroes (`src` = None) `len` bytes at `offset`. Partial
    /// blocks are read, patched and written whole. Callers hold the stripe locks.
    fn modify(&self, st: &State, offset: u64, len: usize, src: Option<&[u8]>) -> Result<()> {
        let mut pos = 0usize;
        while pos < len {
            let off = offset + pos as u64;
            let (b, in_off) = (off / BS, (off % BS) as usize);
            let rest = len - pos;
            if in_off != 0 || rest < BSU {
                let n = (BSU - in_off).min(rest);
                let mut blk = AlignedBuf::new(BSU);
                self.read_full(st, b, &mut blk)?;
                match src {
                    Some(d) => blk[in_off..in_off + n].copy_from_slice(&d[pos..pos + n]),
                    None => blk[in_off..in_off + n].fill(0),
                }
                self.write_full(st, b, &blk)?;
                pos += n;
            } else {
                let n = rest / BSU * BSU;
                match src {
                    Some(d) => self.write_full(st, b, &d[pos..pos + n])?,
                    None => self.zero_blocks(st, b, (n / BSU) as u64)?,
                }
                pos += n;
            }
        }
        Ok(())
    }

    /// Writes whole blocks: runs of all-zero blocks become zero bits and holes, runs of
    /// data are written in one call each.
    fn write_full(&self, st: &State, first: u64, data: &[u8]) -> Result<()> {
        let blocks: Vec<&[u8]> = data.chunks_exact(BSU).collect();
        let zero: Vec<bool> = blocks.iter().map(|b| is_zero(b)).collect();
        let n = blocks.len();
        let mut i = 0;
        while i < n {
            let mut j = i + 1;
            while j < n && (j - i) < MAX_RUN as usize && zero[j] == zero[i] {
                j += 1;
            }
            if zero[i] {
                self.zero_blocks(st, first + i as u64, (j - i) as u64)?;
            } else {
                self.write_data(st, first + i as u64, &data[i * BSU..j * BSU])?;
            }
            i = j;
        }
        Ok(())
    }

    /// Data first, then the bits: a racing reader sees the old or the new block.
    fn write_data(&self, st: &State, first: u64, data: &[u8]) -> Result<()> {
        let ov = &st.overlay;
        ov.write_blocks(first, data)?;
        for (i, block) in data.chunks_exact(BSU).enumerate() {
            let b = first + i as u64;
            ov.hashes.set(b, xxh3_64(block));
            if !ov.dirty.get(b) {
                ov.dirty.set(b);
            }
            if ov.zero.get(b) {
                ov.zero.clear(b);
            }
        }
        ov.changed.store(true, Ordering::Release);
        Ok(())
    }

    /// Marks blocks as zero (zero bit before dirty bit) and frees their data.
    fn zero_blocks(&self, st: &State, first: u64, count: u64) -> Result<()> {
        let ov = &st.overlay;
        let mut held_data = false;
        for b in first..first + count {
            if ov.dirty.get(b) {
                held_data |= !ov.zero.get(b);
                ov.zero.set(b);
            } else if !st.chain_reads_zero(b) {
                ov.zero.set(b);
                ov.dirty.set(b);
            } else {
                continue;
            }
            ov.changed.store(true, Ordering::Release);
        }
        if held_data {
            ov.punch(first, count)?;
        }
        Ok(())
    }
}

/// Resolves `count` blocks from `first`, 64 at a time: per layer, two word loads
/// decide up to 64 blocks, so a deep chain costs O(depth) per 64 blocks, not per block.
pub(super) fn resolve_range(st: &State, first: u64, count: usize) -> Vec<Source> {
    let mut out = vec![Source::Zero; count];
    let mut i = 0;
    while i < count {
        let b = first + i as u64;
        let len = ((64 - b % 64) as usize).min(count - i);
        resolve_word(st, b, &mut out[i..i + len]);
        i += len;
    }
    out
}

/// Resolves `out.len()` blocks from `first`, all within one aligned 64-block word.
fn resolve_word(st: &State, first: u64, out: &mut [Source]) {
    let shift = first % 64;
    let ones = if out.len() >= 64 {
        u64::MAX
    } else {
        (1u64 << out.len()) - 1
    };
    let mut remaining = ones << shift;
    for k in 0..=st.chain.len() {
        let layer = st.layer(k);
        let held = layer.dirty.word_of(first) & remaining;
        if held == 0 {
            continue;
        }
        let zero = layer.zero.word_of(first);
        for bit in SetBits(held) {
            let zeroed = zero & (1 << bit) != 0;
            out[(bit - shift) as usize] = if zeroed {
                Source::Zero
            } else {
                Source::Layer(k)
            };
        }
        remaining &= !held;
        if remaining == 0 {
            break;
        }
    }
}

impl BlockDevice for Disk {
    fn size(&self) -> u64 {
        self.state.read().size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let st = self.state.read();
        check_range("read", offset, buf.len() as u64, st.size)?;
        self.read_locked(&st, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_usable()?;
        let st = self.state.read();
        check_range("write", offset, buf.len() as u64, st.size)?;
        if buf.is_empty() {
            return Ok(());
        }
        let _g = self.lock_stripes(offset / BS, (offset + buf.len() as u64 - 1) / BS);
        self.modify(&st, offset, buf.len(), Some(buf))
    }

    fn flush(&self) -> Result<()> {
        let st = self.state.read();
        let _f = self.flush_lock.lock();
        st.overlay.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.write_zeroes(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check_usable()?;
        let st = self.state.read();
        check_range("write-zeroes", offset, len, st.size)?;
        if len == 0 {
            return Ok(());
        }
        let _g = self.lock_stripes(offset / BS, (offset + len - 1) / BS);
        let len = usize::try_from(len).map_err(|_| Error::OutOfRange {
            op: "write-zeroes",
            offset,
            len,
            size: st.size,
        })?;
        self.modify(&st, offset, len, None)
    }
}
