//! Partial layers: a chain published from one store and read from another, its chunks
//! fetched only as reads need them, each checked before it is used.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use blockstore::remote::{ChunkTable, Fetch, RemoteLayer, CHUNK_BLOCKS};
use blockstore::{BlockDevice, LayerId, Store, StoreOptions, BLOCK_SIZE};

const MIB: u64 = 1 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

fn read(disk: &dyn BlockDevice, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    disk.read_at(&mut buf, off).unwrap();
    buf
}

/// What a publisher put in "the bucket" for one layer.
struct Published {
    meta: Vec<u8>,
    table: ChunkTable,
    packed: Vec<u8>,
}

fn publish(store: &Store, top: &LayerId) -> Vec<(LayerId, Published)> {
    store
        .chain_of(top)
        .unwrap()
        .into_iter()
        .map(|id| {
            let mut packed = Vec::new();
            let table = store.pack_layer(&id, &mut packed).unwrap();
            let meta = store.layer_meta(&id).unwrap();
            (
                id,
                Published {
                    meta,
                    table,
                    packed,
                },
            )
        })
        .collect()
}

/// A fetcher that serves chunks from the published layers, counting what it served;
/// `tamper` flips a byte of every chunk it serves.
struct Bucket {
    store: Store,
    layers: HashMap<LayerId, Published>,
    fetched: Mutex<BTreeSet<(LayerId, u64)>>,
    tamper: bool,
}

impl Fetch for Bucket {
    fn fetch(&self, layer: &LayerId, chunk: u64) -> std::io::Result<()> {
        let p = self.layers.get(layer).ok_or(std::io::ErrorKind::NotFound)?;
        let e = p.table.get(chunk).ok_or(std::io::ErrorKind::NotFound)?;
        let r = e.range();
        let mut bytes = p.packed[r.start as usize..r.end as usize].to_vec();
        if self.tamper {
            bytes[7] ^= 0x40;
        }
        self.store
            .fill_chunk(layer, &p.table, chunk, &bytes)
            .map_err(std::io::Error::other)?;
        self.fetched.lock().unwrap().insert((layer.clone(), chunk));
        Ok(())
    }
}

/// A source store with a two-layer chain: 6 MiB written, then 1 MiB rewritten.
fn source() -> (tempfile::TempDir, Store, LayerId, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(dir.path(), StoreOptions { direct_io: true }).unwrap();
    store.create_disk("src", 16 * MIB, None).unwrap();
    let d = store.open_disk("src").unwrap();
    let mut want = vec![0u8; 16 * MIB as usize];
    let first = pattern(6 * MIB as usize, 5);
    d.write_at(&first, MIB).unwrap();
    want[MIB as usize..7 * MIB as usize].copy_from_slice(&first);
    d.seal().unwrap();
    let second = pattern(MIB as usize + 123, 77);
    d.write_at(&second, 3 * MIB + 11).unwrap();
    let at = (3 * MIB + 11) as usize;
    want[at..at + second.len()].copy_from_slice(&second);
    let top = d.seal().unwrap();
    (dir, store, top, want)
}

fn remote_store(
    published: Vec<(LayerId, Published)>,
    tamper: bool,
) -> (tempfile::TempDir, Store, Arc<Bucket>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(dir.path(), StoreOptions { direct_io: true }).unwrap();
    let layers: Vec<RemoteLayer> = published
        .iter()
        .map(|(_, p)| RemoteLayer {
            meta: p.meta.clone(),
            chunks: p.table.encode(),
        })
        .collect();
    let bucket = Arc::new(Bucket {
        store: store.clone(),
        layers: published.into_iter().collect(),
        fetched: Mutex::new(BTreeSet::new()),
        tamper,
    });
    store.set_fetcher(bucket.clone());
    store.add_remote_chain(&layers, "pulled").unwrap();
    (dir, store, bucket)
}

#[test]
fn a_fork_of_a_remote_chain_fetches_only_what_it_reads() {
    let (_src_dir, src, top, want) = source();
    let published = publish(&src, &top);
    let chain: Vec<LayerId> = published.iter().map(|(id, _)| id.clone()).collect();
    let (_dir, store, bucket) = remote_store(published, false);
    assert_eq!(store.get_ref("pulled").unwrap(), top);
    assert!(chain.iter().all(|l| store.is_partial(l)));

    store.create_disk("fork", 16 * MIB, Some(&top)).unwrap();
    let fork = store.open_disk("fork").unwrap();
    // One block in the lower layer's chunk 2 (bytes 2-3 MiB).
    let off = 2 * MIB + 8192;
    assert_eq!(
        read(&fork, off, 4096),
        want[off as usize..off as usize + 4096]
    );
    assert_eq!(
        bucket.fetched.lock().unwrap().clone(),
        BTreeSet::from([(chain[0].clone(), 2)])
    );
    // A range that the upper layer rewrote: its chunks, and the lower one's only where
    // the rewrite leaves the lower layer's blocks showing.
    let (a, len) = (3 * MIB as usize, 2 * MIB as usize);
    assert_eq!(read(&fork, a as u64, len), want[a..a + len]);
    let fetched = bucket.fetched.lock().unwrap().clone();
    assert!(fetched.contains(&(chain[1].clone(), 3)), "{fetched:?}");
    assert!(fetched.len() <= 5, "{fetched:?}");

    // Writes to the fork stay in its overlay; reading everything fetches the rest.
    fork.write_at(&[9u8; 4096], 0).unwrap();
    let all = read(&fork, 0, 16 * MIB as usize);
    assert_eq!(all[4096..], want[4096..]);
    assert_eq!(all[..4096], [9u8; 4096]);
    // The lower layer's chunk 3 is hidden by the upper one's rewrite: nothing read it.
    assert_eq!(store.missing_chunks(&chain[0]).unwrap(), vec![3]);
    assert!(store.missing_chunks(&chain[1]).unwrap().is_empty());
    store.complete(&chain[0]).unwrap();
    for l in &chain {
        assert!(store.missing_chunks(l).unwrap().is_empty());
        assert!(!store.is_partial(l), "a layer with every chunk is whole");
        store.verify(l).unwrap();
    }
    let expected: usize = chain.iter().map(|l| store.chunk_table_of_whole(l)).sum();
    assert_eq!(bucket.fetched.lock().unwrap().len(), expected);
}

trait ChunkCount {
    fn chunk_table_of_whole(&self, l: &LayerId) -> usize;
}

impl ChunkCount for Store {
    /// Chunks of a whole layer holding blocks (its table, packed again).
    fn chunk_table_of_whole(&self, l: &LayerId) -> usize {
        self.pack_layer(l, &mut std::io::sink())
            .unwrap()
            .entries()
            .len()
    }
}

#[test]
fn a_tampered_chunk_is_refused_and_nothing_is_marked() {
    let (_src_dir, src, top, _) = source();
    let published = publish(&src, &top);
    let bottom = published[0].0.clone();
    let (_dir, store, bucket) = remote_store(published, true);
    store.create_disk("fork", 16 * MIB, Some(&top)).unwrap();
    let fork = store.open_disk("fork").unwrap();
    let mut buf = vec![0u8; 4096];
    let err = format!("{:?}", fork.read_at(&mut buf, MIB).unwrap_err());
    assert!(err.contains("does not match its hash"), "{err}");
    assert!(store.missing_chunks(&bottom).unwrap().contains(&1));
    assert!(bucket.fetched.lock().unwrap().is_empty());
}

#[test]
fn export_completes_a_partial_chain_and_another_store_imports_it() {
    let (_src_dir, src, top, want) = source();
    let (_dir, store, _bucket) = remote_store(publish(&src, &top), false);
    let mut artifact = Vec::new();
    store.export(&top, None, &mut artifact).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other = Store::open(other_dir.path()).unwrap();
    let got = other.import(&mut &artifact[..]).unwrap();
    assert_eq!(got, top);
    other.create_disk("d", 16 * MIB, Some(&top)).unwrap();
    let d = other.open_disk("d").unwrap();
    assert_eq!(read(&d, 0, 16 * MIB as usize), want);
}

#[test]
fn bad_remote_chains_are_refused_and_leave_nothing() {
    let (_src_dir, src, top, _) = source();
    let published = publish(&src, &top);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let layer = |i: usize| RemoteLayer {
        meta: published[i].1.meta.clone(),
        chunks: published[i].1.table.encode(),
    };
    // The upper layer alone: its parent is nowhere here.
    let err = store.add_remote_chain(&[layer(1)], "p").unwrap_err();
    assert!(
        matches!(err, blockstore::Error::MissingParent { .. }),
        "{err}"
    );
    // A chunk table that is another layer's.
    let mut wrong = layer(0);
    wrong.chunks = published[1].1.table.encode();
    let err = store.add_remote_chain(&[wrong], "p").unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
    // A damaged metadata record.
    let mut damaged = layer(0);
    damaged.meta[20] ^= 1;
    assert!(store.add_remote_chain(&[damaged], "p").is_err());
    // Out of order.
    assert!(store.add_remote_chain(&[layer(1), layer(0)], "p").is_err());
    assert!(store.list_refs().unwrap().is_empty());
    assert_eq!(
        std::fs::read_dir(dir.path().join("layers"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn a_partial_layer_without_a_fetcher_says_so() {
    let (_src_dir, src, top, _) = source();
    let published = publish(&src, &top);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let layers: Vec<RemoteLayer> = published
        .iter()
        .map(|(_, p)| RemoteLayer {
            meta: p.meta.clone(),
            chunks: p.table.encode(),
        })
        .collect();
    store.add_remote_chain(&layers, "p").unwrap();
    store.create_disk("d", 16 * MIB, Some(&top)).unwrap();
    let d = store.open_disk("d").unwrap();
    let mut buf = vec![0u8; BLOCK_SIZE as usize];
    let err = d.read_at(&mut buf, MIB).unwrap_err().to_string();
    assert!(err.contains("nothing fetches"), "{err}");
    // Blocks no layer holds need nothing fetched.
    d.read_at(&mut buf, 15 * MIB).unwrap();
    assert_eq!(CHUNK_BLOCKS * BLOCK_SIZE, MIB);
}
