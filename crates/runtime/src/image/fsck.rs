//! Checking the filesystem of a layer that came from elsewhere (an imported snapshot)
//! before the host kernel ever mounts or resizes it: ext4 parsing is kernel code, and a
//! crafted image is an attack on it.
//!
//! The layer is never mounted for the check. A throwaway disk over the layer (O(1)) is
//! copied into a sparse scratch file — blocks that read as zeros are skipped — and
//! `e2fsck -n -f` (read-only, forced) examines the copy in user space.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use blockstore::{BlockDevice, LayerId, Store};

use crate::error::{Error, IoContext, Result};

/// Bytes copied per read.
const CHUNK: usize = 1 << 20;

/// Checks the ext4 filesystem layer `layer` of `store` holds; `scratch` is a directory
/// for the temporary copy (removed afterwards, as is the temporary disk).
pub fn check_layer(store: &Store, layer: &LayerId, scratch: &Path) -> Result<()> {
    let disk_err = |e: blockstore::Error| Error::Disk(Box::new(e));
    let name = format!("fsck-{}-{layer}", std::process::id());
    let size = store.layer_info(layer).map_err(disk_err)?.size;
    store
        .create_disk(&name, size, Some(layer))
        .map_err(disk_err)?;
    let copy = scratch.join(format!("{name}.img"));
    let checked = copy_out(store, &name, &copy, size).and_then(|()| e2fsck(&copy));
    let _ = std::fs::remove_file(&copy);
    let _ = store.delete_disk(&name);
    checked
}

/// Copies disk `name` into a sparse file at `copy`.
fn copy_out(store: &Store, name: &str, copy: &Path, size: u64) -> Result<()> {
    let disk = store
        .open_disk(name)
        .map_err(|e| Error::Disk(Box::new(e)))?;
    let out = std::fs::File::create(copy).at(copy)?;
    out.set_len(size).at(copy)?;
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    while offset < size {
        let n = CHUNK.min((size - offset) as usize);
        disk.read_at(&mut buf[..n], offset)
            .map_err(|e| Error::Disk(Box::new(e)))?;
        if buf[..n].iter().any(|&b| b != 0) {
            out.write_all_at(&buf[..n], offset).at(copy)?;
        }
        offset += n as u64;
    }
    Ok(())
}

fn e2fsck(image: &Path) -> Result<()> {
    let out = Command::new("e2fsck")
        .args(["-n", "-f"])
        .arg(image)
        .output()
        .at(image)?;
    // 0: clean. Anything else under -n means the filesystem has errors it would fix.
    if out.status.success() {
        return Ok(());
    }
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = text.lines().rev().take(4).collect();
    Err(Error::Image(format!(
        "the disk is not a clean ext4 filesystem (e2fsck: {}); refusing to mount it",
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    )))
}
