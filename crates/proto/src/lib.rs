//! Wire types shared by the sandfork daemon, CLI and in-sandbox agent.
//!
//! [`agent`] is the host↔agent protocol. The types here are plain data (serde), with no
//! runtime attached, so every side can share them.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod agent;
