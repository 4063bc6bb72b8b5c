//! File-system helpers: atomic metadata writes, locks, hole punching, aligned buffers.

use std::alloc::{self, Layout};
use std::fs::{self, File, TryLockError};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;

use nix::fcntl::FallocateFlags;

use crate::{Error, Result, BLOCK_SIZE};

/// Fsyncs a directory so that entries created, renamed or removed in it are durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("sync directory {}", dir.display()), e))
}

/// Replaces `dir/name` with `bytes` atomically: write a temp file, fsync, rename, fsync dir.
pub fn atomic_write(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    stage(dir, name, bytes)?.commit()
}

/// A durable temp file waiting to replace its target.
pub struct Staged {
    dir: std::path::PathBuf,
    tmp: std::path::PathBuf,
    target: std::path::PathBuf,
}

/// First half of `atomic_write`: writes and fsyncs the temp file.
pub fn stage(dir: &Path, name: &str, bytes: &[u8]) -> Result<Staged> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let target = dir.join(name);
    let ctx = || format!("write {}", target.display());
    let mut f = File::create(&tmp).map_err(|e| Error::io(ctx(), e))?;
    f.write_all(bytes).map_err(|e| Error::io(ctx(), e))?;
    f.sync_all().map_err(|e| Error::io(ctx(), e))?;
    Ok(Staged {
        dir: dir.to_owned(),
        tmp,
        target,
    })
}

impl Staged {
    /// Second half of `atomic_write`: renames into place and fsyncs the directory.
    pub fn commit(self) -> Result<()> {
        fs::rename(&self.tmp, &self.target)
            .map_err(|e| Error::io(format!("write {}", self.target.display()), e))?;
        fsync_dir(&self.dir)
    }

    /// Drops the temp file.
    pub fn abort(self) {
        let _ = fs::remove_file(&self.tmp);
    }
}

/// Opens (and with `create`, creates) a layer data file, with O_DIRECT when `direct`.
/// Falls back to buffered I/O on file systems that refuse O_DIRECT.
pub fn open_data(path: &Path, create: bool, writable: bool, direct: bool) -> Result<File> {
    let open = |flags: i32| {
        File::options()
            .read(true)
            .write(writable)
            .create(create)
            .custom_flags(flags)
            .open(path)
    };
    let res = if direct {
        match open(libc::O_DIRECT) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0),
            r => r,
        }
    } else {
        open(0)
    };
    res.map_err(|e| Error::io(format!("open {}", path.display()), e))
}

/// Frees the space of `[offset, offset + len)` in `file`; the range reads as zeros.
pub fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(file, flags, offset as i64, len as i64).map_err(io::Error::from)
}

/// An advisory lock held on a lock file until dropped.
pub struct FileLock {
    _file: File,
}

/// Takes a shared or exclusive flock on `path` (created if missing). With `wait` false,
/// returns `Ok(None)` when the lock is held elsewhere.
pub fn lock(path: &Path, exclusive: bool, wait: bool) -> Result<Option<FileLock>> {
    let ctx = || format!("lock {}", path.display());
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::io(ctx(), e))?;
    let taken = match (exclusive, wait) {
        (true, true) => file.lock().map_err(TryLockError::Error),
        (true, false) => file.try_lock(),
        (false, true) => file.lock_shared().map_err(TryLockError::Error),
        (false, false) => file.try_lock_shared(),
    };
    match taken {
        Ok(()) => Ok(Some(FileLock { _file: file })),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(Error::io(ctx(), e)),
    }
}

/// How long a disk lock is waited for before the disk counts as busy. Another process can
/// hold a lock for a moment without meaning to: a child forked elsewhere in the same
/// process shares its open file until it execs.
pub const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// Like [`lock`] without waiting, but retries for up to `patience` before giving up.
pub fn lock_within(
    path: &Path,
    exclusive: bool,
    patience: std::time::Duration,
) -> Result<Option<FileLock>> {
    let deadline = std::time::Instant::now() + patience;
    loop {
        if let Some(l) = lock(path, exclusive, false)? {
            return Ok(Some(l));
        }
        if std::time::Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Reads exactly `buf.len()` bytes at `offset`; a short read is reported as `UnexpectedEof`.
pub fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset)
}

/// Whether every byte of `buf` is zero.
pub fn is_zero(buf: &[u8]) -> bool {
    let (head, mid, tail) = {
        // SAFETY: u128 has no invalid bit patterns, so viewing initialized bytes as u128
        // is sound; `align_to` puts any unaligned bytes in head and tail.
        unsafe { buf.align_to::<u128>() }
    };
    head.iter().all(|&b| b == 0) && tail.iter().all(|&b| b == 0) && mid.iter().all(|&w| w == 0)
}

/// Alignment of buffers used for O_DIRECT I/O.
pub const ALIGN: usize = BLOCK_SIZE as usize;

/// Whether a buffer may be handed to O_DIRECT I/O as it is.
pub fn is_aligned(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(ALIGN) && buf.len().is_multiple_of(ALIGN)
}

/// A zero-initialized heap buffer aligned to 4096 bytes, for O_DIRECT I/O.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`, like a Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (rounded up to a whole block, at least one).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(1).div_ceil(ALIGN) * ALIGN;
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, ALIGN).unwrap_or_else(|_| Layout::new::<[u8; ALIGN]>())
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to `len` initialized bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to `len` initialized bytes owned exclusively by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection() {
        let mut b = vec![0u8; 4099];
        assert!(is_zero(&b) && is_zero(&b[1..]) && is_zero(&[]));
        b[4098] = 1;
        assert!(!is_zero(&b));
        b[4098] = 0;
        b[0] = 1;
        assert!(!is_zero(&b) && is_zero(&b[1..]));
    }

    #[test]
    fn aligned_buffers() {
        let mut b = AlignedBuf::new(5000);
        assert_eq!(b.len(), 8192);
        assert!(is_aligned(&b));
        b[8191] = 3;
        assert!(!is_zero(&b));
    }

    #[test]
    fn locks_exclude() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        let a = lock(&p, true, false).unwrap();
        assert!(a.is_some());
        assert!(lock(&p, false, false).unwrap().is_none());
        drop(a);
        let s1 = lock(&p, false, false).unwrap();
        let s2 = lock(&p, false, false).unwrap();
        assert!(s1.is_some() && s2.is_some());
        assert!(lock(&p, true, false).unwrap().is_none());
    }

    #[test]
    fn atomic_write_replaces() {
        let dir = tempfile::tempdir().unwrap();
        atomic_write(dir.path(), "m", b"one").unwrap();
        atomic_write(dir.path(), "m", b"two").unwrap();
        assert_eq!(fs::read(dir.path().join("m")).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
