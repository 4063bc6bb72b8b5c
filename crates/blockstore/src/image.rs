//! Importing a raw disk image (e.g. made by `mkfs.ext4 -d`) as a sealed base layer.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use nix::errno::Errno;
use nix::unistd::{lseek, Whence};
use xxhash_rust::xxh3::xxh3_64;

use crate::fsutil::is_zero;
use crate::id::LayerId;
use crate::layer::{Layer, MAX_RUN};
use crate::meta::MAX_BLOCKS;
use crate::store::Store;
use crate::{Error, Result, BLOCK_SIZE};

const BS: u64 = BLOCK_SIZE;

impl Store {
    /// Turns a raw image into a sealed parentless layer. Holes are skipped without
    /// reading them and all-zero blocks are not stored.
    pub fn import_image(&self, path: &Path) -> Result<LayerId> {
        let _gc = self.gc_shared()?;
        self.import_image_locked(path)
    }

    /// Like `import_image`, and pins the layer as ref `name` before gc may see it.
    pub fn import_image_as(&self, path: &Path, name: &str) -> Result<LayerId> {
        crate::id::validate_name(name)?;
        let _gc = self.gc_shared()?;
        let id = self.import_image_locked(path)?;
        self.set_ref_locked(name, &id)?;
        Ok(id)
    }

    /// Like `import`, and pins the top layer as ref `name` before gc may see it.
    pub fn import_as(&self, input: &mut dyn io::Read, name: &str) -> Result<LayerId> {
        crate::id::validate_name(name)?;
        let _gc = self.gc_shared()?;
        let id = self.import_locked(input)?;
        self.set_ref_locked(name, &id)?;
        Ok(id)
    }

    fn import_image_locked(&self, path: &Path) -> Result<LayerId> {
        let ctx = |e| Error::io(format!("read image {}", path.display()), e);
        let image = File::open(path).map_err(ctx)?;
        let len = image.metadata().map_err(ctx)?.len();
        let blocks = len.div_ceil(BS);
        if blocks == 0 || blocks > MAX_BLOCKS {
            return Err(Error::InvalidSize {
                size: len,
                reason: "image must be between 1 byte and 1 TiB",
            });
        }
        let id = LayerId::random()?;
        let staging = self.dir("tmp").join(format!("image-{id}"));
        let layer = Layer::create(&staging, id.clone(), None, blocks, false, false)?;
        let res = copy_extents(&image, len, &layer)
            .map_err(ctx)
            .and_then(|()| {
                layer.sync_data()?;
                layer.seal()?;
                self.publish_layer(&staging, &id)
            });
        if res.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        res.map(|()| id)
    }
}

/// Copies the non-zero blocks of every data extent of `image` into `layer`.
fn copy_extents(image: &File, len: u64, layer: &Layer) -> io::Result<()> {
    let mut pos = 0;
    while pos < len {
        let Some(start) = seek(image, pos, Whence::SeekData)? else {
            break;
        };
        let end = seek(image, start, Whence::SeekHole)?
            .unwrap_or(len)
            .min(len);
        copy_range(image, start / BS * BS, end, layer)?;
        pos = end.div_ceil(BS) * BS;
    }
    Ok(())
}

/// The next data (or hole) offset at or after `from`; `None` past the last data.
fn seek(f: &File, from: u64, whence: Whence) -> io::Result<Option<u64>> {
    match lseek(f, from as i64, whence) {
        Ok(p) => Ok(Some(p as u64)),
        Err(Errno::ENXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Copies `[start, end)` (start block aligned) in runs of up to `MAX_RUN` blocks.
fn copy_range(image: &File, start: u64, end: u64, layer: &Layer) -> io::Result<()> {
    let mut buf = vec![0u8; (MAX_RUN * BS) as usize];
    let mut off = start;
    while off < end {
        let n = (end - off).min(MAX_RUN * BS);
        let padded = n.div_ceil(BS) * BS;
        let part = &mut buf[..padded as usize];
        part.fill(0);
        image.read_exact_at(&mut part[..n as usize], off)?;
        store_blocks(layer, off / BS, part).map_err(io::Error::other)?;
        off += n;
    }
    Ok(())
}

/// Writes the non-zero blocks of `part` (starting at block `first`) into `layer`.
fn store_blocks(layer: &Layer, first: u64, part: &[u8]) -> Result<()> {
    let blocks: Vec<&[u8]> = part.chunks_exact(BS as usize).collect();
    let mut i = 0;
    while i < blocks.len() {
        if is_zero(blocks[i]) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < blocks.len() && !is_zero(blocks[j]) {
            j += 1;
        }
        let bytes = &part[i * BS as usize..j * BS as usize];
        layer.write_blocks(first + i as u64, bytes)?;
        for (k, block) in blocks[i..j].iter().enumerate() {
            let b = first + (i + k) as u64;
            layer.hashes.set(b, xxh3_64(block));
            layer.dirty.set(b);
        }
        i = j;
    }
    Ok(())
}
