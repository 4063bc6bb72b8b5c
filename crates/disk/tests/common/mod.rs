//! Shared fixture: a temporary store with an ext4 base image, and a guard that removes
//! every mount, loop device and disk server below the temporary directory.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use blockstore::{LayerId, Store};
use disk::{DiskSpec, MountOptions, MountedDisk};

pub const IMAGE_SIZE: u64 = 96 << 20;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub base: LayerId,
    /// The store lies on a tmpfs of the fixture's own (unmounted on drop).
    tmpfs: bool,
}

impl Fixture {
    /// A store holding one base layer: ext4 with `/hello.txt` and `/etc/motd`.
    pub fn new() -> Fixture {
        Fixture::with_store_on(None)
    }

    /// The same, with the store on a tmpfs of `mib` MiB: a host disk that can fill up.
    pub fn on_small_tmpfs(mib: u64) -> Fixture {
        Fixture::with_store_on(Some(mib))
    }

    fn with_store_on(tmpfs_mib: Option<u64>) -> Fixture {
        std::env::set_var("SANDFORK_DISK_BIN", env!("CARGO_BIN_EXE_sandfork-disk"));
        testkit::needs_root("FUSE, loop devices, mounts");
        let dir = testkit::data_dir("disk");
        if let Some(mib) = tmpfs_mib {
            let store = dir.path().join("store");
            std::fs::create_dir_all(&store).unwrap();
            let size = format!("size={mib}m");
            nix::mount::mount(
                Some("tmpfs"),
                &store,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                Some(size.as_str()),
            )
            .unwrap();
        }
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::fs::write(rootfs.join("hello.txt"), "hello from the image\n").unwrap();
        std::fs::write(rootfs.join("etc/motd"), "base\n").unwrap();
        let image = dir.path().join("base.img");
        disk::build_ext4_image(&rootfs, &image, IMAGE_SIZE).unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let base = store.import_image(&image).unwrap();
        std::fs::remove_file(&image).unwrap();
        Fixture {
            dir,
            store,
            base,
            tmpfs: tmpfs_mib.is_some(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Creates disk `name` over `base` and mounts it at `<tmp>/mnt-<name>`.
    pub fn mount_new(&self, name: &str, base: &LayerId) -> MountedDisk {
        self.store
            .create_disk(name, IMAGE_SIZE, Some(base))
            .unwrap();
        self.mount(name)
    }

    pub fn mount(&self, name: &str) -> MountedDisk {
        self.mount_with(name, MountOptions::default())
    }

    pub fn mount_with(&self, name: &str, opts: MountOptions) -> MountedDisk {
        let mnt = self.path(&format!("mnt-{name}"));
        std::fs::create_dir_all(&mnt).unwrap();
        MountedDisk::mount(&self.spec(name), &mnt, opts).unwrap()
    }

    pub fn spec(&self, name: &str) -> DiskSpec {
        DiskSpec {
            store: self.path("store"),
            disk: name.to_owned(),
            run_dir: self.path(&format!("run-{name}")),
        }
    }

    /// Asserts nothing of this fixture is left: mounts, loop devices, servers.
    pub fn assert_clean(&self) {
        let root = self.dir.path().canonicalize().unwrap();
        let store = format!("mount {}", root.join("store").display());
        let left: Vec<_> = testkit::traces_under(&root)
            .into_iter()
            .filter(|t| !(self.tmpfs && *t == store))
            .collect();
        assert!(left.is_empty(), "left on the host: {left:?}");
        let servers: Vec<_> = disk::mounts::disk_servers()
            .into_iter()
            .filter(|(_, d)| d.starts_with(&root))
            .collect();
        assert!(servers.is_empty(), "servers left: {servers:?}");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = disk::cleanup_stale(self.dir.path());
        if self.tmpfs {
            let store = self.dir.path().join("store");
            let _ = nix::mount::umount2(&store, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

pub fn read(root: &Path, file: &str) -> String {
    std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| format!("<{e}>"))
}

/// Writes `file` and makes it durable on the disk.
pub fn write(root: &Path, file: &str, content: &[u8]) {
    let path = root.join(file);
    std::fs::write(&path, content).unwrap();
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
}

/// A deterministic pseudo-random byte pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
