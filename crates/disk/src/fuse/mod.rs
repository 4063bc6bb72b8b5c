//! FUSE export of one block device as a single regular file.

mod abi;
mod fs;
mod session;
pub mod uring;

pub use abi::open_flag;
pub use fs::{
    DiskFs, FlushMode, FsOptions, IoCounters, IoStats, DEFAULT_OPEN_FLAGS, FILE_NAME, MAX_IO,
};
pub use session::{abort_connection, Session, Workers};

use std::path::Path;
use std::sync::Arc;

use blockstore::BlockDevice;

use crate::Result;

/// A block device exported as `<mountpoint>/disk` and served by worker threads.
pub struct Export {
    session: Session,
    workers: Option<Workers>,
    stats: Arc<IoStats>,
}

impl Export {
    /// Mounts the export at `mountpoint` (an existing empty directory) and starts
    /// `threads` workers. The file is ready for I/O when this returns.
    pub fn start(
        dev: Arc<dyn BlockDevice>,
        mountpoint: &Path,
        threads: usize,
        opts: FsOptions,
    ) -> Result<Export> {
        let stats = Arc::new(IoStats::default());
        let fs = Arc::new(DiskFs::new(dev, stats.clone(), opts));
        let session = Session::mount(mountpoint, fs)?;
        let workers = match session.serve(threads) {
            Ok(w) => w,
            Err(e) => {
                session.abort();
                return Err(e);
            }
        };
        Ok(Export {
            session,
            workers: Some(workers),
            stats,
        })
    }

    /// The exported file.
    pub fn file(&self) -> std::path::PathBuf {
        self.session.mountpoint().join(FILE_NAME)
    }

    /// The live counters, for readers that outlive a borrow of the export.
    pub fn stats_handle(&self) -> Arc<IoStats> {
        self.stats.clone()
    }

    pub fn stats(&self) -> IoCounters {
        self.stats.snapshot()
    }

    /// Whether the kernel sends requests over io_uring.
    pub fn uses_uring(&self) -> bool {
        self.session.uses_uring()
    }

    pub fn connection(&self) -> u64 {
        self.session.connection()
    }

    /// Unmounts and waits for the workers. When the file is still held open (a loop
    /// device not yet detached), waits up to `grace` and then aborts the connection.
    pub fn stop(mut self, grace: std::time::Duration) -> Result<()> {
        let res = self.session.unmount();
        let Some(workers) = self.workers.take() else {
            return res;
        };
        let deadline = std::time::Instant::now() + grace;
        while !workers.finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if !workers.finished() {
            self.session.abort();
        }
        workers.join();
        res
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        if let Some(workers) = self.workers.take() {
            self.session.abort();
            workers.join();
        }
    }
}
