//! The whole disk path on the block store, as root: image → layer → disk → FUSE → loop
//! → ext4, seal, fork, grow, crash of the disk server, adoption, cleanup.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{pattern, read, write, Fixture};
use disk::MountedDisk;

#[test]
fn forks_see_the_sealed_state_and_stay_independent() {
    let fx = Fixture::new();
    let parent = fx.mount_new("parent", &fx.base);
    assert_eq!(
        read(parent.mountpoint(), "hello.txt"),
        "hello from the image\n"
    );
    let options = mount_options(parent.mountpoint());
    assert!(
        options.contains("data=writeback") && options.contains("nobarrier"),
        "writeback-flush disks skip ordering and barriers: {options}"
    );
    write(parent.mountpoint(), "state.txt", b"before seal\n");
    let (layer, times) = parent.seal_timed().unwrap();
    assert!(times.freeze_ms >= 0.0 && times.seal_ms >= 0.0);

    let fork = fx.mount_new("fork", &layer);
    assert_eq!(read(fork.mountpoint(), "state.txt"), "before seal\n");
    assert_eq!(
        read(fork.mountpoint(), "hello.txt"),
        "hello from the image\n"
    );
    write(fork.mountpoint(), "state.txt", b"fork wrote this\n");
    write(parent.mountpoint(), "parent-only.txt", b"parent\n");
    assert_eq!(read(parent.mountpoint(), "state.txt"), "before seal\n");
    assert!(!fork.mountpoint().join("parent-only.txt").exists());
    assert!(!parent.mountpoint().join("fork-only.txt").exists());

    for m in [parent, fork] {
        disk::ext4::unmount(m.mountpoint()).unwrap();
        disk::ext4::fsck(&disk::layout::fuse_file(&m.spec().run_dir)).unwrap();
        m.teardown().unwrap();
    }
    fx.assert_clean();
}

#[test]
fn two_forks_written_concurrently_never_see_each_other() {
    let fx = Fixture::new();
    let a = fx.mount_new("a", &fx.base);
    let b = fx.mount_new("b", &fx.base);
    std::thread::scope(|s| {
        for (i, m) in [&a, &b].into_iter().enumerate() {
            s.spawn(move || {
                for j in 0..8 {
                    let name = format!("f{j}");
                    write(m.mountpoint(), &name, &pattern(i as u64 * 100 + j, 1 << 20));
                }
            });
        }
    });
    for (i, m) in [&a, &b].into_iter().enumerate() {
        for j in 0..8 {
            let got = std::fs::read(m.mountpoint().join(format!("f{j}"))).unwrap();
            assert!(
                got == pattern(i as u64 * 100 + j, 1 << 20),
                "fork {i} file {j}"
            );
        }
    }
    a.teardown().unwrap();
    b.teardown().unwrap();
    fx.assert_clean();
}

#[test]
fn grow_extends_the_filesystem_online_or_at_the_next_mount() {
    let fx = Fixture::new();
    let m = fx.mount_new("g", &fx.base);
    let blocks = |m: &MountedDisk| nix::sys::statvfs::statvfs(m.mountpoint()).unwrap().blocks();
    let before = blocks(&m);
    let m = match m.grow(common::IMAGE_SIZE * 2) {
        Ok(()) => m,
        Err(disk::Error::ResizeRefused) => {
            m.teardown().unwrap();
            fx.mount("g")
        }
        Err(e) => panic!("grow: {e:?}"),
    };
    let after = blocks(&m);
    assert!(after > before * 3 / 2, "blocks {before} -> {after}");
    assert_eq!(m.stats().unwrap().size, common::IMAGE_SIZE * 2);
    write(m.mountpoint(), "big", &pattern(9, 120 << 20));
    disk::ext4::unmount(m.mountpoint()).unwrap();
    disk::ext4::fsck(&disk::layout::fuse_file(&m.spec().run_dir)).unwrap();
    m.teardown().unwrap();
    fx.assert_clean();
}

/// Runs `f` on a thread and fails if it takes longer than `limit` (a hang).
/// The options ext4 reports for the filesystem mounted at `mountpoint`.
fn mount_options(mountpoint: &Path) -> String {
    let want = mountpoint.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[1] == want && f[2] == "ext4")
        .map(|f| f[3].to_owned())
        .unwrap_or_else(|| panic!("no ext4 at {want}"))
}

fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).expect("operation hung")
}

#[test]
fn a_killed_server_gives_eio_and_teardown_completes() {
    let fx = Fixture::new();
    let m = fx.mount_new("k", &fx.base);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m.pid()),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    let root = m.mountpoint().to_path_buf();
    let res = within(Duration::from_secs(20), move || {
        let p = root.join("after-kill");
        std::fs::write(&p, vec![1u8; 1 << 20]).and_then(|()| std::fs::File::open(&p)?.sync_all())
    });
    assert!(res.is_err(), "I/O after the server died must fail");
    let t0 = Instant::now();
    within(Duration::from_secs(30), move || m.teardown()).ok();
    assert!(t0.elapsed() < Duration::from_secs(30));
    fx.assert_clean();
}

#[test]
fn synced_writes_survive_a_killed_server_in_durable_mode() {
    let fx = Fixture::new();
    fx.store
        .create_disk("wb", common::IMAGE_SIZE, Some(&fx.base))
        .unwrap();
    let durable = disk::MountOptions {
        flush: disk::fuse::FlushMode::Durable,
        ..Default::default()
    };
    let m = fx.mount_with("wb", durable);
    let options = mount_options(m.mountpoint());
    assert!(
        !options.contains("data=writeback") && !options.contains("nobarrier"),
        "durable disks keep ext4's ordering and barriers: {options}"
    );
    let data = pattern(7, 3 << 20);
    write(m.mountpoint(), "synced.bin", &data);
    std::fs::File::open(m.mountpoint().join("synced.bin"))
        .and_then(|f| f.sync_all())
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m.pid()),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    within(Duration::from_secs(30), move || m.teardown()).ok();
    let again = fx.mount("wb");
    let got = std::fs::read(again.mountpoint().join("synced.bin")).unwrap();
    assert!(
        got == data,
        "synced data changed after the server was killed"
    );
    again.teardown().unwrap();
    fx.assert_clean();
}

#[test]
fn cleanup_stale_removes_a_crashed_disk() {
    let fx = Fixture::new();
    let alive = fx.mount_new("alive", &fx.base);
    let dead = fx.mount_new("dead", &fx.base);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dead.pid()),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    drop((alive, dead)); // the "daemon" crashed: handles are gone, state is not
    let dir = fx.dir.path().to_path_buf();
    let report = within(Duration::from_secs(60), move || disk::cleanup_stale(&dir)).unwrap();
    assert_eq!(report.unmounted.len(), 2, "{report:?}");
    assert_eq!(report.servers_stopped.len(), 1, "{report:?}");
    fx.assert_clean();
    // The disk that was cleanly stopped mounts again with its data.
    let again = fx.mount("alive");
    assert_eq!(
        read(again.mountpoint(), "hello.txt"),
        "hello from the image\n"
    );
    again.teardown().unwrap();
}

#[test]
fn a_restarted_caller_adopts_a_running_disk() {
    let fx = Fixture::new();
    let m = fx.mount_new("adopt", &fx.base);
    let (spec, mnt, pid) = (m.spec().clone(), m.mountpoint().to_path_buf(), m.pid());
    write(&mnt, "kept.txt", b"still here\n");
    drop(m);
    let m = MountedDisk::adopt(&spec, &mnt).unwrap();
    assert_eq!(m.pid(), pid);
    assert_eq!(read(&mnt, "kept.txt"), "still here\n");
    let layer = m.seal().unwrap();
    assert!(fx.store.layer_info(&layer).unwrap().sealed);
    let stats = m.stats().unwrap();
    assert!(stats.io.writes > 0 && stats.depth >= 2, "{stats:?}");
    let answer = raw_request(&spec.run_dir, "{\"op\":\"format\"}\n");
    assert!(
        answer.starts_with(r#"{"ok":false,"error":"bad request"#),
        "{answer}"
    );
    m.teardown().unwrap();
    fx.assert_clean();
}

#[test]
fn deep_chains_are_compacted_in_the_background() {
    let fx = Fixture::new();
    let m = fx.mount_new("deep", &fx.base);
    for i in 0..blockstore::MAX_DEPTH / 2 + 1 {
        write(
            m.mountpoint(),
            &format!("gen{i}"),
            format!("{i}\n").as_bytes(),
        );
        m.seal().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let stats = loop {
        let s = m.stats().unwrap();
        if s.compactions > 0 || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(stats.compactions >= 1, "{stats:?}");
    assert!(stats.depth < blockstore::MAX_DEPTH / 2, "{stats:?}");
    for i in 0..blockstore::MAX_DEPTH / 2 + 1 {
        assert_eq!(read(m.mountpoint(), &format!("gen{i}")), format!("{i}\n"));
    }
    m.teardown().unwrap();
    fx.assert_clean();
}

/// A memory cgroup for one test, removed on drop. v1 (`memory` hierarchy) or v2.
struct MemoryCgroup(std::path::PathBuf);

impl MemoryCgroup {
    fn new(limit: u64) -> MemoryCgroup {
        let name = format!("sandfork-disk-test-{}", std::process::id());
        let (dir, file) = if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
            (
                Path::new("/sys/fs/cgroup/memory").join(name),
                "memory.limit_in_bytes",
            )
        } else {
            (Path::new("/sys/fs/cgroup").join(name), "memory.max")
        };
        std::fs::create_dir(&dir).unwrap();
        let cg = MemoryCgroup(dir);
        std::fs::write(cg.0.join(file), limit.to_string()).unwrap();
        cg
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_writer_under_memory_pressure_completes() {
    let fx = Fixture::new();
    let m = fx.mount_new("pressure", &fx.base);
    let cg = MemoryCgroup::new(48 << 20);
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec dd if=/dev/urandom of={}/big bs=1M count=80 conv=fsync",
        cg.0.display(),
        m.mountpoint().display()
    );
    let mut child = std::process::Command::new("sh")
        .args(["-c", &script])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(cg);
    // The property: pressure never wedges the disk. Under cgroup v1 the writer itself may
    // be OOM-killed (dirty pages count against it), which is not a hang.
    let status = status.expect("writer hung under memory pressure");
    if status.success() {
        let len = std::fs::metadata(m.mountpoint().join("big")).unwrap().len();
        assert_eq!(len, 80 << 20);
    }
    write(m.mountpoint(), "after", b"still writable\n");
    assert_eq!(read(m.mountpoint(), "after"), "still writable\n");
    m.teardown().unwrap();
    fx.assert_clean();
}

/// Sends one raw line to a disk server's control socket and returns its answer line.
fn raw_request(run_dir: &Path, line: &str) -> String {
    use std::io::{BufRead, Write};
    let sock = std::os::unix::net::UnixStream::connect(disk::layout::control_socket(run_dir));
    let mut sock = sock.unwrap();
    sock.write_all(line.as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(sock)
        .read_line(&mut answer)
        .unwrap();
    answer
}

/// Fills the filesystem of `dir` with one file; returns it.
fn fill(dir: &Path) -> std::path::PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let block = vec![0xa5u8; 1 << 20];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    filler
}

#[test]
fn a_server_holding_writes_for_space_stops_on_sigterm() {
    let fx = Fixture::on_small_tmpfs(64);
    fx.store
        .create_disk("h", common::IMAGE_SIZE, Some(&fx.base))
        .unwrap();
    let opts = disk::MountOptions {
        hold_when_full: true,
        // tmpfs and O_DIRECT need not go together.
        direct_io: false,
        ..disk::MountOptions::default()
    };
    let m = fx.mount_with("h", opts);
    let filler = fill(&fx.path("store"));
    // A writer the host has no room for: its sync waits on the held writes.
    let root = m.mountpoint().to_path_buf();
    std::thread::spawn(move || {
        let p = root.join("big");
        let _ = std::fs::write(&p, pattern(3, 8 << 20))
            .and_then(|()| std::fs::File::open(&p)?.sync_all());
    });
    let run_dir = fx.spec("h").run_dir;
    let deadline = Instant::now() + Duration::from_secs(30);
    while disk::stats_of(&run_dir).map_or(0, |s| s.io.held_writes) == 0 {
        assert!(Instant::now() < deadline, "no write was held");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGTERM (as from a service manager) ends it although writes wait for space.
    let pid = m.pid();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the disk server outlived SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::remove_file(filler).unwrap();
    within(Duration::from_secs(30), move || m.teardown()).ok();
    fx.assert_clean();
}
