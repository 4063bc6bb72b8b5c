//! The few pieces of the FUSE kernel protocol (`linux/fuse.h`, 7.38) this export speaks.
//! Messages are parsed and built field by field in little-endian order, so no `unsafe`
//! casts of kernel structs are needed.

pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 38;
pub const ROOT_ID: u64 = 1;

pub const IN_HEADER_LEN: usize = 40;
pub const OUT_HEADER_LEN: usize = 16;
/// `fuse_in_header` + `fuse_write_in`: where a WRITE's payload starts.
pub const WRITE_PREFIX_LEN: usize = IN_HEADER_LEN + 40;

pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
}

pub mod init_flag {
    pub const ASYNC_READ: u32 = 1 << 0;
    pub const BIG_WRITES: u32 = 1 << 5;
    pub const ASYNC_DIO: u32 = 1 << 15;
    pub const PARALLEL_DIROPS: u32 = 1 << 18;
    pub const MAX_PAGES: u32 = 1 << 22;
    pub const INIT_EXT: u32 = 1 << 30;
    /// In `flags2`: FUSE_OVER_IO_URING (bit 41 of the 64-bit flags).
    pub const OVER_IO_URING2: u32 = 1 << 9;
}

/// `fuse_open_out.open_flags`.
pub mod open_flag {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
}

pub const FATTR_SIZE: u32 = 1 << 3;

/// Reads little-endian fields from a message in order; running short yields `None`.
pub struct Fields<'a> {
    buf: &'a [u8],
}

impl<'a> Fields<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Fields { buf }
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.buf.split_first_chunk::<N>()?;
        self.buf = rest;
        Some(*head)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    pub fn skip(&mut self, n: usize) -> Option<()> {
        self.buf = self.buf.get(n..)?;
        Some(())
    }
}

/// `fuse_in_header`.
#[derive(Clone, Copy, Debug)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
}

impl InHeader {
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let mut f = Fields::new(buf);
        Some(InHeader {
            len: f.u32()?,
            opcode: f.u32()?,
            unique: f.u64()?,
            nodeid: f.u64()?,
        })
    }
}

/// Builds a reply body field by field.
#[derive(Default)]
pub struct Out(pub Vec<u8>);

impl Out {
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

/// `fuse_out_header` for a reply of `body_len` bytes.
pub fn out_header(unique: u64, error: i32, body_len: usize) -> [u8; OUT_HEADER_LEN] {
    let mut h = [0u8; OUT_HEADER_LEN];
    let len = (OUT_HEADER_LEN + body_len) as u32;
    h[0..4].copy_from_slice(&len.to_le_bytes());
    h[4..8].copy_from_slice(&error.to_le_bytes());
    h[8..16].copy_from_slice(&unique.to_le_bytes());
    h
}

/// The attributes of one inode (`fuse_attr`).
#[derive(Clone, Copy, Debug)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub mode: u32,
    pub nlink: u32,
}

impl Attr {
    pub fn encode(&self, out: &mut Out) {
        out.u64(self.ino)
            .u64(self.size)
            .u64(self.size.div_ceil(512));
        out.zeros(3 * 8 + 3 * 4); // atime, mtime, ctime and their nanoseconds
        out.u32(self.mode).u32(self.nlink).u32(0).u32(0); // uid, gid
        out.u32(0).u32(4096).u32(0); // rdev, blksize, flags
    }
}

/// `fuse_entry_out`: the entry never expires (the tree is fixed), the attributes always
/// do, so a size change after a grow is seen at the next stat.
pub fn entry_out(attr: &Attr) -> Out {
    let mut out = Out::default();
    out.u64(attr.ino).u64(0).u64(3600).u64(0).u32(0).u32(0);
    attr.encode(&mut out);
    out
}

/// `fuse_attr_out` with a zero cache timeout.
pub fn attr_out(attr: &Attr) -> Out {
    let mut out = Out::default();
    out.u64(0).u32(0).u32(0);
    attr.encode(&mut out);
    out
}

/// One `fuse_dirent` record, padded to 8 bytes.
pub fn dirent(out: &mut Out, ino: u64, off: u64, name: &str, dtype: u32) {
    out.u64(ino).u64(off).u32(name.len() as u32).u32(dtype);
    out.0.extend_from_slice(name.as_bytes());
    let pad = (8 - name.len() % 8) % 8;
    out.zeros(pad);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_is_the_kernel_size() {
        let mut out = Out::default();
        Attr {
            ino: 2,
            size: 4096,
            mode: 0o100600,
            nlink: 1,
        }
        .encode(&mut out);
        assert_eq!(out.0.len(), 88);
        assert_eq!(
            entry_out(&Attr {
                ino: 1,
                size: 0,
                mode: 0,
                nlink: 2
            })
            .0
            .len(),
            128
        );
        assert_eq!(
            attr_out(&Attr {
                ino: 1,
                size: 0,
                mode: 0,
                nlink: 2
            })
            .0
            .len(),
            104
        );
    }

    #[test]
    fn dirent_is_padded() {
        let mut out = Out::default();
        dirent(&mut out, 2, 3, "disk", 8);
        assert_eq!(out.0.len(), 32);
    }

    #[test]
    fn short_messages_parse_to_none() {
        assert!(InHeader::parse(&[0u8; 10]).is_none());
        let mut f = Fields::new(&[1, 0, 0, 0]);
        assert_eq!(f.u32(), Some(1));
        assert_eq!(f.u64(), None);
    }
}
