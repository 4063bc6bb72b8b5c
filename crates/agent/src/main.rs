//! `sandfork-agent --socket PATH [--identity-dir DIR] [--max-transfer BYTES]`
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::ExitCode;

use agent::server::{run, Config};

const USAGE: &str =
    "usage: sandfork-agent --socket PATH [--identity-dir DIR] [--max-transfer BYTES]";

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Config, String> {
    let mut socket = None;
    let mut config = Config::new(PathBuf::new());
    while let Some(flag) = args.next() {
        if flag == "--version" {
            println!("sandfork-agent {}", env!("CARGO_PKG_VERSION"));
            std::process::exit(0);
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--socket" => socket = Some(PathBuf::from(value)),
            "--identity-dir" => config.identity_dir = PathBuf::from(value),
            "--max-transfer" => {
                config.max_transfer = value
                    .parse()
                    .map_err(|_| format!("bad --max-transfer {value:?}"))?;
            }
            _ => return Err(format!("unknown argument {flag:?}\n{USAGE}")),
        }
    }
    config.socket = socket.ok_or_else(|| USAGE.to_string())?;
    Ok(config)
}

fn main() -> ExitCode {
    let config = match parse_args(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
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
            let source = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            eprintln!("sandfork-agent: {e}{source}");
            ExitCode::FAILURE
        }
    }
}
