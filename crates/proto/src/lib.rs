//! Wire types shared by the sandfork daemon, CLI and in-sandbox agent.
//!
//! [`agent`] is the host↔agent protocol: plain data (serde) that every side shares.
//! [`codec`] frames it over any async byte stream, for both ends.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod agent;
pub mod codec;
