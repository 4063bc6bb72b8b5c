//! The sandfork daemon: the lifecycle manager, its durable state and the `/v1` HTTP API.
//!
//! ```text
//! api (axum handlers, thin) ─► manager (state machine, admission, timeouts)
//!                                 ├─► store (SQLite: sandboxes, images, snapshots)
//!                                 └─► backend (trait) ─► container runtime + agent
//! ```
//! Every front end (HTTP, CLI through HTTP) reaches sandboxes through [`manager::Manager`];
//! the allowed lifecycle transitions are written down once, in [`model::lifecycle`].

pub mod api;
pub mod backend;
pub mod config;
pub mod daemon;
pub mod error;
pub mod logs;
pub mod manager;
pub mod metrics;
pub mod nodekey;
pub mod runc;
pub mod snapfile;
pub mod snapkey;
pub mod snapshots;
pub mod store;

pub use config::Config;
pub use daemon::Daemon;
pub use error::Error;
pub use manager::Manager;

/// Version of the HTTP API (the `/v1` prefix).
pub const API_VERSION: u32 = 1;

/// Version of this daemon.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
