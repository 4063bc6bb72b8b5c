//! envd's `process.Process` service over the daemon's background processes.
//!
//! `Start` spawns a background process (on a terminal for `pty`) and follows its output,
//! so the process outlives its stream as envd's does: `Connect` follows it again, from
//! the output it has reached. E2B's pid is the daemon's process id.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine;
use futures::StreamExt;
use proto::agent::{ExitInfo, ExitStatus, OutputStream, ProcessState, StdinMode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, StreamOut, Ticker};
use super::envd::{self, Ctx};
use super::errors::{Code, RpcErr};
use super::{E2bState, Shared};
use crate::backend::ExecEvent;

/// Terminal processes remembered before those of sandboxes gone are forgotten.
const MAX_TERMINALS: usize = 4096;
/// Re-attachments of one stream after its agent connection dropped, before giving up.
const MAX_REATTACH: u32 = 5;

#[derive(Debug, Default, Deserialize)]
struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Size {
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

#[derive(Debug, Default, Deserialize)]
struct Pty {
    size: Option<Size>,
}

#[derive(Debug, Deserialize)]
struct StartReq {
    #[serde(default)]
    process: ProcessConfig,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct Selector {
    pid: Option<u64>,
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Selected {
    #[serde(default)]
    process: Selector,
}

#[derive(Debug, Default, Deserialize)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SendInputReq {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    input: Input,
}

#[derive(Debug, Deserialize)]
struct SignalReq {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    signal: Value,
}

#[derive(Debug, Deserialize)]
struct UpdateReq {
    #[serde(default)]
    process: Selector,
    pty: Option<Pty>,
}

/// Terminal processes started through E2B (their output is `pty`, not `stdout`).
#[derive(Default)]
pub struct Terminals(Mutex<HashSet<(String, u64)>>);

impl Terminals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(String, u64)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn terminals() -> &'static Terminals {
    static T: std::sync::OnceLock<Terminals> = std::sync::OnceLock::new();
    T.get_or_init(Terminals::default)
}

/// `POST /process.Process/{method}`.
pub async fn call(State(s): State<E2bState>, Path(method): Path<String>, req: Request) -> Response {
    let streaming = matches!(method.as_str(), "Start" | "Connect" | "StreamInput");
    let fail = |e: RpcErr| envd::rpc_failure(streaming, e);
    let ctx = match envd::rpc_context(&s, req.headers(), streaming).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let (parts, body) = req.into_parts();
    if method == "StreamInput" {
        return stream_input(s, ctx, body).await;
    }
    let limit = s.manager.config().max_json_bytes;
    let bytes = match connect::read_body(body, limit).await {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    let result = match method.as_str() {
        "Start" => start(&s, &ctx, &parts.headers, &bytes).await,
        "Connect" => reconnect(&s, &ctx, &parts.headers, &bytes).await,
        "List" => list(&s, &ctx).await,
        "SendInput" => send_input(&s, &ctx, &bytes).await,
        "SendSignal" => send_signal(&s, &ctx, &bytes).await,
        "CloseStdin" => close_stdin(&s, &ctx, &bytes).await,
        "Update" => update(&s, &ctx, &bytes).await,
        other => Err(RpcErr::new(
            Code::Unimplemented,
            format!("process.Process/{other} is not a method of envd"),
        )),
    };
    result.unwrap_or_else(fail)
}

/// The agent's request for E2B's process config.
fn to_exec(
    ctx: &Ctx,
    p: ProcessConfig,
    deadline: Option<Duration>,
) -> Result<proto::agent::ExecRequest, RpcErr> {
    let cwd = match p.cwd.filter(|c| !c.is_empty()) {
        Some(c) => Some(ctx.path(&c).map_err(RpcErr::invalid)?),
        None => None,
    };
    let req = api_types::ExecRequest {
        command: p.cmd,
        args: p.args,
        env: p.envs,
        working_dir: cwd,
        user: ctx.agent_user(),
        timeout_secs: deadline.map(|d| d.as_secs_f64().max(0.001)),
        ..Default::default()
    };
    super::super::exec::to_agent(req).map_err(RpcErr::from)
}

async fn start(
    s: &E2bState,
    ctx: &Ctx,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<Response, RpcErr> {
    let req: StartReq = connect::stream_request(bytes, bytes.len().max(5))?;
    let mut exec = to_exec(ctx, req.process, connect::timeout(headers))?;
    let pty = req.pty.is_some();
    let info = if let Some(p) = req.pty {
        exec.stdin = StdinMode::Stream;
        let size = p.size.unwrap_or_default();
        let size = proto::agent::PtySize {
            cols: if size.cols == 0 { 80 } else { size.cols },
            rows: if size.rows == 0 { 24 } else { size.rows },
        };
        s.manager.spawn_pty(&ctx.id, exec.into(), size).await?
    } else {
        exec.stdin = if req.stdin.unwrap_or(true) {
            StdinMode::Stream
        } else {
            StdinMode::Null
        };
        let spawn = proto::agent::SpawnRequest {
            name: req.tag,
            ..exec.into()
        };
        s.manager.spawn(&ctx.id, spawn).await?
    };
    if pty {
        let mut t = terminals().lock();
        if t.len() >= MAX_TERMINALS {
            t.retain(|(id, _)| {
                s.manager
                    .get(id)
                    .is_ok_and(|v| super::shapes::state(v.state).is_some())
            });
        }
        t.insert((ctx.id.clone(), info.id));
    }
    let (out, resp) = connect::stream_response();
    let follow = Follow {
        s: s.clone(),
        id: ctx.id.clone(),
        pid: info.id,
        offsets: (0, 0),
        pty,
    };
    tokio::spawn(follow.run(out, connect::keepalive(headers)));
    Ok(resp)
}

/// `Connect`: follows a running process from the output it has reached.
async fn reconnect(
    s: &E2bState,
    ctx: &Ctx,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<Response, RpcErr> {
    let req: Selected = connect::stream_request(bytes, bytes.len().max(5))?;
    let pid = select(s, ctx, &req.process).await?;
    let info = running_process(s, ctx, pid).await?;
    let pty = terminals().lock().contains(&(ctx.id.clone(), pid));
    let (out, resp) = connect::stream_response();
    let follow = Follow {
        s: s.clone(),
        id: ctx.id.clone(),
        pid,
        offsets: (info.stdout_len, info.stderr_len),
        pty,
    };
    tokio::spawn(follow.run(out, connect::keepalive(headers)));
    Ok(resp)
}

/// The pid a selector names.
async fn select(s: &Shared, ctx: &Ctx, sel: &Selector) -> Result<u64, RpcErr> {
    match (sel.pid, &sel.tag) {
        (Some(pid), _) => Ok(pid),
        (None, Some(tag)) => {
            s.manager.resolve_pid(&ctx.id, tag).await.map_err(|_| {
                RpcErr::new(Code::NotFound, format!("process with tag {tag} not found"))
            })
        }
        (None, None) => Err(RpcErr::invalid("the process selector names no pid or tag")),
    }
}

/// A process that is still running (envd knows only those).
async fn running_process(
    s: &Shared,
    ctx: &Ctx,
    pid: u64,
) -> Result<proto::agent::ProcessInfo, RpcErr> {
    let not_found = || RpcErr::new(Code::NotFound, format!("process with pid {pid} not found"));
    match s.manager.process(&ctx.id, pid).await {
        Ok(p) if p.state == ProcessState::Running => Ok(p),
        Ok(_) | Err(crate::error::Error::NotFound(_)) => Err(not_found()),
        Err(e) => Err(e.into()),
    }
}

/// A process's output as an E2B stream.
struct Follow {
    s: E2bState,
    id: String,
    pid: u64,
    offsets: (u64, u64),
    pty: bool,
}

/// Why one attachment ended.
enum Step {
    Yield,
    Lost(String),
}

impl Follow {
    async fn run(mut self, out: StreamOut, keepalive: Option<Duration>) {
        if !out
            .send(&json!({"event": {"start": {"pid": self.pid}}}))
            .await
        {
            return;
        }
        let mut ticker = Ticker::new(keepalive);
        let mut lost = 0;
        loop {
            let mut pass = self.s.gates.enter(&self.id).await;
            if !self.alive() {
                return out.end(Some(RpcErr::gone())).await;
            }
            let events = self
                .s
                .manager
                .attach(&self.id, self.pid, self.offsets, true)
                .await;
            let mut events = match events {
                Ok(e) => e,
                Err(e) => return out.end(Some(self.failure(e))).await,
            };
            let step = loop {
                tokio::select! {
                    ev = events.recv() => match ev {
                        Some(Ok(ExecEvent::Exit(x))) => return self.finish(out, x).await,
                        Some(Ok(ev)) => {
                            if !self.forward(&out, ev).await {
                                return;
                            }
                            ticker.reset();
                        }
                        Some(Err(e)) => break Step::Lost(e.to_string()),
                        None => break Step::Lost("the agent connection closed".into()),
                    },
                    () = pass.asked_to_yield() => break Step::Yield,
                    () = ticker.tick() => {
                        if !out.send(&json!({"event": {"keepalive": {}}})).await {
                            return;
                        }
                    }
                    () = out.closed() => return,
                }
            };
            drop(events);
            drop(pass);
            if let Step::Lost(why) = step {
                lost += 1;
                if !self.alive() {
                    return out.end(Some(RpcErr::gone())).await;
                }
                if lost > MAX_REATTACH {
                    return out.end(Some(RpcErr::new(Code::Unavailable, why))).await;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    fn alive(&self) -> bool {
        self.s
            .manager
            .get(&self.id)
            .is_ok_and(|v| super::shapes::state(v.state) == Some("running"))
    }

    /// A daemon error as the end of the stream (a sandbox gone is E2B's "not found").
    fn failure(&self, e: crate::error::Error) -> RpcErr {
        if self.alive() {
            RpcErr::from(e)
        } else {
            RpcErr::gone()
        }
    }

    /// Sends output on; `false` once the client has gone.
    async fn forward(&mut self, out: &StreamOut, ev: ExecEvent) -> bool {
        match ev {
            ExecEvent::Output {
                stream,
                offset,
                data,
            } => {
                let end = offset + data.len() as u64;
                let key = match stream {
                    OutputStream::Stdout if self.pty => "pty",
                    OutputStream::Stdout => {
                        self.offsets.0 = end;
                        "stdout"
                    }
                    OutputStream::Stderr => {
                        self.offsets.1 = end;
                        "stderr"
                    }
                };
                if self.pty {
                    self.offsets.0 = end;
                }
                let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
                out.send(&json!({"event": {"data": {key: b64}}})).await
            }
            ExecEvent::Dropped { stream, to, .. } => {
                match stream {
                    OutputStream::Stdout => self.offsets.0 = to,
                    OutputStream::Stderr => self.offsets.1 = to,
                }
                true
            }
            ExecEvent::Exit(_) => true,
        }
    }

    async fn finish(self, out: StreamOut, exit: ExitInfo) {
        terminals().lock().remove(&(self.id.clone(), self.pid));
        if exit.timed_out {
            let e = RpcErr::new(Code::DeadlineExceeded, "the process reached its timeout");
            return out.end(Some(e)).await;
        }
        if out.send(&json!({"event": {"end": end_event(&exit)}})).await {
            out.end(None).await;
        }
    }
}

/// envd's `end` event: Go's `ProcessState` wording.
fn end_event(exit: &ExitInfo) -> Value {
    match exit.status {
        ExitStatus::Code(0) => json!({"exited": true, "status": "exit status 0"}),
        ExitStatus::Code(c) => {
            let status = format!("exit status {c}");
            json!({"exitCode": c, "exited": true, "status": status, "error": status})
        }
        ExitStatus::Signal { signal, .. } => {
            let status = format!("signal: {}", signal_name(signal));
            json!({"exitCode": -1, "status": status, "error": status})
        }
    }
}

fn signal_name(signal: i32) -> String {
    match signal {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        9 => "killed".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

async fn list(s: &Shared, ctx: &Ctx) -> Result<Response, RpcErr> {
    let procs: Vec<Value> = s
        .manager
        .processes(&ctx.id)
        .await?
        .into_iter()
        .filter(|p| p.state == ProcessState::Running)
        .map(|p| {
            let mut argv = p.command.into_iter();
            let cmd = argv.next().unwrap_or_default();
            let mut info =
                json!({"config": {"cmd": cmd, "args": argv.collect::<Vec<_>>()}, "pid": p.id});
            if let (Some(name), Some(o)) = (p.name, info.as_object_mut()) {
                o.insert("tag".into(), Value::String(name));
            }
            info
        })
        .collect();
    Ok(connect::unary(json!({"processes": procs})))
}

fn decode(b64: &str) -> Result<bytes::Bytes, RpcErr> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map(bytes::Bytes::from)
        .map_err(|e| RpcErr::invalid(format!("input is not base64: {e}")))
}

/// The bytes of an input message (stdin or terminal input).
fn input_bytes(input: &Input) -> Result<bytes::Bytes, RpcErr> {
    match (&input.stdin, &input.pty) {
        (Some(b), _) | (None, Some(b)) => decode(b),
        (None, None) => Ok(bytes::Bytes::new()),
    }
}

async fn send_input(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: SendInputReq = connect::unary_request(bytes)?;
    let pid = select(s, ctx, &req.process).await?;
    running_process(s, ctx, pid).await?;
    let data = input_bytes(&req.input)?;
    s.manager.write_stdin(&ctx.id, pid, data).await?;
    Ok(connect::unary(json!({})))
}

/// A signal of E2B's enum, by name or number.
fn signal_number(v: &Value) -> Result<i32, RpcErr> {
    match v {
        Value::String(s) if s == "SIGNAL_SIGKILL" => Ok(9),
        Value::String(s) if s == "SIGNAL_SIGTERM" => Ok(15),
        Value::Number(n) if n.as_i64() == Some(9) || n.as_i64() == Some(15) => {
            Ok(n.as_i64().unwrap_or(9) as i32)
        }
        other => Err(RpcErr::invalid(format!("unknown signal {other}"))),
    }
}

async fn send_signal(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: SignalReq = connect::unary_request(bytes)?;
    let signal = signal_number(&req.signal)?;
    let pid = select(s, ctx, &req.process).await?;
    running_process(s, ctx, pid).await?;
    s.manager.signal(&ctx.id, pid, signal).await?;
    Ok(connect::unary(json!({})))
}

async fn close_stdin(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: Selected = connect::unary_request(bytes)?;
    let pid = select(s, ctx, &req.process).await?;
    running_process(s, ctx, pid).await?;
    s.manager.close_stdin(&ctx.id, pid).await?;
    Ok(connect::unary(json!({})))
}

async fn update(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: UpdateReq = connect::unary_request(bytes)?;
    let pid = select(s, ctx, &req.process).await?;
    if let Some(size) = req.pty.and_then(|p| p.size) {
        let size = proto::agent::PtySize {
            cols: size.cols,
            rows: size.rows,
        };
        s.manager.resize_pty(&ctx.id, pid, size).await?;
    }
    Ok(connect::unary(json!({})))
}

/// `StreamInput` (client stream): `start` names the process, each `data` is input.
async fn stream_input(s: E2bState, ctx: Ctx, body: Body) -> Response {
    let limit = s.manager.config().max_json_bytes;
    match feed_input(&s, &ctx, body, limit).await {
        Ok(()) => {
            let (out, resp) = connect::stream_response();
            tokio::spawn(async move {
                if out.send(&json!({})).await {
                    out.end(None).await;
                }
            });
            resp
        }
        Err(e) => connect::stream_error(e),
    }
}

async fn feed_input(s: &Shared, ctx: &Ctx, body: Body, limit: usize) -> Result<(), RpcErr> {
    let mut frames = connect::Frames::default();
    let mut pid = None;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| RpcErr::new(Code::Canceled, e.to_string()))?;
        frames.push(&chunk);
        while let Some((end, msg)) = frames.next(limit)? {
            if end {
                return Ok(());
            }
            pid = input_message(s, ctx, pid, msg).await?;
        }
    }
    Ok(())
}

/// Applies one `StreamInput` message; returns the process it is for.
async fn input_message(
    s: &Shared,
    ctx: &Ctx,
    pid: Option<u64>,
    msg: Value,
) -> Result<Option<u64>, RpcErr> {
    if let Some(start) = msg.get("start") {
        let sel: Selected = serde_json::from_value(start.clone())
            .map_err(|e| RpcErr::invalid(format!("invalid start: {e}")))?;
        let pid = select(s, ctx, &sel.process).await?;
        running_process(s, ctx, pid).await?;
        return Ok(Some(pid));
    }
    if let Some(data) = msg.get("data") {
        let pid = pid.ok_or_else(|| RpcErr::invalid("data before start"))?;
        let input: Input = data
            .get("input")
            .map(|i| serde_json::from_value(i.clone()))
            .transpose()
            .map_err(|e| RpcErr::invalid(format!("invalid input: {e}")))?
            .unwrap_or_default();
        s.manager
            .write_stdin(&ctx.id, pid, input_bytes(&input)?)
            .await?;
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_read_as_envd_writes_them() {
        let code = |c| ExitInfo {
            status: ExitStatus::Code(c),
            timed_out: false,
        };
        assert_eq!(
            end_event(&code(0)),
            json!({"exited": true, "status": "exit status 0"})
        );
        assert_eq!(end_event(&code(3))["exitCode"], 3);
        assert_eq!(end_event(&code(3))["error"], "exit status 3");
        let killed = ExitInfo {
            status: ExitStatus::Signal {
                signal: 9,
                core_dumped: false,
            },
            timed_out: false,
        };
        assert_eq!(end_event(&killed)["status"], "signal: killed");
        assert_eq!(end_event(&killed)["exitCode"], -1);
    }

    #[test]
    fn signals_and_inputs_are_checked() {
        assert_eq!(signal_number(&json!("SIGNAL_SIGKILL")).unwrap(), 9);
        assert_eq!(signal_number(&json!(15)).unwrap(), 15);
        assert!(signal_number(&json!("SIGNAL_UNSPECIFIED")).is_err());
        assert!(signal_number(&json!(2)).is_err());
        let i = Input {
            stdin: Some("aGk=".into()),
            pty: None,
        };
        assert_eq!(&input_bytes(&i).unwrap()[..], b"hi");
        let bad = Input {
            stdin: Some("!!".into()),
            pty: None,
        };
        assert!(input_bytes(&bad).is_err());
    }
}
