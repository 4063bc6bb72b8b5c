//! sandfork's in-sandbox agent, run by the `sandfork-agent` binary as the sandbox's init:
//! it reaps zombies, forwards signals, and serves exec, process and file requests on a
//! Unix socket. The host's side of the protocol is the `agent_client` crate; both speak
//! the messages and framing of `proto`.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod server;
