//! E2B's control plane (REST + JSON), served by the manager's lifecycle calls.
//!
//! Templates are images (`base`, when no image has that name, is the daemon's default
//! image) or snapshots (a snapshot id, as `create_snapshot` hands out); pause is suspend,
//! `connect` resumes, fork is the daemon's fork, snapshots are checkpoints. The E2B timeout
//! becomes the sandbox's idle timeout.

use std::collections::{BTreeMap, HashMap};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::errors::ApiErr;
use super::launch::{self, Launch};
use super::shapes::{self, NetworkConfig, NewSandbox, SandboxOut};
use super::{envd, E2bState, Shared, API_KEY_HEADER};
use crate::error::Error;
use crate::manager::CheckpointArgs;
use api_types::{
    CreateSandbox, ForkRequest, ListQuery, OnTimeout, Sandbox, SnapshotQuery, SnapshotType,
    UpdateSandbox,
};

/// E2B's default timeout, seconds.
const DEFAULT_TIMEOUT: u64 = 300;
/// The most items of one list page.
const MAX_PAGE: usize = 1000;
/// The egress rule E2B's `allow_internet_access: false` stands for.
const DENY_ALL: &str = "0.0.0.0/0";

type Answer = Result<Response, ApiErr>;

pub fn routes() -> Router<E2bState> {
    Router::new()
        .route("/v2/sandboxes", post(create).get(list))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}", get(get_info).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/snapshots", post(create_snapshot))
        .route("/sandboxes/{id}/network", put(update_network))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/logs", get(logs))
        .route("/snapshots", get(list_snapshots))
        // One segment (a snapshot id's `/` and `:` arrive encoded), beside the template
        // build routes under `/templates/`.
        .route("/templates/{id}", axum::routing::delete(delete_snapshot))
        .fallback(|| async { ApiErr::not_found("No such route in sandfork's E2B API") })
}

/// `X-API-KEY` must be the daemon's API token (any key when the listener has none).
pub(super) fn check_key(s: &Shared, headers: &axum::http::HeaderMap) -> Result<(), ApiErr> {
    let Some(token) = &s.token else {
        return Ok(());
    };
    let key = headers
        .get(API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if token.accepts(Some(&format!("Bearer {key}"))) {
        Ok(())
    } else {
        Err(ApiErr::new(StatusCode::UNAUTHORIZED, "Invalid API key"))
    }
}

/// Parses a JSON body leniently (unknown fields are E2B's business); empty is `{}`.
pub(super) fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiErr> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| ApiErr::bad_request(format!("Invalid body: {e}")))
}

/// Reads a bounded body (chunked or not).
pub(super) async fn read(
    s: &Shared,
    req: Request,
) -> Result<(axum::http::HeaderMap, Bytes), ApiErr> {
    let (parts, body) = req.into_parts();
    check_key(s, &parts.headers)?;
    let limit = s.manager.config().max_json_bytes;
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|e| ApiErr::new(StatusCode::PAYLOAD_TOO_LARGE, format!("Body: {e}")))?;
    Ok((parts.headers, bytes))
}

/// A sandbox E2B can see (running or paused) and its E2B state; else 404.
fn visible(s: &Shared, id: &str) -> Result<(Sandbox, &'static str), ApiErr> {
    let not_found = || ApiErr::not_found(format!("Sandbox {id} not found"));
    let v = s.manager.get(id).map_err(|_| not_found())?;
    let state = shapes::state(v.state).ok_or_else(not_found)?;
    Ok((v, state))
}

/// The domain under which the daemon's gateway serves sandbox ports by host
/// (`{port}-{id}.<domain>`): its `gateway_domain`, with the port the request came to. The
/// SDKs' `get_host(port)` builds exactly that name.
fn domain(s: &Shared, headers: &axum::http::HeaderMap) -> Option<String> {
    let gateway = s.manager.gateway_domain();
    if gateway.is_empty() {
        return None;
    }
    let host = headers.get(axum::http::header::HOST)?.to_str().ok()?;
    let port = host
        .rsplit_once(':')
        .map(|(_, p)| p)
        .filter(|p| p.parse::<u16>().is_ok());
    Some(match port {
        Some(p) => format!("{gateway}:{p}"),
        None => gateway.to_string(),
    })
}

/// The `Sandbox` answer for `v`.
fn sandbox_out(s: &Shared, v: &Sandbox, domain: Option<String>) -> Result<SandboxOut, ApiErr> {
    let template = shapes::template(v);
    let traffic = if v.public_ports {
        None
    } else {
        Some(s.manager.port_token(&v.id)?)
    };
    Ok(SandboxOut {
        template_id: template.clone(),
        sandbox_id: v.id.clone(),
        client_id: "sandfork",
        envd_version: shapes::ENVD_VERSION,
        envd_access_token: envd::access_token(s, &v.id)?,
        traffic_access_token: traffic,
        domain,
        alias: Some(template),
    })
}

fn created(json: impl serde::Serialize) -> Response {
    (StatusCode::CREATED, Json(json)).into_response()
}

// Lifecycle ----------------------------------------------------------------------------

async fn create(State(s): State<E2bState>, req: Request) -> Answer {
    let (headers, bytes) = read(&s, req).await?;
    let req: NewSandbox = body(&bytes)?;
    let (create, ready) = to_create(&s, req).await?;
    let v = s.manager.create(create).await?;
    warm_users(&s, &v.id);
    if let Some(ready) = ready {
        if let Err(e) = launch::wait_ready(&s, &v.id, &ready).await {
            let _ = s.manager.terminate(&v.id).await;
            return Err(e);
        }
    }
    Ok(created(sandbox_out(&s, &v, domain(&s, &headers))?))
}

/// The daemon's create request for E2B's, and the ready command of its template (one
/// built through E2B's template API) to wait for.
async fn to_create(s: &Shared, req: NewSandbox) -> Result<(CreateSandbox, Option<String>), ApiErr> {
    if req.mcp.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiErr::missing("mcp (the MCP gateway)"));
    }
    if req.iam.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiErr::missing("iam (workload identity)"));
    }
    let net = req.network.unwrap_or_default();
    if let Some(feature) = net.unsupported() {
        return Err(ApiErr::missing(feature));
    }
    let (image, snapshot_id, launch) = resolve_template(s, &req.template_id).await?;
    let mut labels = shapes::labels_of(&req.metadata.unwrap_or_default());
    labels.insert(shapes::TEMPLATE_LABEL.into(), req.template_id.clone());
    if req.auto_resume.is_some_and(|a| a.enabled) {
        labels.insert(shapes::AUTO_RESUME_LABEL.into(), "true".into());
    }
    let mut deny_out = net.deny_out.unwrap_or_default();
    if req.allow_internet_access.or(net.allow_internet_access) == Some(false)
        && !deny_out.iter().any(|d| d == DENY_ALL)
    {
        deny_out.push(DENY_ALL.into());
    }
    let on_timeout = if req.auto_pause == Some(true) {
        OnTimeout::Suspend
    } else {
        OnTimeout::Terminate
    };
    let create = CreateSandbox {
        image,
        snapshot_id,
        entrypoint: launch.entrypoint(),
        cpus: launch.cpus,
        memory_mb: launch.memory_mb,
        timeout_secs: Some(req.timeout.unwrap_or(DEFAULT_TIMEOUT)),
        on_timeout: Some(on_timeout),
        env: req.env_vars.unwrap_or_default(),
        labels,
        allow_out: net.allow_out.filter(|a| !a.is_empty()),
        deny_out: (!deny_out.is_empty()).then_some(deny_out),
        public_ports: net.allow_public_traffic,
        volumes: req
            .volume_mounts
            .unwrap_or_default()
            .into_iter()
            .map(|v| api_types::VolumeMount {
                name: v.name,
                path: v.path,
                read_only: false,
            })
            .collect(),
        ..Default::default()
    };
    Ok((create, launch.ready_cmd))
}

/// Reads the new sandbox's accounts ahead of its first envd request.
fn warm_users(s: &E2bState, id: &str) {
    let (s, id) = (s.clone(), id.to_string());
    tokio::spawn(async move {
        s.users.table(&s.manager, &id).await;
    });
}

/// A template: a snapshot id, an image name, or `base` (the default image); with what
/// an image built through E2B's template API asks of its sandboxes.
async fn resolve_template(
    s: &Shared,
    template: &str,
) -> Result<(Option<String>, Option<String>, Launch), ApiErr> {
    if template.starts_with("snap-") && s.manager.get_snapshot(template).await.is_ok() {
        return Ok((None, Some(template.to_string()), Launch::default()));
    }
    match s.manager.image_details(template).await {
        Ok(d) => Ok((Some(template.to_string()), None, Launch::of(&d.labels))),
        Err(Error::NotFound(_)) if template == "base" => Ok((None, None, Launch::default())),
        Err(Error::NotFound(_)) | Err(Error::InvalidArgument(_)) => Err(ApiErr::not_found(
            format!("template '{template}' not found: build or pull an image of that name first"),
        )),
        Err(e) => Err(e.into()),
    }
}

async fn get_info(State(s): State<E2bState>, Path(id): Path<String>, req: Request) -> Answer {
    let (headers, _) = read(&s, req).await?;
    let (v, state) = visible(&s, &id)?;
    let token = envd::access_token(&s, &v.id)?;
    let mut out = shapes::detail(&v, state, &token);
    out["domain"] = json!(domain(&s, &headers));
    Ok(Json(out).into_response())
}

async fn kill(State(s): State<E2bState>, Path(id): Path<String>, req: Request) -> Answer {
    let _ = read(&s, req).await?;
    let (v, _) = visible(&s, &id)?;
    s.manager.terminate(&v.id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn set_timeout(State(s): State<E2bState>, Path(id): Path<String>, req: Request) -> Answer {
    let (_, bytes) = read(&s, req).await?;
    let t: shapes::Timeout = body(&bytes)?;
    let (v, _) = visible(&s, &id)?;
    let update = UpdateSandbox {
        timeout_secs: Some(t.timeout),
        ..Default::default()
    };
    s.manager.update(&v.id, update).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Resumes a paused sandbox (201), or extends a running one's timeout (200).
async fn connect(State(s): State<E2bState>, Path(id): Path<String>, req: Request) -> Answer {
    let (headers, bytes) = read(&s, req).await?;
    let c: shapes::ConnectBody = body(&bytes)?;
    let (v, state) = visible(&s, &id)
        .map_err(|_| ApiErr::not_found(format!("Paused sandbox {id} not found")))?;
    let resumed = state == "paused";
    if resumed {
        s.manager.resume(&v.id).await?;
    }
    if let Some(t) = c.timeout.filter(|t| resumed || *t > v.timeout_secs) {
        let update = UpdateSandbox {
            timeout_secs: Some(t),
            ..Default::default()
        };
        s.manager.update(&v.id, update).await?;
    }
    let v = s.manager.get(&v.id)?;
    let out = sandbox_out(&s, &v, domain(&s, &headers))?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(out)).into_response())
}

/// Suspends (memory and disk: `memory: false` gets the same, which keeps more).
async fn pause(State(s): State<E2bState>, Path(id): Path<String>, req: Request) -> Answer {
    let (_, bytes) = read(&s, req).await?;
    let _: Value = body(&bytes)?;
    let (v, state) = visible(&s, &id)?;
    if state == "paused" {
        return Err(ApiErr::new(
            StatusCode::CONFLICT,
            format!("Sandbox {id} is already paused"),
        ));
    }
    let _closed = s.gates.close(&v.id).await;
    s.manager.suspend(&v.id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Forks: a memory checkpoint of the sandbox, then `count` children from it.
async fn fork(State(s): State<E2bState>, Path(id): Path<String>, req: Request) -> Answer {
    let (headers, bytes) = read(&s, req).await?;
    let f: shapes::ForkBody = body(&bytes)?;
    let (v, _) = visible(&s, &id)?;
    let req = ForkRequest {
        count: f.count.unwrap_or(1),
        timeout_secs: Some(f.timeout.unwrap_or(DEFAULT_TIMEOUT)),
        on_timeout: Some(OnTimeout::Terminate),
        labels: v.labels.clone(),
        ..Default::default()
    };
    let result = {
        let _closed = s.gates.close(&v.id).await;
        s.manager.fork_sandbox(&v.id, req).await?
    };
    let children: Vec<Value> = result
        .children
        .into_iter()
        .map(|c| match (c.sandbox, c.error) {
            (Some(child), _) => match sandbox_out(&s, &child, domain(&s, &headers)) {
                Ok(out) => json!({"sandbox": out}),
                Err(e) => json!({"error": {"code": e.status.as_u16(), "message": e.message}}),
            },
            (None, Some(e)) => {
                json!({"error": {"code": child_status(&e.code), "message": e.message}})
            }
            (None, None) => json!({"error": {"code": 500, "message": "the child was not made"}}),
        })
        .collect();
    Ok(created(children))
}

/// The status of a fork child's error code.
fn child_status(code: &str) -> u16 {
    match code {
        "not_found" => 404,
        "over_capacity" => 429,
        "unavailable" => 503,
        "invalid_argument" => 400,
        "conflict" => 409,
        _ => 500,
    }
}

async fn update_network(State(s): State<E2bState>, Path(id): Path<String>, req: Request) -> Answer {
    let (_, bytes) = read(&s, req).await?;
    let net: NetworkConfig = body(&bytes)?;
    if let Some(feature) = net.unsupported() {
        return Err(ApiErr::missing(feature));
    }
    let (v, _) = visible(&s, &id)?;
    let mut deny_out = net.deny_out.unwrap_or_default();
    if net.allow_internet_access == Some(false) && !deny_out.iter().any(|d| d == DENY_ALL) {
        deny_out.push(DENY_ALL.into());
    }
    let update = UpdateSandbox {
        allow_out: Some(net.allow_out.unwrap_or_default()),
        deny_out: Some(deny_out),
        public_ports: net.allow_public_traffic,
        ..Default::default()
    };
    s.manager.update(&v.id, update).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// One sample of what the sandbox uses now (E2B keeps a history; sandfork does not).
async fn metrics(State(s): State<E2bState>, Path(id): Path<String>, req: Request) -> Answer {
    let _ = read(&s, req).await?;
    let (v, state) = visible(&s, &id)?;
    if state != "running" {
        return Ok(Json(json!([])).into_response());
    }
    let st = s.manager.stats(&v.id).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let started = unix_seconds(&v.created_at).unwrap_or(now);
    let cpu_pct = 100.0 * st.usage.cpu_seconds / ((now - started).max(1.0) * st.cpus.max(0.01));
    Ok(Json(json!([{
        "timestamp": st.sampled_at,
        "timestampUnix": now as i64,
        "cpuCount": st.cpus.ceil().max(1.0) as u64,
        "cpuUsedPct": (cpu_pct * 100.0).round() / 100.0,
        "memUsed": st.usage.memory_bytes,
        "memTotal": st.usage.memory_limit_bytes,
        "memCache": 0,
        "diskUsed": st.usage.disk_used_bytes,
        "diskTotal": st.usage.disk_total_bytes,
    }]))
    .into_response())
}

async fn logs(State(s): State<E2bState>, req: Request) -> Answer {
    let _ = read(&s, req).await?;
    Err(ApiErr::missing(
        "E2B sandbox logs (use the daemon's GET /v1/sandboxes/{id}/logs)",
    ))
}

// Listing --------------------------------------------------------------------------------

/// A query string as a multimap.
fn params(raw: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// One page of `items` from the offset `nextToken` names, and the next page's token.
fn page<T>(items: Vec<T>, p: &HashMap<String, String>) -> Result<(Vec<T>, Option<String>), ApiErr> {
    let start: usize = match p.get("nextToken").filter(|t| !t.is_empty()) {
        Some(t) => t
            .parse()
            .map_err(|_| ApiErr::bad_request(format!("Invalid nextToken {t:?}")))?,
        None => 0,
    };
    let limit = match p.get("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiErr::bad_request(format!("Invalid limit {l:?}")))?
            .clamp(1, MAX_PAGE),
        None => MAX_PAGE,
    };
    let total = items.len();
    let end = start.saturating_add(limit).min(total);
    let next = (end < total).then(|| end.to_string());
    Ok((items.into_iter().skip(start).take(limit).collect(), next))
}

fn with_next(json: Value, next: Option<String>) -> Response {
    let mut resp = Json(json).into_response();
    if let Some(t) = next.and_then(|t| HeaderValue::from_str(&t).ok()) {
        resp.headers_mut().insert("x-next-token", t);
    }
    resp
}

async fn list(State(s): State<E2bState>, RawQuery(q): RawQuery, req: Request) -> Answer {
    let _ = read(&s, req).await?;
    let p = params(q.as_deref());
    let states: Vec<String> = p
        .get("state")
        .map(|st| st.split(',').map(|x| x.trim().to_string()).collect())
        .unwrap_or_else(|| vec!["running".into(), "paused".into()]);
    let wanted = p
        .get("metadata")
        .map(|m| shapes::metadata_filter(m))
        .unwrap_or_default();
    let after = match p.get("startedAfter") {
        Some(t) => {
            Some(unix_seconds(t).ok_or_else(|| ApiErr::bad_request("Invalid startedAfter"))?)
        }
        None => None,
    };
    let mut found: Vec<(Sandbox, &str)> = s
        .manager
        .list(&ListQuery::default())?
        .into_iter()
        .filter_map(|v| shapes::state(v.state).map(|st| (v, st)))
        .filter(|(_, st)| states.iter().any(|w| w == st))
        .filter(|(v, _)| matches_metadata(&v.labels, &wanted))
        .filter(|(v, _)| {
            p.get("template")
                .is_none_or(|t| *t == shapes::template(v) || *t == v.image)
        })
        .filter(|(v, _)| after.is_none_or(|a| unix_seconds(&v.created_at).is_some_and(|c| c >= a)))
        .collect();
    if p.get("order").is_some_and(|o| o == "desc") {
        found.reverse();
    }
    let (items, next) = page(found, &p)?;
    let json: Vec<Value> = items.iter().map(|(v, st)| shapes::listed(v, st)).collect();
    Ok(with_next(Value::Array(json), next))
}

fn matches_metadata(labels: &BTreeMap<String, String>, wanted: &BTreeMap<String, String>) -> bool {
    let md = shapes::metadata(labels);
    wanted.iter().all(|(k, v)| md.get(k) == Some(v))
}

// Snapshots ------------------------------------------------------------------------------

async fn create_snapshot(
    State(s): State<E2bState>,
    Path(id): Path<String>,
    req: Request,
) -> Answer {
    let (_, bytes) = read(&s, req).await?;
    let b: shapes::SnapshotBody = body(&bytes)?;
    let (v, state) = visible(&s, &id)?;
    if state != "running" {
        return Err(ApiErr::new(
            StatusCode::CONFLICT,
            format!("Sandbox {id} is paused: connect to it first"),
        ));
    }
    let kind = if b.memory == Some(false) {
        SnapshotType::Filesystem
    } else {
        SnapshotType::Memory
    };
    let args = CheckpointArgs {
        kind,
        name: b.name,
        hooks: Vec::new(),
        labels: BTreeMap::new(),
    };
    let snap = {
        let _closed = match kind {
            SnapshotType::Memory => Some(s.gates.close(&v.id).await),
            SnapshotType::Filesystem => None,
        };
        s.manager.checkpoint(&v.id, args).await?
    };
    Ok(created(snapshot_info(&snap)))
}

fn snapshot_info(snap: &api_types::Snapshot) -> Value {
    json!({"snapshotID": snap.id, "names": snap.name.iter().collect::<Vec<_>>()})
}

async fn list_snapshots(State(s): State<E2bState>, RawQuery(q): RawQuery, req: Request) -> Answer {
    let _ = read(&s, req).await?;
    let p = params(q.as_deref());
    let query = SnapshotQuery {
        source: p.get("sandboxID").cloned(),
        ..Default::default()
    };
    let snaps: Vec<api_types::Snapshot> = s
        .manager
        .list_snapshots(&query)
        .await?
        .into_iter()
        .filter(|sn| !sn.id.starts_with("snap-suspend-"))
        .filter(|sn| p.get("name").is_none_or(|n| sn.name.as_ref() == Some(n)))
        .collect();
    let (items, next) = page(snaps, &p)?;
    Ok(with_next(
        Value::Array(items.iter().map(snapshot_info).collect()),
        next,
    ))
}

/// Deletes a snapshot (E2B deletes snapshots as templates); 404 for anything else.
async fn delete_snapshot(
    State(s): State<E2bState>,
    Path(id): Path<String>,
    req: Request,
) -> Answer {
    let _ = read(&s, req).await?;
    if s.manager.get_snapshot(&id).await.is_err() {
        return Err(ApiErr::not_found(format!("snapshot '{id}' not found")));
    }
    s.manager.delete_snapshot(&id, false).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// Time -------------------------------------------------------------------------------------

/// Unix seconds of an RFC 3339 time (`2026-12-07T14:19:51.930581+00:00`, `…Z`).
pub fn unix_seconds(t: &str) -> Option<f64> {
    model::timestamp::unix_millis(t).map(|ms| ms as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_every_form_the_sdks_send() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(unix_seconds("1970-01-02T01:00:00+01:00"), Some(86400.0));
        let js = unix_seconds("2026-12-07T14:20:28.027Z").unwrap();
        let py = unix_seconds("2026-12-07T14:20:28.027000+00:00").unwrap();
        assert!((js - py).abs() < 1e-6);
        assert_eq!(unix_seconds("nonsense"), None);
        assert_eq!(unix_seconds("2026-12-07T99"), None);
        for hostile in [
            "99999999999999999-01-01T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01T00:00:00+99999999999:00",
            "2026-01-01T00:00:NaNZ",
            "2026-01-01T00:00:1e300Z",
        ] {
            assert_eq!(unix_seconds(hostile), None, "{hostile}");
        }
    }

    #[test]
    fn pages_carry_the_next_offset() {
        let mut p = HashMap::new();
        p.insert("limit".to_string(), "2".to_string());
        let (items, next) = page(vec![1, 2, 3], &p).unwrap();
        assert_eq!((items, next.as_deref()), (vec![1, 2], Some("2")));
        p.insert("nextToken".into(), "2".into());
        assert_eq!(page(vec![1, 2, 3], &p).unwrap(), (vec![3], None));
        p.insert("nextToken".into(), "x".into());
        assert!(page(vec![1], &p).is_err());
        p.insert("nextToken".into(), "99999999999999999999".into());
        assert!(page(vec![1], &p).is_err());
    }
}
