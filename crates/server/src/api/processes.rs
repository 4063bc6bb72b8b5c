//! Background processes.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;

use super::extract::{ApiJson, ApiQuery};
use super::ndjson::stream_response;
use super::spawn::{to_spawn, view};
use super::{ApiResult, AppState};
use crate::backend::BackendError;
use crate::error::Error;
use api_types::{
    ErrorBody, OutputQuery, Process, ProcessList, SignalRequest, SignalSpec, SpawnProcess,
    StreamEvent, WaitQuery,
};

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

/// Start a background process (supervised with a `name`, `restart` or `health_check`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path)), request_body = SpawnProcess,
    responses((status = 201, body = Process), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn spawn(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<SpawnProcess>,
) -> ApiResult<(StatusCode, Json<Process>)> {
    let info = m.spawn(&id, to_spawn(req)?).await?;
    Ok((StatusCode::CREATED, Json(view(info))))
}

/// Stop a process and start it again with the same request (a new pid).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/restart", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path, description = "pid or name")),
    responses((status = 200, body = Process), (status = 404, body = ErrorBody)))]
pub async fn restart(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> ApiResult<Json<Process>> {
    let pid = m.resolve_pid(&id, &pid).await?;
    Ok(Json(view(m.restart_process(&id, pid).await?)))
}

/// Stop a process: SIGTERM to its group, SIGKILL after 2 s; a supervised one is not
/// restarted.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path, description = "pid or name")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn stop(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let pid = m.resolve_pid(&id, &pid).await?;
    m.stop_process(&id, pid).await?;
    Ok(StatusCode::NO_CONTENT)
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
    params(("id" = String, Path), ("pid" = String, Path, description = "pid or name")),
    responses((status = 200, body = Process), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> ApiResult<Json<Process>> {
    let pid = m.resolve_pid(&id, &pid).await?;
    Ok(Json(view(m.process(&id, pid).await?)))
}

/// Stream a process's output (NDJSON, events carry offsets).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path, description = "pid or name"), OutputQuery),
    responses((status = 200, body = StreamEvent, content_type = "application/x-ndjson"),
        (status = 404, body = ErrorBody)))]
pub async fn output(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> ApiResult<Response> {
    let pid = m.resolve_pid(&id, &pid).await?;
    // An unknown process is a 404, not a 200 whose stream holds only an error line.
    m.process(&id, pid).await?;
    let events = m
        .attach(&id, pid, (q.offset, q.stderr_offset), q.follow)
        .await?;
    Ok(stream_response(events, Instant::now()))
}

/// Write to a process's stdin (raw body).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path, description = "pid or name")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn stdin(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    req: axum::extract::Request,
) -> ApiResult<StatusCode> {
    let pid = m.resolve_pid(&id, &pid).await?;
    let data: Bytes = super::extract::read_limited(req, m.config().max_json_bytes).await?;
    m.write_stdin(&id, pid, data).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Close a process's stdin.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin/close", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path, description = "pid or name")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn close_stdin(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let pid = m.resolve_pid(&id, &pid).await?;
    m.close_stdin(&id, pid).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Send a signal to a process (its process group).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path, description = "pid or name")), request_body = SignalRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn signal(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiJson(req): ApiJson<SignalRequest>,
) -> ApiResult<StatusCode> {
    let pid = m.resolve_pid(&id, &pid).await?;
    m.signal(&id, pid, signal_number(&req.signal)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Wait for a process to exit; returns it (still running if the timeout passed).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/wait", tag = "processes",
    params(("id" = String, Path), ("pid" = String, Path, description = "pid or name"), WaitQuery),
    responses((status = 200, body = Process), (status = 404, body = ErrorBody)))]
pub async fn wait(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> ApiResult<Json<Process>> {
    let pid = m.resolve_pid(&id, &pid).await?;
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

/// The sandbox log: each line its background processes write (stdout as `info`, stderr
/// as `error`), in order, with when; NDJSON. `follow` keeps streaming (an empty line every
/// second while quiet); a memory checkpoint ends a followed log, and the client asks again
/// from the next `seq`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/logs", tag = "processes",
    params(("id" = String, Path), api_types::LogsQuery),
    responses((status = 200, description = "NDJSON of LogEntry", content_type = "application/x-ndjson", body = api_types::LogEntry),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn logs(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<api_types::LogsQuery>,
) -> ApiResult<Response> {
    let follow = q.follow;
    let lines = m.logs(&id, q).await?;
    Ok(if follow {
        super::ndjson::json_lines_with_heartbeat(lines)
    } else {
        super::ndjson::json_lines(lines)
    })
}
