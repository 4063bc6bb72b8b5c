//! A block-store disk mounted as ext4: disk server + loop device + ext4 mount, and
//! the operations a runtime needs on it (freeze, seal, grow, teardown).

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blockstore::LayerId;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::control::{self, Request, ServerStats};
use crate::loopdev::{self, LoopDevice};
use crate::{ext4, layout, mounts, Error, Result};

const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);

/// Which disk, and where its server keeps its run files.
#[derive(Clone, Debug)]
pub struct DiskSpec {
    pub store: PathBuf,
    pub disk: String,
    pub run_dir: PathBuf,
}

/// Knobs for [`MountedDisk::mount`].
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// FUSE worker threads in the disk server.
    pub threads: usize,
    /// How long the server may take to start serving.
    pub start_timeout: Duration,
    /// Grow the filesystem to the disk size before mounting (after a grow whose online
    /// resize the kernel refused).
    pub grow_fs: bool,
    /// FUSE open flags for the exported file (see [`crate::fuse::open_flag`]).
    pub open_flags: u32,
    /// The server opens the store's data files with O_DIRECT.
    pub direct_io: bool,
    /// The server takes FUSE requests over io_uring where the kernel offers it.
    pub uring: bool,
    /// What a flush from inside waits for (see [`crate::fuse::FlushMode`]).
    pub flush: crate::fuse::FlushMode,
    /// Hold writes the host has no space for until it has, instead of failing them (a
    /// sandbox's root disk: see [`crate::fuse::FsOptions::hold_when_full`]).
    pub hold_when_full: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            threads: 8,
            start_timeout: Duration::from_secs(30),
            grow_fs: true,
            open_flags: crate::fuse::DEFAULT_OPEN_FLAGS,
            direct_io: true,
            uring: false,
            flush: Default::default(),
            hold_when_full: false,
        }
    }
}

/// Timings of one seal, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct SealTimes {
    pub freeze_ms: f64,
    pub seal_ms: f64,
    pub thaw_ms: f64,
}

/// A mounted disk. Dropping the handle leaves everything running (the daemon may
/// restart and [`MountedDisk::adopt`] it); [`MountedDisk::teardown`] ends it.
#[derive(Debug)]
pub struct MountedDisk {
    spec: DiskSpec,
    mountpoint: PathBuf,
    loop_dev: LoopDevice,
    pid: i32,
}

impl MountedDisk {
    /// Starts the disk server, attaches a loop device to its file and mounts ext4 at
    /// `mountpoint` (an existing directory). On failure nothing is left behind.
    pub fn mount(spec: &DiskSpec, mountpoint: &Path, opts: MountOptions) -> Result<MountedDisk> {
        let pid = spawn_server(spec, &opts)?;
        let mut partial = Partial {
            run_dir: spec.run_dir.clone(),
            pid,
            loop_dev: None,
            mountpoint: None,
        };
        let file = layout::fuse_file(&spec.run_dir);
        if opts.grow_fs {
            ext4::grow_offline(&file)?;
        }
        let held = LoopDevice::attach(&file)?;
        let loop_dev = LoopDevice::from_path(held.path());
        partial.loop_dev = Some(held);
        let options = match opts.flush {
            crate::fuse::FlushMode::Writeback => ext4::WRITEBACK_OPTIONS,
            crate::fuse::FlushMode::Durable => ext4::DURABLE_OPTIONS,
        };
        ext4::mount_ext4(loop_dev.path(), mountpoint, options)?;
        partial.mountpoint = Some(mountpoint.to_path_buf());
        partial.disarm();
        Ok(MountedDisk {
            spec: spec.clone(),
            mountpoint: mountpoint.to_path_buf(),
            loop_dev,
            pid,
        })
    }

    /// Takes over a disk whose server still runs (after a daemon restart).
    pub fn adopt(spec: &DiskSpec, mountpoint: &Path) -> Result<MountedDisk> {
        let stats = stats_of(&spec.run_dir)?;
        // sysfs names the backing file by its canonical path; canonicalize the run
        // directory only (a stat inside the FUSE mount would be a needless request).
        let file = layout::fuse_file(&mounts::canonical(&spec.run_dir));
        let loop_dev = loopdev::attached()
            .into_iter()
            .find(|(_, backing)| *backing == file)
            .map(|(dev, _)| dev)
            .ok_or_else(|| Error::Invalid(format!("no loop device on {}", file.display())))?;
        if !mounts::is_mountpoint(mountpoint) {
            return Err(Error::Invalid(format!(
                "{} is not mounted",
                mountpoint.display()
            )));
        }
        Ok(MountedDisk {
            spec: spec.clone(),
            mountpoint: mountpoint.to_path_buf(),
            loop_dev,
            pid: stats.pid as i32,
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn loop_device(&self) -> &Path {
        self.loop_dev.path()
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn spec(&self) -> &DiskSpec {
        &self.spec
    }

    pub fn freeze(&self) -> Result<()> {
        ext4::freeze(&self.mountpoint)
    }

    pub fn thaw(&self) -> Result<()> {
        ext4::thaw(&self.mountpoint)
    }

    /// Freezes, seals and thaws (thaws even when the seal fails).
    pub fn seal(&self) -> Result<LayerId> {
        self.seal_timed().map(|(id, _)| id)
    }

    /// [`MountedDisk::seal`], also reporting how long each step took.
    pub fn seal_timed(&self) -> Result<(LayerId, SealTimes)> {
        let t0 = Instant::now();
        self.freeze()?;
        let t1 = Instant::now();
        let sealed = self.seal_frozen();
        let t2 = Instant::now();
        let thawed = self.thaw();
        let times = SealTimes {
            freeze_ms: ms(t1 - t0),
            seal_ms: ms(t2 - t1),
            thaw_ms: ms(t2.elapsed()),
        };
        let id = sealed?;
        thawed?;
        Ok((id, times))
    }

    /// Seals a filesystem the caller has already frozen (or paused).
    pub fn seal_frozen(&self) -> Result<LayerId> {
        let resp = self.call(&Request::Seal)?;
        resp.layer
            .ok_or_else(|| Error::Server("seal answered without a layer".into()))
    }

    /// Grows the disk, the loop device and the mounted filesystem to `new_size`. Where
    /// the kernel refuses online resizes this returns [`Error::ResizeRefused`] with the
    /// disk grown: the filesystem grows when the disk is next mounted.
    pub fn grow(&self, new_size: u64) -> Result<()> {
        self.call(&Request::Grow { size: new_size })?;
        // A stat makes the kernel fetch the new size of the FUSE file.
        let file = layout::fuse_file(&self.spec.run_dir);
        let size = std::fs::metadata(&file)
            .map_err(Error::io("stat the disk file"))?
            .len();
        if size != new_size {
            return Err(Error::Server(format!(
                "disk file is {size} bytes after grow"
            )));
        }
        self.loop_dev.refresh_capacity()?;
        ext4::resize(self.loop_dev.path())
    }

    /// The server's counters.
    pub fn stats(&self) -> Result<ServerStats> {
        stats_of(&self.spec.run_dir)
    }

    /// Unmounts ext4, detaches the loop device and stops the server. Always completes:
    /// a dead or stuck server is killed and its FUSE connection aborted.
    pub fn teardown(self) -> Result<()> {
        // Writes held for want of host space would hold the unmount's flush forever.
        let _ = self.call(&Request::Release);
        let _ = ext4::thaw(&self.mountpoint);
        let unmounted = ext4::unmount(&self.mountpoint);
        let detached = self.loop_dev.detach();
        stop_server(&self.spec.run_dir, self.pid);
        unmounted.and(detached)
    }

    fn call(&self, req: &Request) -> Result<control::Response> {
        control::call(
            &layout::control_socket(&self.spec.run_dir),
            req,
            CONTROL_TIMEOUT,
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The counters of the disk server running in `run_dir`.
pub fn stats_of(run_dir: &Path) -> Result<ServerStats> {
    let resp = control::call(
        &layout::control_socket(run_dir),
        &Request::Stats,
        CONTROL_TIMEOUT,
    )?;
    resp.stats
        .ok_or_else(|| Error::Server("stats answered without stats".into()))
}

/// What a failed mount has set up so far; undone on drop.
struct Partial {
    run_dir: PathBuf,
    pid: i32,
    loop_dev: Option<LoopDevice>,
    mountpoint: Option<PathBuf>,
}

impl Partial {
    /// Keeps what was set up: the mount now holds the loop device, the server runs on.
    fn disarm(mut self) {
        self.pid = 0;
        self.mountpoint = None;
        self.loop_dev = None;
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if self.pid == 0 {
            return;
        }
        if let Some(m) = &self.mountpoint {
            let _ = ext4::unmount(m);
        }
        if let Some(l) = &self.loop_dev {
            let _ = l.detach();
        }
        stop_server(&self.run_dir, self.pid);
    }
}

/// A block-store disk served as one file only (no loop device, no filesystem): what reads
/// it gets its bytes, fetched first when they are still in an object store. Memory images
/// pulled from an object store are served so (docs/scale-out.md). Dropping the handle
/// leaves the server running; [`ServedFile::stop`] ends it.
#[derive(Debug)]
pub struct ServedFile {
    spec: DiskSpec,
    pid: i32,
}

impl ServedFile {
    /// Starts the disk server for `spec` and returns once its file is served.
    pub fn start(spec: &DiskSpec, opts: &MountOptions) -> Result<ServedFile> {
        let pid = spawn_server(spec, opts)?;
        Ok(ServedFile {
            spec: spec.clone(),
            pid,
        })
    }

    /// The server already serving `spec` (after a daemon restart), if it answers.
    pub fn adopt(spec: &DiskSpec) -> Option<ServedFile> {
        let stats = stats_of(&spec.run_dir).ok()?;
        Some(ServedFile {
            spec: spec.clone(),
            pid: stats.pid as i32,
        })
    }

    /// The served file.
    pub fn path(&self) -> PathBuf {
        layout::fuse_file(&self.spec.run_dir)
    }

    /// Stops the server and removes its mount.
    pub fn stop(self) {
        stop_server(&self.spec.run_dir, self.pid);
    }
}

/// Asks the server to shut down; kills it when it does not answer or linger. Then makes
/// sure its FUSE mount is gone.
pub(crate) fn stop_server(run_dir: &Path, pid: i32) {
    let sock = layout::control_socket(run_dir);
    let asked = control::call(&sock, &Request::Shutdown, Duration::from_secs(5)).is_ok();
    if !asked || !wait_exit(pid, Duration::from_secs(5)) {
        // Only a process that still is this disk's server (pids get reused).
        if mounts::server_dir_of(pid)
            .is_some_and(|d| mounts::canonical(&d) == mounts::canonical(run_dir))
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            wait_exit(pid, Duration::from_secs(5));
        }
    }
    mounts::abort_and_detach_fuse(&layout::fuse_dir(run_dir));
}

/// Polls until `pid` is gone (it is not our child: the server double-forks).
fn wait_exit(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if !mounts::process_alive(pid) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

static SERVER_BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Names the binary that runs [`crate::cli`] when started as `sandfork-disk` (a binary
/// that carries the disk server, such as `sandfork` itself). Set once, at start.
pub fn use_server_binary(path: PathBuf) {
    let _ = SERVER_BINARY.set(path);
}

/// The binary started for disk servers: `SANDFORK_DISK_BIN`, else the one given to
/// [`use_server_binary`], else `sandfork-disk` next to the current executable or one
/// directory up (tests run from `target/*/deps`).
pub fn server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SANDFORK_DISK_BIN") {
        return PathBuf::from(p);
    }
    if let Some(p) = SERVER_BINARY.get() {
        return p.clone();
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().unwrap_or(Path::new("."));
    let beside = dir.join("sandfork-disk");
    if beside.is_file() {
        return beside;
    }
    dir.parent().unwrap_or(dir).join("sandfork-disk")
}

/// Starts a detached disk server and waits until it serves; returns its pid.
fn spawn_server(spec: &DiskSpec, opts: &MountOptions) -> Result<i32> {
    std::fs::create_dir_all(&spec.run_dir).map_err(Error::io("create the run directory"))?;
    let (rd, wr) = nix::unistd::pipe().map_err(Error::sys("create the readiness pipe"))?;
    nix::fcntl::fcntl(
        &rd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(Error::sys("set close-on-exec"))?;
    let bin = server_binary();
    let mut cmd = Command::new(&bin);
    // The name the server runs under: `sandfork` dispatches on it, and cleanup finds
    // disk servers by it (mounts::server_dir_of).
    cmd.arg0("sandfork-disk").arg("serve");
    if !opts.direct_io {
        cmd.arg("--buffered");
    }
    if opts.uring {
        cmd.arg("--uring");
    }
    if opts.hold_when_full {
        cmd.arg("--hold-when-full");
    }
    let mut child = cmd
        .arg("--store")
        .arg(&spec.store)
        .args(["--disk", &spec.disk])
        .arg("--dir")
        .arg(mounts::canonical(&spec.run_dir))
        .args(["--threads", &opts.threads.to_string()])
        .args(["--open-flags", &opts.open_flags.to_string()])
        .args(["--flush", &opts.flush.to_string()])
        .args(["--ready-fd", &wr.as_raw_fd().to_string(), "--detach"])
        .stdin(Stdio::null())
        .spawn()
        .map_err(Error::io(format!("start {}", bin.display())))?;
    drop(wr);
    let _ = child.wait();
    read_ready(rd, opts.start_timeout, &spec.run_dir)
}

/// Reads the server's one-line readiness report.
fn read_ready(rd: OwnedFd, timeout: Duration, run_dir: &Path) -> Result<i32> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(rd.as_fd(), PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(timeout.as_millis().min(i32::MAX as u128) as i32)
        .unwrap_or(PollTimeout::MAX);
    let n = poll(&mut fds, ms).map_err(Error::sys("wait for the disk server"))?;
    if n == 0 {
        return Err(Error::Server(format!(
            "did not start in {timeout:?} (log: {})",
            layout::log_file(run_dir).display()
        )));
    }
    let mut line = String::new();
    BufReader::new(std::fs::File::from(rd))
        .read_line(&mut line)
        .map_err(Error::io("read the readiness report"))?;
    match line.trim().strip_prefix("ready ") {
        Some(pid) => pid
            .parse()
            .map_err(|_| Error::Server(format!("bad readiness report {line:?}"))),
        None if line.is_empty() => Err(Error::Server("exited before serving".into())),
        None => Err(Error::Server(line.trim().to_owned())),
    }
}
