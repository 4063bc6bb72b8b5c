//! Lifecycle routes (WIRE.md §4): sandboxes, suspend and resume, snapshots, copies. Each
//! calls the manager method its native `/v1` counterpart calls.

use std::collections::BTreeMap;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::extract::{parse_json, read_limited, ApiJson, ApiQuery};
use super::super::{ApiResult, AppState};
use super::errors::unsupported;
use super::shapes::{
    check_auto_resume, CreateBody, Created, NetworkPolicy, ResizeRequested, ResourceResize,
    SandboxInfo, SnapshotBody, SnapshotInfo, UpdateBody,
};
use super::SandboxUrl;
use crate::manager::CheckpointArgs;
use api_types::{
    ForkChild, ForkRequest, ListQuery, NetworkModeName, Sandbox, SnapshotQuery, SnapshotType,
    UpdateSandbox,
};

/// L1: create (blocking: the daemon answers once the sandbox runs), or restore with
/// `snapshot_id`.
pub async fn create(
    State(m): State<AppState>,
    Path(_ns): Path<String>,
    SandboxUrl(url): SandboxUrl,
    ApiJson(body): ApiJson<CreateBody>,
) -> ApiResult<Json<Created>> {
    let sandbox = m.create(body.into_native()?).await?;
    Ok(Json(Created::of(sandbox, url.as_deref())))
}

/// L2: one sandbox, by id or name.
pub async fn get(
    State(m): State<AppState>,
    Path((ns, id)): Path<(String, String)>,
    SandboxUrl(url): SandboxUrl,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(SandboxInfo::of(m.get(&id)?, &ns, url.as_deref())))
}

/// L3: the live sandboxes.
pub async fn list(
    State(m): State<AppState>,
    Path(ns): Path<String>,
    SandboxUrl(url): SandboxUrl,
) -> ApiResult<Json<Value>> {
    let sandboxes: Vec<SandboxInfo> = m
        .list(&ListQuery::default())?
        .into_iter()
        .map(|s| SandboxInfo::of(s, &ns, url.as_deref()))
        .collect();
    Ok(Json(json!({ "sandboxes": sandboxes })))
}

/// L4: change a live sandbox. `resources` is answered in `resource_resize`: sandfork
/// cannot resize a live sandbox, so any change of them is reported `failed`.
pub async fn update(
    State(m): State<AppState>,
    Path((ns, id)): Path<(String, String)>,
    SandboxUrl(url): SandboxUrl,
    ApiJson(body): ApiJson<UpdateBody>,
) -> ApiResult<Json<SandboxInfo>> {
    check_auto_resume(body.auto_resume)?;
    let current = m.get(&id)?;
    let change = native_update(&body, &current)?;
    let sandbox = if change == UpdateSandbox::default() {
        current
    } else {
        m.update(&id, change).await?
    };
    let resize = body.resources.as_ref().map(|r| resize_answer(r, &sandbox));
    let mut info = SandboxInfo::of(sandbox, &ns, url.as_deref());
    info.resource_resize = resize;
    Ok(Json(info))
}

/// The daemon's update for a Tensorlake one.
fn native_update(body: &UpdateBody, current: &Sandbox) -> ApiResult<UpdateSandbox> {
    let (allow_out, deny_out) = match &body.network {
        None => (None, None),
        Some(policy) => egress_lists(policy.as_ref(), current)?,
    };
    Ok(UpdateSandbox {
        name: body.name.clone(),
        labels: body.labels.clone(),
        allow_out,
        deny_out,
        timeout_secs: body.timeout_secs,
        public_ports: body.allow_unauthenticated_access,
        exposed_ports: body.exposed_ports.clone(),
        on_timeout: None,
    })
}

type Lists = (Option<Vec<String>>, Option<Vec<String>>);

/// A new network policy as egress lists; internet access itself is fixed at create.
fn egress_lists(policy: Option<&NetworkPolicy>, current: &Sandbox) -> ApiResult<Lists> {
    let internet = current.network.mode == NetworkModeName::Internet;
    let Some(p) = policy else {
        // `null` clears the policy: no lists (a sandbox without internet has none).
        return Ok(if internet {
            (Some(Vec::new()), Some(Vec::new()))
        } else {
            (None, None)
        });
    };
    if p.allow_internet_access != internet {
        return Err(unsupported(
            "Changing internet access of a live sandbox is not supported by sandfork \
             (network.allow_internet_access is fixed at create; allow_out and deny_out \
             can change)",
        ));
    }
    if !internet {
        return Ok((None, None));
    }
    Ok((Some(p.allow_out.clone()), Some(p.deny_out.clone())))
}

/// `resource_resize` for a resize request: `succeeded` when nothing changes, else
/// `failed` naming the missing feature.
fn resize_answer(r: &super::shapes::Resources, s: &Sandbox) -> ResourceResize {
    let requested = ResizeRequested {
        cpus: r.cpus.unwrap_or(s.cpus),
        memory_mb: r.memory_mb.unwrap_or(s.memory_mb),
        disk_mb: r.disk_mb.or(r.ephemeral_disk_mb).unwrap_or(s.disk_mb),
    };
    let current = ResizeRequested {
        cpus: s.cpus,
        memory_mb: s.memory_mb,
        disk_mb: s.disk_mb,
    };
    let same = requested == current;
    ResourceResize {
        generation: 1,
        requested,
        status: if same { "succeeded" } else { "failed" },
        error_message: (!same).then(|| {
            "Live resize is not supported by sandfork: cpus, memory_mb and disk_mb are \
             fixed at create (create a new sandbox, or restore a filesystem snapshot with \
             other resources through its native API); see docs/compat.md"
                .to_string()
        }),
    }
}

/// L5: terminate.
pub async fn delete(
    State(m): State<AppState>,
    Path((ns, id)): Path<(String, String)>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(SandboxInfo::of(m.terminate(&id).await?, &ns, None)))
}

/// L6: suspend (the daemon answers once suspended; `wait_ms` is not needed).
pub async fn suspend(
    State(m): State<AppState>,
    Path((ns, id)): Path<(String, String)>,
    SandboxUrl(url): SandboxUrl,
) -> ApiResult<Json<SandboxInfo>> {
    let s = m.suspend(&id).await?;
    Ok(Json(SandboxInfo::of(s, &ns, url.as_deref())))
}

/// L7: resume (the daemon answers once running).
pub async fn resume(
    State(m): State<AppState>,
    Path((ns, id)): Path<(String, String)>,
    SandboxUrl(url): SandboxUrl,
) -> ApiResult<Json<SandboxInfo>> {
    let s = m.resume(&id).await?;
    Ok(Json(SandboxInfo::of(s, &ns, url.as_deref())))
}

/// L8: a checkpoint; no body (type not chosen) takes the daemon's default, filesystem.
/// The daemon answers once it is complete.
pub async fn snapshot(
    State(m): State<AppState>,
    Path((_ns, id)): Path<(String, String)>,
    req: Request,
) -> ApiResult<Json<Value>> {
    let bytes = read_limited(req, m.config().max_json_bytes).await?;
    let body: SnapshotBody = parse_json(&bytes)?;
    let args = CheckpointArgs {
        kind: body.snapshot_type.unwrap_or(SnapshotType::Filesystem),
        name: None,
        hooks: Vec::new(),
        labels: BTreeMap::new(),
    };
    let snap = m.checkpoint(&id, args).await?;
    Ok(Json(json!({"snapshot_id": snap.id, "status": "completed"})))
}

/// L9: one snapshot.
pub async fn get_snapshot(
    State(m): State<AppState>,
    Path((ns, snap)): Path<(String, String)>,
) -> ApiResult<Json<SnapshotInfo>> {
    Ok(Json(SnapshotInfo::of(m.get_snapshot(&snap).await?, &ns)))
}

/// L10: every snapshot.
pub async fn list_snapshots(
    State(m): State<AppState>,
    Path(ns): Path<String>,
) -> ApiResult<Json<Value>> {
    snapshots_of(&m, &ns, SnapshotQuery::default()).await
}

/// L11: the snapshots of one sandbox (by id or name).
pub async fn sandbox_snapshots(
    State(m): State<AppState>,
    Path((ns, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let source = m.get(&id)?.id;
    let q = SnapshotQuery {
        source: Some(source),
        ..Default::default()
    };
    snapshots_of(&m, &ns, q).await
}

async fn snapshots_of(m: &AppState, ns: &str, q: SnapshotQuery) -> ApiResult<Json<Value>> {
    let snapshots: Vec<SnapshotInfo> = m
        .list_snapshots(&q)
        .await?
        .into_iter()
        .map(|s| SnapshotInfo::of(s, ns))
        .collect();
    Ok(Json(json!({ "snapshots": snapshots })))
}

/// L12: delete a snapshot.
pub async fn delete_snapshot(
    State(m): State<AppState>,
    Path((_ns, snap)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    m.delete_snapshot(&snap, false).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
pub struct CopyQuery {
    #[serde(default = "one")]
    times: u32,
}

fn one() -> u32 {
    1
}

/// L13: `times` copies of a running sandbox: the daemon's fork (a memory checkpoint in
/// place, then that many sandboxes from it). Answers 422 with the same body when a copy
/// failed, as Tensorlake does for partial copies.
pub async fn copy(
    State(m): State<AppState>,
    Path((_ns, id)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<CopyQuery>,
    SandboxUrl(url): SandboxUrl,
) -> ApiResult<Response> {
    let source = m.get(&id)?.id;
    let req = ForkRequest {
        count: q.times,
        ..Default::default()
    };
    let result = m.fork_sandbox(&source, req).await?;
    let all_ok = result.children.iter().all(|c| c.sandbox.is_some());
    let copies: Vec<Created> = result
        .children
        .into_iter()
        .map(|c| copy_of(c, url.as_deref()))
        .collect();
    let status = if all_ok {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    let body = json!({"source_sandbox_id": source, "sandboxes": copies});
    Ok((status, Json(body)).into_response())
}

fn copy_of(c: ForkChild, url: Option<&str>) -> Created {
    match (c.sandbox, c.error) {
        (Some(s), _) => Created::of(s, url),
        (None, e) => Created {
            sandbox_id: String::new(),
            status: "failed",
            name: None,
            sandbox_url: None,
            reason: e.as_ref().map(|e| e.code.clone()),
            error_details: e.map(|e| e.message),
        },
    }
}
