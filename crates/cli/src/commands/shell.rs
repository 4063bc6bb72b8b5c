//! `sandfork shell`: an interactive terminal in a sandbox — a terminal session driven over
//! the daemon's WebSocket, with the local terminal in raw mode, resizes forwarded, and a
//! reconnect (from the last byte seen) when a checkpoint or suspend interrupts it.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use hyper::Method;
use nix::sys::termios::{self, SetArg, Termios};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

use crate::client::{encode_segment, Client};

/// Reconnects tried after an interruption before giving up.
const RECONNECTS: u32 = 50;

/// Opens a terminal session (or attaches to session `attach`) and runs it until the
/// process exits; returns its exit code.
pub async fn shell(
    client: &Client,
    id: &str,
    attach: Option<String>,
    command: Vec<String>,
) -> Result<i32> {
    let (cols, rows) = terminal_size().unwrap_or((80, 24));
    let pid = match attach {
        Some(pid) => pid,
        None => {
            let mut body = json!({"cols": cols, "rows": rows});
            if let Some((program, args)) = command.split_first() {
                body["command"] = json!(program);
                body["args"] = json!(args);
            }
            let route = format!("/v1/sandboxes/{}/pty", encode_segment(id));
            let p: Value = client.json(Method::POST, &route, Some(&body)).await?;
            p["pid"].to_string()
        }
    };
    let _raw = RawMode::enter()?;
    let mut input = stdin_channel();
    let mut offset = 0;
    for _ in 0..RECONNECTS {
        let end = session(client, id, &pid, &mut offset, &mut input).await?;
        match end {
            End::Exited(code) => return Ok(code),
            End::Interrupted => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    bail!("the session kept being interrupted; attach again with `sandfork shell {id} --attach {pid}`")
}

enum End {
    Exited(i32),
    /// A checkpoint or suspend closed the connection; the process goes on.
    Interrupted,
}

async fn session(
    client: &Client,
    id: &str,
    pid: &str,
    offset: &mut u64,
    input: &mut Keys,
) -> Result<End> {
    let route = format!(
        "/v1/sandboxes/{}/pty/{}/connect?offset={offset}",
        encode_segment(id),
        encode_segment(pid)
    );
    let mut req = format!("ws://{}{route}", client.host()).into_client_request()?;
    if let Some(t) = client.token() {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse()?);
    }
    let stream = client.stream().await?;
    let (ws, _) = tokio_tungstenite::client_async(req, stream)
        .await
        .context("cannot open the terminal session")?;
    let (mut tx, mut rx) = ws.split();
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut stdout = std::io::stdout();
    let mut exit_code = None;
    loop {
        tokio::select! {
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    *offset += data.len() as u64;
                    stdout.write_all(&data)?;
                    stdout.flush()?;
                }
                Some(Ok(Message::Text(text))) => {
                    let v: Value = serde_json::from_str(text.as_str()).unwrap_or_default();
                    match v["type"].as_str() {
                        Some("offset") => *offset = v["offset"].as_u64().unwrap_or(*offset),
                        Some("exit") => {
                            let signal = v["signal"].as_i64().map(|s| 128 + s as i32);
                            exit_code = v["exit_code"].as_i64().map(|c| c as i32).or(signal);
                        }
                        Some("error") => eprint!("\r\nsandfork: {}\r\n", v["message"]),
                        _ => {}
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    if let Some(code) = exit_code {
                        return Ok(End::Exited(code));
                    }
                    return match frame {
                        Some(f) if f.code == CloseCode::Restart => Ok(End::Interrupted),
                        Some(f) => bail!("the terminal session ended: {}", f.reason),
                        None => Ok(End::Interrupted),
                    };
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    return Ok(exit_code.map_or(End::Interrupted, End::Exited));
                }
            },
            data = input.rx.recv(), if !input.ended => match data {
                Some(data) => tx.send(Message::Binary(data.into())).await?,
                // Local input ended: end of file for the program too (^D), then its
                // output until it exits.
                None => {
                    input.ended = true;
                    tx.send(Message::Binary(vec![4].into())).await?;
                }
            },
            _ = winch.recv() => {
                if let Some((cols, rows)) = terminal_size() {
                    let msg = json!({"type": "resize", "cols": cols, "rows": rows});
                    tx.send(Message::Text(msg.to_string().into())).await?;
                }
            }
        }
    }
}

/// Local keystrokes, and whether they have ended.
struct Keys {
    rx: mpsc::Receiver<Vec<u8>>,
    ended: bool,
}

/// Local keystrokes, read on a thread of their own (a blocking read of a terminal cannot
/// be cancelled; the thread ends with the process).
fn stdin_channel() -> Keys {
    let (tx, rx) = mpsc::channel(64);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    Keys { rx, ended: false }
}

nix::ioctl_read_bad!(get_winsize, nix::libc::TIOCGWINSZ, nix::pty::Winsize);

/// The local terminal's size, when stdout is a terminal.
fn terminal_size() -> Option<(u16, u16)> {
    let mut ws = nix::pty::Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which outlives the call; fd 1 is
    // this process's stdout (an error if it is not a terminal, handled below).
    let ok = unsafe { get_winsize(1, &mut ws) }.is_ok();
    (ok && ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}

/// The local terminal in raw mode (keys go to the sandbox as typed, Ctrl-C included)
/// until dropped; nothing when stdin is not a terminal.
struct RawMode(Option<Termios>);

impl RawMode {
    fn enter() -> Result<RawMode> {
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(stdin.as_fd()) else {
            return Ok(RawMode(None));
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw)
            .context("cannot put the terminal in raw mode")?;
        Ok(RawMode(Some(saved)))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }
}
