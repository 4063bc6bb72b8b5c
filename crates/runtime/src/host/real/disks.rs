//! Root disks of sandboxes: block-store disks forked from an image's layer, each served by
//! its own disk server process and mounted as ext4 at the sandbox's rootfs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

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

fn disk_err(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Disk(Box::new(e))
}

impl Disks {
    /// Opens (or creates) the block store at `store_path`.
    pub fn open(store_path: impl Into<PathBuf>) -> Result<Disks> {
        Disks::open_with(store_path, disk::fuse::FlushMode::default())
    }

    /// Opens (or creates) the block store at `store_path`; flushes inside the disks it
    /// mounts wait for `flush`.
    pub fn open_with(
        store_path: impl Into<PathBuf>,
        flush: disk::fuse::FlushMode,
    ) -> Result<Disks> {
        // A sandbox's writes are held, never dropped, while the host has no space.
        let options = MountOptions {
            flush,
            hold_when_full: true,
            ..MountOptions::default()
        };
        let store_path = store_path.into();
        let store = Store::open(&store_path).map_err(disk_err)?;
        // Reads of partial layers (pulled from an object store) in this process go, as
        // disk servers' do, to the daemon's fetch socket.
        store.set_fetcher(std::sync::Arc::new(blockstore::remote::SocketFetch::new(
            store_path.join(blockstore::remote::FETCH_SOCKET),
            std::time::Duration::from_secs(60),
        )));
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

    /// Mounts the disk. (A disk lock briefly shared with a forked child is waited for
    /// by the block store itself.)
    pub fn mount(&self, disk: &str, paths: &SandboxPaths) -> Result<()> {
        let spec = self.spec(disk, paths);
        let m =
            MountedDisk::mount(&spec, &paths.rootfs(), self.options.clone()).map_err(disk_err)?;
        self.keep(disk, m);
        Ok(())
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

    /// Writes the disk's server holds for want of host space (its control socket asked).
    pub fn held_writes(&self, disk: &str) -> Result<u64> {
        let run_dir = self.with_mounted(disk, |m| Ok(m.spec().run_dir.clone()))?;
        disk::stats_of(&run_dir)
            .map(|s| s.io.held_writes)
            .map_err(disk_err)
    }

    pub fn delete(&self, disk: &str) -> Result<()> {
        match self.store.delete_disk(disk) {
            Err(blockstore::Error::DiskNotFound(_)) => Ok(()),
            r => r.map_err(disk_err),
        }
    }
}
