//! Terminal sessions: a process on a pseudo-terminal, driven over a WebSocket.
//!
//! On the socket, binary messages are terminal bytes both ways: input from the client,
//! output from the sandbox. Text messages are JSON control messages: the client sends
//! `{"type": "resize", "cols": C, "rows": R}` (or `{"type": "input", "data": "..."}`); the
//! daemon sends `{"type": "offset", "offset": N}` before output that does not follow on
//! from the last (the first output, or after a gap the agent's buffer dropped), and
//! `{"type": "exit", "exit_code": .., "signal": ..}` when the process ends, then closes
//! with 1000. A session interrupted by a memory checkpoint or a suspend closes with 1012
//! (the process goes on): the client reconnects with `?offset=` the next byte it expects.

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::exec::to_agent;
use super::extract::{ApiJson, ApiQuery};
use super::ndjson::exit_parts;
use super::spawn::view;
use super::{ApiResult, AppState};
use crate::backend::{ExecEvent, PtyChannel, PtyInput};
use crate::error::Error;
use api_types::{CreatePty, ErrorBody, ExecRequest, Process, PtyConnectQuery, PtySize};

/// What runs when a session names no command: a login bash where there is one.
const DEFAULT_SHELL: &str = "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l";

/// Largest WebSocket message accepted from a client.
const MAX_MESSAGE: usize = 1 << 20;

fn wire_size(size: PtySize) -> proto::agent::PtySize {
    proto::agent::PtySize {
        cols: size.cols,
        rows: size.rows,
    }
}

/// Start a terminal session: a process on a new pseudo-terminal. Attach with
/// `GET .../pty/{pid}/connect`; stop it like any process (`DELETE .../processes/{pid}`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty", tag = "pty",
    params(("id" = String, Path)), request_body = CreatePty,
    responses((status = 201, body = Process), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create(
    State(m): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CreatePty>,
) -> ApiResult<(StatusCode, Json<Process>)> {
    let size = PtySize {
        cols: req.cols.unwrap_or(80),
        rows: req.rows.unwrap_or(24),
    };
    let (command, args) = match req.command {
        Some(c) => (c, req.args),
        None if req.args.is_empty() => ("/bin/sh".into(), vec!["-c".into(), DEFAULT_SHELL.into()]),
        None => return Err(Error::InvalidArgument("args given without a command".into()).into()),
    };
    let mut exec = to_agent(ExecRequest {
        command,
        args,
        env: req.env,
        working_dir: req.working_dir,
        user: req.user,
        stdin: None,
        stdin_b64: None,
        timeout_secs: None,
        stream: false,
    })?;
    exec.stdin = proto::agent::StdinMode::Stream;
    let info = m.spawn_pty(&id, exec.into(), wire_size(size)).await?;
    Ok((StatusCode::CREATED, Json(view(info))))
}

/// Resize a terminal session (its foreground program gets SIGWINCH).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{pid}/resize", tag = "pty",
    params(("id" = String, Path), ("pid" = String, Path)), request_body = PtySize,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn resize(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiJson(size): ApiJson<PtySize>,
) -> ApiResult<StatusCode> {
    let pid = m.resolve_pid(&id, &pid).await?;
    m.resize_pty(&id, pid, wire_size(size)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Attach to a terminal session (WebSocket; see the module's protocol). Any number of
/// clients may attach; each sees the output from its `offset` and may type.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty/{pid}/connect", tag = "pty",
    params(("id" = String, Path), ("pid" = String, Path), PtyConnectQuery),
    responses((status = 101, description = "WebSocket session"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn connect(
    State(m): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<PtyConnectQuery>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let upgrade = upgrade.map_err(|e| {
        Error::InvalidArgument(format!("This route is a WebSocket; connect with one ({e})"))
    })?;
    let pid = m.resolve_pid(&id, &pid).await?;
    let channel = m.pty_connect(&id, pid, q.offset).await?;
    Ok(upgrade
        .max_message_size(MAX_MESSAGE)
        .on_upgrade(move |socket| session(socket, channel)))
}

/// A control message from the client.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Control {
    Resize { cols: u16, rows: u16 },
    Input { data: String },
}

/// How a session ended, as told to the client.
enum End {
    Exited(serde_json::Value),
    Interrupted,
    Failed(String),
    ClientLeft,
}

/// Output and input go separately: typed input waiting for a busy terminal never holds
/// back the terminal's output, and a client that stops reading never holds back input.
async fn session(socket: WebSocket, mut ch: PtyChannel) {
    let (mut out, inp) = socket.split();
    let (notes_tx, mut notes) = mpsc::channel::<String>(8);
    let mut input = tokio::spawn(forward_input(inp, ch.input.clone(), notes_tx));
    let mut expected: Option<u64> = None;
    let end = loop {
        tokio::select! {
            ev = ch.output.recv() => match ev {
                Some(Ok(ExecEvent::Output { offset, data, .. })) => {
                    let mut sent = Ok(());
                    if expected != Some(offset) {
                        let note = serde_json::json!({"type": "offset", "offset": offset});
                        sent = out.send(Message::Text(note.to_string().into())).await;
                    }
                    expected = Some(offset + data.len() as u64);
                    if sent.is_err() || out.send(Message::Binary(data)).await.is_err() {
                        break End::ClientLeft;
                    }
                }
                Some(Ok(ExecEvent::Dropped { .. })) => {}
                Some(Ok(ExecEvent::Exit(x))) => {
                    let (code, signal) = exit_parts(&x);
                    break End::Exited(serde_json::json!(
                        {"type": "exit", "exit_code": code, "signal": signal}
                    ));
                }
                Some(Err(e)) => break End::Failed(e.to_string()),
                None => break End::Interrupted,
            },
            Some(note) = notes.recv() => {
                if out.send(Message::Text(note.into())).await.is_err() {
                    break End::ClientLeft;
                }
            }
            ended = &mut input => break ended.unwrap_or(End::ClientLeft),
        }
    };
    input.abort();
    let (code, reason) = match end {
        End::ClientLeft => return,
        End::Exited(note) => {
            let _ = out.send(Message::Text(note.to_string().into())).await;
            (1000, "process exited".to_string())
        }
        End::Interrupted => (
            1012,
            "session interrupted (checkpoint or suspend); reconnect with the offset".into(),
        ),
        End::Failed(e) => (1011, e),
    };
    let frame = CloseFrame {
        code,
        reason: truncate(&reason, 120).into(),
    };
    let _ = out.send(Message::Close(Some(frame))).await;
}

/// Passes the client's frames on until it leaves (or the session ends); a refused control
/// message becomes a note for the client.
async fn forward_input(
    mut inp: futures::stream::SplitStream<WebSocket>,
    to: mpsc::Sender<PtyInput>,
    notes: mpsc::Sender<String>,
) -> End {
    loop {
        match inp.next().await {
            Some(Ok(Message::Binary(data))) => {
                if to.send(PtyInput::Data(data)).await.is_err() {
                    return End::Interrupted;
                }
            }
            Some(Ok(Message::Text(text))) => {
                if let Err(reason) = control(&to, text.as_str()).await {
                    let note = serde_json::json!({"type": "error", "message": reason});
                    let _ = notes.send(note.to_string()).await;
                }
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            Some(Ok(Message::Close(_)) | Err(_)) | None => return End::ClientLeft,
        }
    }
}

/// Applies one control message; `Err` is the reason it was refused.
async fn control(to: &mpsc::Sender<PtyInput>, text: &str) -> Result<(), String> {
    let msg: Control =
        serde_json::from_str(text).map_err(|e| format!("invalid control message: {e}"))?;
    let input = match msg {
        Control::Resize { cols, rows } => {
            PtyInput::Resize(proto::agent::PtySize { cols, rows }.check()?)
        }
        Control::Input { data } => PtyInput::Data(data.into_bytes().into()),
    };
    to.send(input)
        .await
        .map_err(|_| "the session has ended".to_string())
}

/// At most `max` bytes of `s`, cut at a character boundary (close reasons are short).
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
