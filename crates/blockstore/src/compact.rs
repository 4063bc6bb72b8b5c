//! Compaction: merging a run of adjacent sealed layers into one new sealed layer.

use std::sync::Arc;

use crate::bitmap::Bitmap;
use crate::fsutil::AlignedBuf;
use crate::id::LayerId;
use crate::layer::{runs, Layer, MAX_RUN};
use crate::store::Store;
use crate::{Result, BLOCK_SIZE};

/// Builds, in tmp/, a layer equal to reading `run` (bottom to top) over the run's parent,
/// then moves it into layers/. Reads only sealed, immutable layers, so it runs while the
/// disk is in use. Callers hold the gc lock shared until they reference the result.
pub(crate) fn merge(store: &Store, run: &[Arc<Layer>]) -> Result<Arc<Layer>> {
    let parent = run.first().and_then(|l| l.parent.clone());
    let size = run.iter().map(|l| l.size_blocks).max().unwrap_or(0);
    let id = LayerId::random()?;
    let staging = store.dir("tmp").join(format!("compact-{id}"));
    let out = Layer::create(
        &staging,
        id.clone(),
        parent.clone(),
        size,
        store.opts().direct_io,
        false,
    )?;
    let union = Bitmap::new(size);
    for l in run {
        l.dirty.iter_ones().for_each(|b| union.set(b));
    }
    let mut data_blocks: Vec<(u64, usize)> = Vec::new();
    for b in union.iter_ones() {
        let Some(k) = run.iter().rposition(|l| l.dirty.get(b)) else {
            continue;
        };
        if !run[k].zero.get(b) {
            data_blocks.push((b, k));
        } else if parent.is_some() {
            out.zero.set(b);
            out.dirty.set(b);
        }
    }
    copy_blocks(run, &out, &data_blocks)?;
    out.sync_data()?;
    out.seal()?;
    store.publish_layer(&staging, &id)?;
    store.load_sealed(&id)
}

/// Copies each `(block, source index)` from its source layer, one read per run.
fn copy_blocks(run: &[Arc<Layer>], out: &Layer, blocks: &[(u64, usize)]) -> Result<()> {
    let mut buf = AlignedBuf::new((MAX_RUN * BLOCK_SIZE) as usize);
    let mut i = 0;
    while i < blocks.len() {
        let src = blocks[i].1;
        let mut j = i;
        while j < blocks.len() && blocks[j].1 == src {
            j += 1;
        }
        for (first, count) in runs(blocks[i..j].iter().map(|(b, _)| *b)) {
            let bytes = &mut buf[..(count * BLOCK_SIZE) as usize];
            run[src].read_blocks(first, bytes)?;
            out.write_blocks(first, bytes)?;
            for b in first..first + count {
                out.dirty.set(b);
                out.hashes.set(b, run[src].hashes.get(b));
            }
        }
        i = j;
    }
    Ok(())
}
