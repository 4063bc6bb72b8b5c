//! Data-plane processes (WIRE.md §5, D1-D11), health and info (D19, D20). A run is the
//! daemon's exec; a started process is its background process; `{proc}` is a pid or a
//! supervised process's name, resolved as the native routes resolve it.

use std::collections::BTreeMap;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::super::exec::to_agent;
use super::super::extract::ApiJson;
use super::super::spawn::{to_spawn, view};
use super::super::{processes as native, ApiError, ApiResult, AppState};
use super::shapes::unix_millis;
use super::sse::{self, Filter};
use super::TlSandbox;
use crate::error::Error;
use api_types::{
    ExecRequest, HealthCheckConfig, ManagedProcess, OutputModeName, Process, RestartConfig,
    SignalSpec, SpawnProcess, StdinModeName,
};

/// `user`: a name, `uid:gid`, or `{name?, uid?, gid?}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum User {
    Spec(String),
    Parts {
        name: Option<String>,
        uid: Option<u32>,
        gid: Option<u32>,
    },
}

impl User {
    /// The daemon's spelling: `name`, `uid` or `uid:gid`.
    fn native(self) -> Result<String, ApiError> {
        match self {
            User::Spec(s) => Ok(s),
            User::Parts {
                uid: Some(uid),
                gid,
                ..
            } => Ok(gid.map_or(uid.to_string(), |g| format!("{uid}:{g}"))),
            User::Parts {
                name: Some(name),
                gid: None,
                ..
            } => Ok(name),
            User::Parts { .. } => Err(ApiError(Error::InvalidArgument(
                "user needs a name or a uid (a gid goes with a uid)".into(),
            ))),
        }
    }
}

pub(super) fn native_user(u: Option<User>) -> Result<Option<String>, ApiError> {
    u.map(User::native).transpose()
}

/// `POST /api/v1/processes/run` (WIRE.md §6.9).
#[derive(Debug, Deserialize)]
pub struct RunBody {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    working_dir: Option<String>,
    /// Seconds.
    timeout: Option<f64>,
    user: Option<User>,
}

/// `POST /api/v1/processes` (WIRE.md §6.9).
#[derive(Debug, Deserialize)]
pub struct StartBody {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    working_dir: Option<String>,
    user: Option<User>,
    stdin_mode: Option<StdinModeName>,
    stdout_mode: Option<OutputModeName>,
    stderr_mode: Option<OutputModeName>,
    name: Option<String>,
    restart: Option<RestartConfig>,
    health_check: Option<HealthCheckConfig>,
    /// Seconds (sandfork's own: the process is killed after it).
    timeout: Option<f64>,
}

impl StartBody {
    fn native(self) -> Result<SpawnProcess, ApiError> {
        Ok(SpawnProcess {
            command: self.command,
            args: self.args,
            env: self.env,
            working_dir: self.working_dir,
            user: native_user(self.user)?,
            timeout_secs: self.timeout,
            name: self.name,
            // Tensorlake's default is a closed stdin; the daemon's a pipe.
            stdin_mode: Some(self.stdin_mode.unwrap_or(StdinModeName::Closed)),
            stdout_mode: self.stdout_mode,
            stderr_mode: self.stderr_mode,
            restart: self.restart,
            health_check: self.health_check,
            ..Default::default()
        })
    }
}

/// ProcessInfo (WIRE.md §6.10).
#[derive(Debug, Serialize)]
pub struct ProcessInfo {
    pid: u64,
    status: String,
    command: String,
    args: Vec<String>,
    started_at: String,
    exit_code: Option<i32>,
    signal: Option<i32>,
    stdin_writable: bool,
    ended_at: Option<String>,
    oom_killed: bool,
    name: Option<String>,
    managed: Option<ManagedProcess>,
}

impl From<Process> for ProcessInfo {
    fn from(p: Process) -> Self {
        ProcessInfo {
            pid: p.pid,
            status: p.status,
            command: p.command,
            args: p.args,
            started_at: p.started_at,
            exit_code: p.exit_code,
            signal: p.signal,
            stdin_writable: p.stdin_writable,
            ended_at: p.ended_at,
            oom_killed: false,
            name: p.name,
            managed: p.managed,
        }
    }
}

/// D1: run a command to its end, its output and exit as server-sent events.
pub async fn run(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    ApiJson(body): ApiJson<RunBody>,
) -> ApiResult<Response> {
    let req = to_agent(ExecRequest {
        command: body.command,
        args: body.args,
        env: body.env,
        working_dir: body.working_dir,
        user: native_user(body.user)?,
        timeout_secs: body.timeout,
        ..Default::default()
    })?;
    let events = m.exec(&id, req).await?;
    Ok(sse::response(events, Filter::BOTH, true))
}

/// D2: start a background process.
pub async fn start(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    ApiJson(body): ApiJson<StartBody>,
) -> ApiResult<Json<ProcessInfo>> {
    let info = m.spawn(&id, to_spawn(body.native()?)?).await?;
    Ok(Json(view(info).into()))
}

/// D3: every process.
pub async fn list(State(m): State<AppState>, TlSandbox(id): TlSandbox) -> ApiResult<Json<Value>> {
    let processes: Vec<ProcessInfo> = m
        .processes(&id)
        .await?
        .into_iter()
        .map(|p| view(p).into())
        .collect();
    Ok(Json(json!({ "processes": processes })))
}

/// D4: one process.
pub async fn get(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path(proc): Path<String>,
) -> ApiResult<Json<ProcessInfo>> {
    let pid = m.resolve_pid(&id, &proc).await?;
    Ok(Json(view(m.process(&id, pid).await?).into()))
}

/// D5: kill (SIGTERM to its group, SIGKILL after 2 s, as the native stop).
pub async fn kill(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path(proc): Path<String>,
) -> ApiResult<StatusCode> {
    native::stop(State(m), Path((id, proc))).await
}

#[derive(Debug, Deserialize)]
pub struct SignalBody {
    signal: SignalSpec,
}

/// D6: send a signal.
pub async fn signal(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path(proc): Path<String>,
    ApiJson(body): ApiJson<SignalBody>,
) -> ApiResult<Json<Value>> {
    let pid = m.resolve_pid(&id, &proc).await?;
    m.signal(&id, pid, native::signal_number(&body.signal)?)
        .await?;
    Ok(Json(json!({"success": true})))
}

/// D7: write to stdin (raw body, bounded like the native route).
pub async fn stdin(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path(proc): Path<String>,
    req: Request,
) -> ApiResult<StatusCode> {
    native::stdin(State(m), Path((id, proc)), req).await
}

/// D8: close stdin.
pub async fn close_stdin(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path(proc): Path<String>,
) -> ApiResult<StatusCode> {
    native::close_stdin(State(m), Path((id, proc))).await
}

/// D11: restart (a new pid).
pub async fn restart(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path(proc): Path<String>,
) -> ApiResult<Json<ProcessInfo>> {
    let pid = m.resolve_pid(&id, &proc).await?;
    Ok(Json(view(m.restart_process(&id, pid).await?).into()))
}

fn filter_of(name: &str) -> Result<Filter, ApiError> {
    Filter::named(name).ok_or_else(|| {
        ApiError(Error::NotFound(format!(
            "No output stream {name:?}: use stdout, stderr or output"
        )))
    })
}

/// D9: the output so far, as lines.
pub async fn output(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path((proc, stream)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let filter = filter_of(&stream)?;
    let pid = m.resolve_pid(&id, &proc).await?;
    m.process(&id, pid).await?;
    let events = m.attach(&id, pid, (0, 0), false).await?;
    let lines = sse::collect(events, filter, m.config().max_exec_output_bytes).await;
    Ok(Json(
        json!({"pid": pid, "line_count": lines.len(), "lines": lines}),
    ))
}

/// D10: the output as server-sent events until the process has exited.
pub async fn follow(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path((proc, stream)): Path<(String, String)>,
) -> ApiResult<Response> {
    let filter = filter_of(&stream)?;
    let pid = m.resolve_pid(&id, &proc).await?;
    // An unknown process is a 404, not a stream that ends at once.
    m.process(&id, pid).await?;
    let events = m.attach(&id, pid, (0, 0), true).await?;
    Ok(sse::response(events, filter, false))
}

/// D19: whether the sandbox's agent answers (a suspended sandbox resumes first, as on any
/// data-plane request).
pub async fn health(State(m): State<AppState>, TlSandbox(id): TlSandbox) -> ApiResult<Json<Value>> {
    m.get(&id)?;
    let healthy = m.processes(&id).await.is_ok();
    Ok(Json(json!({ "healthy": healthy })))
}

/// D20: the daemon's version, the sandbox's age and its processes.
pub async fn info(State(m): State<AppState>, TlSandbox(id): TlSandbox) -> ApiResult<Json<Value>> {
    let sandbox = m.get(&id)?;
    let processes = m.processes(&id).await?;
    let running = processes
        .iter()
        .filter(|p| matches!(p.state, proto::agent::ProcessState::Running))
        .count();
    let now = crate::manager::unix_now() as i64;
    let uptime = unix_millis(&sandbox.created_at).map_or(0, |ms| (now - ms / 1000).max(0));
    Ok(Json(json!({
        "version": crate::VERSION,
        "uptime_secs": uptime,
        "running_processes": running,
        "total_processes": processes.len(),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_translate() {
        let u = |s: &str| serde_json::from_str::<User>(s).unwrap().native();
        assert_eq!(u(r#""alice""#).unwrap(), "alice");
        assert_eq!(u(r#"{"uid": 1000, "gid": 100}"#).unwrap(), "1000:100");
        assert_eq!(u(r#"{"uid": 1000}"#).unwrap(), "1000");
        assert_eq!(u(r#"{"name": "bob"}"#).unwrap(), "bob");
        assert!(u(r#"{"gid": 5}"#).is_err());
    }

    #[test]
    fn a_started_process_has_a_closed_stdin_unless_asked() {
        let body: StartBody = serde_json::from_str(r#"{"command": "sleep"}"#).unwrap();
        assert_eq!(
            body.native().unwrap().stdin_mode,
            Some(StdinModeName::Closed)
        );
        let body: StartBody =
            serde_json::from_str(r#"{"command": "cat", "stdin_mode": "pipe"}"#).unwrap();
        assert_eq!(body.native().unwrap().stdin_mode, Some(StdinModeName::Pipe));
    }
}
