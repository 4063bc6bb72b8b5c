//! The `sandfork-disk` command: the per-disk server process, and a stale-state cleaner.
//! The `sandfork-disk` binary is a thin wrapper; the `sandfork` binary runs the same
//! command when started under that name (see [`crate::use_server_binary`]), so one binary
//! carries the whole host side.
//!
//! ```text
//! sandfork-disk serve --store DIR --disk NAME --dir RUNDIR [--threads N] [--detach] [--ready-fd FD]
//! sandfork-disk serve --file PATH --dir RUNDIR ...     serve a plain file (baselines)
//! sandfork-disk cleanup DIR                            after a crash
//! sandfork-disk create   --store DIR --disk NAME (--image IMG | --size BYTES) [--base LAYER]
//! sandfork-disk mount    --store DIR --disk NAME --dir RUNDIR --mountpoint M [--threads N]
//! sandfork-disk seal     --store DIR --disk NAME --dir RUNDIR --mountpoint M
//! sandfork-disk teardown --store DIR --disk NAME --dir RUNDIR --mountpoint M
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use blockstore::{LayerId, Store};
use clap::{Args, Parser, Subcommand};

use crate::fuse::FlushMode;
use crate::server::{self, ServeArgs};
use crate::{DiskSpec, MountOptions, MountedDisk};

#[derive(Debug, Parser)]
#[command(
    name = "sandfork-disk",
    about = "A block-store disk served as a mounted ext4 filesystem"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve one disk (or a plain file) over FUSE until stopped.
    Serve(ServeOpts),
    /// Remove what a crashed disk server left below DIR.
    Cleanup { dir: PathBuf },
    /// Create a disk: over an imported raw image, over a layer, or empty.
    Create(CreateOpts),
    /// Start a disk server and mount its ext4.
    Mount(MountOpts),
    /// Seal a mounted disk's overlay into a layer.
    Seal(Mounted),
    /// Unmount and stop a disk (or clean up what a half-made one left).
    Teardown(Mounted),
}

#[derive(Debug, Args)]
struct ServeOpts {
    #[arg(long, requires = "disk")]
    store: Option<PathBuf>,
    #[arg(long, requires = "store")]
    disk: Option<String>,
    /// Serve a plain file instead of a disk (baselines).
    #[arg(long, conflicts_with = "store")]
    file: Option<PathBuf>,
    /// Run directory: FUSE mountpoint, control socket, pid and log.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Written to once the file is served.
    #[arg(long)]
    ready_fd: Option<i32>,
    #[arg(long, default_value_t = crate::fuse::DEFAULT_OPEN_FLAGS)]
    open_flags: u32,
    /// Fork, start a new session and log to the run directory.
    #[arg(long)]
    detach: bool,
    /// Without O_DIRECT on the store's data files.
    #[arg(long)]
    buffered: bool,
    #[arg(long)]
    uring: bool,
    #[arg(long, default_value_t)]
    flush: FlushMode,
    /// Hold writes the host has no space for until it has (else fail them).
    #[arg(long)]
    hold_when_full: bool,
}

#[derive(Debug, Args)]
struct DiskOpts {
    #[arg(long)]
    store: PathBuf,
    #[arg(long)]
    disk: String,
}

#[derive(Debug, Args)]
struct CreateOpts {
    #[command(flatten)]
    disk: DiskOpts,
    /// A raw ext4 image to import as the base layer.
    #[arg(long, conflicts_with = "base")]
    image: Option<PathBuf>,
    /// A sealed layer to start from.
    #[arg(long)]
    base: Option<String>,
    /// Size in bytes (default: the base's).
    #[arg(long)]
    size: Option<u64>,
}

#[derive(Debug, Args)]
struct Mounted {
    #[command(flatten)]
    disk: DiskOpts,
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    mountpoint: PathBuf,
}

#[derive(Debug, Args)]
struct MountOpts {
    #[command(flatten)]
    mounted: Mounted,
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long)]
    buffered: bool,
    #[arg(long)]
    uring: bool,
    #[arg(long)]
    flush: Option<FlushMode>,
    #[arg(long)]
    open_flags: Option<u32>,
}

impl Mounted {
    fn spec(&self) -> DiskSpec {
        DiskSpec {
            store: self.disk.store.clone(),
            disk: self.disk.disk.clone(),
            run_dir: self.dir.clone(),
        }
    }
}

/// Runs the command with this process's arguments; returns the exit status.
pub fn main() -> i32 {
    match run(Cli::parse()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sandfork-disk: {e:#}");
            1
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Serve(o) => serve(o),
        Command::Cleanup { dir } => {
            println!("{:?}", crate::cleanup_stale(&dir)?);
            Ok(())
        }
        Command::Create(o) => create(&o),
        Command::Mount(o) => mount(&o),
        Command::Seal(o) => seal(&o),
        Command::Teardown(o) => teardown(&o),
    }
}

fn serve(o: ServeOpts) -> Result<()> {
    let args = ServeArgs {
        store: o.store.zip(o.disk),
        file: o.file,
        dir: o.dir,
        threads: o.threads,
        ready_fd: o.ready_fd,
        open_flags: o.open_flags,
        compact_depth: blockstore::MAX_DEPTH / 2,
        direct_io: !o.buffered,
        uring: o.uring,
        flush: o.flush,
        hold_when_full: o.hold_when_full,
    };
    if o.detach {
        std::fs::create_dir_all(&args.dir).context("create the run directory")?;
        server::daemonize(&crate::layout::log_file(&args.dir))?;
    }
    server::serve(&args)?;
    Ok(())
}

/// Creates a disk: over an imported raw image, over a layer, or empty.
fn create(o: &CreateOpts) -> Result<()> {
    let store = Store::open(&o.disk.store)?;
    let base: Option<LayerId> = match (&o.image, &o.base) {
        (Some(img), _) => Some(store.import_image(img)?),
        (None, Some(id)) => Some(id.parse()?),
        (None, None) => None,
    };
    let size = match (o.size, &base) {
        (Some(s), _) => s,
        (None, Some(b)) => store.layer_info(b)?.size,
        (None, None) => bail!("give --image, --base or --size"),
    };
    store.create_disk(&o.disk.disk, size, base.as_ref())?;
    println!(
        "{}",
        serde_json::json!({ "disk": o.disk.disk, "size": size, "base": base })
    );
    Ok(())
}

fn mount(o: &MountOpts) -> Result<()> {
    let mut opts = MountOptions::default();
    opts.threads = o.threads.unwrap_or(opts.threads);
    opts.direct_io = !o.buffered;
    opts.uring = o.uring;
    opts.flush = o.flush.unwrap_or(opts.flush);
    opts.open_flags = o.open_flags.unwrap_or(opts.open_flags);
    let m = MountedDisk::mount(&o.mounted.spec(), &o.mounted.mountpoint, opts)?;
    let out = serde_json::json!({
        "pid": m.pid(), "loop": m.loop_device(), "mountpoint": m.mountpoint(),
    });
    println!("{out}");
    Ok(())
}

fn seal(o: &Mounted) -> Result<()> {
    let m = MountedDisk::adopt(&o.spec(), &o.mountpoint)?;
    let (layer, t) = m.seal_timed()?;
    let out = serde_json::json!({
        "layer": layer, "freeze_ms": t.freeze_ms, "seal_ms": t.seal_ms, "thaw_ms": t.thaw_ms,
    });
    println!("{out}");
    Ok(())
}

/// Tears a mounted disk down; a half-made one (no loop device, or nothing mounted) is
/// cleaned up from what is found: the mountpoint, then everything below the run directory.
fn teardown(o: &Mounted) -> Result<()> {
    let spec = o.spec();
    let mountpoint: &Path = &o.mountpoint;
    match MountedDisk::adopt(&spec, mountpoint) {
        Ok(m) => m.teardown()?,
        Err(e) => {
            eprintln!("sandfork-disk: {e}; cleaning up what is left");
            crate::ext4::unmount(mountpoint)?;
            crate::cleanup_stale(&spec.run_dir)?;
        }
    }
    Ok(())
}
