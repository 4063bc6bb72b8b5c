//! What a snapshot captured.

use serde::{Deserialize, Serialize};

/// What a snapshot captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SnapshotType {
    /// The disk only: sandboxes start from it by a cold boot.
    Filesystem,
    /// Disk, memory and processes: sandboxes resume warm.
    Memory,
}

impl SnapshotType {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotType::Filesystem => "filesystem",
            SnapshotType::Memory => "memory",
        }
    }
}
