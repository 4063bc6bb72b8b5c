//! End-to-end behaviour of stores and disks.

use blockstore::{BlockDevice, Error, LayerId, Store, StoreOptions, BLOCK_SIZE};

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

#[test]
fn write_seal_fork_read() {
    for direct_io in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with(dir.path(), StoreOptions { direct_io }).unwrap();
        store.create_disk("a", 4 * MIB, None).unwrap();
        let a = store.open_disk("a").unwrap();
        assert_eq!(a.size(), 4 * MIB);
        assert_eq!(read(&a, 0, 8192), vec![0; 8192]);
        let data = pattern(10_000, 3);
        a.write_at(&data, 1000).unwrap();
        assert_eq!(read(&a, 1000, 10_000), data);
        let top = a.seal().unwrap();
        assert_eq!(a.chain(), vec![top.clone()]);
        a.write_at(&pattern(5000, 9), 3000).unwrap();
        store.create_disk("b", 8 * MIB, Some(&top)).unwrap();
        let b = store.open_disk("b").unwrap();
        assert_eq!(read(&b, 1000, 10_000), data);
        assert_eq!(read(&a, 3000, 5000), pattern(5000, 9));
        b.write_zeroes(0, 8 * MIB).unwrap();
        assert_eq!(read(&b, 0, 20_000), vec![0; 20_000]);
        assert_eq!(read(&a, 1000, 2000), data[..2000]);
        store.verify(&top).unwrap();
        assert_eq!(store.refcount(&top).unwrap(), 2);
    }
}

#[test]
fn busy_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.create_disk("d", MIB, None).unwrap();
    let d = store.open_disk("d").unwrap();
    assert!(matches!(store.open_disk("d"), Err(Error::DiskBusy(_))));
    assert!(matches!(
        store.open_disk("nope"),
        Err(Error::DiskNotFound(_))
    ));
    assert!(matches!(
        store.create_disk("d", MIB, None),
        Err(Error::DiskBusy(_))
    ));
    assert!(matches!(
        store.create_disk("../x", MIB, None),
        Err(Error::InvalidName(_))
    ));
    assert!(matches!(
        store.create_disk("x", 1000, None),
        Err(Error::Unaligned { .. })
    ));
    let mut buf = [0u8; 10];
    assert!(matches!(
        d.read_at(&mut buf, MIB - 5),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        d.write_at(&buf, u64::MAX),
        Err(Error::OutOfRange { .. })
    ));
    let unknown: LayerId = "0123456789abcdef0123456789abcdef".parse().unwrap();
    assert!(matches!(
        store.verify(&unknown),
        Err(Error::LayerNotFound(_))
    ));
    assert!(matches!(
        store.create_disk("y", MIB, Some(&unknown)),
        Err(Error::LayerNotFound(_))
    ));
    assert!(matches!(store.get_ref("r"), Err(Error::RefNotFound(_))));
    assert!(matches!(
        d.grow(MIB - BLOCK_SIZE),
        Err(Error::InvalidSize { .. })
    ));
    drop(d);
    store.create_disk("d2", MIB, None).unwrap();
    assert!(matches!(
        store.create_disk("d2", MIB, None),
        Err(Error::DiskExists(_))
    ));
}

#[test]
fn compact_grow_gc_and_refs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.create_disk("d", MIB, None).unwrap();
    let d = store.open_disk("d").unwrap();
    let mut expect = vec![0u8; MIB as usize];
    for i in 0..5u64 {
        let data = pattern(6000, i as u8);
        let off = i * 7000;
        d.write_at(&data, off).unwrap();
        expect[off as usize..off as usize + 6000].copy_from_slice(&data);
        d.seal().unwrap();
    }
    d.discard(4096, 8192).unwrap();
    expect[4096..12288].fill(0);
    let snap = d.seal().unwrap();
    store.set_ref("snap", &snap).unwrap();
    assert_eq!(d.depth(), 6);
    let merged = d.compact().unwrap().unwrap();
    assert_eq!(d.depth(), 2);
    assert_eq!(d.chain()[1], merged);
    assert_eq!(read(&d, 0, MIB as usize), expect);
    d.grow(2 * MIB).unwrap();
    d.write_at(&[7; 100], 2 * MIB - 100).unwrap();
    let top = d.seal().unwrap();
    assert_eq!(store.chain_of(&top).unwrap(), d.chain());
    let stats = store.gc().unwrap();
    assert_eq!(stats.layers_deleted, 0, "the ref keeps the old chain");
    store.delete_ref("snap").unwrap();
    let stats = store.gc().unwrap();
    assert_eq!(stats.layers_deleted, 5);
    drop(d);
    let d = store.open_disk("d").unwrap();
    assert_eq!(d.size(), 2 * MIB);
    assert_eq!(read(&d, 0, MIB as usize), expect);
    assert_eq!(read(&d, 2 * MIB - 100, 100), vec![7; 100]);
    drop(d);
    store.delete_disk("d").unwrap();
    assert_eq!(store.gc().unwrap().layers_deleted, 3);
    assert!(store.list_disks().unwrap().is_empty());
}

#[test]
fn export_import_round_trip() {
    let src_dir = tempfile::tempdir().unwrap();
    let dst_dir = tempfile::tempdir().unwrap();
    let src = Store::open(src_dir.path()).unwrap();
    let dst = Store::open(dst_dir.path()).unwrap();
    src.create_disk("d", MIB, None).unwrap();
    let d = src.open_disk("d").unwrap();
    d.write_at(&pattern(9000, 1), 0).unwrap();
    let l1 = d.seal().unwrap();
    d.write_at(&pattern(9000, 2), 50_000).unwrap();
    d.write_zeroes(0, 4096).unwrap();
    let l2 = d.seal().unwrap();
    let mut top_only = Vec::new();
    src.export(&l2, Some(&l1), &mut top_only).unwrap();
    assert!(matches!(
        dst.import(&mut &top_only[..]),
        Err(Error::MissingParent { .. })
    ));
    let mut full = Vec::new();
    let stats = src.export(&l2, None, &mut full).unwrap();
    assert_eq!(stats.layers, 2);
    assert_eq!(dst.import(&mut &full[..]).unwrap(), l2);
    assert_eq!(dst.import(&mut &top_only[..]).unwrap(), l2);
    dst.verify(&l1).unwrap();
    dst.verify(&l2).unwrap();
    assert_eq!(
        dst.layer_info(&l2).unwrap().checksum,
        src.layer_info(&l2).unwrap().checksum
    );
    dst.create_disk("c", MIB, Some(&l2)).unwrap();
    let c = dst.open_disk("c").unwrap();
    assert_eq!(read(&c, 0, MIB as usize), read(&d, 0, MIB as usize));
}

#[test]
fn image_import_skips_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let img = dir.path().join("img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(3 * MIB + 100).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &pattern(5000, 4), MIB + 10).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0; 8192], 2 * MIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[5; 100], 3 * MIB).unwrap();
    let id = store.import_image(&img).unwrap();
    let info = store.layer_info(&id).unwrap();
    assert_eq!(info.size, 3 * MIB + 4096);
    assert_eq!(info.held_blocks, 3);
    assert!(info.sealed && info.parent.is_none());
    store.create_disk("d", 4 * MIB, Some(&id)).unwrap();
    let d = store.open_disk("d").unwrap();
    let want = std::fs::read(&img).unwrap();
    assert_eq!(read(&d, 0, want.len()), want);
    assert_eq!(read(&d, 3 * MIB + 100, 4096), vec![0; 4096]);
}

#[test]
fn export_file_matches_stream_export() {
    for direct_io in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with(dir.path(), StoreOptions { direct_io }).unwrap();
        store.create_disk("d", 4 * MIB, None).unwrap();
        let d = store.open_disk("d").unwrap();
        d.write_at(&pattern(3 * MIB as usize, 5), 12_345).unwrap();
        let l1 = d.seal().unwrap();
        d.write_at(&pattern(70_000, 6), MIB).unwrap();
        let l2 = d.seal().unwrap();
        let mut stream = Vec::new();
        let s1 = store.export(&l2, None, &mut stream).unwrap();
        let path = dir.path().join("artifact");
        let file = std::fs::File::create(&path).unwrap();
        let s2 = store.export_file(&l2, None, &file).unwrap();
        assert_eq!(s1, s2);
        assert_eq!(std::fs::read(&path).unwrap(), stream);
        let other = tempfile::tempdir().unwrap();
        let other = Store::open(other.path()).unwrap();
        let mut input = std::fs::File::open(&path).unwrap();
        assert_eq!(other.import_as(&mut input, "snap").unwrap(), l2);
        assert_eq!(other.get_ref("snap").unwrap(), l2);
        assert_eq!(other.chain_of(&l2).unwrap(), vec![l1, l2]);
    }
}

#[test]
fn opening_the_store_while_disks_are_deleted_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let names: Vec<String> = (0..300).map(|i| format!("d{i}")).collect();
    for name in &names {
        store.create_disk(name, MIB, None).unwrap();
    }
    let deleter = std::thread::spawn(move || {
        for name in &names {
            store.delete_disk(name).unwrap();
        }
    });
    while !deleter.is_finished() {
        Store::open(dir.path()).expect("an open racing a delete");
    }
    deleter.join().unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path().join("disks"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        Vec::<std::ffi::OsString>::new(),
        "files left in disks/"
    );
}
