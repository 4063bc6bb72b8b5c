//! The gateway's API: the same routes as a node's, each sent where it belongs.
//!
//! | route | where it goes |
//! |---|---|
//! | `POST /v1/sandboxes` | placed by Ray, then to that node |
//! | `GET /v1/sandboxes` | every node, merged; sandboxes of lost nodes as `lost` |
//! | `/v1/sandboxes/{id}/…` (files, processes, terminals, ports, checkpoints…) | its node |
//! | `POST /v1/sandboxes/{id}/fork` | a memory checkpoint on its node, then a cluster fork |
//! | `POST /v1/snapshots/{id}/fork` | spread over the nodes Ray places the children on |
//! | `GET /v1/snapshots` | every node, with what the object store holds |
//! | other snapshot routes | a node that holds it, else any (it pulls it) |
//! | image changes (pull, delete, from-snapshot) | every node |
//! | `/ui/`, `/v1/openapi.json`, `/v1/health`, image reads | any node |
//!
//! Every request but a port's needs the gateway's token and goes on with the nodes'; a
//! port request goes on as it came, so the node checks the sandbox's own access token.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use api_types::{CreateSandbox, Sandbox, SandboxList, Snapshot, SnapshotList};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use sandfork_http::proxy::{host_target, port_refusal};
use serde::de::{DeserializeOwned, IgnoredAny};

use crate::directory::{self, Placed};
use crate::node::node_answer;
use crate::node::{self, NodeError};
use crate::wire::client_body;
use crate::{error, json_response, node_error, Gateway};

/// Largest request body the gateway reads itself (creates, forks).
const MAX_BODY: usize = 1 << 20;

pub fn router(g: Arc<Gateway>) -> Router {
    Router::new().fallback(handle).with_state(g)
}

async fn handle(State(g): State<Arc<Gateway>>, mut req: Request) -> Response {
    g.counters.forwarded.fetch_add(1, Ordering::Relaxed);
    if let Some((id, _)) = host_target(req.headers(), req.uri(), &g.config.domain) {
        return g.to_port_by_host(&id, req).await;
    }
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segs.as_slice() {
        ["ui", ..] => return g.to_any(req).await,
        ["v1", "sandboxes", id, "ports", ..] => {
            let authed = g.authorized(&mut req);
            return g.to_sandbox(id, req, authed).await;
        }
        _ => {}
    }
    if !g.authorized(&mut req) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Missing or wrong bearer token",
        );
    }
    g.with_node_token(&mut req);
    let method = req.method().clone();
    match (method, segs.as_slice()) {
        (Method::GET, ["metrics"]) => g.metrics(),
        (Method::GET, ["v1", "health"]) | (Method::GET, ["v1", "openapi.json"]) => {
            g.to_any(req).await
        }
        (Method::POST, ["v1", "sandboxes"]) => g.create(req).await,
        (Method::GET, ["v1", "sandboxes"]) => g.list(req).await,
        (Method::POST, ["v1", "sandboxes", id, "fork"]) => g.fork_sandbox(id, req).await,
        (_, ["v1", "sandboxes", id, ..]) => g.to_sandbox(id, req, true).await,
        (Method::GET, ["v1", "snapshots"]) => g.list_snapshots(req).await,
        (Method::POST, ["v1", "snapshots", "import"]) => g.to_any(req).await,
        (Method::POST, ["v1", "snapshots", id, "fork"]) => g.fork_snapshot(id, req).await,
        (Method::DELETE, ["v1", "snapshots", id]) => g.delete_snapshot(id).await,
        (_, ["v1", "snapshots", id, ..]) => g.to_holder(id, req).await,
        (Method::GET | Method::HEAD, ["v1", "images", ..]) => g.to_any(req).await,
        (Method::POST, ["v1", "images", "build" | "import"]) => error(
            StatusCode::NOT_IMPLEMENTED,
            "unsupported",
            "Image builds and imports are not taken by the gateway yet: push the image to a \
             registry and pull it here (every node pulls it), or build it on each node",
        ),
        (_, ["v1", "images", ..]) => g.broadcast(req).await,
        (_, ["v1", "volumes", ..]) => error(
            StatusCode::NOT_IMPLEMENTED,
            "unsupported",
            "Volumes live on one node and the gateway does not place them yet: create them on \
             the nodes directly",
        ),
        (Method::GET, ["v1", "events"]) => g.events(req).await,
        _ => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("No route {path}"),
        ),
    }
}

/// Reads a request's body (at most [`MAX_BODY`]).
pub(crate) async fn body_bytes(
    req: Request,
) -> Result<(axum::http::request::Parts, Bytes), Response> {
    let (parts, body) = req.into_parts();
    let bytes = http_body_util::Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("Request body: {e}"),
            )
        })?
        .to_bytes();
    Ok((parts, bytes))
}

/// The request as it came, its body `body` (JSON).
fn rebuild(parts: &axum::http::request::Parts, body: Bytes) -> Request {
    let mut r = Request::new(Body::from(body));
    *r.method_mut() = parts.method.clone();
    *r.uri_mut() = parts.uri.clone();
    *r.headers_mut() = parts.headers.clone();
    r.headers_mut().remove(header::CONTENT_LENGTH);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

impl Gateway {
    /// Whether the request carries the gateway's token (a WebSocket may carry it in its
    /// query as `access_token`).
    fn authorized(&self, req: &mut Request) -> bool {
        self.token.carried_by(req)
    }

    fn with_node_token(&self, req: &mut Request) {
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {}", self.node_token)) {
            req.headers_mut().insert(header::AUTHORIZATION, v);
        }
    }

    /// Where sandbox `id_or_name` runs, as the directory says. The entry's address is
    /// not taken on trust (anyone who can write Ray's store could point it anywhere): the
    /// address used is that of the node the entry names, as this gateway admitted it.
    pub(crate) async fn placed(&self, id_or_name: &str) -> Option<(String, Placed)> {
        let (id, mut p) = self.directory_entry(id_or_name).await?;
        if let Some(n) = self.node(&p.node) {
            if n.api != p.api {
                tracing::warn!(sandbox = %id, entry = %p.api, node = %n.api, "a directory entry names another address than its node's: the node's is used");
                p.api = n.api;
            }
        }
        Some((id, p))
    }

    async fn directory_entry(&self, id_or_name: &str) -> Option<(String, Placed)> {
        if let Ok(Some(v)) = self.ray.get(&directory::sandbox(id_or_name)).await {
            return serde_json::from_str(&v)
                .ok()
                .map(|p| (id_or_name.to_string(), p));
        }
        let id = self
            .ray
            .get(&directory::name(id_or_name))
            .await
            .ok()
            .flatten()?;
        let v = self
            .ray
            .get(&directory::sandbox(&id))
            .await
            .ok()
            .flatten()?;
        serde_json::from_str(&v).ok().map(|p| (id, p))
    }

    fn is_lost(&self, p: &Placed) -> bool {
        !self.node(&p.node).is_some_and(|n| n.alive)
    }

    /// Records where sandbox `view` runs (and its name).
    pub(crate) async fn record(&self, view: &Sandbox, node: &ray::NodeInfo, pg: Option<String>) {
        let id = view.id.as_str();
        let p = Placed {
            node: node.id.clone(),
            api: node.api.clone(),
            node_name: node.name.clone(),
            pg,
            view: view.clone(),
        };
        let entry = serde_json::to_string(&p).unwrap_or_default();
        if let Err(e) = self.ray.put(&directory::sandbox(id), &entry).await {
            tracing::warn!(sandbox = id, error = %e, "cannot record where the sandbox runs");
        }
        if let Some(name) = &view.name {
            let _ = self.ray.put(&directory::name(name), id).await;
        }
        if let Some(snap) = &view.snapshot_id {
            let _ = self.ray.put(&directory::holder(snap, &node.id), "1").await;
        }
    }

    /// Forgets sandbox `id` and frees its slot.
    async fn forget(&self, id: &str, p: &Placed) {
        if let Some(pg) = &p.pg {
            let _ = self.ray.release(std::slice::from_ref(pg)).await;
        }
        let _ = self.ray.delete(&directory::sandbox(id)).await;
        if let Some(name) = &p.view.name {
            let _ = self.ray.delete(&directory::name(name)).await;
        }
    }

    /// Nodes (alive) holding snapshot `id`.
    pub(crate) async fn holders(&self, id: &str) -> Vec<String> {
        let keys = self
            .ray
            .list(&directory::holders(id))
            .await
            .unwrap_or_default();
        let alive: Vec<String> = self.alive().into_iter().map(|n| n.id).collect();
        keys.keys()
            .filter_map(|k| k.rsplit('/').next().map(String::from))
            .filter(|n| alive.contains(n))
            .collect()
    }

    async fn to_any(&self, req: Request) -> Response {
        let Some(n) = self.alive().into_iter().next() else {
            return no_nodes();
        };
        self.links
            .send(&n.api, req)
            .await
            .unwrap_or_else(node_error)
    }

    async fn create(&self, req: Request) -> Response {
        let (parts, bytes) = match body_bytes(req).await {
            Ok(x) => x,
            Err(r) => return r,
        };
        let create: CreateSandbox = match client_body(&bytes) {
            Ok(c) => c,
            Err(bad) => return bad.into_response(),
        };
        let prefer = match &create.snapshot_id {
            Some(s) => self.holders(s).await,
            None => Vec::new(),
        };
        // The daemon's own default for a sandbox that names no memory limit.
        let memory = create.memory_mb.unwrap_or(api_types::DEFAULT_MEMORY_MB);
        let placed = match self.place(1, &prefer, memory).await {
            Ok(mut p) => p.remove(0),
            Err(r) => return r,
        };
        let (Some(node_id), Some(pg)) = (placed.node.clone(), placed.pg.clone()) else {
            return no_room(placed.error.as_deref());
        };
        let Some(n) = self.node(&node_id) else {
            let _ = self.ray.release(&[pg]).await;
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Ray placed the sandbox on a node that is gone",
            );
        };
        let answer = match self.links.send(&n.api, rebuild(&parts, bytes)).await {
            Ok(resp) => node::read(&n.api, resp).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok((status, bytes)) if status.is_success() => {
                match node_answer::<Sandbox>(&n.api, &bytes) {
                    Ok(view) => self.record(&view, &n, Some(pg)).await,
                    Err(e) => {
                        let _ = self.ray.release(&[pg]).await;
                        return node_error(e);
                    }
                }
                node::respond(status, bytes)
            }
            Ok((status, bytes)) => {
                let _ = self.ray.release(&[pg]).await;
                node::respond(status, bytes)
            }
            Err(e) => {
                let _ = self.ray.release(&[pg]).await;
                node_error(e)
            }
        }
    }

    /// Placements of `count` sandboxes, or the answer saying why Ray cannot.
    pub(crate) async fn place(
        &self,
        count: u32,
        prefer: &[String],
        memory_mb: u64,
    ) -> Result<Vec<ray::Placement>, Response> {
        match self
            .ray
            .place(
                count,
                prefer,
                &self.trusted_ids(),
                memory_mb,
                self.config.place_timeout,
            )
            .await
        {
            Ok(p) => {
                let ok = p.iter().filter(|p| p.node.is_some()).count() as u64;
                self.counters.placed.fetch_add(ok, Ordering::Relaxed);
                self.counters
                    .placement_failures
                    .fetch_add(p.len() as u64 - ok, Ordering::Relaxed);
                Ok(p)
            }
            Err(e) => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            )),
        }
    }

    async fn list(&self, req: Request) -> Response {
        let query = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        let path = format!("/v1/sandboxes{query}");
        let mut all: Vec<Sandbox> = Vec::new();
        for (n, answer) in self.ask_every::<SandboxList>(Method::GET, &path).await {
            match answer {
                Ok(list) => all.extend(list.sandboxes),
                Err(e) => tracing::warn!(node = %n.name, error = %e, "listing a node's sandboxes"),
            }
        }
        // Sandboxes whose node is gone are reported, as lost.
        let wanted_state = query_value(req.uri().query(), "state");
        if let Ok(entries) = self.ray.list(directory::SANDBOXES).await {
            for (key, v) in entries {
                let Ok(p) = serde_json::from_str::<Placed>(&v) else {
                    continue;
                };
                if self.is_lost(&p) && wanted_state.as_deref().is_none_or(|s| s == "lost") {
                    let id = key.trim_start_matches(directory::SANDBOXES);
                    if !all.iter().any(|s| s.id == id) {
                        all.push(lost_view(&p));
                    }
                }
            }
        }
        all.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        json_response(StatusCode::OK, &SandboxList { sandboxes: all })
    }

    /// One call to every live node, concurrently, each answer read as `T`.
    pub(crate) async fn ask_every<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
    ) -> Vec<(ray::NodeInfo, Result<T, NodeError>)> {
        let calls = self.alive().into_iter().map(|n| {
            let method = method.clone();
            async move {
                let r = self
                    .links
                    .call::<T>(&n.api, method, path, &self.node_token)
                    .await;
                (n, r)
            }
        });
        futures::future::join_all(calls).await
    }

    async fn to_sandbox(&self, id: &str, req: Request, authed: bool) -> Response {
        let placed = self.placed(id).await;
        // A port request without the token learns nothing of what exists or was lost.
        if !authed && placed.as_ref().is_none_or(|(_, p)| self.is_lost(p)) {
            return port_refusal(&req);
        }
        let Some((id, p)) = placed else {
            return error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("Sandbox {id} not found"),
            );
        };
        if self.is_lost(&p) {
            return self.lost(&id, &p, req).await;
        }
        let mut req = req;
        if authed {
            self.with_node_token(&mut req);
        }
        let path = req.uri().path().to_string();
        let segs: Vec<String> = path.split('/').skip(4).map(String::from).collect();
        let method = req.method().clone();
        let resp = match self.links.send(&p.api, req).await {
            Ok(r) => r,
            Err(e) => return node_error(e),
        };
        let watched = (method == Method::DELETE && segs.is_empty())
            || (method == Method::POST && segs.first().map(String::as_str) == Some("checkpoint"));
        if !resp.status().is_success() || !watched {
            return resp;
        }
        let (status, bytes) = match node::read(&p.api, resp).await {
            Ok(x) => x,
            Err(e) => return node_error(e),
        };
        if method == Method::DELETE {
            self.forget(&id, &p).await;
        } else {
            let snap = match node_answer::<Snapshot>(&p.api, &bytes) {
                Ok(s) => s,
                Err(e) => return node_error(e),
            };
            let _ = self
                .ray
                .put(&directory::holder(&snap.id, &p.node), "1")
                .await;
        }
        node::respond(status, bytes)
    }

    /// A port reached by host name: passed on with its `Host`, credentials as they came.
    async fn to_port_by_host(&self, id: &str, req: Request) -> Response {
        match self.placed(id).await {
            Some((_, p)) if !self.is_lost(&p) => self
                .links
                .send_as(&p.api, req, true)
                .await
                .unwrap_or_else(node_error),
            // Gone, lost or never there: the node's fixed refusal, whoever asks.
            _ => port_refusal(&req),
        }
    }

    /// A call for a sandbox whose node is gone.
    async fn lost(&self, id: &str, p: &Placed, req: Request) -> Response {
        let rest = req.uri().path().split('/').nth(4).is_some();
        match (req.method().clone(), rest) {
            (Method::GET, false) => json_response(StatusCode::OK, &lost_view(p)),
            (Method::DELETE, false) => {
                self.forget(id, p).await;
                let v = Sandbox {
                    state: api_types::State::Terminated,
                    ..lost_view(p)
                };
                json_response(StatusCode::OK, &v)
            }
            _ => error(
                StatusCode::GONE,
                "lost",
                format!(
                    "Sandbox {id} ran on node {}, which is lost; its published snapshots restore \
                     on other nodes",
                    p.node_name
                ),
            ),
        }
    }

    async fn list_snapshots(&self, req: Request) -> Response {
        let mut pairs: Vec<(String, String)> = req
            .uri()
            .query()
            .map(|q| {
                q.split('&')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        pairs.retain(|(k, _)| k != "published");
        pairs.push(("published".into(), "true".into()));
        let q: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let path = format!("/v1/snapshots?{}", q.join("&"));
        let mut seen = std::collections::BTreeMap::new();
        for (n, answer) in self.ask_every::<SnapshotList>(Method::GET, &path).await {
            match answer {
                Ok(list) => {
                    for s in list.snapshots {
                        seen.entry(s.id.clone()).or_insert(s);
                    }
                }
                Err(e) => tracing::warn!(node = %n.name, error = %e, "listing a node's snapshots"),
            }
        }
        let mut all: Vec<Snapshot> = seen.into_values().collect();
        all.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        json_response(StatusCode::OK, &SnapshotList { snapshots: all })
    }

    /// A snapshot's route: to a node that holds it, else any node (which pulls it).
    async fn to_holder(&self, id: &str, req: Request) -> Response {
        let holders = self.holders(id).await;
        let target = holders
            .first()
            .and_then(|h| self.node(h))
            .or_else(|| self.alive().into_iter().next());
        match target {
            Some(n) => self
                .links
                .send(&n.api, req)
                .await
                .unwrap_or_else(node_error),
            None => no_nodes(),
        }
    }

    async fn delete_snapshot(&self, id: &str) -> Response {
        let Some(first) = self.alive().into_iter().next() else {
            return no_nodes();
        };
        let path = format!("/v1/snapshots/{id}?everywhere=true");
        if let Err(e) = self
            .links
            .call::<IgnoredAny>(&first.api, Method::DELETE, &path, &self.node_token)
            .await
        {
            return node_error(e);
        }
        // Copies other nodes pulled go too.
        for (n, r) in self
            .ask_every::<IgnoredAny>(Method::DELETE, &format!("/v1/snapshots/{id}"))
            .await
        {
            if let Err(e) = r {
                if !matches!(
                    e,
                    NodeError::Refused {
                        status: StatusCode::NOT_FOUND,
                        ..
                    }
                ) {
                    tracing::warn!(node = %n.name, error = %e, "dropping a snapshot's copy");
                }
            }
        }
        for k in self
            .ray
            .list(&directory::holders(id))
            .await
            .unwrap_or_default()
            .keys()
        {
            let _ = self.ray.delete(k).await;
        }
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NO_CONTENT;
        r
    }

    /// An image change, made on every node; the first node's answer is returned, the
    /// others' failures logged.
    async fn broadcast(&self, req: Request) -> Response {
        let (parts, body) = match body_bytes(req).await {
            Ok(x) => x,
            Err(r) => return r,
        };
        let nodes = self.alive();
        if nodes.is_empty() {
            return no_nodes();
        }
        let sends = nodes.iter().map(|n| {
            let r = rebuild(&parts, body.clone());
            async move {
                match self.links.send(&n.api, r).await {
                    Ok(resp) => node::read(&n.api, resp).await,
                    Err(e) => Err(e),
                }
            }
        });
        let mut answers = futures::future::join_all(sends).await.into_iter();
        let first = answers.next();
        for (n, a) in nodes.iter().skip(1).zip(answers) {
            match a {
                Ok((s, b)) if !s.is_success() => {
                    tracing::warn!(node = %n.name, status = %s, body = %String::from_utf8_lossy(&b), "image change refused")
                }
                Err(e) => tracing::warn!(node = %n.name, error = %e, "image change failed"),
                _ => {}
            }
        }
        match first {
            Some(Ok((s, b))) => node::respond(s, b),
            Some(Err(e)) => node_error(e),
            None => no_nodes(),
        }
    }

    /// The events of every node, merged as they come.
    async fn events(&self, req: Request) -> Response {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(256);
        for n in self.alive() {
            let mut r = node::request(Method::GET, &req.uri().to_string(), &self.node_token, None);
            *r.headers_mut() = req.headers().clone();
            let (tx, links) = (tx.clone(), self.links.clone());
            tokio::spawn(async move {
                let Ok(resp) = links.send(&n.api, r).await else {
                    return;
                };
                let mut body = resp.into_body().into_data_stream();
                use futures::StreamExt;
                let mut partial = Vec::new();
                while let Some(Ok(chunk)) = body.next().await {
                    partial.extend_from_slice(&chunk);
                    while let Some(i) = partial.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = partial.drain(..=i).collect();
                        if tx.send(Ok(line.into())).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
        drop(tx);
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
        let mut r = Response::new(Body::from_stream(stream));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        );
        r
    }

    fn metrics(&self) -> Response {
        let nodes = self.nodes();
        let alive = nodes.iter().filter(|n| n.alive).count();
        let c = &self.counters;
        let mut text = String::new();
        let mut put = |name: &str, help: &str, kind: &str, value: String| {
            text.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{value}\n"
            ));
        };
        put(
            "sandfork_gateway_nodes",
            "Nodes of the cluster, by state.",
            "gauge",
            format!(
                "sandfork_gateway_nodes{{state=\"alive\"}} {alive}\nsandfork_gateway_nodes{{state=\"lost\"}} {}",
                nodes.len() - alive
            ),
        );
        put(
            "sandfork_gateway_free_slots",
            "Sandbox slots free on live nodes.",
            "gauge",
            format!(
                "sandfork_gateway_free_slots {}",
                nodes
                    .iter()
                    .filter(|n| n.alive)
                    .map(|n| n.free as u64)
                    .sum::<u64>()
            ),
        );
        for (name, help, v) in [
            (
                "sandfork_gateway_placements_total",
                "Sandboxes placed by Ray.",
                &c.placed,
            ),
            (
                "sandfork_gateway_placement_failures_total",
                "Sandboxes Ray found no room for.",
                &c.placement_failures,
            ),
            (
                "sandfork_gateway_requests_total",
                "Requests received.",
                &c.forwarded,
            ),
            (
                "sandfork_gateway_fork_retries_total",
                "Fork children started again elsewhere after their node failed.",
                &c.retried_children,
            ),
        ] {
            put(
                name,
                help,
                "counter",
                format!("{name} {}", v.load(Ordering::Relaxed)),
            );
        }
        let mut r = Response::new(Body::from(text));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        r
    }
}

fn query_value(query: Option<&str>, key: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

/// A sandbox of a lost node, as last seen, in state `lost`.
fn lost_view(p: &Placed) -> Sandbox {
    Sandbox {
        state: api_types::State::Lost,
        error: Some(format!("its node {} is lost", p.node_name)),
        ..p.view.clone()
    }
}

pub(crate) fn no_nodes() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "No sandfork node of the cluster is alive",
    )
}

pub(crate) fn no_room(why: Option<&str>) -> Response {
    error(
        StatusCode::TOO_MANY_REQUESTS,
        "over_capacity",
        format!(
            "The cluster has no room: {}",
            why.unwrap_or("no node has a free sandbox slot")
        ),
    )
}
