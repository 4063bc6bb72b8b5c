//! `sandfork-agent --socket PATH [--identity-dir DIR] [--max-transfer BYTES] [--user U]
//! [--workdir DIR]`
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::ExitCode;

use agent::server::{run, Config};
use clap::Parser;

/// The sandbox's init: serves the host's exec, process and file requests on a Unix socket.
#[derive(Debug, Parser)]
#[command(name = "sandfork-agent", version)]
struct Args {
    /// The socket to listen on.
    #[arg(long)]
    socket: PathBuf,
    /// Where the sandbox's fork identity is written for its processes.
    #[arg(long)]
    identity_dir: Option<PathBuf>,
    /// Largest file transfer, in bytes.
    #[arg(long)]
    max_transfer: Option<u64>,
    /// User (`name`, `uid` or `uid:gid`) of processes whose request names none.
    #[arg(long)]
    user: Option<String>,
    /// Working directory of processes whose request names none.
    #[arg(long)]
    workdir: Option<String>,
}

impl Args {
    fn config(self) -> Config {
        let mut config = Config::new(self.socket);
        if let Some(dir) = self.identity_dir {
            config.identity_dir = dir;
        }
        if let Some(max) = self.max_transfer {
            config.max_transfer = max;
        }
        config.default_user = self.user;
        config.default_cwd = self.workdir;
        config
    }
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(agent::server::pty::KEEPER_ARG) {
        // A terminal relay (see agent::server::pty), started by the agent.
        return ExitCode::from(agent::server::pty::keep().clamp(0, 255) as u8);
    }
    let config = Args::parse().config();
    let level = std::env::var("SANDFORK_AGENT_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(level.parse().unwrap_or(tracing::Level::INFO))
        .init();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandfork-agent: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandfork-agent: {}", model::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
