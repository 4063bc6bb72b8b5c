//! The `sandfork` command line. `sandfork serve` runs the daemon; every other verb is a
//! thin client of its `/v1` API (over the Unix socket, or TCP with a token).

pub mod args;
pub mod client;
mod commands;
mod output;

use clap::Parser;

pub use args::Args;
pub use client::Client;

/// Runs the command line and returns the process exit code.
pub fn main() -> i32 {
    let args = Args::parse();
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
