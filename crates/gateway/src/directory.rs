//! The cluster's directory, in Ray's key-value store (no metadata service of our own):
//! which node runs which sandbox (with its placement group and its last known view), names
//! to ids, and which nodes hold a copy of which snapshot (for fork locality).
//!
//! ```text
//! sb/<sandbox id>              {"node", "api", "node_name", "pg", "view"}
//! name/<name>                  <sandbox id>
//! snap/<snapshot id>/<node>    "1": the node has the snapshot (took it, or pulled it)
//! ```

use serde::{Deserialize, Serialize};

/// Where a sandbox runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placed {
    /// Ray's id of its node.
    pub node: String,
    /// Its node's API.
    pub api: String,
    pub node_name: String,
    /// Its placement group, which holds its slot.
    pub pg: Option<String>,
    /// The sandbox as last seen (what a lost sandbox is reported as).
    pub view: api_types::Sandbox,
}

pub fn sandbox(id: &str) -> String {
    format!("sb/{id}")
}

pub fn name(name: &str) -> String {
    format!("name/{name}")
}

pub fn holder(snapshot: &str, node: &str) -> String {
    format!("snap/{snapshot}/{node}")
}

pub fn holders(snapshot: &str) -> String {
    format!("snap/{snapshot}/")
}

pub const SANDBOXES: &str = "sb/";
