//! The small capability surface every disk export (FUSE today, vhost-user-blk later)
//! serves: byte-addressed reads and writes, flush, discard, write-zeroes and size.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::{Error, Result};

/// A byte-addressed block device. Implementations are safe to call from many threads.
pub trait BlockDevice: Send + Sync {
    /// Current size in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` from `offset`. The whole range must lie within the device.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Writes all of `buf` at `offset`. The whole range must lie within the device.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> Result<()>;
    /// Forgets the range: it reads as zeros afterwards and frees its space.
    fn discard(&self, offset: u64, len: u64) -> Result<()>;
    /// Makes the range read as zeros.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()>;
}

/// Checks that `[offset, offset + len)` lies within a device of `size` bytes.
pub fn check_range(op: &'static str, offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange {
            op,
            offset,
            len,
            size,
        }),
    }
}

/// A plain file served as a block device: the baseline every layered disk is measured
/// against, and a simple backend for tests of the export path.
pub struct FileDevice {
    file: File,
    size: u64,
}

impl FileDevice {
    /// Opens an existing file read-write; its length is the device size.
    pub fn open(path: &Path) -> Result<Self> {
        let context = || format!("open {}", path.display());
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(context(), e))?;
        let size = file.metadata().map_err(|e| Error::io(context(), e))?.len();
        Ok(FileDevice { file, size })
    }
}

impl BlockDevice for FileDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range("read", offset, buf.len() as u64, self.size)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::io("read file device", e))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_range("write", offset, buf.len() as u64, self.size)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| Error::io("write file device", e))
    }

    fn flush(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io("flush file device", e))
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.write_zeroes(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        check_range("write-zeroes", offset, len, self.size)?;
        let zeros = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}
