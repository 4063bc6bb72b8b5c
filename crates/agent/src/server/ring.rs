//! A bounded byte buffer addressed by absolute stream offsets: keeps the last `capacity`
//! bytes of a stream and remembers how many bytes the stream has produced in total.

use std::collections::VecDeque;

pub struct Ring {
    buf: VecDeque<u8>,
    capacity: usize,
    /// Bytes ever pushed; the offset one past the newest byte.
    end: u64,
}

impl Ring {
    pub fn new(capacity: usize) -> Self {
        Self {
            buf: VecDeque::new(),
            capacity,
            end: 0,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.end += data.len() as u64;
        let data = &data[data.len().saturating_sub(self.capacity)..];
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.capacity);
        self.buf.drain(..overflow);
        self.buf.extend(data);
    }

    /// Offset of the oldest byte still held.
    pub fn start(&self) -> u64 {
        self.end - self.buf.len() as u64
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// Up to `max` bytes from `offset` (clamped to what is held), with their offset.
    pub fn read_from(&self, offset: u64, max: usize) -> (u64, Vec<u8>) {
        let from = offset.clamp(self.start(), self.end);
        // `from - start` <= buf.len(), which fits in usize.
        let skip = (from - self.start()) as usize;
        (from, self.buf.range(skip..).take(max).copied().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_tail_with_offsets() {
        let mut r = Ring::new(8);
        r.push(b"hello");
        assert_eq!(r.read_from(0, 100), (0, b"hello".to_vec()));
        r.push(b" world");
        assert_eq!((r.start(), r.end()), (3, 11));
        assert_eq!(r.read_from(0, 100), (3, b"lo world".to_vec()));
        assert_eq!(r.read_from(9, 1), (9, b"l".to_vec()));
        assert_eq!(r.read_from(50, 10), (11, vec![]));
        r.push(&[b'x'; 20]);
        assert_eq!((r.start(), r.end()), (23, 31));
        assert_eq!(r.read_from(0, 100).1, vec![b'x'; 8]);
    }
}
