//! The disk path end to end: image → base layer → disk mounted through FUSE + loop +
//! ext4 → write → seal → four forks, independent → layer sizes → teardown.
//!
//! `cargo run --release -p sandfork-disk --example demo` (as root).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use blockstore::{LayerId, Store};
use disk::{DiskSpec, MountOptions, MountedDisk};

const DISK_SIZE: u64 = 512 << 20;
const FORKS: usize = 4;

/// Removes every mount, loop device and server below the work directory, even on error.
struct Work(tempfile::TempDir);

impl Drop for Work {
    fn drop(&mut self) {
        let _ = disk::cleanup_stale(self.0.path());
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("demo failed: {e:#}");
        std::process::exit(1);
    }
}

fn ms(t: Instant) -> String {
    format!("{:.1} ms", t.elapsed().as_secs_f64() * 1e3)
}

fn run() -> Result<()> {
    let work = Work(
        tempfile::Builder::new()
            .prefix("sandfork-demo")
            .tempdir_in("/var/tmp")?,
    );
    let dir = work.0.path();
    let store = Store::open(&dir.join("store"))?;

    let t = Instant::now();
    let image = build_image(dir)?;
    let base = store.import_image(&image)?;
    std::fs::remove_file(&image)?;
    println!(
        "image: busybox rootfs → ext4 → base layer {base} in {}",
        ms(t)
    );

    let parent = mount(&store, dir, "parent", &base)?;
    let t = Instant::now();
    let payload = payload(100 << 20);
    write_synced(&parent.mountpoint().join("data.bin"), &payload)?;
    println!("wrote 100 MiB into the parent disk in {}", ms(t));
    let (sealed, times) = parent.seal_timed()?;
    println!(
        "seal: freeze {:.1} ms, seal {:.1} ms, thaw {:.1} ms → layer {sealed}",
        times.freeze_ms, times.seal_ms, times.thaw_ms
    );

    let forks = fork_and_diverge(&store, dir, &sealed, &payload)?;
    let tops = seal_all(&forks)?;
    report_layers(&store, &base, &sealed, &tops)?;

    let t = Instant::now();
    for m in forks.into_iter().chain([parent]) {
        m.teardown()?;
    }
    let left = disk::cleanup_stale(dir)?;
    ensure!(left.is_empty(), "teardown left things behind: {left:?}");
    println!("teardown of 5 disks in {} (nothing left behind)", ms(t));
    println!("OK");
    Ok(())
}

/// Forks the sealed layer four times, mounts each fork, writes a different file into
/// each and checks that no fork sees another's file and all see the parent's data.
fn fork_and_diverge(
    store: &Store,
    dir: &Path,
    sealed: &LayerId,
    payload: &[u8],
) -> Result<Vec<MountedDisk>> {
    let mut forks = Vec::new();
    for i in 0..FORKS {
        let t = Instant::now();
        let m = mount(store, dir, &format!("fork{i}"), sealed)?;
        println!("fork {i}: create + mount in {}", ms(t));
        forks.push(m);
    }
    for (i, m) in forks.iter().enumerate() {
        write_synced(
            &m.mountpoint().join(format!("fork{i}.txt")),
            format!("I am fork {i}\n").as_bytes(),
        )?;
    }
    for (i, m) in forks.iter().enumerate() {
        for j in 0..FORKS {
            let seen = m.mountpoint().join(format!("fork{j}.txt")).exists();
            ensure!(seen == (i == j), "fork {i} sees fork {j}'s file: {seen}");
        }
        let data = std::fs::read(m.mountpoint().join("data.bin"))?;
        ensure!(data == payload, "fork {i} lost the parent's data");
    }
    println!("forks are independent: each sees its own file only, and the parent's 100 MiB");
    Ok(forks)
}

fn seal_all(forks: &[MountedDisk]) -> Result<Vec<LayerId>> {
    forks.iter().map(|m| Ok(m.seal()?)).collect()
}

fn report_layers(store: &Store, base: &LayerId, sealed: &LayerId, tops: &[LayerId]) -> Result<()> {
    println!("snapshot cost = what changed:");
    let line = |label: &str, id: &LayerId| -> Result<()> {
        let info = store.layer_info(id)?;
        println!(
            "  {label:<28} {:>9.2} MiB written blocks  ({:>8.2} MiB on disk)",
            (info.held_blocks * blockstore::BLOCK_SIZE) as f64 / (1 << 20) as f64,
            info.bytes_on_disk as f64 / (1 << 20) as f64
        );
        Ok(())
    };
    line("base image", base)?;
    line("parent after +100 MiB", sealed)?;
    for (i, id) in tops.iter().enumerate() {
        line(&format!("fork {i} after one small file"), id)?;
    }
    Ok(())
}

fn mount(store: &Store, dir: &Path, name: &str, base: &LayerId) -> Result<MountedDisk> {
    store.create_disk(name, DISK_SIZE, Some(base))?;
    let mnt = dir.join(format!("mnt-{name}"));
    std::fs::create_dir_all(&mnt)?;
    let spec = DiskSpec {
        store: dir.join("store"),
        disk: name.to_owned(),
        run_dir: dir.join(format!("run-{name}")),
    };
    MountedDisk::mount(&spec, &mnt, MountOptions::default())
        .with_context(|| format!("mount {name}"))
}

/// A rootfs with busybox-static and its applet links, as an ext4 image.
fn build_image(dir: &Path) -> Result<PathBuf> {
    let root = dir.join("rootfs");
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).context("copy /bin/busybox")?;
    for applet in ["sh", "ls", "cat", "echo"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))?;
    }
    std::fs::write(root.join("etc/hostname"), "sandfork\n")?;
    let image = dir.join("rootfs.img");
    disk::build_ext4_image(&root, &image, DISK_SIZE)?;
    Ok(image)
}

fn payload(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

fn write_synced(path: &Path, data: &[u8]) -> Result<()> {
    std::fs::write(path, data)?;
    std::fs::File::open(path)?.sync_all()?;
    Ok(())
}
