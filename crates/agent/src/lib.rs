//! sandfork's in-sandbox agent and its host-side client.
//!
//! - [`server`]: the agent itself (run by the `sandfork-agent` binary as the sandbox's
//!   init): reaps zombies, forwards signals, and serves exec, process and file requests on
//!   a Unix socket.
//! - [`client`]: [`AgentClient`], what the host uses to talk to an agent. It treats the
//!   agent as hostile: bounded reads, and never follows a symlink planted in the socket
//!   directory.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod client;
pub mod codec;
pub mod server;

pub use client::{AgentClient, ClientError};
pub use proto::agent as proto;
