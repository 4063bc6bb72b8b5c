//! HTTP as both of sandfork's servers speak it, the daemon (`crates/server`) and the
//! cluster gateway (`crates/gateway`):
//!
//! - [`listen`]: the accept loop with bounds a network client cannot get around (connection
//!   limit and reserve, header and idle timeouts) and TLS, with the cluster's client
//!   certificate check;
//! - [`token`]: the bearer token and where a request may carry it;
//! - [`proxy`]: what a request passed on to a node or a sandbox's port loses on the way
//!   (hop-by-hop headers, the daemon's credentials), the port a `Host` names, and the one
//!   refusal of a port request that opens nothing.
//!
//! It knows nothing of sandboxes beyond those names on the wire.

pub mod listen;
pub mod proxy;
pub mod token;
