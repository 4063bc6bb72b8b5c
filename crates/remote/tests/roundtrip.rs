//! A snapshot chain published from one store into a bucket and read from another through
//! the chunk service's socket, as a disk server reads it (the bucket is in memory here;
//! tests/cluster runs the same against a real S3 server).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use blockstore::remote::{SocketFetch, FETCH_SOCKET};
use blockstore::{BlockDevice, LayerId, Store, StoreOptions};
use remote::manifest::{Signature, Signer};
use remote::{Bucket, ChunkService, Tables};

const MIB: u64 = 1 << 20;

struct Key([u8; 32]);

impl Signer for Key {
    fn sign(&self, body: &[u8]) -> Result<Signature, String> {
        Ok(Signature {
            bytes: blake3::keyed_hash(&self.0, body).as_bytes().to_vec(),
            signer: None,
        })
    }
    fn verify(&self, body: &[u8], signature: &Signature) -> Result<(), String> {
        (self.sign(body)? == *signature)
            .then_some(())
            .ok_or_else(|| "not this key's".into())
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) | 1)
        .collect()
}

/// A store with an 8 MiB disk: 5 MiB written, sealed, 1 MiB more, sealed.
fn source(dir: &Path) -> (Store, LayerId, Vec<u8>) {
    let store = Store::open_with(dir, StoreOptions { direct_io: true }).unwrap();
    store.create_disk("src", 8 * MIB, None).unwrap();
    let d = store.open_disk("src").unwrap();
    let mut want = vec![0u8; 8 * MIB as usize];
    let a = pattern(5 * MIB as usize, 1);
    d.write_at(&a, 0).unwrap();
    want[..a.len()].copy_from_slice(&a);
    d.seal().unwrap();
    let b = pattern(MIB as usize, 2);
    d.write_at(&b, 6 * MIB).unwrap();
    want[6 * MIB as usize..7 * MIB as usize].copy_from_slice(&b);
    (store.clone(), d.seal().unwrap(), want)
}

fn bucket() -> Arc<Bucket> {
    Arc::new(Bucket::with_store(
        Arc::new(object_store::memory::InMemory::new()),
        "cluster-a",
        "memory://",
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_then_read_lazily_through_the_fetch_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, top, want) = source(&tmp.path().join("a"));
    let bucket = bucket();
    let key = Key([7; 32]);
    let tables = Tables::open(tmp.path().join("tables")).unwrap();
    let memfile = tmp.path().join("pages-1.img");
    std::fs::write(&memfile, pattern(9 * MIB as usize + 5, 3)).unwrap();
    let publication = |id: &'static str| remote::publish::Publication {
        snapshot_id: id,
        publisher: "node-a",
        published_at: "now".into(),
        record: serde_json::json!({"kind": "memory"}),
        top: &top,
        memory: vec![memfile.clone()],
        memory_layers: vec![],
        scratch: tmp.path(),
    };
    let m = bucket
        .publish(&src, &tables, publication("snap-1"), &key)
        .await
        .unwrap();
    assert_eq!(m.layers.len(), 2);
    let first_out = bucket.stats.bytes_out.load(Ordering::Relaxed);
    // A second snapshot of the same chain sends only its manifest.
    bucket
        .publish(&src, &tables, publication("snap-2"), &key)
        .await
        .unwrap();
    let second_out = bucket.stats.bytes_out.load(Ordering::Relaxed) - first_out;
    assert!(
        second_out < 64 << 10,
        "{second_out} bytes for an unchanged chain"
    );
    assert_eq!(
        bucket.snapshot_ids().await.unwrap(),
        vec!["snap-1", "snap-2"]
    );

    // Another node: manifest, layer records, memory file; then a fork read lazily.
    let b_root = tmp.path().join("b");
    let b = Store::open_with(&b_root, StoreOptions { direct_io: true }).unwrap();
    let got = bucket.manifest("snap-1", &key).await.unwrap();
    assert_eq!(got, m);
    assert!(bucket.manifest("snap-1", &Key([8; 32])).await.is_err());
    let records = bucket.layer_records(&got).await.unwrap();
    let pulled = b.add_remote_chain(&records, "snapshot-snap-1").unwrap();
    assert_eq!(pulled, top);
    let dest = tmp.path().join("fetched.img");
    bucket.fetch_file(&got.memory[0], &dest).await.unwrap();
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        std::fs::read(&memfile).unwrap()
    );

    let service = ChunkService::new(bucket.clone(), b.clone());
    let listener = tokio::net::UnixListener::bind(b_root.join(FETCH_SOCKET)).unwrap();
    let serving = tokio::spawn(service.clone().serve(listener));
    let reader = Store::open_unrecovered(&b_root, StoreOptions { direct_io: true }).unwrap();
    reader.set_fetcher(Arc::new(SocketFetch::new(
        b_root.join(FETCH_SOCKET),
        Duration::from_secs(5),
    )));
    reader.create_disk("fork", 8 * MIB, Some(&top)).unwrap();
    let before = bucket.stats.bytes_in.load(Ordering::Relaxed);
    let (one, all) = tokio::task::spawn_blocking(move || {
        let d = reader.open_disk("fork").unwrap();
        let mut one = vec![0u8; 4096];
        d.read_at(&mut one, 2 * MIB + 4096).unwrap();
        let mut all = vec![0u8; 8 * MIB as usize];
        d.read_at(&mut all, 0).unwrap();
        (one, all)
    })
    .await
    .unwrap();
    assert_eq!(one, want[2 * MIB as usize + 4096..2 * MIB as usize + 8192]);
    assert_eq!(all, want);
    let fetched = bucket.stats.bytes_in.load(Ordering::Relaxed) - before;
    assert_eq!(fetched, service.bytes.load(Ordering::Relaxed));
    assert_eq!(fetched, 6 * MIB, "each held block fetched once");
    serving.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_bucket_is_refused_and_the_store_is_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, top, _) = source(&tmp.path().join("a"));
    let inner = Arc::new(object_store::memory::InMemory::new());
    let bucket = Arc::new(Bucket::with_store(inner.clone(), "", "memory://"));
    let key = Key([7; 32]);
    let tables = Tables::open(tmp.path().join("tables")).unwrap();
    let p = remote::publish::Publication {
        snapshot_id: "s",
        publisher: "a",
        published_at: "now".into(),
        record: serde_json::Value::Null,
        top: &top,
        memory: vec![],
        memory_layers: vec![],
        scratch: tmp.path(),
    };
    let m = bucket.publish(&src, &tables, p, &key).await.unwrap();
    // A layer's metadata swapped for another's: refused before anything is added.
    let (a, b) = (&m.layers[0].id, &m.layers[1].id);
    let other = bucket
        .get(&remote::keys::layer(b, "meta"), 1 << 30)
        .await
        .unwrap();
    bucket
        .put(&remote::keys::layer(a, "meta"), other)
        .await
        .unwrap();
    let e = bucket.layer_records(&m).await.unwrap_err().to_string();
    assert!(e.contains("does not match the manifest"), "{e}");
    // Blocks changed in the bucket: the chunk is refused when it is fetched.
    let fresh = Arc::new(Bucket::with_store(inner.clone(), "", "memory://"));
    let m = fresh
        .publish(
            &src,
            &Tables::open(tmp.path().join("t2")).unwrap(),
            remote::publish::Publication {
                snapshot_id: "s2",
                publisher: "a",
                published_at: "now".into(),
                record: serde_json::Value::Null,
                top: &top,
                memory: vec![],
                memory_layers: vec![],
                scratch: tmp.path(),
            },
            &key,
        )
        .await
        .unwrap();
    let blocks = remote::keys::layer(&m.layers[0].id, "blocks");
    let mut bytes = fresh.get(&blocks, 1 << 30).await.unwrap().to_vec();
    bytes[100] ^= 1;
    fresh.put(&blocks, bytes.into()).await.unwrap();
    let b = Store::open(&tmp.path().join("b")).unwrap();
    let records = fresh.layer_records(&m).await.unwrap();
    b.add_remote_chain(&records, "p").unwrap();
    let service = ChunkService::new(fresh.clone(), b.clone());
    let bottom: LayerId = m.layers[0].id.parse().unwrap();
    let e = service.fetch(&bottom, 0).await.unwrap_err();
    assert!(e.contains("does not match its hash"), "{e}");
    assert!(b.missing_chunks(&bottom).unwrap().contains(&0));
    assert_eq!(service.bytes.load(Ordering::Relaxed), 0);
}
