//! The disk server: one process per disk that serves it over FUSE at `RUNDIR/fuse/disk`
//! and answers the control socket `RUNDIR/control.sock`. It lives outside the daemon
//! so a daemon restart never takes a running sandbox's disk down.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockstore::{BlockDevice, Disk, FileDevice, Store, StoreOptions};

/// How long a read of a block still in an object store waits for the daemon that fetches
/// it (it may be restarting) before the read fails.
const FETCH_PATIENCE: Duration = Duration::from_secs(60);
use nix::sys::signal::{SigSet, Signal};

use crate::control::{Request, Response, ServerStats};
use crate::fuse::{Export, FsOptions};
use crate::{layout, Error, Result};

/// What to serve, and how.
#[derive(Clone, Debug)]
pub struct ServeArgs {
    /// The block store root and disk name.
    pub store: Option<(PathBuf, String)>,
    /// A plain file to serve instead of a store disk (tests, baselines).
    pub file: Option<PathBuf>,
    /// The run directory: FUSE mount, control socket, pid file and log.
    pub dir: PathBuf,
    /// FUSE worker threads.
    pub threads: usize,
    /// Where to write the one-line readiness report ("ready PID" or "error: ...").
    pub ready_fd: Option<i32>,
    /// FUSE open flags for the exported file.
    pub open_flags: u32,
    /// Compact in the background once the chain is this deep.
    pub compact_depth: usize,
    /// Open the store's data files with O_DIRECT (the default; see docs/disk-path.md).
    pub direct_io: bool,
    /// Take requests over io_uring when the kernel offers it (turns the host's
    /// `enable_uring` parameter on).
    pub uring: bool,
    /// What a flush from the kernel waits for.
    pub flush: crate::fuse::FlushMode,
    /// Hold writes the host has no space for until it has (see [`FsOptions`]).
    pub hold_when_full: bool,
}

/// The disk being served: a block-store disk, or a plain file.
enum Backend {
    Store(Arc<Disk>),
    File(Arc<FileDevice>),
}

impl Backend {
    fn open(args: &ServeArgs) -> Result<Backend> {
        if let Some(path) = &args.file {
            return Ok(Backend::File(Arc::new(FileDevice::open(path)?)));
        }
        let Some((root, name)) = &args.store else {
            return Err(Error::Invalid(
                "nothing to serve: give a store disk or a file".into(),
            ));
        };
        // The daemon that owns the store recovers it (and sweeps tmp/ in its garbage
        // collection); a disk server starting on a sandbox's path does not.
        let store = Store::open_unrecovered(
            root,
            StoreOptions {
                direct_io: args.direct_io,
            },
        )?;
        // Chunks of partial layers (snapshots pulled from an object store) are fetched by
        // the daemon that owns the store; a restart of it is waited out.
        let socket = root.join(blockstore::remote::FETCH_SOCKET);
        store.set_fetcher(Arc::new(blockstore::remote::SocketFetch::new(
            socket,
            FETCH_PATIENCE,
        )));
        Ok(Backend::Store(Arc::new(store.open_disk(name)?)))
    }

    fn device(&self) -> Arc<dyn BlockDevice> {
        match self {
            Backend::Store(d) => d.clone(),
            Backend::File(f) => f.clone(),
        }
    }

    fn disk(&self) -> Result<&Arc<Disk>> {
        match self {
            Backend::Store(d) => Ok(d),
            Backend::File(_) => Err(Error::Invalid("a plain file has no layers".into())),
        }
    }

    fn name(&self) -> String {
        match self {
            Backend::Store(d) => d.name().to_owned(),
            Backend::File(_) => "file".into(),
        }
    }

    fn depth(&self) -> usize {
        self.disk().map(|d| d.depth()).unwrap_or(0)
    }
}

/// Shared state of the control side.
struct Server {
    backend: Backend,
    io: Arc<crate::fuse::IoStats>,
    compactions: AtomicU64,
    compacting: AtomicBool,
    compact_depth: usize,
    shutdown: Sender<()>,
}

/// Runs the server until shutdown. Reports readiness (or the startup error) on
/// `args.ready_fd`.
pub fn serve(args: &ServeArgs) -> Result<()> {
    let mut ready = args.ready_fd.map(|fd| {
        // SAFETY: the starter passes an open pipe end it does not use itself.
        File::from(unsafe { OwnedFd::from_raw_fd(fd) })
    });
    match start(args) {
        Ok(running) => {
            if let Some(r) = ready.as_mut() {
                let _ = writeln!(r, "ready {}", std::process::id());
            }
            drop(ready);
            running.run()
        }
        Err(e) => {
            if let Some(r) = ready.as_mut() {
                let _ = writeln!(r, "error: {}", model::error_chain(&e));
            }
            Err(e)
        }
    }
}

struct Running {
    server: Arc<Server>,
    export: Export,
    listener: UnixListener,
    stop: std::sync::mpsc::Receiver<()>,
    dir: PathBuf,
}

fn start(args: &ServeArgs) -> Result<Running> {
    block_signals()?;
    let backend = Backend::open(args)?;
    let fuse_dir = layout::fuse_dir(&args.dir);
    std::fs::create_dir_all(&fuse_dir).map_err(Error::io("create the FUSE mount directory"))?;
    if args.uring {
        if let Err(e) = crate::fuse::uring::enable() {
            eprintln!("disk server: cannot enable FUSE over io_uring: {e}");
        }
    }
    let opts = FsOptions {
        open_flags: args.open_flags,
        uring: args.uring,
        flush: args.flush,
        hold_when_full: args.hold_when_full,
        ..FsOptions::default()
    };
    let export = Export::start(backend.device(), &fuse_dir, args.threads, opts)?;
    let via = if export.uses_uring() {
        "io_uring"
    } else {
        "/dev/fuse"
    };
    eprintln!("disk server: serving {} over {via}", backend.name());
    let sock = layout::control_socket(&args.dir);
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).map_err(Error::io("bind the control socket"))?;
    std::fs::write(layout::pid_file(&args.dir), std::process::id().to_string())
        .map_err(Error::io("write the pid file"))?;
    let (tx, rx) = channel();
    let server = Arc::new(Server {
        backend,
        io: export.stats_handle(),
        compactions: AtomicU64::new(0),
        compacting: AtomicBool::new(false),
        compact_depth: args.compact_depth,
        shutdown: tx,
    });
    lock_memory();
    Ok(Running {
        server,
        export,
        listener,
        stop: rx,
        dir: args.dir.clone(),
    })
}

impl Running {
    fn run(self) -> Result<()> {
        spawn_signal_waiter(self.server.shutdown.clone());
        let server = self.server.clone();
        let listener = self.listener;
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(listener, server))
            .map_err(Error::io("spawn the control thread"))?;
        let _ = self.stop.recv();
        eprintln!("disk server: shutting down");
        // However asked to stop (the control socket or a signal), writes held for want of
        // host space give up: nothing will read this disk again.
        self.server.io.give_up.store(true, Ordering::Relaxed);
        let res = self.export.stop(Duration::from_secs(2));
        let flushed = self.server.backend.device().flush();
        let _ = std::fs::remove_file(layout::control_socket(&self.dir));
        let _ = std::fs::remove_file(layout::pid_file(&self.dir));
        res.and(flushed.map_err(Error::from))
    }
}

/// SIGTERM, SIGINT and SIGHUP are taken by one thread with sigwait and turned into a
/// clean shutdown; they are blocked before any other thread starts so all inherit it.
fn block_signals() -> Result<()> {
    signal_set()
        .thread_block()
        .map_err(Error::sys("block signals"))
}

fn signal_set() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(s);
    }
    set
}

fn spawn_signal_waiter(shutdown: Sender<()>) {
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if signal_set().wait().is_ok() {
                let _ = shutdown.send(());
            }
        });
}

/// Keeps the server's pages resident: a disk server paged out under memory pressure
/// could wait on its own disk. Best effort.
fn lock_memory() {
    use nix::sys::mman::{mlockall, MlockAllFlags};
    if let Err(e) = mlockall(MlockAllFlags::MCL_CURRENT) {
        eprintln!("disk server: mlockall failed ({e}); continuing unlocked");
    }
}

fn accept_loop(listener: UnixListener, server: Arc<Server>) {
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                let server = server.clone();
                let spawned = std::thread::Builder::new()
                    .name("control-client".into())
                    .stack_size(256 << 10)
                    .spawn(move || {
                        if let Err(e) = handle_client(s, &server) {
                            eprintln!("disk server: control client: {e}");
                        }
                    });
                if let Err(e) = spawned {
                    eprintln!("disk server: no thread for a control client: {e}");
                }
            }
            Err(e) => eprintln!("disk server: accept: {e}"),
        }
    }
}

/// Longest control request line; longer ones are cut and fail to parse.
const MAX_REQUEST: u64 = 64 << 10;

fn handle_client(stream: UnixStream, server: &Arc<Server>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    while (&mut reader).take(MAX_REQUEST).read_line(&mut line)? > 0 {
        let (resp, stop) = match serde_json::from_str::<Request>(&line) {
            Ok(req) => (server.handle(&req), req == Request::Shutdown),
            Err(e) => (Response::err(format!("bad request: {e}")), false),
        };
        let mut out = serde_json::to_string(&resp).unwrap_or_default();
        out.push('\n');
        (&stream).write_all(out.as_bytes())?;
        if stop {
            let _ = server.shutdown.send(());
            return Ok(());
        }
        line.clear();
    }
    Ok(())
}

impl Server {
    fn handle(self: &Arc<Self>, req: &Request) -> Response {
        let t0 = Instant::now();
        let res = match req {
            Request::Seal => self.seal(),
            Request::Grow { size } => self.grow(*size),
            Request::Compact => self.compact(),
            Request::Stats => Ok(Response {
                stats: Some(self.stats()),
                ..Response::ok()
            }),
            Request::Release => {
                self.io.give_up.store(true, Ordering::Relaxed);
                Ok(Response::ok())
            }
            Request::Shutdown => Ok(Response::ok()),
        };
        match res {
            Ok(mut r) => {
                r.millis = Some(t0.elapsed().as_secs_f64() * 1e3);
                r
            }
            Err(e) => Response::err(model::error_chain(&e)),
        }
    }

    fn seal(self: &Arc<Self>) -> Result<Response> {
        let layer = self.backend.disk()?.seal()?;
        self.maybe_compact();
        Ok(Response {
            layer: Some(layer),
            ..Response::ok()
        })
    }

    fn grow(&self, size: u64) -> Result<Response> {
        self.backend.disk()?.grow(size)?;
        Ok(Response::ok())
    }

    fn compact(&self) -> Result<Response> {
        let layer = self.backend.disk()?.compact()?;
        self.compactions.fetch_add(1, Ordering::Relaxed);
        Ok(Response {
            layer,
            ..Response::ok()
        })
    }

    /// Starts a background compaction when the chain has grown past the bound.
    fn maybe_compact(self: &Arc<Self>) {
        if self.backend.depth() < self.compact_depth || self.compacting.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("compact".into())
            .spawn(move || {
                // A seal landing mid-compaction makes it give up (the chain moved); go
                // again while the chain is still too deep, or no later seal may come to.
                for _ in 0..8 {
                    if let Err(e) = me.compact() {
                        eprintln!(
                            "disk server: background compaction failed: {}",
                            model::error_chain(&e)
                        );
                    }
                    if me.backend.depth() < me.compact_depth {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                me.compacting.store(false, Ordering::Release);
            });
    }

    fn stats(&self) -> ServerStats {
        let dev = self.backend.device();
        ServerStats {
            pid: std::process::id(),
            disk: self.backend.name(),
            size: dev.size(),
            depth: self.backend.depth(),
            io: self.io.snapshot(),
            compactions: self.compactions.load(Ordering::Relaxed),
        }
    }
}

/// Sends stdin to /dev/null and stdout/stderr to `log`, and leaves the caller's session
/// so the server outlives whoever started it.
pub fn detach_stdio(log: &Path) -> Result<()> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(Error::io(format!("open {}", log.display())))?;
    let null = File::open("/dev/null").map_err(Error::io("open /dev/null"))?;
    nix::unistd::dup2_stdin(&null)
        .and_then(|()| nix::unistd::dup2_stdout(&log))
        .and_then(|()| nix::unistd::dup2_stderr(&log))
        .map_err(Error::sys("redirect stdio"))
}

/// Forks into the background: the parent exits at once (so whoever spawned it can reap
/// it), the child starts a new session with stdio on `log`. Call before any thread.
pub fn daemonize(log: &Path) -> Result<()> {
    use nix::unistd::{fork, setsid, ForkResult};
    // SAFETY: called from `main` before any thread is started, so the child is a copy of
    // a single-threaded process and may run arbitrary code.
    match unsafe { fork() }.map_err(Error::sys("fork the disk server"))? {
        ForkResult::Parent { .. } => std::process::exit(0),
        ForkResult::Child => {}
    }
    setsid().map_err(Error::sys("start a new session"))?;
    detach_stdio(log)
}
