//! A fork of N spread over the cluster: Ray places each child (preferring the nodes that
//! hold the snapshot), each node then forks its share in one request (its children's
//! indices a contiguous range), and a node that fails mid-way has its share started again
//! on the others.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use crate::node::NodeError;
use crate::routes::no_nodes;
use crate::{error, json_response, node_error, Gateway};

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
        let (_, body) = match crate::routes::json_body(req).await {
            Ok(x) => x,
            Err(r) => return r,
        };
        let count = body["count"].as_u64().unwrap_or(0);
        if count == 0 || count > 256 {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                format!("count must be 1-256, got {count}"),
            );
        }
        let holders = self.holders(id).await;
        // The snapshot must be in the object store before other nodes can start from it.
        let mut snapshot = Value::Null;
        for h in holders.iter().filter_map(|h| self.node(h)) {
            match self
                .links
                .call(
                    &h.api,
                    Method::POST,
                    &format!("/v1/snapshots/{id}/publish"),
                    &self.node_token,
                    None,
                )
                .await
            {
                Ok(v) => {
                    snapshot = v;
                    break;
                }
                Err(e) => tracing::warn!(node = %h.name, error = %e, "publishing before a fork"),
            }
        }
        if snapshot.is_null() {
            snapshot = match self.any_snapshot(id).await {
                Ok(v) => v,
                Err(r) => return r,
            };
        }
        let memory = snapshot["memory_mb"].as_u64().unwrap_or(512);
        let base = body["first_index"].as_u64().unwrap_or(0) as u32;
        let indices: Vec<u32> = (0..count as u32).map(|i| base + i).collect();
        let children = self
            .start_children(id, &body, &holders, memory, indices)
            .await;
        json_response(
            StatusCode::OK,
            &json!({ "snapshot_id": id, "children": children }),
        )
    }

    /// A snapshot's view from any node (which reads the object store for it).
    async fn any_snapshot(&self, id: &str) -> Result<Value, Response> {
        let Some(n) = self.alive().into_iter().next() else {
            return Err(no_nodes());
        };
        self.links
            .call(
                &n.api,
                Method::GET,
                &format!("/v1/snapshots/{id}"),
                &self.node_token,
                None,
            )
            .await
            .map_err(node_error)
    }

    /// Places and starts the children `indices`, retrying once elsewhere the shares of
    /// nodes that failed as a whole. Returns the children, by index.
    async fn start_children(
        &self,
        id: &str,
        body: &Value,
        holders: &[String],
        memory: u64,
        indices: Vec<u32>,
    ) -> Vec<Value> {
        let mut done: BTreeMap<u32, Value> = BTreeMap::new();
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
                let r = self.fork_share(id, body, &s).await;
                (s, r)
            });
            todo = Vec::new();
            for (share, result) in futures::future::join_all(runs).await {
                match result {
                    Ok(children) => {
                        for c in children {
                            let i = c["index"].as_u64().unwrap_or(0) as u32;
                            done.insert(i, c);
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
    async fn fork_share(&self, id: &str, body: &Value, s: &Share) -> Result<Vec<Value>, NodeError> {
        let first = s.indices[0];
        let base = body["first_index"].as_u64().unwrap_or(0) as u32;
        let mut b = body.clone();
        b["count"] = json!(s.indices.len());
        b["first_index"] = json!(first);
        if let Some(per) = body["per_child"].as_array() {
            let from = (first - base) as usize;
            let slice: Vec<Value> = per
                .iter()
                .skip(from)
                .take(s.indices.len())
                .cloned()
                .collect();
            b["per_child"] = json!(slice);
        }
        let result = self
            .links
            .call(
                &s.node.api,
                Method::POST,
                &format!("/v1/snapshots/{id}/fork"),
                &self.node_token,
                Some(&b),
            )
            .await?;
        let children = result["children"].as_array().cloned().unwrap_or_default();
        let mut free = Vec::new();
        for (c, pg) in children.iter().zip(&s.pgs) {
            match c.get("sandbox") {
                Some(view) if !view.is_null() => self.record(view, &s.node, Some(pg.clone())).await,
                _ => free.push(pg.clone()),
            }
        }
        if !free.is_empty() {
            let _ = self.ray.release(&free).await;
        }
        Ok(children)
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
        let (parts, body) = match crate::routes::json_body(req).await {
            Ok(x) => x,
            Err(r) => return r,
        };
        let path = format!("/v1/sandboxes/{id}/checkpoint");
        let snap = match self
            .links
            .call(
                &p.api,
                Method::POST,
                &path,
                &self.node_token,
                Some(&json!({"type": "memory"})),
            )
            .await
        {
            Ok(v) => v,
            Err(e) => return node_error(e),
        };
        let Some(snap_id) = snap["id"].as_str() else {
            return error(
                StatusCode::BAD_GATEWAY,
                "node_protocol",
                "the checkpoint answer names no snapshot",
            );
        };
        let _ = self
            .ray
            .put(&crate::directory::holder(snap_id, &p.node), "1")
            .await;
        let mut r = Request::new(axum::body::Body::from(body.to_string()));
        *r.headers_mut() = parts.headers;
        self.fork_snapshot(snap_id, r).await
    }
}

fn child_error(index: u32, code: &str, message: &str) -> Value {
    json!({"index": index, "error": {"code": code, "message": message}})
}
