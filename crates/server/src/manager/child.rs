//! What one sandbox started from a snapshot is asked to be: its index in its fork, its
//! name, environment, secrets, labels, timeout, resource overrides and network. Forks,
//! creates from a snapshot and the pool of ready forks all speak of children in it.

use std::collections::BTreeMap;

use crate::backend::NetworkSpec;

/// One child to start from a snapshot.
#[derive(Debug, Clone, Default)]
pub(super) struct Child {
    pub index: u32,
    pub name: Option<String>,
    pub env: BTreeMap<String, String>,
    /// Given at restore, never kept in a snapshot.
    pub secrets: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub timeout_secs: u64,
    pub on_timeout: Option<api_types::OnTimeout>,
    /// Resource overrides (filesystem snapshots only).
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub disk_mb: Option<u64>,
    pub network: Option<NetworkSpec>,
    /// The fork call it is part of.
    pub fork_id: Option<String>,
}
