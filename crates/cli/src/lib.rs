//! The `sandfork` command line: every verb is a thin client of the daemon's `/v1` API
//! (over the Unix socket, or TCP with a token), speaking the API's own types
//! (`api_types`). It knows nothing else of the daemon; the binary (crate `sandfork`) adds
//! `serve`.

pub mod args;
pub mod client;
mod commands;
mod context;
mod output;

pub use args::{ClientArgs, Command};
pub use client::Client;
pub use commands::run;

/// A client whose output is cut short (`sandfork ls | head -1`) ends quietly, as other
/// Unix tools do, instead of panicking on a write to a closed pipe. Not for the daemon,
/// whose writes to closed sockets must stay errors. Call it first thing in `main`.
pub fn quiet_on_closed_stdout() {
    // SAFETY: called first thing in main, before any thread exists; restoring the
    // default disposition of SIGPIPE has no other effect on the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The error chain on one line (anyhow's alternate form joins the causes with `: `).
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}
