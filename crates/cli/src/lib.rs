//! The `sandfork` command line. `sandfork serve` runs the daemon; every other verb is a
//! thin client of its `/v1` API (over the Unix socket, or TCP with a token).

pub mod args;
pub mod client;
mod commands;
mod output;

use clap::Parser;

pub use args::Args;
pub use client::Client;

/// A client whose output is cut short (`sandfork ls | head -1`) ends quietly, as other
/// Unix tools do, instead of panicking on a write to a closed pipe. Not for the daemon,
/// whose writes to closed sockets must stay errors.
fn quiet_on_closed_stdout() {
    // SAFETY: called first thing in main, before any thread exists; restoring the
    // default disposition of SIGPIPE has no other effect on the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Runs the command line and returns the process exit code. Started as `sandfork-disk`
/// (by the daemon, for a disk server), the binary is the disk-server command instead: one
/// binary carries the whole host side.
pub fn main() -> i32 {
    let exe = std::env::args_os().next().map(std::path::PathBuf::from);
    if exe.as_deref().and_then(|p| p.file_name()) == Some("sandfork-disk".as_ref()) {
        return disk::cli::main();
    }
    // This very binary (even once an upgrade replaced its file): disk servers are always
    // the daemon's own build.
    disk::use_server_binary("/proc/self/exe".into());
    let args = Args::parse();
    if !matches!(args.command, args::Command::Serve(_)) {
        quiet_on_closed_stdout();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match rt.block_on(commands::run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            1
        }
    }
}

/// The error chain on one line.
fn one_line(e: &anyhow::Error) -> String {
    let parts: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    parts.join(": ").replace('\n', " ")
}
