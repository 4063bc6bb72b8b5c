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

use std::collections::HashMap;

use crate::server::{self, ServeArgs};
use crate::{DiskSpec, MountOptions, MountedDisk};
use anyhow::{bail, Context, Result};
use blockstore::{LayerId, Store};

/// Runs the command with this process's arguments; returns the exit status.
pub fn main() -> i32 {
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sandfork-disk: {e:#}");
            1
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("cleanup") => {
            let dir = args.get(1).context("cleanup needs a directory")?;
            let report = crate::cleanup_stale(&PathBuf::from(dir))?;
            println!("{report:?}");
            Ok(())
        }
        Some(cmd @ ("create" | "mount" | "seal" | "teardown")) => {
            let opts = Opts::parse(&args[1..])?;
            match cmd {
                "create" => create(&opts),
                "mount" => mount(&opts),
                "seal" => seal(&opts),
                _ => teardown(&opts),
            }
        }
        _ => bail!("usage: sandfork-disk serve|create|mount|seal|teardown|cleanup ..."),
    }
}

fn serve(args: &[String]) -> Result<()> {
    let (serve_args, detach) = parse_serve(args)?;
    if detach {
        std::fs::create_dir_all(&serve_args.dir).context("create the run directory")?;
        server::daemonize(&crate::layout::log_file(&serve_args.dir))?;
    }
    server::serve(&serve_args)?;
    Ok(())
}

fn parse_serve(args: &[String]) -> Result<(ServeArgs, bool)> {
    let mut a = ServeArgs {
        store: None,
        file: None,
        dir: PathBuf::new(),
        threads: 8,
        ready_fd: None,
        open_flags: crate::fuse::DEFAULT_OPEN_FLAGS,
        compact_depth: blockstore::MAX_DEPTH / 2,
        direct_io: true,
        uring: false,
        flush: Default::default(),
    };
    let (mut store, mut name, mut detach) = (None, None, false);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => store = Some(PathBuf::from(value()?)),
            "--disk" => name = Some(value()?.clone()),
            "--file" => a.file = Some(PathBuf::from(value()?)),
            "--dir" => a.dir = PathBuf::from(value()?),
            "--threads" => a.threads = value()?.parse().context("--threads")?,
            "--ready-fd" => a.ready_fd = Some(value()?.parse().context("--ready-fd")?),
            "--open-flags" => a.open_flags = value()?.parse().context("--open-flags")?,
            "--detach" => detach = true,
            "--buffered" => a.direct_io = false,
            "--uring" => a.uring = true,
            "--flush" => a.flush = value()?.parse().map_err(anyhow::Error::msg)?,
            other => bail!("unknown option {other}"),
        }
    }
    if a.dir.as_os_str().is_empty() {
        bail!("serve needs --dir");
    }
    a.store = store.zip(name);
    Ok((a, detach))
}

/// `--flag value` pairs of the management subcommands.
struct Opts(HashMap<String, String>);

impl Opts {
    fn parse(args: &[String]) -> Result<Opts> {
        let mut map = HashMap::new();
        for pair in args.chunks(2) {
            let flag = pair[0]
                .strip_prefix("--")
                .context("expected --flag value")?;
            let value = pair
                .get(1)
                .with_context(|| format!("--{flag} needs a value"))?;
            map.insert(flag.to_owned(), value.clone());
        }
        Ok(Opts(map))
    }

    fn get(&self, flag: &str) -> Result<&str> {
        self.0
            .get(flag)
            .map(String::as_str)
            .with_context(|| format!("--{flag} is required"))
    }

    fn spec(&self) -> Result<DiskSpec> {
        Ok(DiskSpec {
            store: self.get("store")?.into(),
            disk: self.get("disk")?.into(),
            run_dir: self.get("dir")?.into(),
        })
    }
}

/// Creates a disk: over an imported raw image, over a layer, or empty.
fn create(o: &Opts) -> Result<()> {
    let store = Store::open(o.get("store")?.as_ref())?;
    let base: Option<LayerId> = match (o.0.get("image"), o.0.get("base")) {
        (Some(img), _) => Some(store.import_image(img.as_ref())?),
        (None, Some(id)) => Some(id.parse()?),
        (None, None) => None,
    };
    let size = match (o.0.get("size"), &base) {
        (Some(s), _) => s.parse().context("--size")?,
        (None, Some(b)) => store.layer_info(b)?.size,
        (None, None) => bail!("give --image, --base or --size"),
    };
    store.create_disk(o.get("disk")?, size, base.as_ref())?;
    println!(
        "{}",
        serde_json::json!({ "disk": o.get("disk")?, "size": size, "base": base })
    );
    Ok(())
}

fn mount(o: &Opts) -> Result<()> {
    let mut opts = MountOptions::default();
    if let Some(t) = o.0.get("threads") {
        opts.threads = t.parse().context("--threads")?;
    }
    if o.0.get("buffered").is_some_and(|b| b == "1") {
        opts.direct_io = false;
    }
    opts.uring = o.0.get("uring").is_some_and(|b| b == "1");
    if let Some(f) = o.0.get("flush") {
        opts.flush = f.parse().map_err(anyhow::Error::msg)?;
    }
    if let Some(f) = o.0.get("open-flags") {
        opts.open_flags = f.parse().context("--open-flags")?;
    }
    let mnt = std::path::Path::new(o.get("mountpoint")?);
    let m = MountedDisk::mount(&o.spec()?, mnt, opts)?;
    let out = serde_json::json!({
        "pid": m.pid(), "loop": m.loop_device(), "mountpoint": m.mountpoint(),
    });
    println!("{out}");
    Ok(())
}

fn seal(o: &Opts) -> Result<()> {
    let m = MountedDisk::adopt(&o.spec()?, o.get("mountpoint")?.as_ref())?;
    let (layer, t) = m.seal_timed()?;
    let out = serde_json::json!({
        "layer": layer, "freeze_ms": t.freeze_ms, "seal_ms": t.seal_ms, "thaw_ms": t.thaw_ms,
    });
    println!("{out}");
    Ok(())
}

/// Tears a mounted disk down; a half-made one (no loop device, or nothing mounted) is
/// cleaned up from what is found: the mountpoint, then everything below the run directory.
fn teardown(o: &Opts) -> Result<()> {
    let spec = o.spec()?;
    let mountpoint: &Path = o.get("mountpoint")?.as_ref();
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
