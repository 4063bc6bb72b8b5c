//! What a partial layer has here: its present bitmap, read through by every read of
//! the layer, and the [`Fetch`] that brings the chunks it still misses. Loading a layer
//! (`crate::store`) opens it, reading a layer (`crate::layer`) consults it; adding,
//! filling and packing partial layers is `crate::remote`'s.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::bitmap::Bitmap;
use crate::id::LayerId;
use crate::{Error, Result};

/// Blocks of a layer's address space per chunk (1 MiB).
pub const CHUNK_BLOCKS: u64 = 256;
/// The present bitmap inside a partial layer's directory.
pub const PRESENT_FILE: &str = "present";

/// Brings a chunk of a partial layer here.
pub trait Fetch: Send + Sync {
    /// Returns once chunk `chunk` of layer `layer` is present (written with
    /// [`Store::fill_chunk`](crate::Store::fill_chunk) by whoever fetched it), or says
    /// why it is not.
    fn fetch(&self, layer: &LayerId, chunk: u64) -> std::io::Result<()>;
}

/// Chunks of a layer of `size_blocks` blocks.
pub(crate) fn chunks_of(size_blocks: u64) -> u64 {
    size_blocks.div_ceil(CHUNK_BLOCKS)
}

/// What a loaded layer knows of its missing chunks.
pub(crate) struct Partial {
    present: File,
    /// Chunks seen present (bits only ever get set while the layer exists).
    known: Bitmap,
    fetch: Option<Arc<dyn Fetch>>,
}

impl Partial {
    /// The partial state of the layer in `dir`, or None for a whole layer.
    pub(crate) fn open(
        dir: &Path,
        size_blocks: u64,
        fetch: Option<Arc<dyn Fetch>>,
    ) -> Result<Option<Partial>> {
        let path = dir.join(PRESENT_FILE);
        let present = match File::open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            r => r.map_err(|e| Error::io(format!("open {}", path.display()), e))?,
        };
        Ok(Some(Partial {
            present,
            known: Bitmap::new(chunks_of(size_blocks)),
            fetch,
        }))
    }

    fn is_present(&self, chunk: u64) -> Result<bool> {
        if self.known.get(chunk) {
            return Ok(true);
        }
        let mut byte = [0u8; 1];
        let n = self
            .present
            .read_at(&mut byte, chunk / 8)
            .map_err(|e| Error::io("read the present bitmap", e))?;
        let set = n == 1 && byte[0] & (1 << (chunk % 8)) != 0;
        if set {
            self.known.set(chunk);
        }
        Ok(set)
    }

    /// Makes sure blocks `first..first + count` of layer `id` are in its data file.
    pub(crate) fn ensure(&self, id: &LayerId, first: u64, count: u64) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        for chunk in first / CHUNK_BLOCKS..=(first + count - 1) / CHUNK_BLOCKS {
            if self.is_present(chunk)? {
                continue;
            }
            let Some(fetch) = &self.fetch else {
                return Err(Error::io(
                    format!("layer {id} is only partly here and nothing fetches its chunk {chunk}"),
                    std::io::ErrorKind::NotConnected.into(),
                ));
            };
            fetch
                .fetch(id, chunk)
                .map_err(|e| Error::io(format!("fetch chunk {chunk} of layer {id}"), e))?;
            if !self.is_present(chunk)? {
                return Err(Error::io(
                    format!("chunk {chunk} of layer {id} is still missing after its fetch"),
                    std::io::ErrorKind::NotFound.into(),
                ));
            }
        }
        Ok(())
    }
}
