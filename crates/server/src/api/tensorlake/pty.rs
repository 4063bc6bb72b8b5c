//! Terminal sessions (WIRE.md §8, D16-D18): the daemon's own terminal sessions with
//! Tensorlake's binary frames. A session is a process on a pseudo-terminal; its
//! `session_id` is its pid and its `token` a MAC of the pid under a key derived from the
//! daemon's secret for that sandbox, so nothing about it is stored.
//!
//! Frames are binary, byte 0 the opcode: `0x00` DATA (both ways), `0x01` RESIZE (cols and
//! rows, u16 big-endian), `0x02` READY (the client's first frame; output starts after
//! it), `0x03` EXIT (i32 big-endian), then a close 1000 with reason `exit:{code}`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

use super::super::extract::{ApiJson, ApiQuery};
use super::super::ndjson::exit_parts;
use super::super::{processes as native_processes, pty as native, ApiError, ApiResult, AppState};
use super::processes::{native_user, User};
use super::TlSandbox;
use crate::backend::{ExecEvent, PtyChannel, PtyInput};
use crate::error::Error;
use api_types::CreatePty;

/// Largest WebSocket message accepted from a client.
const MAX_MESSAGE: usize = 1 << 20;

/// How long a new connection waits for the client's READY before sending output anyway.
const READY_WAIT: Duration = Duration::from_secs(30);

const DATA: u8 = 0x00;
const RESIZE: u8 = 0x01;
const READY: u8 = 0x02;
const EXIT: u8 = 0x03;

/// `POST /api/v1/pty`.
#[derive(Debug, Deserialize)]
pub struct PtyBody {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    working_dir: Option<String>,
    user: Option<User>,
    rows: Option<u16>,
    cols: Option<u16>,
}

/// The token of session `pid` of sandbox `id`.
fn session_token(m: &AppState, id: &str, pid: u64) -> Result<String, ApiError> {
    let key = m.port_token(id)?;
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes())
        .map_err(|e| ApiError(Error::InvalidArgument(e.to_string())))?;
    mac.update(format!("tensorlake-pty:{pid}").as_bytes());
    Ok(mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// D16: start a terminal session.
pub async fn create(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    ApiJson(body): ApiJson<PtyBody>,
) -> ApiResult<Json<Value>> {
    let req = CreatePty {
        command: body.command,
        args: body.args,
        env: body.env,
        working_dir: body.working_dir,
        user: native_user(body.user)?,
        cols: body.cols,
        rows: body.rows,
    };
    let (_, Json(process)) =
        native::create(State(m.clone()), Path(id.clone()), ApiJson(req)).await?;
    let canonical = m.get(&id)?.id;
    let token = session_token(&m, &canonical, process.pid)?;
    Ok(Json(
        json!({"session_id": process.pid.to_string(), "token": token}),
    ))
}

/// D18: end a session (its process, as the native stop).
pub async fn kill(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path(session): Path<String>,
) -> ApiResult<StatusCode> {
    let pid = session_pid(&session)?;
    native_processes::stop(State(m), Path((id, pid.to_string()))).await
}

fn session_pid(session: &str) -> Result<u64, ApiError> {
    session
        .parse()
        .map_err(|_| ApiError(Error::NotFound(format!("No terminal session {session:?}"))))
}

#[derive(Debug, Deserialize)]
pub struct TokenQuery {
    token: Option<String>,
}

/// D17: attach over a WebSocket; the session's token comes as `X-PTY-Token` or `?token=`.
pub async fn connect(
    State(m): State<AppState>,
    TlSandbox(id): TlSandbox,
    Path(session): Path<String>,
    ApiQuery(q): ApiQuery<TokenQuery>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let upgrade = upgrade.map_err(|e| {
        Error::InvalidArgument(format!("This route is a WebSocket; connect with one ({e})"))
    })?;
    let pid = session_pid(&session)?;
    let canonical = m.get(&id)?.id;
    let given = headers
        .get("x-pty-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(q.token)
        .unwrap_or_default();
    let expected = session_token(&m, &canonical, pid)?;
    if !bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        return Err(ApiError(Error::Forbidden(format!(
            "The token does not open terminal session {pid}"
        ))));
    }
    let channel = m.pty_connect(&canonical, pid, 0).await?;
    Ok(upgrade
        .max_message_size(MAX_MESSAGE)
        .on_upgrade(move |socket| session_loop(socket, channel)))
}

/// A frame from the client.
#[derive(Debug, PartialEq, Eq)]
enum ClientFrame {
    Input(PtyInput),
    Ready,
    Ignored,
}

fn decode(frame: &Bytes) -> ClientFrame {
    match frame.first() {
        Some(&DATA) => ClientFrame::Input(PtyInput::Data(frame.slice(1..))),
        Some(&RESIZE) if frame.len() == 5 => {
            let size = proto::agent::PtySize {
                cols: u16::from_be_bytes([frame[1], frame[2]]),
                rows: u16::from_be_bytes([frame[3], frame[4]]),
            };
            size.check().map_or(ClientFrame::Ignored, |s| {
                ClientFrame::Input(PtyInput::Resize(s))
            })
        }
        Some(&READY) => ClientFrame::Ready,
        _ => ClientFrame::Ignored,
    }
}

/// How a session ended.
enum End {
    Exited(i32),
    Interrupted,
    Failed(String),
    ClientLeft,
}

type Incoming = futures::stream::SplitStream<WebSocket>;

/// Waits for READY, passing on input sent before it; `false` when the client left.
async fn await_ready(inp: &mut Incoming, to: &mpsc::Sender<PtyInput>) -> bool {
    let wait = async {
        loop {
            match inp.next().await {
                Some(Ok(Message::Binary(b))) => match decode(&b) {
                    ClientFrame::Ready => return true,
                    ClientFrame::Input(i) => {
                        if to.send(i).await.is_err() {
                            return false;
                        }
                    }
                    ClientFrame::Ignored => {}
                },
                Some(Ok(Message::Close(_)) | Err(_)) | None => return false,
                Some(Ok(_)) => {}
            }
        }
    };
    tokio::time::timeout(READY_WAIT, wait).await.unwrap_or(true)
}

async fn forward_input(mut inp: Incoming, to: mpsc::Sender<PtyInput>) {
    loop {
        match inp.next().await {
            Some(Ok(Message::Binary(b))) => {
                if let ClientFrame::Input(i) = decode(&b) {
                    if to.send(i).await.is_err() {
                        return;
                    }
                }
            }
            Some(Ok(Message::Close(_)) | Err(_)) | None => return,
            Some(Ok(_)) => {}
        }
    }
}

fn exit_code(x: &proto::agent::ExitInfo) -> i32 {
    match exit_parts(x) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => -1,
    }
}

async fn session_loop(socket: WebSocket, mut ch: PtyChannel) {
    let (mut out, mut inp) = socket.split();
    if !await_ready(&mut inp, &ch.input).await {
        return;
    }
    let mut input = tokio::spawn(forward_input(inp, ch.input.clone()));
    let end = loop {
        tokio::select! {
            ev = ch.output.recv() => match ev {
                Some(Ok(ExecEvent::Output { data, .. })) => {
                    let mut frame = Vec::with_capacity(data.len() + 1);
                    frame.push(DATA);
                    frame.extend_from_slice(&data);
                    if out.send(Message::Binary(frame.into())).await.is_err() {
                        break End::ClientLeft;
                    }
                }
                Some(Ok(ExecEvent::Dropped { .. })) => {}
                Some(Ok(ExecEvent::Exit(x))) => break End::Exited(exit_code(&x)),
                Some(Err(e)) => break End::Failed(e.to_string()),
                None => break End::Interrupted,
            },
            _ = &mut input => break End::ClientLeft,
        }
    };
    input.abort();
    let (code, reason) = match end {
        End::ClientLeft => return,
        End::Exited(code) => {
            let mut frame = vec![EXIT];
            frame.extend_from_slice(&code.to_be_bytes());
            let _ = out.send(Message::Binary(frame.into())).await;
            (1000, format!("exit:{code}"))
        }
        End::Interrupted => (
            1012,
            "session interrupted (checkpoint or suspend); reconnect".into(),
        ),
        End::Failed(e) => (1011, e.chars().take(100).collect()),
    };
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    let _ = out.send(Message::Close(Some(frame))).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_frames_decode() {
        let f = |b: &[u8]| decode(&Bytes::copy_from_slice(b));
        assert_eq!(f(&[READY]), ClientFrame::Ready);
        assert_eq!(
            f(b"\x00hi"),
            ClientFrame::Input(PtyInput::Data(Bytes::from_static(b"hi")))
        );
        assert_eq!(
            f(&[RESIZE, 0, 100, 0, 30]),
            ClientFrame::Input(PtyInput::Resize(proto::agent::PtySize {
                cols: 100,
                rows: 30
            }))
        );
        for bad in [
            &[RESIZE, 0, 0, 0, 30][..],
            &[RESIZE, 1][..],
            &[9][..],
            &[][..],
        ] {
            assert_eq!(f(bad), ClientFrame::Ignored, "{bad:?}");
        }
    }
}
