//! The domain model every other crate speaks: a sandbox's states and the one table of
//! legal transitions between them, what a snapshot captures, ids and timestamps, and how
//! an error is told.
//!
//! No I/O and no other crate of the workspace: the daemon, the runtime, the API types and
//! the command line all build on it.

pub mod ids;
pub mod labels;
pub mod lifecycle;
pub mod report;
pub mod snapshot;
pub mod timestamp;

pub use ids::IdError;
pub use labels::LabelError;
pub use lifecycle::{interrupted, plan, Op, Plan, State, ALL_STATES};
pub use report::error_chain;
pub use snapshot::SnapshotType;
