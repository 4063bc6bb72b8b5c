//! Corrupt, truncated and hostile inputs are refused with errors naming what is wrong.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use blockstore::{BlockDevice, Error, LayerId, Store};

const MIB: u64 = 1 << 20;

/// A store with disk "d" whose sealed chain is [l1, l2]; l2 holds data at 64 KiB.
fn setup(dir: &Path) -> (Store, LayerId, LayerId) {
    let store = Store::open(dir).unwrap();
    store.create_disk("d", MIB, None).unwrap();
    let d = store.open_disk("d").unwrap();
    d.write_at(&[1u8; 8192], 0).unwrap();
    let l1 = d.seal().unwrap();
    d.write_at(&[2u8; 8192], 65536).unwrap();
    let l2 = d.seal().unwrap();
    (store, l1, l2)
}

fn data_file(store: &Store, id: &LayerId) -> std::path::PathBuf {
    store.root().join("layers").join(id.as_str()).join("data")
}

fn assert_corrupt(res: blockstore::Result<()>, layer: &LayerId) {
    match res {
        Err(Error::Corrupt { layer: l, .. }) => assert_eq!(&l, layer.as_str()),
        other => panic!("expected corruption of {layer}, got {other:?}"),
    }
}

#[test]
fn flipped_byte_is_reported_on_read_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (store, l1, l2) = setup(dir.path());
    let f = OpenOptions::new()
        .write(true)
        .open(data_file(&store, &l2))
        .unwrap();
    f.write_all_at(&[0xff], 65536 + 4100).unwrap();
    assert_corrupt(store.verify(&l2), &l2);
    store.verify(&l1).unwrap();
    let d = store.open_disk("d").unwrap();
    let mut buf = vec![0u8; 4096];
    d.read_at(&mut buf, 0).unwrap();
    assert_corrupt(d.read_at(&mut buf, 65536 + 4096), &l2);
    let msg = d.read_at(&mut buf, 65536 + 4096).unwrap_err().to_string();
    assert!(
        msg.contains(l2.as_str()) && msg.contains("block 17"),
        "{msg}"
    );
    assert!(store.export(&l2, None, &mut Vec::new()).is_err());
}

#[test]
fn truncated_data_is_reported_not_read_as_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _l1, l2) = setup(dir.path());
    let d = store.open_disk("d").unwrap();
    OpenOptions::new()
        .write(true)
        .open(data_file(&store, &l2))
        .unwrap()
        .set_len(65536)
        .unwrap();
    let mut buf = vec![0u8; 100];
    assert_corrupt(d.read_at(&mut buf, 65536 + 10), &l2);
    assert_corrupt(store.verify(&l2), &l2);
}

#[test]
fn corrupt_metadata_is_refused_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let (store, l1, _l2) = setup(dir.path());
    let meta = store.root().join("layers").join(l1.as_str()).join("meta");
    let mut bytes = fs::read(&meta).unwrap();
    bytes[60] ^= 1;
    fs::write(&meta, &bytes).unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_corrupt(store.verify(&l1), &l1);
    assert_corrupt(store.open_disk("d").map(|_| ()), &l1);
}

fn layer_count(store: &Store) -> usize {
    fs::read_dir(store.root().join("layers")).unwrap().count()
}

fn tmp_is_empty(store: &Store) -> bool {
    fs::read_dir(store.root().join("tmp"))
        .unwrap()
        .next()
        .is_none()
}

#[test]
fn corrupted_artifacts_leave_nothing_visible() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _l1, l2) = setup(dir.path());
    let mut art = Vec::new();
    store.export(&l2, None, &mut art).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other = Store::open(other_dir.path()).unwrap();
    let step = (art.len() / 300).max(1);
    for pos in (0..art.len()).step_by(step).chain([art.len() - 1]) {
        let mut bad = art.clone();
        bad[pos] ^= 0x10;
        assert!(
            other.import(&mut &bad[..]).is_err(),
            "flip at {pos} accepted"
        );
        assert_eq!(layer_count(&other), 0);
        assert!(tmp_is_empty(&other));
    }
    for len in [0, 7, 16, 100, art.len() / 2, art.len() - 1] {
        let res = other.import(&mut &art[..len]);
        assert!(
            matches!(res, Err(Error::InvalidArtifact { .. })),
            "len {len}: {res:?}"
        );
        assert_eq!(layer_count(&other), 0);
    }
    let layers = blockstore::verify_artifact(&mut &art[..]).unwrap();
    assert_eq!(
        layers.iter().map(|l| l.id.clone()).collect::<Vec<_>>(),
        store.chain_of(&l2).unwrap()
    );
    assert_eq!(layers.iter().map(|l| l.data_blocks).sum::<u64>(), 4);
    assert_eq!(other.import(&mut &art[..]).unwrap(), l2);
    assert_eq!(layer_count(&other), 2);
}

#[test]
fn garbage_artifacts_are_refused_without_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _l1, l2) = setup(dir.path());
    let mut art = Vec::new();
    store.export(&l2, None, &mut art).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other = Store::open(other_dir.path()).unwrap();
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..300 {
        let mut bad = art.clone();
        // Corrupt the headers, where length fields live, with random words.
        for _ in 0..(rnd() % 4 + 1) {
            let pos = (rnd() % 200) as usize;
            let word = rnd().to_le_bytes();
            let end = (pos + 8).min(bad.len());
            bad[pos..end].copy_from_slice(&word[..end - pos]);
        }
        assert!(other.import(&mut &bad[..]).is_err());
        assert!(blockstore::verify_artifact(&mut &bad[..]).is_err());
        let noise: Vec<u8> = (0..rnd() % 5000).map(|_| rnd() as u8).collect();
        assert!(other.import(&mut &noise[..]).is_err());
    }
    assert_eq!(layer_count(&other), 0);
}

#[test]
fn missing_parent_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, l1, l2) = setup(dir.path());
    let mut art = Vec::new();
    store.export(&l2, Some(&l1), &mut art).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other = Store::open(other_dir.path()).unwrap();
    match other.import(&mut &art[..]) {
        Err(Error::MissingParent { layer, parent }) => {
            assert_eq!(
                (layer.as_str(), parent.as_str()),
                (l2.as_str(), l1.as_str())
            );
        }
        other => panic!("expected a missing parent, got {other:?}"),
    }
    assert_eq!(layer_count(&other), 0);
    assert!(matches!(
        store.export(&l1, Some(&l2), &mut Vec::new()),
        Err(Error::NotAncestor { .. })
    ));
}

/// Writes a small two-layer artifact to `$BLOCKSTORE_FUZZ_SEED` (the fuzz seed corpus).
#[test]
#[ignore = "generates fuzz seeds on request"]
fn write_fuzz_seed() {
    let path = std::env::var("BLOCKSTORE_FUZZ_SEED").expect("BLOCKSTORE_FUZZ_SEED");
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.create_disk("d", 8 * 4096, None).unwrap();
    let d = store.open_disk("d").unwrap();
    d.write_at(&[1u8; 4096], 4096).unwrap();
    let l1 = d.seal().unwrap();
    d.write_at(&[2u8; 10], 0).unwrap();
    d.discard(4096, 4096).unwrap();
    let l2 = d.seal().unwrap();
    let mut art = Vec::new();
    store.export(&l2, None, &mut art).unwrap();
    fs::write(format!("{path}-two-layers"), &art).unwrap();
    art.clear();
    store.export(&l1, None, &mut art).unwrap();
    fs::write(format!("{path}-one-layer"), &art).unwrap();
}

#[test]
fn stale_staging_goes_through_the_trash_and_only_the_owner_sweeps() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _l1, _l2) = setup(dir.path());
    let tmp = store.root().join("tmp");
    let staged = tmp.join("compact-cut-short");
    fs::create_dir(&staged).unwrap();
    fs::write(staged.join("data"), vec![7u8; 1 << 16]).unwrap();
    // A process serving one disk leaves the store-wide sweep to the owner.
    let server = Store::open_unrecovered(dir.path(), Default::default()).unwrap();
    drop(server.open_disk("d").unwrap());
    assert!(staged.exists());
    // The owner's gc moves it out of tmp/ and deletes it.
    let stats = store.gc().unwrap();
    assert_eq!(stats.tmp_entries_deleted, 1);
    assert!(tmp_is_empty(&store));
    let trash = store.root().join("trash");
    assert_eq!(fs::read_dir(&trash).unwrap().count(), 0);
    // Left in the trash by a crash: the next open deletes it.
    fs::create_dir(trash.join("1-0-0-gc-left")).unwrap();
    fs::write(trash.join("1-0-0-gc-left").join("data"), b"x").unwrap();
    let reopened = Store::open(dir.path()).unwrap();
    assert_eq!(
        fs::read_dir(reopened.root().join("trash")).unwrap().count(),
        0
    );
}
