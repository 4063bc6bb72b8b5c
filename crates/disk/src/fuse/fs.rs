//! The exported filesystem: a root directory holding one regular file, `disk`, whose
//! bytes are the block device's. Each request is answered from the device directly.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use blockstore::{BlockDevice, BLOCK_SIZE};
use serde::{Deserialize, Serialize};

use super::abi::{self, op, Attr, Fields, InHeader, Out};

/// Inode number of the exported file.
pub const FILE_ID: u64 = 2;
/// Name of the exported file inside the mount.
pub const FILE_NAME: &str = "disk";
/// Largest READ or WRITE the kernel sends (`max_write`, `max_read`): 1 MiB. 256 KiB
/// measured ~25% slower on sequential writes.
pub const MAX_IO: usize = 1 << 20;
/// Open flags of the exported file: direct I/O (no page cache between the loop device
/// and the server) with parallel direct writes (no inode lock per write).
pub const DEFAULT_OPEN_FLAGS: u32 =
    abi::open_flag::DIRECT_IO | abi::open_flag::PARALLEL_DIRECT_WRITES;

const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const DT_DIR: u32 = 4;
const DT_REG: u32 = 8;
const FALLOC_FL_KEEP_SIZE: u32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
const FALLOC_FL_ZERO_RANGE: u32 = 0x10;

/// What a flush (fsync) from the disk's user waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// A flush is acknowledged without a host sync: the data is already in the store's
    /// data file (O_DIRECT), the bitmaps in the server's memory, and both are synced at
    /// seal (checkpoint, suspend), compaction and shutdown. Unsealed writes are lost with
    /// the disk server or the host — as the sandbox itself is (its processes die; the
    /// daemon fails a sandbox whose disk server died). The default.
    #[default]
    Writeback,
    /// Every flush is a host fsync of the data and the metadata.
    Durable,
}

impl std::str::FromStr for FlushMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "writeback" => Ok(FlushMode::Writeback),
            "durable" => Ok(FlushMode::Durable),
            other => Err(format!(
                "unknown flush mode {other:?} (writeback or durable)"
            )),
        }
    }
}

impl std::fmt::Display for FlushMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FlushMode::Writeback => "writeback",
            FlushMode::Durable => "durable",
        })
    }
}

/// How the kernel is told to treat the file and the connection.
#[derive(Clone, Copy, Debug)]
pub struct FsOptions {
    /// Requests the kernel may keep in flight (`max_background`); async direct I/O from
    /// the loop device is bounded by it.
    pub max_background: u16,
    /// `fuse_open_out.open_flags` for every open of the file.
    pub open_flags: u32,
    /// Ask for FUSE over io_uring (used when the kernel offers it).
    pub uring: bool,
    /// What a flush from the kernel waits for.
    pub flush: FlushMode,
    /// A write the host has no space for waits until it has, instead of failing (see
    /// [`DiskFs::write_holding`]).
    pub hold_when_full: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            max_background: 128,
            open_flags: DEFAULT_OPEN_FLAGS,
            uring: false,
            flush: FlushMode::default(),
            hold_when_full: false,
        }
    }
}

/// I/O counters of one export.
#[derive(Debug, Default)]
pub struct IoStats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub flushes: AtomicU64,
    pub discards: AtomicU64,
    pub write_zeroes: AtomicU64,
    pub errors: AtomicU64,
    /// Writes waiting now for the host to have space for them (see [`DiskFs::write`]).
    pub held_writes: AtomicU64,
    /// Writes that found the host out of space (held or failed).
    pub no_space: AtomicU64,
    /// Set when the disk is going away: held writes then fail instead of waiting.
    pub give_up: AtomicBool,
}

/// A copy of the counters, for reports. Fields missing from an older server's report
/// read as zero.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct IoCounters {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub write_zeroes: u64,
    pub errors: u64,
    pub held_writes: u64,
    pub no_space: u64,
}

impl IoStats {
    pub fn snapshot(&self) -> IoCounters {
        IoCounters {
            reads: self.reads.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            writes: self.writes.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            discards: self.discards.load(Relaxed),
            write_zeroes: self.write_zeroes.load(Relaxed),
            errors: self.errors.load(Relaxed),
            held_writes: self.held_writes.load(Relaxed),
            no_space: self.no_space.load(Relaxed),
        }
    }
}

/// What to send back for one request.
pub enum Reply {
    /// The request takes no reply (FORGET, INTERRUPT).
    None,
    /// A negative-errno reply.
    Error(i32),
    /// A reply body.
    Body(Out),
    /// READ data: the first `n` bytes of the thread's data buffer.
    Data(usize),
}

/// The filesystem served over one FUSE connection.
pub struct DiskFs {
    dev: Arc<dyn BlockDevice>,
    stats: Arc<IoStats>,
    opts: FsOptions,
}

impl DiskFs {
    pub fn new(dev: Arc<dyn BlockDevice>, stats: Arc<IoStats>, opts: FsOptions) -> Self {
        DiskFs { dev, stats, opts }
    }

    /// The INIT reply and whether io_uring was agreed, or `None` when the kernel speaks
    /// another major version.
    pub fn init(&self, arg: &[u8]) -> Option<(Out, bool)> {
        let mut f = Fields::new(arg);
        let (major, _minor, readahead, kflags) = (f.u32()?, f.u32()?, f.u32()?, f.u32()?);
        let kflags2 = f.u32().unwrap_or(0);
        if major != abi::KERNEL_VERSION {
            return None;
        }
        use abi::init_flag::*;
        let uring = self.opts.uring && kflags & INIT_EXT != 0 && kflags2 & OVER_IO_URING2 != 0;
        let mut want = ASYNC_READ | BIG_WRITES | ASYNC_DIO | PARALLEL_DIROPS | MAX_PAGES;
        if uring {
            want |= INIT_EXT;
        }
        let flags2 = if uring { OVER_IO_URING2 } else { 0 };
        let mut out = Out::default();
        out.u32(abi::KERNEL_VERSION).u32(abi::KERNEL_MINOR_VERSION);
        out.u32(readahead).u32(kflags & want);
        let bg = self.opts.max_background;
        out.u16(bg).u16(bg - bg / 4).u32(MAX_IO as u32).u32(1);
        out.u16((MAX_IO / 4096) as u16)
            .u16(0)
            .u32(flags2)
            .zeros(7 * 4);
        Some((out, uring))
    }

    /// Answers one request. `arg` is the request after its header; `data` holds a
    /// WRITE's payload on entry and receives a READ's data.
    pub fn handle(&self, h: &InHeader, arg: &[u8], data: &mut [u8]) -> Reply {
        match h.opcode {
            op::FORGET | op::BATCH_FORGET | op::INTERRUPT => Reply::None,
            op::LOOKUP => self.lookup(h.nodeid, arg),
            op::GETATTR | op::SETATTR => self.setattr(h.opcode, h.nodeid, arg),
            op::OPEN => self.open(h.nodeid),
            op::OPENDIR => open_out(0),
            op::READ => self.read(arg, data),
            op::WRITE => self.write(arg, data),
            op::FALLOCATE => self.fallocate(arg),
            op::FSYNC => self.fsync(),
            op::READDIR => readdir(h.nodeid, arg),
            op::STATFS => self.statfs(),
            op::FLUSH | op::RELEASE | op::RELEASEDIR | op::FSYNCDIR | op::ACCESS => ok(),
            op::DESTROY => ok(),
            // GETXATTR and LISTXATTR too: ENOSYS stops the kernel from asking again.
            _ => Reply::Error(libc::ENOSYS),
        }
    }

    fn attr(&self, nodeid: u64) -> Option<Attr> {
        match nodeid {
            abi::ROOT_ID => Some(Attr {
                ino: abi::ROOT_ID,
                size: 0,
                mode: S_IFDIR | 0o755,
                nlink: 2,
            }),
            FILE_ID => Some(Attr {
                ino: FILE_ID,
                size: self.dev.size(),
                mode: S_IFREG | 0o600,
                nlink: 1,
            }),
            _ => None,
        }
    }

    fn lookup(&self, parent: u64, arg: &[u8]) -> Reply {
        let name = arg.split(|&b| b == 0).next().unwrap_or_default();
        if parent != abi::ROOT_ID || name != FILE_NAME.as_bytes() {
            return Reply::Error(libc::ENOENT);
        }
        match self.attr(FILE_ID) {
            Some(a) => Reply::Body(abi::entry_out(&a)),
            None => Reply::Error(libc::ENOENT),
        }
    }

    /// GETATTR, and SETATTR where only a truncate to the current size is allowed: the
    /// size changes through the disk server's grow, never through the file.
    fn setattr(&self, opcode: u32, nodeid: u64, arg: &[u8]) -> Reply {
        let Some(attr) = self.attr(nodeid) else {
            return Reply::Error(libc::ENOENT);
        };
        if opcode == op::SETATTR {
            let mut f = Fields::new(arg);
            let valid = f.u32().unwrap_or(0);
            let size = f.skip(12).and_then(|_| f.u64());
            if valid & abi::FATTR_SIZE != 0 && size != Some(attr.size) {
                return Reply::Error(libc::EPERM);
            }
        }
        Reply::Body(abi::attr_out(&attr))
    }

    fn open(&self, nodeid: u64) -> Reply {
        match nodeid {
            FILE_ID => open_out(self.opts.open_flags),
            _ => Reply::Error(libc::EISDIR),
        }
    }

    /// Clamps `[off, off + len)` to the device; `None` when it starts past the end.
    fn clamp(&self, off: u64, len: u64) -> Option<u64> {
        let size = self.dev.size();
        (off <= size).then(|| len.min(size - off))
    }

    fn read(&self, arg: &[u8], data: &mut [u8]) -> Reply {
        let mut f = Fields::new(arg);
        let (Some(_fh), Some(off), Some(len)) = (f.u64(), f.u64(), f.u32()) else {
            return Reply::Error(libc::EINVAL);
        };
        let Some(n) = self.clamp(off, (len as usize).min(data.len()) as u64) else {
            return Reply::Data(0);
        };
        let n = n as usize;
        bump(&self.stats.reads, &self.stats.read_bytes, n);
        self.check(self.dev.read_at(&mut data[..n], off))
            .map_or_else(Reply::Error, |_| Reply::Data(n))
    }

    fn write(&self, arg: &[u8], data: &[u8]) -> Reply {
        let mut f = Fields::new(arg);
        let (Some(_fh), Some(off), Some(len)) = (f.u64(), f.u64(), f.u32()) else {
            return Reply::Error(libc::EINVAL);
        };
        let len = len as usize;
        if len > data.len() {
            return Reply::Error(libc::EINVAL);
        }
        if self.clamp(off, len as u64) != Some(len as u64) {
            return Reply::Error(libc::EFBIG);
        }
        bump(&self.stats.writes, &self.stats.write_bytes, len);
        match self.check(self.write_holding(&data[..len], off)) {
            Ok(()) => {
                let mut out = Out::default();
                out.u32(len as u32).u32(0);
                Reply::Body(out)
            }
            Err(e) => Reply::Error(e),
        }
    }

    /// Writes `data` at `off`; while the host has no space for it, the write waits and is
    /// tried again (as a thin pool queues I/O when it runs out of space) instead of
    /// failing. A failed write is lost to the guest's filesystem, which then turns
    /// read-only, while a flush it sent earlier may already have been acknowledged; a
    /// held write is never acknowledged, so nothing the sandbox was told is kept gets lost,
    /// and it goes on by itself once space is freed. The daemon reports the wait
    /// (`held_writes`). A disk being torn down fails its held writes ([`IoStats::give_up`]).
    fn write_holding(&self, data: &[u8], off: u64) -> blockstore::Result<()> {
        let mut res = self.dev.write_at(data, off);
        if !res.as_ref().is_err_and(no_space) {
            return res;
        }
        let s = &self.stats;
        s.no_space.fetch_add(1, Relaxed);
        if !self.opts.hold_when_full {
            return res;
        }
        if s.held_writes.fetch_add(1, Relaxed) == 0 {
            eprintln!(
                "disk server: the host has no space for a write: holding writes until it has"
            );
        }
        let mut pause = SPACE_RETRY_FIRST;
        while res.as_ref().is_err_and(no_space) && !s.give_up.load(Relaxed) {
            std::thread::sleep(pause);
            pause = (pause * 2).min(SPACE_RETRY_MAX);
            res = self.dev.write_at(data, off);
        }
        if s.held_writes.fetch_sub(1, Relaxed) == 1 && res.is_ok() {
            eprintln!("disk server: the host has space again: held writes done");
        }
        res
    }

    fn fallocate(&self, arg: &[u8]) -> Reply {
        let mut f = Fields::new(arg);
        let (Some(_fh), Some(off), Some(len), Some(mode)) = (f.u64(), f.u64(), f.u64(), f.u32())
        else {
            return Reply::Error(libc::EINVAL);
        };
        let Some(len) = self.clamp(off, len) else {
            return Reply::Error(libc::EINVAL);
        };
        let res = match mode & !FALLOC_FL_KEEP_SIZE {
            0 if mode & FALLOC_FL_KEEP_SIZE != 0 || len > 0 => Ok(()),
            FALLOC_FL_PUNCH_HOLE => self.discard(off, len),
            FALLOC_FL_ZERO_RANGE => {
                self.stats.write_zeroes.fetch_add(1, Relaxed);
                self.dev.write_zeroes(off, len)
            }
            _ => return Reply::Error(libc::EOPNOTSUPP),
        };
        self.check(res).map_or_else(Reply::Error, |_| ok())
    }

    /// Discards the whole blocks of the range; partial blocks at either end are zeroed.
    fn discard(&self, off: u64, len: u64) -> blockstore::Result<()> {
        self.stats.discards.fetch_add(1, Relaxed);
        let end = off + len;
        let (lo, hi) = (
            off.next_multiple_of(BLOCK_SIZE),
            end / BLOCK_SIZE * BLOCK_SIZE,
        );
        if lo >= hi {
            return self.dev.write_zeroes(off, len);
        }
        if off < lo {
            self.dev.write_zeroes(off, lo - off)?;
        }
        self.dev.discard(lo, hi - lo)?;
        if hi < end {
            self.dev.write_zeroes(hi, end - hi)?;
        }
        Ok(())
    }

    fn fsync(&self) -> Reply {
        self.stats.flushes.fetch_add(1, Relaxed);
        let res = match self.opts.flush {
            FlushMode::Writeback => Ok(()),
            FlushMode::Durable => self.dev.flush(),
        };
        self.check(res).map_or_else(Reply::Error, |_| ok())
    }

    fn statfs(&self) -> Reply {
        let blocks = self.dev.size() / BLOCK_SIZE;
        let mut out = Out::default();
        out.u64(blocks).u64(0).u64(0).u64(2).u64(0);
        out.u32(BLOCK_SIZE as u32)
            .u32(255)
            .u32(BLOCK_SIZE as u32)
            .u32(0);
        out.zeros(6 * 4);
        Reply::Body(out)
    }

    /// Turns a device result into an errno, counting and logging failures.
    fn check(&self, res: blockstore::Result<()>) -> Result<(), i32> {
        res.map_err(|e| {
            // A broken disk fails every request: log the first few, then a sample.
            let n = self.stats.errors.fetch_add(1, Relaxed);
            if n < 10 || n.is_multiple_of(10_000) {
                eprintln!(
                    "disk I/O failed ({} so far): {}",
                    n + 1,
                    model::error_chain(&e)
                );
            }
            errno_of(&e)
        })
    }
}

/// Adds one operation of `bytes` bytes to a pair of counters.
fn bump(ops: &AtomicU64, total: &AtomicU64, bytes: usize) {
    ops.fetch_add(1, Relaxed);
    total.fetch_add(bytes as u64, Relaxed);
}

/// First and longest pause of a write waiting for host space.
const SPACE_RETRY_FIRST: Duration = Duration::from_millis(10);
const SPACE_RETRY_MAX: Duration = Duration::from_secs(1);

/// Whether a device error is the host's file system out of space (or quota).
fn no_space(e: &blockstore::Error) -> bool {
    matches!(e, blockstore::Error::Io { source, .. }
        if matches!(source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)))
}

fn errno_of(e: &blockstore::Error) -> i32 {
    match e {
        blockstore::Error::OutOfRange { .. } => libc::EINVAL,
        blockstore::Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

fn ok() -> Reply {
    Reply::Body(Out::default())
}

fn open_out(flags: u32) -> Reply {
    let mut out = Out::default();
    out.u64(0).u32(flags).u32(0);
    Reply::Body(out)
}

fn readdir(nodeid: u64, arg: &[u8]) -> Reply {
    if nodeid != abi::ROOT_ID {
        return Reply::Error(libc::ENOTDIR);
    }
    let mut f = Fields::new(arg);
    let (Some(_fh), Some(start), Some(size)) = (f.u64(), f.u64(), f.u32()) else {
        return Reply::Error(libc::EINVAL);
    };
    let entries = [
        (abi::ROOT_ID, ".", DT_DIR),
        (abi::ROOT_ID, "..", DT_DIR),
        (FILE_ID, FILE_NAME, DT_REG),
    ];
    let mut out = Out::default();
    for (i, (ino, name, dtype)) in entries.iter().enumerate().skip(start as usize) {
        let before = out.0.len();
        abi::dirent(&mut out, *ino, i as u64 + 1, name, *dtype);
        if out.0.len() > size as usize {
            out.0.truncate(before);
            break;
        }
    }
    Reply::Body(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockstore::FileDevice;

    fn fs_over(len: u64) -> (tempfile::NamedTempFile, DiskFs) {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(len).unwrap();
        let dev = Arc::new(FileDevice::open(file.path()).unwrap());
        let fs = DiskFs::new(dev, Arc::default(), FsOptions::default());
        (file, fs)
    }

    fn header(opcode: u32, nodeid: u64) -> InHeader {
        InHeader {
            len: 0,
            opcode,
            unique: 1,
            nodeid,
        }
    }

    fn args(fields: &[u64]) -> Vec<u8> {
        fields.iter().flat_map(|f| f.to_le_bytes()).collect()
    }

    /// A device whose first `fail` writes find the host out of space.
    struct FullFor {
        inner: FileDevice,
        fail: AtomicU64,
    }

    impl BlockDevice for FullFor {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> blockstore::Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> blockstore::Result<()> {
            let left = self.fail.load(Relaxed);
            if left > 0 {
                self.fail.store(left - 1, Relaxed);
                let source = std::io::Error::from_raw_os_error(libc::ENOSPC);
                return Err(blockstore::Error::io("write data of layer x", source));
            }
            self.inner.write_at(buf, offset)
        }
        fn flush(&self) -> blockstore::Result<()> {
            self.inner.flush()
        }
        fn discard(&self, offset: u64, len: u64) -> blockstore::Result<()> {
            self.inner.discard(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64) -> blockstore::Result<()> {
            self.inner.write_zeroes(offset, len)
        }
    }

    fn full_fs(fail: u64, hold: bool) -> (tempfile::NamedTempFile, DiskFs) {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(8192).unwrap();
        let dev = Arc::new(FullFor {
            inner: FileDevice::open(file.path()).unwrap(),
            fail: AtomicU64::new(fail),
        });
        let opts = FsOptions {
            hold_when_full: hold,
            ..FsOptions::default()
        };
        (file, DiskFs::new(dev, Arc::default(), opts))
    }

    #[test]
    fn a_write_without_host_space_waits_for_it_and_is_kept() {
        let (_f, fs) = full_fs(3, true);
        let mut data = vec![7u8; 4096];
        let r = fs.handle(&header(op::WRITE, FILE_ID), &args(&[0, 0, 4096]), &mut data);
        assert!(
            matches!(r, Reply::Body(_)),
            "the write succeeds once there is space"
        );
        let c = fs.stats.snapshot();
        assert_eq!((c.no_space, c.held_writes, c.errors), (1, 0, 0));
        let mut back = vec![0u8; 4096];
        let r = fs.handle(&header(op::READ, FILE_ID), &args(&[0, 0, 4096]), &mut back);
        assert!(matches!(r, Reply::Data(4096)));
        assert_eq!(back, vec![7u8; 4096]);
    }

    #[test]
    fn without_holding_or_once_given_up_a_write_without_space_fails() {
        let (_f, fs) = full_fs(u64::MAX, false);
        let mut data = vec![7u8; 4096];
        let r = fs.handle(&header(op::WRITE, FILE_ID), &args(&[0, 0, 4096]), &mut data);
        assert!(matches!(r, Reply::Error(libc::ENOSPC)));
        let (_f, fs) = full_fs(u64::MAX, true);
        fs.stats.give_up.store(true, Relaxed);
        let r = fs.handle(&header(op::WRITE, FILE_ID), &args(&[0, 0, 4096]), &mut data);
        assert!(matches!(r, Reply::Error(libc::ENOSPC)));
        assert_eq!(fs.stats.snapshot().held_writes, 0);
    }

    #[test]
    fn size_changes_through_setattr_are_refused() {
        let (_f, fs) = fs_over(8192);
        let mut arg = vec![0u8; 88];
        arg[0..4].copy_from_slice(&abi::FATTR_SIZE.to_le_bytes());
        arg[16..24].copy_from_slice(&4096u64.to_le_bytes());
        let r = fs.handle(&header(op::SETATTR, FILE_ID), &arg, &mut []);
        assert!(matches!(r, Reply::Error(libc::EPERM)));
        arg[16..24].copy_from_slice(&8192u64.to_le_bytes());
        let r = fs.handle(&header(op::SETATTR, FILE_ID), &arg, &mut []);
        assert!(matches!(r, Reply::Body(_)));
    }

    #[test]
    fn reads_stop_at_the_end_and_writes_past_it_fail() {
        let (_f, fs) = fs_over(8192);
        let mut buf = vec![0u8; 8192];
        let r = fs.handle(
            &header(op::READ, FILE_ID),
            &args(&[0, 4096, 8192]),
            &mut buf,
        );
        assert!(matches!(r, Reply::Data(4096)));
        let r = fs.handle(&header(op::READ, FILE_ID), &args(&[0, 9000, 10]), &mut buf);
        assert!(matches!(r, Reply::Data(0)));
        let r = fs.handle(
            &header(op::WRITE, FILE_ID),
            &args(&[0, 8000, 400]),
            &mut buf,
        );
        assert!(matches!(r, Reply::Error(libc::EFBIG)));
    }

    #[test]
    fn punch_hole_zeroes_partial_blocks_and_discards_whole_ones() {
        let (_f, fs) = fs_over(4 * 4096);
        let mut ones = vec![1u8; 4 * 4096];
        let r = fs.handle(
            &header(op::WRITE, FILE_ID),
            &args(&[0, 0, 4 * 4096]),
            &mut ones,
        );
        assert!(matches!(r, Reply::Body(_)));
        let mode = u64::from(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
        let r = fs.handle(
            &header(op::FALLOCATE, FILE_ID),
            &args(&[0, 100, 3 * 4096, mode]),
            &mut [],
        );
        assert!(matches!(r, Reply::Body(_)));
        let mut back = vec![0u8; 4 * 4096];
        fs.handle(
            &header(op::READ, FILE_ID),
            &args(&[0, 0, 4 * 4096]),
            &mut back,
        );
        assert!(back[..100].iter().all(|&b| b == 1));
        assert!(back[100..100 + 3 * 4096].iter().all(|&b| b == 0));
        assert!(back[100 + 3 * 4096..].iter().all(|&b| b == 1));
        assert_eq!(fs.stats.snapshot().discards, 1);
    }

    #[test]
    fn readdir_pages_and_lookup_knows_one_name() {
        let (_f, fs) = fs_over(4096);
        let Reply::Body(all) = fs.handle(
            &header(op::READDIR, abi::ROOT_ID),
            &args(&[0, 0, 4096]),
            &mut [],
        ) else {
            panic!("readdir failed");
        };
        assert_eq!(all.0.len(), 32 * 3);
        let Reply::Body(rest) = fs.handle(
            &header(op::READDIR, abi::ROOT_ID),
            &args(&[0, 2, 4096]),
            &mut [],
        ) else {
            panic!("readdir failed");
        };
        assert_eq!(rest.0.len(), 32);
        assert!(matches!(
            fs.handle(&header(op::LOOKUP, 1), b"disk\0", &mut []),
            Reply::Body(_)
        ));
        assert!(matches!(
            fs.handle(&header(op::LOOKUP, 1), b"etc\0", &mut []),
            Reply::Error(libc::ENOENT)
        ));
        assert!(matches!(
            fs.handle(&header(op::OPEN, 1), &[], &mut []),
            Reply::Error(libc::EISDIR)
        ));
    }
}
