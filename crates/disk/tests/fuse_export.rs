//! The FUSE export of a plain-file device, byte for byte (root, real FUSE).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Arc;
use std::time::Duration;

use blockstore::FileDevice;
use disk::fuse::{Export, FsOptions};

const SIZE: u64 = 64 << 20;

struct Fixture {
    _dir: tempfile::TempDir,
    backing: std::path::PathBuf,
    export: Option<Export>,
}

fn start() -> Fixture {
    start_with(FsOptions::default())
}

fn start_with(opts: FsOptions) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    let f = File::create(&backing).unwrap();
    f.set_len(SIZE).unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let dev = Arc::new(FileDevice::open(&backing).unwrap());
    let export = Export::start(dev, &mnt, 4, opts).unwrap();
    Fixture {
        _dir: dir,
        backing,
        export: Some(export),
    }
}

impl Fixture {
    fn file(&self) -> std::path::PathBuf {
        self.export.as_ref().unwrap().file()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(e) = self.export.take() {
            let _ = e.stop(Duration::from_secs(1));
        }
    }
}

/// A deterministic pseudo-random byte pattern.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn read_back(path: &std::path::Path, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    File::open(path)
        .unwrap()
        .read_exact_at(&mut buf, off)
        .unwrap();
    buf
}

#[test]
fn unaligned_writes_match_the_backing_file() {
    let fx = start();
    assert_eq!(std::fs::metadata(fx.file()).unwrap().len(), SIZE);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.file())
        .unwrap();
    let cases = [
        (0u64, 1usize),
        (4095, 2),
        (12_345, 70_000),
        (SIZE - 777, 777),
        (1 << 20, 3 << 20),
    ];
    for (i, (off, len)) in cases.into_iter().enumerate() {
        let data = pattern(i as u64, len);
        f.write_all_at(&data, off).unwrap();
        f.sync_all().unwrap();
        assert_eq!(
            read_back(&fx.file(), off, len),
            data,
            "through FUSE at {off}"
        );
        assert_eq!(
            read_back(&fx.backing, off, len),
            data,
            "in the backing file at {off}"
        );
    }
    assert!(
        f.write_all_at(b"x", SIZE).is_err(),
        "writes past the end must fail"
    );
}

#[test]
fn direct_io_round_trips() {
    let fx = start();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(fx.file())
        .unwrap();
    let mut raw = vec![0u8; (2 << 20) + 4096];
    let start = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[start..start + (2 << 20)];
    buf.copy_from_slice(&pattern(7, 2 << 20));
    f.write_all_at(buf, 8 << 20).unwrap();
    let expect = buf.to_vec();
    buf.fill(0);
    f.read_exact_at(buf, 8 << 20).unwrap();
    assert_eq!(buf, &expect[..]);
    assert_eq!(read_back(&fx.backing, 8 << 20, 2 << 20), expect);
}

#[test]
fn punch_hole_and_zero_range_read_as_zeros() {
    let fx = start();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.file())
        .unwrap();
    f.write_all_at(&pattern(3, 1 << 20), 0).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(
        &f,
        nix::fcntl::FallocateFlags::from_bits_retain(punch),
        1000,
        10_000,
    )
    .unwrap();
    let zero = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(
        &f,
        nix::fcntl::FallocateFlags::from_bits_retain(zero),
        100_000,
        8192,
    )
    .unwrap();
    let mut expect = pattern(3, 1 << 20);
    expect[1000..11_000].fill(0);
    expect[100_000..108_192].fill(0);
    assert_eq!(read_back(&fx.file(), 0, 1 << 20), expect);
    assert_eq!(read_back(&fx.backing, 0, 1 << 20), expect);
    assert_eq!(
        std::fs::metadata(fx.file()).unwrap().len(),
        SIZE,
        "size kept"
    );
}

#[test]
fn the_export_lists_one_file_and_counts_io() {
    let fx = start();
    let names: Vec<_> = std::fs::read_dir(fx.file().parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["disk"]);
    read_back(&fx.file(), 0, 4096);
    let stats = fx.export.as_ref().unwrap().stats();
    assert!(stats.reads >= 1 && stats.read_bytes >= 4096, "{stats:?}");
    assert!(File::open(fx.file().with_file_name("other")).is_err());
}

#[test]
fn requests_over_io_uring_round_trip() {
    let have_uring = std::path::Path::new(disk::fuse::uring::ENABLE_PARAM).exists();
    if have_uring {
        disk::fuse::uring::enable().unwrap();
    }
    let fx = start_with(FsOptions {
        uring: true,
        ..FsOptions::default()
    });
    assert_eq!(fx.export.as_ref().unwrap().uses_uring(), have_uring);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.file())
        .unwrap();
    for (i, (off, len)) in [(0u64, 4096usize), (5000, 300_000), (SIZE - 4096, 4096)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(40 + i as u64, len);
        f.write_all_at(&data, off).unwrap();
        assert_eq!(read_back(&fx.file(), off, len), data);
        assert_eq!(read_back(&fx.backing, off, len), data);
    }
    f.sync_all().unwrap();
    assert!(fx.export.as_ref().unwrap().stats().writes >= 3);
}
