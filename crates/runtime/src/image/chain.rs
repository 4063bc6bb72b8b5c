//! OCI layers as a chain of block-store layers, so images share their common base.
//!
//! Layer `i` of an image is recorded under block-store ref `oci-chain-<key i>`, where key
//! 0 hashes layer 0's content and key `i` hashes key `i-1` with layer `i`'s content (the
//! OCI "chain id", over the blobs as stored). An import finds the longest prefix of its
//! layers already here and applies only the rest: the bottom layer is unpacked into a
//! directory and made an ext4 disk image (`mkfs.ext4 -d`); every layer above it is
//! unpacked into a throwaway disk forked from the layer below, mounted on the host, and
//! sealed. Two images on the same base therefore hold its blocks once, and a second pull
//! of a shared base does no work. Chain refs are a cache: they pin their layers until
//! they are pruned.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::budget::{unpack_within, Budget};
use super::{ext4_size, report, BuildDir, Images, ProgressFn};
use crate::error::{Error, IoContext, Result};

/// What an unpack and seal on `mounted` made, judged by its disk server too: a write the
/// host had no room for fails inside the guest filesystem as an I/O error (or a freeze's,
/// or not at all when the filesystem only logs it), so a layer whose disk lost any write
/// is refused, as out of space when that is why.
fn writes_kept(
    mounted: &disk::MountedDisk,
    sealed: Result<blockstore::LayerId>,
) -> Result<blockstore::LayerId> {
    let io = mounted.stats().map(|s| s.io).unwrap_or_default();
    if io.no_space > 0 {
        let why = sealed.err().map_or_else(String::new, |e| format!(": {e}"));
        tracing::warn!("unpacking an image layer ran out of host disk space{why}");
        return Err(Error::io(
            mounted.spec().store.clone(),
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        ));
    }
    if io.errors > 0 && sealed.is_ok() {
        return Err(Error::Image(format!(
            "{} write(s) to the disk of an image layer failed",
            io.errors
        )));
    }
    sealed
}

fn disk_err(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Disk(Box::new(e))
}

/// The chain keys of `layers`: one per layer, each naming it and all below it.
fn chain_keys(layers: &[(PathBuf, String)]) -> Result<Vec<String>> {
    let mut keys = Vec::with_capacity(layers.len());
    let mut prev = String::from("sandfork-oci-chain-v1");
    for (path, _) in layers {
        let mut h = Sha256::new();
        let mut f = std::fs::File::open(path).at(path)?;
        std::io::copy(&mut f, &mut h).at(path)?;
        let content = format!("{:x}", h.finalize());
        let key = format!("{:x}", Sha256::digest(format!("{prev}\n{content}")));
        keys.push(key.clone());
        prev = key;
    }
    Ok(keys)
}

fn chain_ref(key: &str) -> String {
    format!("oci-chain-{}", &key[..40])
}

/// What a layer tar holds once unpacked, in bytes (entry sizes plus a block each); the
/// count stops once it passes `stop` (a gzip bomb is not inflated to the end).
fn unpacked_size(path: &Path, stop: u64) -> Result<u64> {
    let file = std::fs::File::open(path).at(path)?;
    let mut magic = [0u8; 2];
    let gz = std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == [0x1f, 0x8b];
    let reader: Box<dyn Read> = if gz {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut archive = tar::Archive::new(reader);
    let mut total = 0u64;
    let entries = archive
        .entries()
        .map_err(|e| Error::Image(format!("layer {}: {e}", path.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::Image(format!("layer {}: {e}", path.display())))?;
        total = total.saturating_add(entry.size().div_ceil(4096).saturating_mul(4096) + 4096);
        if total > stop {
            break;
        }
    }
    Ok(total)
}

impl Images {
    /// Makes (or finds) the block-store layers of `layers`; returns the top one and its
    /// disk size.
    pub(super) fn chain(
        &self,
        layers: &[(PathBuf, String)],
        work: &BuildDir,
        progress: ProgressFn<'_>,
    ) -> Result<(blockstore::LayerId, u64)> {
        if layers.is_empty() {
            return Err(Error::Image("an image needs at least one layer".into()));
        }
        for (_, media) in layers {
            if media.contains("zstd") {
                return Err(Error::Image(
                    "zstd-compressed layers are not supported".into(),
                ));
            }
        }
        let keys = chain_keys(layers)?;
        let store = self.store();
        let n = layers.len();
        let have = (0..n)
            .rev()
            .find_map(|i| store.get_ref(&chain_ref(&keys[i])).ok().map(|l| (i, l)));
        let (mut next, mut top) = match have {
            Some((i, layer)) => {
                report(
                    progress,
                    "layer",
                    format!("{}/{n} layers already here", i + 1),
                );
                let size = store.layer_info(&layer).map_err(disk_err)?.size;
                (i + 1, (layer, size))
            }
            None => {
                report(progress, "layer", format!("1/{n} unpacking"));
                let bottom = self.bottom(&layers[0].0, &chain_ref(&keys[0]), work)?;
                (1, bottom)
            }
        };
        while next < n {
            report(progress, "layer", format!("{}/{n} unpacking", next + 1));
            top = self.apply(&top, &layers[next].0, &chain_ref(&keys[next]), work, next)?;
            next += 1;
        }
        Ok(top)
    }

    /// The bottom layer: unpacked into a directory, made an ext4 image, imported.
    fn bottom(
        &self,
        layer: &Path,
        pin: &str,
        work: &BuildDir,
    ) -> Result<(blockstore::LayerId, u64)> {
        // Unpacked into a host directory, then made an ext4 image beside it: room for both
        // first, so a layer whose stream expands past the host disk (beyond its floor) or
        // the import cap is refused unwritten, and the unpack itself is held to that room.
        let (limits, at) = (self.limits(), work.path());
        let budget = Budget::of(limits, at, 2)?;
        if unpacked_size(layer, budget.bytes)? > budget.bytes {
            return Err(budget.exceeded(at, layer, limits));
        }
        let root = work.path().join("bottom");
        std::fs::create_dir(&root).at(&root)?;
        unpack_within(layer, &root, true, budget, at, limits)?;
        let size = ext4_size(&root)?;
        let image = work.path().join("bottom.ext4");
        disk::build_ext4_image(&root, &image, size).map_err(disk_err)?;
        let _ = std::fs::remove_dir_all(&root);
        let id = self
            .store()
            .import_image_as(&image, pin)
            .map_err(disk_err)?;
        let _ = std::fs::remove_file(&image);
        Ok((id, size))
    }

    /// Layer `layer` applied on top of `below` in a throwaway fork, sealed and pinned.
    fn apply(
        &self,
        below: &(blockstore::LayerId, u64),
        layer: &Path,
        pin: &str,
        work: &BuildDir,
        index: usize,
    ) -> Result<(blockstore::LayerId, u64)> {
        let store = self.store();
        let limits = self.limits();
        let budget = Budget::of(limits, store.root(), 1)?;
        let grow = unpacked_size(layer, budget.bytes)?;
        if grow > budget.bytes {
            return Err(budget.exceeded(store.root(), layer, limits));
        }
        let size = (below.1 + grow + grow / 2).div_ceil(1 << 20) << 20;
        let disk = format!("chain-{}-{}-{index}", std::process::id(), work.serial());
        store
            .create_disk(&disk, size, Some(&below.0))
            .map_err(disk_err)?;
        let (mnt, run_dir) = (
            work.path().join(format!("m{index}")),
            work.path().join(format!("d{index}")),
        );
        let result = (|| {
            std::fs::create_dir_all(&mnt).at(&mnt)?;
            std::fs::create_dir_all(&run_dir).at(&run_dir)?;
            let spec = disk::DiskSpec {
                store: store.root().to_path_buf(),
                disk: disk.clone(),
                run_dir: run_dir.clone(),
            };
            let options = disk::MountOptions {
                grow_fs: true,
                ..disk::MountOptions::default()
            };
            let mounted = disk::MountedDisk::mount(&spec, &mnt, options).map_err(disk_err)?;
            let sealed = unpack_within(layer, &mnt, true, budget, store.root(), limits)
                .and_then(|()| mounted.seal().map_err(disk_err));
            let sealed = writes_kept(&mounted, sealed);
            let down = mounted.teardown().map_err(disk_err);
            let id = sealed?;
            down?;
            store.set_ref(pin, &id).map_err(disk_err)?;
            Ok((id, size))
        })();
        let _ = disk::cleanup_stale(&run_dir);
        let _ = store.delete_disk(&disk);
        result
    }
}
