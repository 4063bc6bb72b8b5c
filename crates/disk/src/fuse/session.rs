//! A FUSE session spoken directly over `/dev/fuse`: mount(2), the INIT handshake, then
//! worker threads that each read requests from their own cloned device fd.

use std::fs::{File, OpenOptions};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::uio::{readv, writev};

use super::abi::{self, InHeader, IN_HEADER_LEN, WRITE_PREFIX_LEN};
use super::fs::{DiskFs, Reply, MAX_IO};
use super::uring;
use crate::{Error, Result};

nix::ioctl_read!(fuse_dev_ioc_clone, 229, 0, u32);

/// Room for the largest request after its first `WRITE_PREFIX_LEN` bytes.
const DATA_BUF_LEN: usize = MAX_IO + 4096;
const PAGE: usize = 4096;
/// Workers need little stack; small stacks keep the locked memory of a server small.
const WORKER_STACK: usize = 256 << 10;

/// A mounted, initialised FUSE connection, not yet served by workers.
pub struct Session {
    dev: File,
    fs: Arc<DiskFs>,
    mountpoint: PathBuf,
    conn: u64,
    uring: bool,
}

/// The worker threads of a served session.
pub struct Workers {
    handles: Vec<JoinHandle<()>>,
}

impl Session {
    /// Mounts a FUSE filesystem at `mountpoint` and answers the kernel's INIT.
    pub fn mount(mountpoint: &Path, fs: Arc<DiskFs>) -> Result<Session> {
        let dev = open_dev()?;
        let opts = format!(
            "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,max_read={MAX_IO}",
            dev.as_raw_fd()
        );
        // One regular file the loop device reads: nothing on it is ever executed.
        let flags =
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_NOATIME;
        mount(
            Some("sandfork-disk"),
            mountpoint,
            Some("fuse"),
            flags,
            Some(opts.as_str()),
        )
        .map_err(Error::sys(format!(
            "mount FUSE at {}",
            mountpoint.display()
        )))?;
        let mut session = Session {
            dev,
            fs,
            mountpoint: mountpoint.to_path_buf(),
            conn: 0,
            uring: false,
        };
        // The mount is unusable (even stat waits) until INIT is answered.
        let res = session.handshake().and_then(|()| connection_of(mountpoint));
        match res {
            Ok(conn) => {
                session.conn = conn;
                Ok(session)
            }
            Err(e) => {
                let _ = umount2(mountpoint, MntFlags::MNT_DETACH);
                Err(e)
            }
        }
    }

    /// The connection number under `/sys/fs/fuse/connections`.
    pub fn connection(&self) -> u64 {
        self.conn
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether requests come over io_uring.
    pub fn uses_uring(&self) -> bool {
        self.uring
    }

    /// Reads the INIT request and replies to it.
    fn handshake(&mut self) -> Result<()> {
        let mut buf = vec![0u8; DATA_BUF_LEN + WRITE_PREFIX_LEN];
        let n = loop {
            match nix::unistd::read(&self.dev, &mut buf) {
                Err(Errno::EINTR) | Err(Errno::EAGAIN) => continue,
                r => break r.map_err(Error::sys("read FUSE INIT"))?,
            }
        };
        let h = InHeader::parse(&buf[..n]).ok_or(Error::Protocol)?;
        if h.opcode != abi::op::INIT {
            return Err(Error::Protocol);
        }
        let init = self.fs.init(&buf[IN_HEADER_LEN..n]);
        let (body, uring) = init.ok_or(Error::Protocol)?;
        self.uring = uring;
        send(&self.dev, h.unique, 0, &body.0).map_err(Error::sys("reply to FUSE INIT"))
    }

    /// Starts `threads` workers, each on its own clone of the device fd. Over io_uring
    /// one more worker reads `/dev/fuse` for what never goes through the ring (FORGET,
    /// INTERRUPT).
    pub fn serve(&self, threads: usize) -> Result<Workers> {
        let mut handles = Vec::new();
        let threads = threads.max(1);
        let classic = if self.uring { 1 } else { threads };
        let queues = uring::queue_count().max(1);
        for i in 0..classic + if self.uring { threads.max(queues) } else { 0 } {
            let fd = if i == 0 {
                self.dev.try_clone()
            } else {
                clone_dev(&self.dev)
            };
            let fd = fd.map_err(Error::io("clone /dev/fuse"))?;
            let fs = self.fs.clone();
            let builder = std::thread::Builder::new()
                .name(format!("fuse-{i}"))
                .stack_size(WORKER_STACK);
            let h = if i < classic {
                builder.spawn(move || worker(fd, fs))
            } else {
                let qid = ((i - classic) % queues) as u16;
                builder.spawn(move || uring::worker(fd, fs, qid))
            };
            handles.push(h.map_err(Error::io("spawn FUSE worker"))?);
        }
        Ok(Workers { handles })
    }

    /// Unmounts; a mount still held open (by a loop device) is detached lazily.
    pub fn unmount(&self) -> Result<()> {
        match umount2(&self.mountpoint, MntFlags::empty()) {
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => Ok(()),
            Err(Errno::EBUSY) => umount2(&self.mountpoint, MntFlags::MNT_DETACH)
                .map_err(Error::sys("detach the FUSE mount")),
            Err(e) => Err(Error::sys("unmount FUSE")(e)),
        }
    }

    /// Ends the connection at once: every pending and later request fails.
    pub fn abort(&self) {
        abort_connection(self.conn);
        let _ = umount2(&self.mountpoint, MntFlags::MNT_DETACH);
    }
}

impl Workers {
    /// Waits for every worker; they end when the connection goes away.
    pub fn join(self) {
        for h in self.handles {
            let _ = h.join();
        }
    }

    /// Whether every worker has ended.
    pub fn finished(&self) -> bool {
        self.handles.iter().all(|h| h.is_finished())
    }
}

/// Aborts FUSE connection `conn` through the fusectl filesystem, mounting fusectl at
/// `/sys/fs/fuse/connections` first when the host has not.
pub fn abort_connection(conn: u64) {
    const CTL: &str = "/sys/fs/fuse/connections";
    let path = format!("{CTL}/{conn}/abort");
    if !Path::new(&path).exists() {
        let _ = mount(
            Some("fusectl"),
            CTL,
            Some("fusectl"),
            MsFlags::empty(),
            None::<&str>,
        );
    }
    let _ = std::fs::write(path, b"1");
}

/// The FUSE connection number of the mount at `mountpoint`, from mountinfo: a stat
/// would wait for a worker to answer it.
fn connection_of(mountpoint: &Path) -> Result<u64> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(Error::io("read /proc/self/mountinfo"))?;
    let want = mountpoint.to_string_lossy().replace(' ', "\\040");
    let dev = info
        .lines()
        .rev()
        .filter_map(|l| {
            let mut f = l.split(' ').skip(2);
            let dev = f.next()?;
            (f.nth(1)? == want).then_some(dev)
        })
        .next()
        .ok_or_else(|| Error::Invalid(format!("no mount at {}", mountpoint.display())))?;
    let minor = dev.split(':').nth(1).and_then(|m| m.parse().ok());
    minor.ok_or_else(|| Error::Invalid(format!("bad device number {dev} in mountinfo")))
}

fn open_dev() -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(Error::io("open /dev/fuse"))
}

/// A new `/dev/fuse` fd attached to the same connection, with its own request queue
/// reader so workers never contend on one fd.
fn clone_dev(master: &File) -> std::io::Result<File> {
    let fd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")?;
    let mut master_fd = master.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the master fd) from the pointer, which
    // points at a live local; `fd` is an open /dev/fuse descriptor.
    unsafe { fuse_dev_ioc_clone(fd.as_raw_fd(), &mut master_fd) }?;
    Ok(fd)
}

/// Serves requests until the connection ends. The data buffer is page-aligned, and a
/// request is read as [header + WRITE args | payload] so WRITE data lands aligned.
fn worker(dev: File, fs: Arc<DiskFs>) {
    let mut head = [0u8; WRITE_PREFIX_LEN];
    let mut raw = vec![0u8; DATA_BUF_LEN + PAGE];
    let start = raw.as_ptr().align_offset(PAGE).min(PAGE);
    let data = &mut raw[start..start + DATA_BUF_LEN];
    let mut scratch = Vec::with_capacity(PAGE);
    loop {
        let n = match readv(
            dev.as_fd(),
            &mut [IoSliceMut::new(&mut head), IoSliceMut::new(data)],
        ) {
            Ok(n) => n,
            Err(Errno::EINTR) | Err(Errno::EAGAIN) | Err(Errno::ENOENT) => continue,
            Err(Errno::ENODEV) | Err(Errno::ECONNABORTED) => return,
            Err(e) => {
                eprintln!("FUSE worker stops: read /dev/fuse: {e}");
                return;
            }
        };
        let Some(h) = InHeader::parse(&head[..n.min(WRITE_PREFIX_LEN)]) else {
            continue;
        };
        let arg_end = n.min(WRITE_PREFIX_LEN);
        let reply = if h.opcode == abi::op::WRITE {
            let payload_len = n.saturating_sub(WRITE_PREFIX_LEN);
            fs.handle(&h, &head[IN_HEADER_LEN..arg_end], &mut data[..payload_len])
        } else if n <= WRITE_PREFIX_LEN {
            fs.handle(&h, &head[IN_HEADER_LEN..arg_end], data)
        } else {
            scratch.clear();
            scratch.extend_from_slice(&head[IN_HEADER_LEN..]);
            scratch.extend_from_slice(&data[..n - WRITE_PREFIX_LEN]);
            fs.handle(&h, &scratch, data)
        };
        if let Err(e) = respond(&dev, h.unique, reply, data) {
            if e != Errno::ENOENT {
                eprintln!("FUSE worker: reply failed: {e}");
            }
        }
    }
}

fn respond(dev: &File, unique: u64, reply: Reply, data: &[u8]) -> nix::Result<()> {
    match reply {
        Reply::None => Ok(()),
        Reply::Error(errno) => send(dev, unique, -errno, &[]),
        Reply::Body(out) => send(dev, unique, 0, &out.0),
        Reply::Data(n) => send(dev, unique, 0, &data[..n]),
    }
}

fn send(dev: &File, unique: u64, error: i32, body: &[u8]) -> nix::Result<()> {
    let header = abi::out_header(unique, error, if error == 0 { body.len() } else { 0 });
    let iov = [
        IoSlice::new(&header),
        IoSlice::new(if error == 0 { body } else { &[] }),
    ];
    writev(dev.as_fd(), &iov).map(|_| ())
}
