//! Background processes.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use proto::agent::{ProcessInfo, ProcessState};

use super::exec::to_agent;
use super::extract::{parse_pid, ApiJson, ApiQuery};
use super::ndjson::{exit_parts, stream_response};
use super::types::{
    ErrorBody, ExecRequest, OutputQuery, Process, ProcessList, SignalRequest, SignalSpec,
    StreamEvent, WaitQuery,
};
use super::{ApiResult, AppState};
use crate::backend::BackendError;
use crate::error::Error;

fn rfc3339_ms(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The API view of a process.
pub fn view(p: ProcessInfo) -> Process {
    let mut argv = p.command.into_iter();
    let command = argv.next().unwrap_or_default();
    let (state, exit_code, signal) = match p.state {
        ProcessState::Running => ("running", None, None),
        ProcessState::Exited(e) => {
            let (c, s) = exit_parts(&e);
            ("exited", c, s)
        }
    };
    Process {
        pid: p.id,
        os_pid: p.pid,
        command,
        args: argv.collect(),
        state: state.into(),
        exit_code,
        signal,
        started_at: rfc3339_ms(p.started_unix_ms),
        stdout_len: p.stdout_len,
        stderr_len: p.stderr_len,
    }
}

/// A signal number from a number or a name such as `TERM` or `SIGKILL`.
pub fn signal_number(s: &SignalSpec) -> Result<i32, Error> {
    const NAMES: [(&str, i32); 11] = [
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("PIPE", 13),
        ("ALRM", 14),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
    ];
    let n = match s {
        SignalSpec::Number(n) => Some(*n).filter(|n| (1..=64).contains(n)),
        SignalSpec::Name(name) => {
            let upper = name.to_ascii_uppercase();
            let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
            NAMES.iter().find(|(n, _)| *n == bare).map(|(_, v)| *v)
        }
    };
    n.ok_or_else(|| Error::InvalidArgument(format!("Unknown signal {s:?}")))
}

/// Start a background process.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path)), request_body = ExecRequest,
    responses((status = 201, body = Process), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn spawn(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> ApiResult<(StatusCode, Json<Process>)> {
    if req.stream {
        return Err(Error::InvalidArgument("stream does not apply to processes".into()).into());
    }
    let mut req = to_agent(req)?;
    if req.stdin == proto::agent::StdinMode::Null {
        // Background processes get a pipe, fed through the stdin routes.
        req.stdin = proto::agent::StdinMode::Stream;
    }
    let info = m.spawn(&id, req).await?;
    Ok((StatusCode::CREATED, Json(view(info))))
}

/// List background processes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path)),
    responses((status = 200, body = ProcessList), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<ProcessList>> {
    let processes = m.processes(&id).await?.into_iter().map(view).collect();
    Ok(Json(ProcessList { processes }))
}

/// One background process.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)),
    responses((status = 200, body = Process), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> ApiResult<Json<Process>> {
    Ok(Json(view(m.process(&id, parse_pid(&pid)?).await?)))
}

/// Stream a process's output (NDJSON, events carry offsets).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path), OutputQuery),
    responses((status = 200, body = StreamEvent, content_type = "application/x-ndjson"),
        (status = 404, body = ErrorBody)))]
pub async fn output(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> ApiResult<Response> {
    let pid = parse_pid(&pid)?;
    // An unknown process is a 404, not a 200 whose stream holds only an error line.
    m.process(&id, pid).await?;
    let events = m
        .attach(&id, pid, (q.offset, q.stderr_offset), q.follow)
        .await?;
    Ok(stream_response(events, Instant::now()))
}

/// Write to a process's stdin (raw body).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn stdin(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    req: axum::extract::Request,
) -> ApiResult<StatusCode> {
    let pid = parse_pid(&pid)?;
    let data: Bytes = super::extract::read_limited(req, m.config().max_json_bytes).await?;
    m.write_stdin(&id, pid, data).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Close a process's stdin.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin/close", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn close_stdin(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    m.close_stdin(&id, parse_pid(&pid)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Send a signal to a process (its process group).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path)), request_body = SignalRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn signal(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiJson(req): ApiJson<SignalRequest>,
) -> ApiResult<StatusCode> {
    let pid = parse_pid(&pid)?;
    m.signal(&id, pid, signal_number(&req.signal)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Wait for a process to exit; returns it (still running if the timeout passed).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/wait", tag = "processes",
    params(("id" = String, Path), ("pid" = u64, Path), WaitQuery),
    responses((status = 200, body = Process), (status = 404, body = ErrorBody)))]
pub async fn wait(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> ApiResult<Json<Process>> {
    let pid = parse_pid(&pid)?;
    let timeout_ms = match q.timeout_secs {
        Some(t) if !(t.is_finite() && t >= 0.0) => {
            return Err(Error::InvalidArgument("timeout_secs must not be negative".into()).into())
        }
        t => t.map(|t| (t * 1000.0) as u64),
    };
    match m.wait(&id, pid, timeout_ms).await {
        Ok(_) | Err(Error::Backend(BackendError::TimedOut(_))) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Json(view(m.process(&id, pid).await?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(signal_number(&SignalSpec::Name("TERM".into())).unwrap(), 15);
        assert_eq!(
            signal_number(&SignalSpec::Name("sigkill".into())).unwrap(),
            9
        );
        assert_eq!(signal_number(&SignalSpec::Number(2)).unwrap(), 2);
        assert!(signal_number(&SignalSpec::Number(0)).is_err());
        assert!(signal_number(&SignalSpec::Name("BOGUS".into())).is_err());
    }
}
