//! `POST /v1/sandboxes/{id}/exec`: streamed NDJSON or one collected result.

use std::time::Instant;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use proto::agent::{self, OutputStream, StdinMode};

use super::extract::ApiJson;
use super::ndjson::{exit_parts, stream_response};
use super::{ApiResult, AppState};
use crate::backend::{ExecEvent, Stream};
use crate::error::Error;
use api_types::{ErrorBody, ExecRequest, ExecResult, StreamEvent};

/// Converts an API exec request into the agent's.
pub fn to_agent(req: ExecRequest) -> Result<agent::ExecRequest, Error> {
    if req.command.is_empty() {
        return Err(Error::InvalidArgument("command must not be empty".into()));
    }
    let stdin = match (req.stdin, req.stdin_b64) {
        (Some(_), Some(_)) => {
            return Err(Error::InvalidArgument(
                "Give stdin or stdin_b64, not both".into(),
            ))
        }
        (Some(s), None) => StdinMode::Bytes(s.into_bytes()),
        (None, Some(b)) => StdinMode::Bytes(
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| Error::InvalidArgument(format!("stdin_b64 is not base64: {e}")))?,
        ),
        (None, None) => StdinMode::Null,
    };
    let timeout_ms = match req.timeout_secs {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            return Err(Error::InvalidArgument(
                "timeout_secs must be positive".into(),
            ))
        }
        Some(t) => Some((t * 1000.0).ceil() as u64),
        None => None,
    };
    if let Some(d) = &req.working_dir {
        if !d.starts_with('/') {
            return Err(Error::InvalidArgument(
                "working_dir must be an absolute path".into(),
            ));
        }
    }
    Ok(agent::ExecRequest {
        command: req.command,
        args: req.args,
        env: req.env.into_iter().collect(),
        cwd: req.working_dir,
        user: req.user,
        stdin,
        timeout_ms,
    })
}

/// Run a command in a sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id or name")),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "The result (stream=false), or NDJSON events ending with an exit or error event (stream=true)",
            content((ExecResult = "application/json"), (StreamEvent = "application/x-ndjson"))),
        (status = 400, description = "Bad request or the command could not start", body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn exec(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> ApiResult<Response> {
    let stream = req.stream;
    let req = to_agent(req)?;
    let started = Instant::now();
    let events = m.exec(&id, req).await?;
    if stream {
        return Ok(stream_response(events, started));
    }
    let cap = m.config().max_exec_output_bytes;
    Ok(Json(collect(events, cap, started).await?).into_response())
}

/// Bytes of one output stream, capped by the size they take in the JSON answer.
#[derive(Default)]
struct Capped {
    data: Vec<u8>,
    /// Upper bound of the answer bytes `data` takes (see [`encoded_cost`]).
    cost: usize,
    truncated: bool,
}

/// The most bytes one output byte can take in the JSON answer: a control character is
/// escaped as `\u00XX`, and a byte that is not ASCII may be part of output that is not
/// UTF-8, which appears twice (lossy text, up to 3 bytes, and base64).
fn encoded_cost(b: u8) -> usize {
    match b {
        b'\n' | b'\t' | b'\r' | b'"' | b'\\' => 2,
        0x00..=0x1f => 6,
        0x80..=0xff => 5,
        _ => 1,
    }
}

impl Capped {
    /// Keeps as much of `bytes` as fits in `cap` bytes of answer: a flood of control
    /// characters or of bytes that are not UTF-8 must not cost the daemon six times `cap`.
    fn push(&mut self, bytes: &[u8], cap: usize) {
        if self.truncated {
            return;
        }
        let mut taken = 0;
        for &b in bytes {
            let cost = encoded_cost(b);
            if self.cost + cost > cap {
                self.truncated = true;
                break;
            }
            self.cost += cost;
            taken += 1;
        }
        self.data.extend_from_slice(&bytes[..taken]);
    }

    /// Text (lossy) and, when not valid UTF-8, the exact bytes in base64.
    fn finish(self) -> (String, Option<String>, bool) {
        match String::from_utf8(self.data) {
            Ok(s) => (s, None, self.truncated),
            Err(e) => {
                let b64 = base64::engine::general_purpose::STANDARD.encode(e.as_bytes());
                (
                    String::from_utf8_lossy(e.as_bytes()).into_owned(),
                    Some(b64),
                    self.truncated,
                )
            }
        }
    }
}

/// Collects a whole exec into one result.
async fn collect(
    mut events: Stream<ExecEvent>,
    cap: usize,
    started: Instant,
) -> ApiResult<ExecResult> {
    let (mut out, mut err) = (Capped::default(), Capped::default());
    while let Some(ev) = events.recv().await {
        match ev? {
            ExecEvent::Output {
                stream: OutputStream::Stdout,
                data,
                ..
            } => out.push(&data, cap),
            ExecEvent::Output {
                stream: OutputStream::Stderr,
                data,
                ..
            } => err.push(&data, cap),
            ExecEvent::Dropped {
                stream: OutputStream::Stdout,
                ..
            } => out.truncated = true,
            ExecEvent::Dropped {
                stream: OutputStream::Stderr,
                ..
            } => err.truncated = true,
            ExecEvent::Exit(exit) => {
                let (exit_code, signal) = exit_parts(&exit);
                let (stdout, stdout_b64, stdout_truncated) = out.finish();
                let (stderr, stderr_b64, stderr_truncated) = err.finish();
                return Ok(ExecResult {
                    stdout,
                    stderr,
                    stdout_b64,
                    stderr_b64,
                    exit_code,
                    signal,
                    timed_out: exit.timed_out,
                    duration_ms: started.elapsed().as_millis() as u64,
                    stdout_truncated,
                    stderr_truncated,
                });
            }
        }
    }
    Err(Error::Backend(crate::backend::BackendError::Unavailable(
        "Agent connection closed before the command exited".into(),
    ))
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_capped_by_its_size_in_the_answer() {
        let mut text = Capped::default();
        text.push(b"abcdef", 4);
        assert_eq!((text.data.as_slice(), text.truncated), (&b"abcd"[..], true));
        let mut zeros = Capped::default();
        zeros.push(&[0u8; 100], 60);
        zeros.push(b"a", 60);
        assert_eq!((zeros.data.len(), zeros.truncated), (10, true));
        let (stdout, _, truncated) = zeros.finish();
        assert!(serde_json::to_string(&stdout).unwrap().len() <= 60 + 2);
        assert!(truncated);
        let mut binary = Capped::default();
        binary.push(&[0xffu8; 100], 50);
        let (lossy, b64, _) = binary.finish();
        let answer = serde_json::to_string(&lossy).unwrap().len() + b64.unwrap().len();
        assert!(answer <= 50 + 2, "{answer}");
    }

    #[test]
    fn requests_convert_and_are_checked() {
        let r = to_agent(ExecRequest {
            command: "echo".into(),
            stdin_b64: Some("aGk=".into()),
            timeout_secs: Some(1.5),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.stdin, StdinMode::Bytes(b"hi".to_vec()));
        assert_eq!(r.timeout_ms, Some(1500));
        for bad in [
            ExecRequest::default(),
            ExecRequest {
                command: "x".into(),
                timeout_secs: Some(-1.0),
                ..Default::default()
            },
            ExecRequest {
                command: "x".into(),
                stdin_b64: Some("!!".into()),
                ..Default::default()
            },
            ExecRequest {
                command: "x".into(),
                working_dir: Some("rel".into()),
                ..Default::default()
            },
        ] {
            assert_eq!(to_agent(bad).unwrap_err().status_code().0, 400);
        }
    }

    #[test]
    fn capped_output_truncates_and_keeps_binary() {
        let mut c = Capped::default();
        c.push(b"hello", 3);
        c.push(b"x", 3);
        assert_eq!(c.finish(), ("hel".into(), None, true));
        let mut c = Capped::default();
        c.push(&[0xff], 10);
        let (text, b64, _) = c.finish();
        assert_eq!(text, "\u{fffd}");
        assert_eq!(b64.as_deref(), Some("/w=="));
    }
}
