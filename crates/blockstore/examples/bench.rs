//! Block store benchmarks, printed as JSON lines (medians of at least 5 runs).
//!
//! `cargo run --release -p sandfork-blockstore --example bench -- [--quick] [--only seal|fork|export|read]`

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use blockstore::{BlockDevice, Disk, Store, StoreOptions};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const RUNS: usize = 5;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn emit(name: &str, value: f64, unit: &str, baseline: Option<(f64, &str)>) {
    let line = serde_json::json!({
        "suite": "blockstore",
        "name": name,
        "value": round(value),
        "unit": unit,
        "baseline": baseline.map(|b| round(b.0)),
        "baseline_name": baseline.map(|b| b.1),
        "ratio": baseline.map(|b| round(value / b.0)),
    });
    println!("{line}");
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A 1 MiB buffer of non-zero pseudo-random bytes.
fn noise(rng: &mut Rng) -> Vec<u8> {
    let mut buf = vec![0u8; MIB as usize];
    for chunk in buf.chunks_exact_mut(8) {
        chunk.copy_from_slice(&(rng.next() | 1).to_le_bytes());
    }
    buf
}

/// Writes `bytes` in 256 KiB pieces at random aligned offsets.
fn scatter(disk: &Disk, bytes: u64, rng: &mut Rng, buf: &mut [u8]) {
    const PIECE: u64 = 256 * 1024;
    let slots = disk.size() / PIECE;
    for _ in 0..bytes / PIECE {
        let off = rng.next() % slots * PIECE;
        let i = (rng.next() % (buf.len() as u64 / 8)) as usize * 8;
        buf[i] = buf[i].wrapping_add(1) | 1;
        disk.write_at(&buf[..PIECE as usize], off).unwrap();
    }
}

/// Median seal time (ms) after `changed` bytes of scattered writes.
fn seal_time(store: &Store, name: &str, size: u64, changed: u64, rng: &mut Rng) -> f64 {
    store.create_disk(name, size, None).unwrap();
    let disk = store.open_disk(name).unwrap();
    let mut buf = noise(rng);
    let mut times = Vec::new();
    for _ in 0..RUNS {
        scatter(&disk, changed, rng, &mut buf);
        let t = Instant::now();
        disk.seal().unwrap();
        times.push(ms(t.elapsed()));
    }
    drop(disk);
    store.delete_disk(name).unwrap();
    store.gc().unwrap();
    median(times)
}

fn bench_seal(root: &Path, quick: bool, rng: &mut Rng) {
    let store = Store::open_with(root, StoreOptions { direct_io: true }).unwrap();
    let mut changes = vec![(0, "0"), (MIB, "1mb"), (100 * MIB, "100mb")];
    if !quick {
        changes.push((GIB, "1gb"));
    }
    for (changed, label) in changes {
        let small = seal_time(&store, "seal4", 4 * GIB, changed, rng);
        let large = seal_time(&store, "seal64", 64 * GIB, changed, rng);
        let target = (changed == 100 * MIB).then_some((20.0, "target_ms"));
        emit(&format!("seal_after_{label}_4gib"), small, "ms", target);
        emit(
            &format!("seal_after_{label}_64gib"),
            large,
            "ms",
            Some((small, "seal_4gib")),
        );
    }
}

/// Median latency of writing and fsyncing a 4 KiB file: the unit most metadata costs
/// are made of, printed so the other figures can be read against the machine's state.
fn bench_fsync(root: &Path) {
    let path = root.join("fsync-probe");
    let mut times = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        let mut f = File::create(&path).unwrap();
        std::io::Write::write_all(&mut f, &[1u8; 4096]).unwrap();
        f.sync_all().unwrap();
        times.push(ms(t.elapsed()));
    }
    std::fs::remove_file(&path).unwrap();
    emit("fsync_4k_file", median(times), "ms", None);
}

fn bench_fork(root: &Path, rng: &mut Rng) {
    let store = Store::open(root).unwrap();
    store.create_disk("base", 4 * GIB, None).unwrap();
    let disk = store.open_disk("base").unwrap();
    let mut buf = noise(rng);
    scatter(&disk, 64 * MIB, rng, &mut buf);
    let top = disk.seal().unwrap();
    let mut times = Vec::new();
    for i in 0..RUNS * 2 {
        let t = Instant::now();
        store
            .create_disk(&format!("fork{i}"), 4 * GIB, Some(&top))
            .unwrap();
        times.push(ms(t.elapsed()));
    }
    emit("fork", median(times), "ms", Some((5.0, "target_ms")));
    drop(disk);
    for i in 0..RUNS * 2 {
        store.delete_disk(&format!("fork{i}")).unwrap();
    }
    store.delete_disk("base").unwrap();
    store.gc().unwrap();
}

fn warm(path: &Path) {
    let mut f = File::open(path).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    while f.read(&mut buf).unwrap() > 0 {}
}

fn bench_export(root: &Path, quick: bool, rng: &mut Rng) {
    let store = Store::open(root).unwrap();
    let bytes = if quick { 128 * MIB } else { 512 * MIB };
    store.create_disk("exp", bytes, None).unwrap();
    let disk = store.open_disk("exp").unwrap();
    let buf = noise(rng);
    for off in (0..bytes).step_by(MIB as usize) {
        disk.write_at(&buf, off).unwrap();
    }
    let top = disk.seal().unwrap();
    warm(&root.join("layers").join(top.as_str()).join("data"));
    let (out, copy) = (root.join("artifact"), root.join("artifact.copy"));
    let (mut export_t, mut stream_t, mut cp_t) = (Vec::new(), Vec::new(), Vec::new());
    let rate = |t: Instant| bytes as f64 / MIB as f64 / t.elapsed().as_secs_f64();
    // Each timed copy starts with no dirty pages left over from the previous one.
    let settle = nix::unistd::sync;
    for _ in 0..RUNS {
        settle();
        let t = Instant::now();
        let mut w = BufWriter::with_capacity(MIB as usize, File::create(&out).unwrap());
        store.export(&top, None, &mut w).unwrap();
        drop(w);
        stream_t.push(rate(t));
        std::fs::remove_file(&out).unwrap();
        settle();
        let t = Instant::now();
        let file = File::create(&out).unwrap();
        store.export_file(&top, None, &file).unwrap();
        export_t.push(rate(t));
        // cp reads its source from the page cache, as export reads the layer.
        warm(&out);
        settle();
        let t = Instant::now();
        let status = Command::new("cp").arg(&out).arg(&copy).status().unwrap();
        assert!(status.success(), "cp failed");
        cp_t.push(rate(t));
        std::fs::remove_file(&copy).unwrap();
    }
    std::fs::remove_file(&out).unwrap();
    let cp = Some((median(cp_t), "cp"));
    emit("export_file_throughput", median(export_t), "MiB/s", cp);
    emit("export_stream_throughput", median(stream_t), "MiB/s", cp);
    drop(disk);
    store.delete_disk("exp").unwrap();
    store.gc().unwrap();
}

/// Builds a disk whose `bytes` are spread over `depth` layers in stripes of `stripe`
/// bytes, round robin, and returns a fork of it (so reads resolve through the overlay
/// and the whole chain).
fn striped(store: &Store, name: &str, bytes: u64, depth: u64, stripe: u64, rng: &mut Rng) -> Disk {
    store.create_disk(name, bytes, None).unwrap();
    let disk = store.open_disk(name).unwrap();
    let buf = noise(rng);
    for layer in 0..depth {
        for off in (layer * stripe..bytes).step_by((depth * stripe) as usize) {
            for piece in (off..off + stripe).step_by(MIB as usize) {
                let n = (off + stripe - piece).min(MIB) as usize;
                disk.write_at(&buf[..n], piece).unwrap();
            }
        }
        disk.seal().unwrap();
    }
    let top = disk.chain().pop().unwrap();
    let fork = format!("{name}-fork");
    store.create_disk(&fork, bytes, Some(&top)).unwrap();
    store.open_disk(&fork).unwrap()
}

fn read_all(disk: &Disk) -> f64 {
    let mut buf = vec![0u8; MIB as usize];
    let t = Instant::now();
    for off in (0..disk.size()).step_by(MIB as usize) {
        disk.read_at(&mut buf, off).unwrap();
    }
    disk.size() as f64 / MIB as f64 / t.elapsed().as_secs_f64()
}

fn bench_depth(root: &Path, quick: bool, direct_io: bool, rng: &mut Rng) {
    let store = Store::open_with(root, StoreOptions { direct_io }).unwrap();
    let bytes = if quick { 64 * MIB } else { 256 * MIB };
    let mode = if direct_io { "direct" } else { "buffered" };
    let d1 = striped(&store, "depth1", bytes, 1, bytes, rng);
    // Each layer holds one contiguous eighth of the disk: measures chain resolution.
    let d8 = striped(&store, "depth8", bytes, 8, bytes / 8, rng);
    // Layers interleaved in 64 KiB stripes: every 1 MiB read splits into 16 reads.
    let d8s = striped(&store, "depth8s", bytes, 8, 64 * 1024, rng);
    let (mut t1, mut t8, mut t8s) = (Vec::new(), Vec::new(), Vec::new());
    for d in [&d1, &d8, &d8s] {
        read_all(d);
    }
    for _ in 0..RUNS {
        t1.push(read_all(&d1));
        t8.push(read_all(&d8));
        t8s.push(read_all(&d8s));
    }
    let base = Some((median(t1), "depth1"));
    emit(
        &format!("seq_read_depth8_{mode}"),
        median(t8),
        "MiB/s",
        base,
    );
    emit(
        &format!("seq_read_depth8_interleaved_{mode}"),
        median(t8s),
        "MiB/s",
        base,
    );
    drop((d1, d8, d8s));
    for name in store.list_disks().unwrap() {
        store.delete_disk(&name).unwrap();
    }
    store.gc().unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    let run = |suite: &str| only.is_none_or(|o| o == suite);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x9e3779b97f4a7c15);
    bench_fsync(dir.path());
    if run("seal") {
        bench_seal(dir.path(), quick, &mut rng);
    }
    if run("fork") {
        bench_fork(dir.path(), &mut rng);
    }
    if run("export") {
        bench_export(dir.path(), quick, &mut rng);
    }
    if run("read") {
        bench_depth(dir.path(), quick, true, &mut rng);
        bench_depth(dir.path(), quick, false, &mut rng);
    }
}
