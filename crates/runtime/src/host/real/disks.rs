//! Root disks of sandboxes: block-store disks forked from an image's layer, each served by
//! its own disk server process and mounted as ext4 at the sandbox's rootfs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use blockstore::{LayerId, Store};
use disk::{DiskSpec, MountOptions, MountedDisk};

use crate::error::{Error, Result};
use crate::layout::SandboxPaths;

/// The block store and the disks this process has mounted.
pub struct Disks {
    store: Store,
    store_path: PathBuf,
    options: MountOptions,
    mounted: Mutex<HashMap<String, MountedDisk>>,
}

/// The disk server's report of a disk whose lock another handle holds.
fn is_busy(msg: &str) -> bool {
    msg.contains("is open in another process")
}

fn disk_err(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Disk(Box::new(e))
}

impl Disks {
    /// Opens (or creates) the block store at `store_path`.
    pub fn open(store_path: impl Into<PathBuf>) -> Result<Disks> {
        let store_path = store_path.into();
        let store = Store::open(&store_path).map_err(disk_err)?;
        let options = MountOptions::default();
        Ok(Disks {
            store,
            store_path,
            options,
            mounted: Mutex::new(HashMap::new()),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    fn spec(&self, disk: &str, paths: &SandboxPaths) -> DiskSpec {
        DiskSpec {
            store: self.store_path.clone(),
            disk: disk.into(),
            run_dir: paths.disk(),
        }
    }

    fn keep(&self, disk: &str, mounted: MountedDisk) {
        let mut map = self.mounted.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(disk.into(), mounted);
    }

    fn take(&self, disk: &str) -> Option<MountedDisk> {
        self.mounted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(disk)
    }

    /// Forks `disk` from layer `base`; at least the base's size, `size_mb` if larger.
    pub fn create(&self, disk: &str, base: &str, size_mb: u64) -> Result<()> {
        let base: LayerId = base
            .parse()
            .map_err(|_| Error::InvalidSpec(format!("bad layer id {base:?}")))?;
        let base_size = self.store.layer_info(&base).map_err(disk_err)?.size;
        let size = base_size.max(size_mb << 20);
        self.store
            .create_disk(disk, size, Some(&base))
            .map_err(disk_err)
    }

    /// Mounts the disk. A disk server refused the disk's lock is retried for a while: a
    /// process forked by this one (for another sandbox) while the store held that lock
    /// keeps a copy of it until it execs, which takes a moment on a loaded host.
    pub fn mount(&self, disk: &str, paths: &SandboxPaths) -> Result<()> {
        let spec = self.spec(disk, paths);
        let mut pause = Duration::from_millis(5);
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match MountedDisk::mount(&spec, &paths.rootfs(), self.options.clone()) {
                Ok(m) => {
                    self.keep(disk, m);
                    return Ok(());
                }
                Err(disk::Error::Server(msg)) if is_busy(&msg) && Instant::now() < deadline => {
                    tracing::debug!(disk, "disk lock busy, retrying");
                    let _ = disk::cleanup_stale(&paths.disk());
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(e) => return Err(disk_err(e)),
            }
        }
    }

    pub fn adopt(&self, disk: &str, paths: &SandboxPaths) -> Result<()> {
        let m = MountedDisk::adopt(&self.spec(disk, paths), &paths.rootfs()).map_err(disk_err)?;
        self.keep(disk, m);
        Ok(())
    }

    /// Tears the disk down; one this process does not hold (never mounted by it, or a
    /// half-made mount) is cleaned up from what is found below the sandbox's directory.
    pub fn unmount(&self, disk: &str, paths: &SandboxPaths) -> Result<()> {
        if let Some(m) = self.take(disk) {
            m.teardown().map_err(disk_err)?;
        }
        disk::cleanup_stale(&paths.dir).map(drop).map_err(disk_err)
    }

    /// Runs `f` on a disk this process has mounted (or adopted).
    pub fn with_mounted<T>(
        &self,
        disk: &str,
        f: impl FnOnce(&MountedDisk) -> Result<T>,
    ) -> Result<T> {
        let map = self.mounted.lock().unwrap_or_else(|p| p.into_inner());
        let m = map
            .get(disk)
            .ok_or_else(|| Error::InvalidSpec(format!("disk {disk} is not mounted here")))?;
        f(m)
    }

    pub fn delete(&self, disk: &str) -> Result<()> {
        match self.store.delete_disk(disk) {
            Err(blockstore::Error::DiskNotFound(_)) => Ok(()),
            r => r.map_err(disk_err),
        }
    }
}
