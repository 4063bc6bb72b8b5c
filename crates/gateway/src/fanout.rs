//! A fork of N spread over the cluster: Ray places each child (preferring the nodes that
//! hold the snapshot), each node then forks its share in one request (its children's
//! indices a contiguous range), and a node that fails mid-way has its share started again
//! on the others.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use api_types::{
    CheckpointRequest, ChildError, ForkChild, ForkRequest, ForkResult, Snapshot, SnapshotType,
};
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::node::NodeError;
use crate::routes::{body_bytes, no_nodes};
use crate::wire::client_body;
use crate::{error, json_response, node_error, Gateway};

/// Most children one fork may ask for.
const MAX_CHILDREN: u32 = 256;

/// One node's share of a fork.
struct Share {
    node: ray::NodeInfo,
    /// Global child indices, contiguous.
    indices: Vec<u32>,
    pgs: Vec<String>,
}

impl Gateway {
    /// `POST /v1/snapshots/{id}/fork`.
    pub(crate) async fn fork_snapshot(&self, id: &str, req: Request) -> Response {
        match fork_request(req).await {
            Ok(fork) => self.fork_from(id, fork).await,
            Err(r) => r,
        }
    }

    /// A fork of snapshot `id` over the cluster.
    async fn fork_from(&self, id: &str, fork: ForkRequest) -> Response {
        let count = fork.count;
        if count == 0 || count > MAX_CHILDREN {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                format!("count must be 1-{MAX_CHILDREN}, got {count}"),
            );
        }
        let base = fork.first_index.unwrap_or(0);
        if base.checked_add(count).is_none() {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                format!("first_index {base} leaves no room for {count} children"),
            );
        }
        let holders = self.holders(id).await;
        // The snapshot must be in the object store before other nodes can start from it.
        let mut snapshot = None;
        for h in holders.iter().filter_map(|h| self.node(h)) {
            let path = format!("/v1/snapshots/{id}/publish");
            match self
                .links
                .call::<Snapshot>(&h.api, Method::POST, &path, &self.node_token)
                .await
            {
                Ok(s) => {
                    snapshot = Some(s);
                    break;
                }
                Err(e) => tracing::warn!(node = %h.name, error = %e, "publishing before a fork"),
            }
        }
        let snapshot = match snapshot {
            Some(s) => s,
            None => match self.any_snapshot(id).await {
                Ok(s) => s,
                Err(r) => return r,
            },
        };
        let indices: Vec<u32> = (base..base + count).collect();
        let children = self
            .start_children(id, &fork, &holders, snapshot.memory_mb, indices)
            .await;
        let result = ForkResult {
            snapshot_id: id.to_string(),
            children,
        };
        json_response(StatusCode::OK, &result)
    }

    /// A snapshot's view from any node (which reads the object store for it).
    async fn any_snapshot(&self, id: &str) -> Result<Snapshot, Response> {
        let Some(n) = self.alive().into_iter().next() else {
            return Err(no_nodes());
        };
        let path = format!("/v1/snapshots/{id}");
        self.links
            .call(&n.api, Method::GET, &path, &self.node_token)
            .await
            .map_err(node_error)
    }

    /// Places and starts the children `indices`, retrying once elsewhere the shares of
    /// nodes that failed as a whole. Returns the children, by index.
    async fn start_children(
        &self,
        id: &str,
        fork: &ForkRequest,
        holders: &[String],
        memory: u64,
        indices: Vec<u32>,
    ) -> Vec<ForkChild> {
        let mut done: BTreeMap<u32, ForkChild> = BTreeMap::new();
        let mut todo = indices;
        let mut avoid: Vec<String> = Vec::new();
        for attempt in 0..2 {
            if todo.is_empty() {
                break;
            }
            let prefer: Vec<String> = match attempt {
                0 => holders.to_vec(),
                _ => self
                    .alive()
                    .into_iter()
                    .map(|n| n.id)
                    .filter(|n| !avoid.contains(n))
                    .collect(),
            };
            let (shares, unplaced) = match self.shares(&todo, &prefer, memory).await {
                Ok(x) => x,
                Err(message) => {
                    for i in &todo {
                        done.insert(*i, child_error(*i, "over_capacity", &message));
                    }
                    break;
                }
            };
            for (i, why) in unplaced {
                done.insert(i, child_error(i, "over_capacity", &why));
            }
            let runs = shares.into_iter().map(|s| async move {
                let r = self.fork_share(id, fork, &s).await;
                (s, r)
            });
            todo = Vec::new();
            for (share, result) in futures::future::join_all(runs).await {
                match result {
                    Ok(children) => {
                        for c in children {
                            done.insert(c.index, c);
                        }
                    }
                    Err(e) if e.is_unreachable() && attempt == 0 => {
                        tracing::warn!(node = %share.node.name, error = %e, "a node failed mid-fork; its children start elsewhere");
                        self.counters
                            .retried_children
                            .fetch_add(share.indices.len() as u64, Ordering::Relaxed);
                        let _ = self.ray.release(&share.pgs).await;
                        avoid.push(share.node.id.clone());
                        todo.extend(share.indices);
                    }
                    Err(e) => {
                        let _ = self.ray.release(&share.pgs).await;
                        for i in share.indices {
                            done.insert(i, child_error(i, "node", &e.to_string()));
                        }
                    }
                }
            }
        }
        done.into_values().collect()
    }

    /// Ray's placement of `indices`, grouped by node (each group's indices contiguous), and
    /// the indices it found no room for.
    async fn shares(
        &self,
        indices: &[u32],
        prefer: &[String],
        memory: u64,
    ) -> Result<(Vec<Share>, Vec<(u32, String)>), String> {
        let placed = self
            .ray
            .place(
                indices.len() as u32,
                prefer,
                &self.trusted_ids(),
                memory,
                self.config.place_timeout,
            )
            .await
            .map_err(|e| e.to_string())?;
        let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut unplaced = Vec::new();
        let mut failed = 0;
        for p in placed {
            match (p.node, p.pg) {
                (Some(n), Some(pg)) => by_node.entry(n).or_default().push(pg),
                _ => {
                    failed += 1;
                    unplaced.push(p.error.unwrap_or_else(|| "no room".into()));
                }
            }
        }
        self.counters
            .placed
            .fetch_add((indices.len() - failed) as u64, Ordering::Relaxed);
        self.counters
            .placement_failures
            .fetch_add(failed as u64, Ordering::Relaxed);
        let mut next = indices.iter().copied();
        let mut shares = Vec::new();
        let mut left_out: Vec<(u32, String)> = Vec::new();
        for (node_id, pgs) in by_node {
            let indices: Vec<u32> = next.by_ref().take(pgs.len()).collect();
            match self.node(&node_id) {
                Some(node) => shares.push(Share { node, indices, pgs }),
                None => {
                    let _ = self.ray.release(&pgs).await;
                    left_out.extend(
                        indices
                            .into_iter()
                            .map(|i| (i, "placed on a node that is gone".to_string())),
                    );
                }
            }
        }
        left_out.extend(next.zip(unplaced));
        Ok((shares, left_out))
    }

    /// One node's share: a fork of its children on that node; records those that start,
    /// frees the slots of those that do not.
    async fn fork_share(
        &self,
        id: &str,
        fork: &ForkRequest,
        s: &Share,
    ) -> Result<Vec<ForkChild>, NodeError> {
        let first = s.indices[0];
        let from = (first - fork.first_index.unwrap_or(0)) as usize;
        let share = ForkRequest {
            count: s.indices.len() as u32,
            first_index: Some(first),
            per_child: fork
                .per_child
                .iter()
                .skip(from)
                .take(s.indices.len())
                .cloned()
                .collect(),
            ..fork.clone()
        };
        let path = format!("/v1/snapshots/{id}/fork");
        let result: ForkResult = self
            .links
            .call_with(&s.node.api, Method::POST, &path, &self.node_token, &share)
            .await?;
        let mut free = Vec::new();
        for (c, pg) in result.children.iter().zip(&s.pgs) {
            match &c.sandbox {
                Some(view) => self.record(view, &s.node, Some(pg.clone())).await,
                None => free.push(pg.clone()),
            }
        }
        if !free.is_empty() {
            let _ = self.ray.release(&free).await;
        }
        Ok(result.children)
    }

    /// `POST /v1/sandboxes/{id}/fork`: a memory checkpoint on the sandbox's node, then a
    /// fork of it over the cluster.
    pub(crate) async fn fork_sandbox(&self, id: &str, req: Request) -> Response {
        let Some((_, p)) = self.placed(id).await else {
            return error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("Sandbox {id} not found"),
            );
        };
        let fork = match fork_request(req).await {
            Ok(f) => f,
            Err(r) => return r,
        };
        let checkpoint = CheckpointRequest {
            kind: Some(SnapshotType::Memory),
            ..CheckpointRequest::default()
        };
        let path = format!("/v1/sandboxes/{id}/checkpoint");
        let snap: Snapshot = match self
            .links
            .call_with(&p.api, Method::POST, &path, &self.node_token, &checkpoint)
            .await
        {
            Ok(s) => s,
            Err(e) => return node_error(e),
        };
        let _ = self
            .ray
            .put(&crate::directory::holder(&snap.id, &p.node), "1")
            .await;
        self.fork_from(&snap.id, fork).await
    }
}

/// A client's fork body.
async fn fork_request(req: Request) -> Result<ForkRequest, Response> {
    let (_, bytes) = body_bytes(req).await?;
    client_body(&bytes).map_err(IntoResponse::into_response)
}

fn child_error(index: u32, code: &str, message: &str) -> ForkChild {
    ForkChild {
        index,
        sandbox: None,
        error: Some(ChildError {
            code: code.into(),
            message: message.into(),
        }),
    }
}
