//! `sandfork-disk`: the per-disk server process, and a stale-state cleaner.
//!
//! ```text
//! sandfork-disk serve --store DIR --disk NAME --dir RUNDIR [--threads N] [--detach] [--ready-fd FD]
//! sandfork-disk serve --file PATH --dir RUNDIR ...     serve a plain file (baselines)
//! sandfork-disk cleanup DIR                            after a crash
//! ```

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use disk::server::{self, ServeArgs};

fn main() {
    if let Err(e) = run() {
        eprintln!("sandfork-disk: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("cleanup") => {
            let dir = args.get(1).context("cleanup needs a directory")?;
            let report = disk::cleanup_stale(&PathBuf::from(dir))?;
            println!("{report:?}");
            Ok(())
        }
        _ => bail!("usage: sandfork-disk serve ... | cleanup DIR"),
    }
}

fn serve(args: &[String]) -> Result<()> {
    let (serve_args, detach) = parse_serve(args)?;
    if detach {
        std::fs::create_dir_all(&serve_args.dir).context("create the run directory")?;
        server::daemonize(&disk::layout::log_file(&serve_args.dir))?;
    }
    server::serve(&serve_args)?;
    Ok(())
}

fn parse_serve(args: &[String]) -> Result<(ServeArgs, bool)> {
    let mut a = ServeArgs {
        store: None,
        file: None,
        dir: PathBuf::new(),
        threads: 6,
        ready_fd: None,
        open_flags: 0,
        compact_depth: blockstore::MAX_DEPTH / 2,
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
            other => bail!("unknown option {other}"),
        }
    }
    if a.dir.as_os_str().is_empty() {
        bail!("serve needs --dir");
    }
    a.store = store.zip(name);
    Ok((a, detach))
}
