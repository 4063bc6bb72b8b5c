//! `sandfork mcp`: a Model Context Protocol server for sandfork, over stdio or streamable
//! HTTP. It is a client of the daemon's `/v1` API like the other client verbs (the Unix
//! socket by default, or `--url`/`--token`), never a second copy of what the daemon does.
//!
//! - `tools.rs`: create, run a command, read/write/list files, checkpoint, fork,
//!   suspend/resume, terminate, port URL;
//! - `resources.rs`: a sandbox's files and log by URI;
//! - `transport.rs`: stdio, and streamable HTTP behind the daemon's bearer token;
//! - `daemon.rs`: the API client with typed errors (`error.rs`); `limits.rs`: output bounds.
//!
//! See docs/mcp.md.

mod daemon;
mod error;
mod files;
mod limits;
mod resources;
mod server;
mod tools;
mod transport;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use daemon::Daemon;
pub use error::Error;
pub use server::Sandfork;
pub use transport::ENDPOINT;

/// `sandfork mcp`'s own flags (the daemon's address and token are the client flags).
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio. Every request must carry
    /// the daemon's token (Authorization: Bearer ...).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// With --http: the file holding the token HTTP clients must present (default: the
    /// token the daemon is reached with, --token or SANDFORK_TOKEN, else the api.token
    /// beside the daemon's socket).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// With --http: also accept requests whose Host is HOST (or HOST:PORT); loopback
    /// names and a non-loopback listen address are accepted already (DNS rebinding guard).
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// With --http: listen on a non-loopback address over plain HTTP anyway (the token
    /// then crosses the network in the clear: put TLS in front).
    #[arg(long)]
    pub allow_remote: bool,
}

/// Runs the server until its client leaves (stdio) or it is stopped (HTTP).
pub async fn run(url: Option<String>, token: Option<String>, args: McpArgs) -> Result<i32, Error> {
    let token = token.filter(|t| !t.trim().is_empty());
    let daemon = Daemon::connect(url.as_deref(), token.clone())?;
    match args.http {
        None => transport::serve_stdio(daemon).await?,
        Some(addr) => {
            if !addr.ip().is_loopback() && !args.allow_remote {
                return Err(Error::Serve(format!(
                    "--http {addr} is not a loopback address: its clients would send the \
                     daemon's token in the clear; give --allow-remote to serve it anyway \
                     (behind TLS)"
                )));
            }
            let http_token = http_token(args.token_file.as_deref(), token, url.as_deref())?;
            transport::serve_http(addr, http_token, args.allowed_hosts, daemon).await?;
        }
    }
    Ok(0)
}

/// The token HTTP clients must present.
fn http_token(
    file: Option<&Path>,
    token: Option<String>,
    url: Option<&str>,
) -> Result<String, Error> {
    if let Some(f) = file {
        return read_token(f);
    }
    if let Some(t) = token {
        return Ok(t.trim().to_string());
    }
    let socket = match url {
        None | Some("") => Some(PathBuf::from(cli::client::DEFAULT_SOCKET)),
        Some(u) if u.starts_with("unix://") => Some(PathBuf::from(&u["unix://".len()..])),
        Some(u) if u.starts_with('/') => Some(PathBuf::from(u)),
        Some(_) => None,
    };
    if let Some(beside) = socket.and_then(|s| s.parent().map(|d| d.join("api.token"))) {
        if beside.is_file() {
            return read_token(&beside);
        }
    }
    Err(Error::Serve(
        "--http needs the daemon's token for its clients to present: give --token-file FILE \
         (e.g. the daemon's <data-dir>/api.token), or --token / SANDFORK_TOKEN"
            .into(),
    ))
}

fn read_token(path: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::Serve(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    let token = text.trim().to_string();
    if token.is_empty() {
        return Err(Error::Serve(format!(
            "the token file {} is empty",
            path.display()
        )));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_remote_http_address_needs_allow_remote() {
        let args = McpArgs {
            http: "0.0.0.0:0".parse().ok(),
            token_file: None,
            allowed_hosts: Vec::new(),
            allow_remote: false,
        };
        let e = run(None, Some("t".into()), args)
            .await
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("--allow-remote")));
    }

    #[test]
    fn the_http_token_comes_from_the_file_then_the_flag() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("t");
        std::fs::write(&f, "abc\n").expect("write");
        assert_eq!(
            http_token(Some(&f), Some("x".into()), None).ok().as_deref(),
            Some("abc")
        );
        assert_eq!(
            http_token(None, Some("x".into()), None).ok().as_deref(),
            Some("x")
        );
        std::fs::write(&f, "  \n").expect("write");
        assert!(http_token(Some(&f), None, None).is_err());
        let sock = dir.path().join("s.sock");
        let url = format!("unix://{}", sock.display());
        assert!(http_token(None, None, Some(&url)).is_err());
        std::fs::write(dir.path().join("api.token"), "beside").expect("write");
        assert_eq!(
            http_token(None, None, Some(&url)).ok().as_deref(),
            Some("beside")
        );
    }
}
