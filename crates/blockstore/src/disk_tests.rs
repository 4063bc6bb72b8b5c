//! Recovery from operations interrupted between their steps.

use super::*;
use crate::BlockDevice;

fn setup() -> (tempfile::TempDir, Store, Disk) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.create_disk("d", 1 << 20, None).unwrap();
    let disk = store.open_disk("d").unwrap();
    (dir, store, disk)
}

fn content(disk: &Disk) -> Vec<u8> {
    let mut buf = vec![0u8; disk.size() as usize];
    disk.read_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn seal_interrupted_before_the_manifest_is_completed_on_open() {
    let (_dir, store, disk) = setup();
    disk.write_at(&[9u8; 10_000], 5000).unwrap();
    disk.seal().unwrap();
    disk.write_at(&[7u8; 3000], 100).unwrap();
    let want = content(&disk);
    let ov = disk.state.read().overlay.clone();
    ov.sync_data().unwrap();
    ov.seal().unwrap(); // the manifest still names it as the overlay
    drop(disk);
    let store = Store::open(store.root()).unwrap();
    assert_eq!(store.disk_chain("d").unwrap().last(), Some(&ov.id));
    let disk = store.open_disk("d").unwrap();
    assert_eq!(disk.depth(), 2);
    assert_eq!(content(&disk), want);
    store.verify(&ov.id).unwrap();
}

#[test]
fn compaction_interrupted_after_the_manifest_reparents_the_overlay() {
    let (_dir, store, disk) = setup();
    for i in 0..3u8 {
        disk.write_at(&[i + 1; 5000], i as u64 * 4000).unwrap();
        disk.seal().unwrap();
    }
    disk.write_at(&[8u8; 100], 50_000).unwrap();
    disk.flush().unwrap();
    let want = content(&disk);
    let run = disk.state.read().chain[1..].to_vec();
    let merged = {
        let _gc = store.gc_shared().unwrap();
        compact::merge(&store, &run).unwrap()
    };
    let mut m = disk.state.read().manifest();
    m.chain.truncate(1);
    m.chain.push(merged.id.clone());
    store.write_manifest("d", &m).unwrap(); // the overlay still sits on the old top
    drop(disk);
    let disk = store.open_disk("d").unwrap();
    assert_eq!(disk.chain()[1], merged.id);
    assert_eq!(content(&disk), want);
    let top = disk.seal().unwrap();
    assert_eq!(store.chain_of(&top).unwrap(), disk.chain());
    drop(disk);
    assert_eq!(store.gc().unwrap().layers_deleted, 2);
    assert_eq!(content(&store.open_disk("d").unwrap()), want);
}

#[test]
fn overlay_lost_before_its_first_flush_is_recreated() {
    let (_dir, store, disk) = setup();
    disk.write_at(&[3u8; 9000], 0).unwrap();
    disk.seal().unwrap();
    let want = content(&disk);
    let ov = disk.overlay_id();
    drop(disk);
    std::fs::remove_dir_all(store.layer_dir(&ov)).unwrap();
    let disk = store.open_disk("d").unwrap();
    assert_eq!(disk.overlay_id(), ov);
    assert_eq!(content(&disk), want);
    disk.write_at(&[4u8; 10], 0).unwrap();
    disk.flush().unwrap();
}

#[test]
fn unflushed_bitmap_changes_are_dropped_flushed_ones_kept() {
    let (_dir, store, disk) = setup();
    disk.write_at(&[1u8; 4096], 0).unwrap();
    disk.flush().unwrap();
    disk.write_at(&[2u8; 4096], 8192).unwrap(); // never flushed
    drop(disk);
    let disk = store.open_disk("d").unwrap();
    let got = content(&disk);
    assert_eq!(got[..4096], [1u8; 4096]);
    assert_eq!(got[8192..12288], [0u8; 4096]);
    // Recovered hashes make the overlay sealable and verifiable.
    let id = disk.seal().unwrap();
    store.verify(&id).unwrap();
}

#[test]
fn grown_size_survives_reopen_without_flush() {
    let (_dir, store, disk) = setup();
    disk.grow(3 << 20).unwrap();
    drop(disk);
    let disk = store.open_disk("d").unwrap();
    assert_eq!(disk.size(), 3 << 20);
    disk.write_at(&[5u8; 4096], (3 << 20) - 4096).unwrap();
}

#[test]
fn word_resolution_matches_per_block_resolution() {
    let (_dir, _store, disk) = setup();
    let mut x = 0x1234_5678_9abc_def1u64;
    for round in 0..6 {
        for _ in 0..40 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = x % ((1 << 20) - 9000);
            if x.is_multiple_of(3) {
                disk.discard(off, x % 9000).unwrap();
            } else {
                disk.write_at(&vec![round + 1; (x % 9000) as usize + 1], off)
                    .unwrap();
            }
        }
        disk.seal().unwrap();
    }
    let st = disk.state.read();
    for (first, count) in [(0, 256), (3, 61), (63, 2), (64, 64), (100, 156), (250, 6)] {
        let fast = io::resolve_range(&st, first, count);
        let slow: Vec<Source> = (first..first + count as u64)
            .map(|b| st.resolve(b))
            .collect();
        assert_eq!(fast, slow, "blocks {first}..+{count}");
    }
}
