//! envd's `filesystem.Filesystem` service over the daemon's file calls (and, for what
//! the daemon has no call for — rename, a symlink's target, acting as another user — a
//! short command run through the same exec path as `/v1/sandboxes/{id}/exec`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use proto::agent::{FileKind, FileStat, FsEvent, FsEventKind, OutputStream};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::connect::{self, Ticker};
use super::envd::{self, Ctx};
use super::errors::{Code, RpcErr};
use super::{E2bState, Shared};
use crate::backend::ExecEvent;
use crate::error::Error;

/// The most entries one `ListDir` answers.
const MAX_LISTED: usize = 100_000;
/// The most symlinks of one `ListDir` whose targets are looked up (the rest are listed
/// as symlinks to nothing known, which the SDKs leave out).
const MAX_LINKS_FOLLOWED: usize = 256;
/// The most events a polled watcher keeps between two reads.
const MAX_QUEUED: usize = 10_000;
/// The most polled watchers at once, over all sandboxes.
const MAX_WATCHERS: usize = 1024;
/// The most output of a helper command kept.
const MAX_HELPER_OUTPUT: usize = 64 << 10;

#[derive(Debug, Default, Deserialize)]
struct PathReq {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Default, Deserialize)]
struct MoveReq {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

#[derive(Debug, Default, Deserialize)]
struct ListReq {
    #[serde(default)]
    path: String,
    depth: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchReq {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    include_entry: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherReq {
    #[serde(default)]
    watcher_id: String,
}

/// `POST /filesystem.Filesystem/{method}`.
pub async fn call(State(s): State<E2bState>, Path(method): Path<String>, req: Request) -> Response {
    let streaming = method == "WatchDir";
    let fail = |e: RpcErr| envd::rpc_failure(streaming, e);
    let ctx = match envd::rpc_context(&s, req.headers(), streaming).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let (parts, body) = req.into_parts();
    let bytes = match connect::read_body(body, s.manager.config().max_json_bytes).await {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    let result = match method.as_str() {
        "Stat" => stat(&s, &ctx, &bytes).await,
        "MakeDir" => make_dir(&s, &ctx, &bytes).await,
        "Move" => move_entry(&s, &ctx, &bytes).await,
        "ListDir" => list_dir(&s, &ctx, &bytes).await,
        "Remove" => remove(&s, &ctx, &bytes).await,
        "WatchDir" => watch_dir(&s, ctx, &parts.headers, &bytes).await,
        "CreateWatcher" => create_watcher(&s, ctx, &bytes).await,
        "GetWatcherEvents" => watcher_events(&s, &ctx, &bytes),
        "RemoveWatcher" => remove_watcher(&s, &ctx, &bytes),
        other => Err(RpcErr::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{other} is not a method of envd"),
        )),
    };
    result.unwrap_or_else(fail)
}

/// A path error as envd words it.
fn path_err(e: Error, path: &str) -> RpcErr {
    match e {
        Error::NotFound(_) => RpcErr::new(Code::NotFound, format!("path '{path}' does not exist")),
        other => RpcErr::from(other),
    }
}

fn resolve(ctx: &Ctx, path: &str) -> Result<String, RpcErr> {
    ctx.path(path).map_err(RpcErr::invalid)
}

fn base_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or_default().to_string()
}

/// Go's `FileMode.String()` of a file's type and permission bits.
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::new();
    match kind {
        FileKind::Dir => s.push('d'),
        FileKind::Symlink => s.push('L'),
        _ => {}
    }
    for (bit, c) in [(0o4000, 'u'), (0o2000, 'g'), (0o1000, 't')] {
        if mode & bit != 0 {
            s.push(c);
        }
    }
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

fn file_type(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink | FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    }
}

/// envd's `EntryInfo` of `path` (a symlink reports its target's type and mode).
async fn entry(s: &Shared, ctx: &Ctx, path: &str, st: &FileStat) -> Value {
    entry_of(s, ctx, path, st, true).await
}

/// An `EntryInfo`; a symlink's target is looked up only when `follow` (each costs a
/// command in the sandbox).
async fn entry_of(s: &Shared, ctx: &Ctx, path: &str, st: &FileStat, follow: bool) -> Value {
    let mut out = json!({
        "name": base_name(path),
        "type": file_type(st.kind),
        "path": path,
        "size": st.size.to_string(),
        "mode": st.mode & 0o777,
        "permissions": permissions(st.kind, st.mode),
        "owner": ctx.table.user_name(st.uid),
        "group": ctx.table.group_name(st.gid),
        "modifiedTime": model::timestamp::from_unix_millis(st.mtime_unix_ms),
    });
    if st.kind == FileKind::Symlink && follow {
        if let Some(target) = link_target(s, ctx, path).await {
            out["symlinkTarget"] = json!(target);
            if let Ok(t) = s.manager.stat(&ctx.id, &target).await {
                out["type"] = json!(file_type(t.kind));
                out["mode"] = json!(t.mode & 0o777);
            }
        }
    }
    out
}

/// The fully resolved target of a symlink.
async fn link_target(s: &Shared, ctx: &Ctx, path: &str) -> Option<String> {
    let args = ["-f", "--", path].map(String::from).to_vec();
    let (code, out, _) = run(s, &ctx.id, None, "readlink", args).await.ok()?;
    let target = out.trim_end_matches('\n').to_string();
    (code == 0 && !target.is_empty()).then_some(target)
}

/// Runs a short helper command; `(exit code, stdout, stderr)`.
pub async fn run(
    s: &Shared,
    id: &str,
    user: Option<String>,
    command: &str,
    args: Vec<String>,
) -> Result<(i32, String, String), Error> {
    let req = api_types::ExecRequest {
        command: command.into(),
        args,
        user,
        timeout_secs: Some(30.0),
        ..Default::default()
    };
    let mut events = s
        .manager
        .exec(id, super::super::exec::to_agent(req)?)
        .await?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(ev) = events.recv().await {
        match ev? {
            ExecEvent::Output { stream, data, .. } => {
                let buf = if stream == OutputStream::Stdout {
                    &mut out
                } else {
                    &mut err
                };
                if buf.len() < MAX_HELPER_OUTPUT {
                    buf.extend_from_slice(&data);
                }
            }
            ExecEvent::Dropped { .. } => {}
            ExecEvent::Exit(x) => {
                let code = match x.status {
                    proto::agent::ExitStatus::Code(c) => c,
                    proto::agent::ExitStatus::Signal { .. } => -1,
                };
                let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
                return Ok((code, text(out), text(err)));
            }
        }
    }
    Err(Error::Backend(crate::backend::BackendError::Unavailable(
        "the agent connection closed before the command exited".into(),
    )))
}

/// A helper command that must succeed; its failure worded as a Connect error.
async fn run_ok(s: &Shared, ctx: &Ctx, command: &str, args: Vec<String>) -> Result<(), RpcErr> {
    let (code, _, err) = run(s, &ctx.id, ctx.agent_user(), command, args).await?;
    if code == 0 {
        return Ok(());
    }
    let msg = err.trim().to_string();
    let code = if msg.contains("No such file") {
        Code::NotFound
    } else if msg.contains("Permission denied") || msg.contains("Operation not permitted") {
        Code::PermissionDenied
    } else {
        Code::InvalidArgument
    };
    Err(RpcErr::new(code, format!("{command}: {msg}")))
}

async fn stat(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: PathReq = connect::unary_request(bytes)?;
    let path = resolve(ctx, &req.path)?;
    let st = s
        .manager
        .stat(&ctx.id, &path)
        .await
        .map_err(|e| path_err(e, &path))?;
    Ok(connect::unary(
        json!({"entry": entry(s, ctx, &path, &st).await}),
    ))
}

async fn make_dir(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: PathReq = connect::unary_request(bytes)?;
    let path = resolve(ctx, &req.path)?;
    if s.manager.stat(&ctx.id, &path).await.is_ok() {
        return Err(RpcErr::new(
            Code::AlreadyExists,
            format!("path '{path}' already exists"),
        ));
    }
    if ctx.account.uid == 0 {
        s.manager.mkdir(&ctx.id, &path, true).await?;
    } else {
        let args = ["-p", "--", &path].map(String::from).to_vec();
        run_ok(s, ctx, "mkdir", args).await?;
    }
    let st = s
        .manager
        .stat(&ctx.id, &path)
        .await
        .map_err(|e| path_err(e, &path))?;
    Ok(connect::unary(
        json!({"entry": entry(s, ctx, &path, &st).await}),
    ))
}

async fn move_entry(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: MoveReq = connect::unary_request(bytes)?;
    let (from, to) = (resolve(ctx, &req.source)?, resolve(ctx, &req.destination)?);
    s.manager
        .stat(&ctx.id, &from)
        .await
        .map_err(|e| path_err(e, &from))?;
    let args = ["-T", "--", &from, &to].map(String::from).to_vec();
    run_ok(s, ctx, "mv", args).await?;
    let st = s
        .manager
        .stat(&ctx.id, &to)
        .await
        .map_err(|e| path_err(e, &to))?;
    Ok(connect::unary(
        json!({"entry": entry(s, ctx, &to, &st).await}),
    ))
}

async fn list_dir(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: ListReq = connect::unary_request(bytes)?;
    let root = resolve(ctx, &req.path)?;
    let depth = req.depth.unwrap_or(1).max(1);
    let st = s
        .manager
        .stat(&ctx.id, &root)
        .await
        .map_err(|e| path_err(e, &root))?;
    if st.kind != FileKind::Dir {
        return Err(RpcErr::invalid(format!("path '{root}' is not a directory")));
    }
    let mut entries = Vec::new();
    let mut links = 0;
    let mut level = vec![root];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            let listed = match s.manager.list_dir(&ctx.id, &dir).await {
                Ok(l) => l,
                Err(e) if entries.is_empty() => return Err(path_err(e, &dir)),
                Err(_) => continue,
            };
            for e in listed {
                let path = format!("{}/{}", dir.trim_end_matches('/'), e.name);
                if e.stat.kind == FileKind::Dir {
                    next.push(path.clone());
                }
                let follow = e.stat.kind == FileKind::Symlink && links < MAX_LINKS_FOLLOWED;
                links += usize::from(follow);
                entries.push(
                    entry_of(
                        s,
                        ctx,
                        &path,
                        &e.stat,
                        follow || e.stat.kind != FileKind::Symlink,
                    )
                    .await,
                );
                if entries.len() >= MAX_LISTED {
                    return Err(RpcErr::new(
                        Code::ResourceExhausted,
                        format!("more than {MAX_LISTED} entries: list with a smaller depth"),
                    ));
                }
            }
        }
        level = next;
    }
    Ok(connect::unary(json!({"entries": entries})))
}

async fn remove(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: PathReq = connect::unary_request(bytes)?;
    let path = resolve(ctx, &req.path)?;
    s.manager
        .stat(&ctx.id, &path)
        .await
        .map_err(|e| path_err(e, &path))?;
    s.manager
        .remove(&ctx.id, &path, true)
        .await
        .map_err(|e| path_err(e, &path))?;
    Ok(connect::unary(json!({})))
}

// Watches ---------------------------------------------------------------------------------

/// A watched directory: where, how, for whom.
#[derive(Clone)]
struct Watch {
    s: E2bState,
    ctx: Arc<Ctx>,
    root: String,
    recursive: bool,
    include_entry: bool,
}

/// Checks the request and puts the watch in place (so that what follows is seen).
async fn open_watch(
    s: &E2bState,
    ctx: Ctx,
    bytes: &[u8],
    framed: bool,
) -> Result<(Watch, crate::backend::Stream<Vec<FsEvent>>), RpcErr> {
    let req: WatchReq = if framed {
        connect::stream_request(bytes, bytes.len().max(5))?
    } else {
        connect::unary_request(bytes)?
    };
    let root = resolve(&ctx, &req.path)?;
    let st = s
        .manager
        .stat(&ctx.id, &root)
        .await
        .map_err(|e| path_err(e, &root))?;
    if st.kind != FileKind::Dir {
        return Err(RpcErr::invalid(format!("path '{root}' is not a directory")));
    }
    let events = s.manager.watch_dir(&ctx.id, &root, req.recursive).await?;
    let w = Watch {
        s: s.clone(),
        ctx: Arc::new(ctx),
        root,
        recursive: req.recursive,
        include_entry: req.include_entry,
    };
    Ok((w, events))
}

impl Watch {
    /// Produces E2B events into `tx` until its reader goes or the sandbox does (then a
    /// last `Err`); steps aside for E2B's memory checkpoints and watches again after.
    async fn run(
        self,
        mut events: crate::backend::Stream<Vec<FsEvent>>,
        tx: mpsc::Sender<Result<Value, RpcErr>>,
    ) {
        loop {
            let mut pass = self.s.gates.enter(&self.ctx.id).await;
            loop {
                let batch = tokio::select! {
                    b = events.recv() => b,
                    () = pass.asked_to_yield() => break,
                    () = tx.closed() => return,
                };
                let Some(Ok(batch)) = batch else { break };
                for e in batch {
                    for ev in self.convert(e).await {
                        if tx.send(Ok(ev)).await.is_err() {
                            return;
                        }
                    }
                }
            }
            drop(events);
            drop(pass);
            let _wait = self.s.gates.enter(&self.ctx.id).await;
            if !self.alive() {
                let _ = tx.send(Err(RpcErr::gone())).await;
                return;
            }
            events = match self
                .s
                .manager
                .watch_dir(&self.ctx.id, &self.root, self.recursive)
                .await
            {
                Ok(e) => e,
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
            };
        }
    }

    fn alive(&self) -> bool {
        self.s
            .manager
            .get(&self.ctx.id)
            .is_ok_and(|v| super::shapes::state(v.state) == Some("running"))
    }

    /// envd's events for one of the daemon's (a rename is the old name's RENAME, then
    /// the new name's CREATE).
    async fn convert(&self, e: FsEvent) -> Vec<Value> {
        let kinds: Vec<(&str, &str)> = match e.kind {
            FsEventKind::Create => vec![("EVENT_TYPE_CREATE", e.path.as_str())],
            FsEventKind::Modify => vec![("EVENT_TYPE_WRITE", e.path.as_str())],
            FsEventKind::Delete => vec![("EVENT_TYPE_REMOVE", e.path.as_str())],
            FsEventKind::Chmod => vec![("EVENT_TYPE_CHMOD", e.path.as_str())],
            FsEventKind::Rename => {
                let mut v = Vec::new();
                if let Some(old) = &e.old_path {
                    v.push(("EVENT_TYPE_RENAME", old.as_str()));
                }
                v.push(("EVENT_TYPE_CREATE", e.path.as_str()));
                v
            }
            FsEventKind::Overflow => Vec::new(),
        };
        let mut out = Vec::new();
        for (kind, path) in kinds {
            let mut ev = json!({"name": self.relative(path), "type": kind});
            let exists = !matches!(kind, "EVENT_TYPE_REMOVE" | "EVENT_TYPE_RENAME");
            if self.include_entry && exists {
                if let Ok(st) = self.s.manager.stat(&self.ctx.id, path).await {
                    ev["entry"] = entry(&self.s, &self.ctx, path, &st).await;
                }
            }
            out.push(ev);
        }
        out
    }

    fn relative(&self, path: &str) -> String {
        let root = self.root.trim_end_matches('/');
        path.strip_prefix(root)
            .and_then(|p| p.strip_prefix('/'))
            .unwrap_or(path)
            .to_string()
    }
}

/// `WatchDir`: a stream of events, from `start` (sent once the watch is in place).
async fn watch_dir(
    s: &E2bState,
    ctx: Ctx,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<Response, RpcErr> {
    let (watch, events) = open_watch(s, ctx, bytes, true).await?;
    let (tx, mut rx) = mpsc::channel(crate::backend::STREAM_DEPTH);
    tokio::spawn(watch.run(events, tx));
    let (out, resp) = connect::stream_response();
    let deadline = connect::timeout(headers);
    let mut ticker = Ticker::new(connect::keepalive(headers));
    tokio::spawn(async move {
        if !out.send(&json!({"start": {}})).await {
            return;
        }
        let until = deadline.and_then(|d| tokio::time::Instant::now().checked_add(d));
        loop {
            let over = async {
                match until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(Ok(ev)) => {
                        if !out.send(&json!({"filesystem": ev})).await {
                            return;
                        }
                        ticker.reset();
                    }
                    Some(Err(e)) => return out.end(Some(e)).await,
                    None => return out.end(None).await,
                },
                () = ticker.tick() => {
                    if !out.send(&json!({"keepalive": {}})).await {
                        return;
                    }
                }
                () = over => {
                    let e = RpcErr::new(Code::DeadlineExceeded, "the watch reached its timeout");
                    return out.end(Some(e)).await;
                }
                () = out.closed() => return,
            }
        }
    });
    Ok(resp)
}

/// Polled watchers (`CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher`).
#[derive(Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, (Arc<Polled>, tokio::task::AbortHandle)>>,
}

/// What a polled watcher has seen since it was last read.
#[derive(Default)]
struct Polled {
    sandbox: String,
    queue: Mutex<VecDeque<Value>>,
    ended: Mutex<Option<RpcErr>>,
}

impl Polled {
    fn take(&self) -> (Vec<Value>, Option<RpcErr>) {
        let events: Vec<Value> = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        let ended = if events.is_empty() {
            self.ended.lock().unwrap_or_else(|p| p.into_inner()).take()
        } else {
            None
        };
        (events, ended)
    }

    fn push(&self, item: Result<Value, RpcErr>) {
        match item {
            Ok(ev) => {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if q.len() >= MAX_QUEUED {
                    q.pop_front();
                }
                q.push_back(ev);
            }
            Err(e) => *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(e),
        }
    }
}

type WatcherMap = HashMap<String, (Arc<Polled>, tokio::task::AbortHandle)>;

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, WatcherMap> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, sandbox: &str, id: &str) -> Result<Arc<Polled>, RpcErr> {
        self.lock()
            .get(id)
            .filter(|(w, _)| w.sandbox == sandbox)
            .map(|(w, _)| w.clone())
            .ok_or_else(|| RpcErr::new(Code::NotFound, format!("watcher with id {id} not found")))
    }

    /// Forgets the watchers of sandboxes that no longer run.
    fn prune(&self, m: &crate::manager::Manager) {
        self.lock().retain(|_, (w, task)| {
            let live = m
                .get(&w.sandbox)
                .is_ok_and(|v| super::shapes::state(v.state).is_some());
            if !live {
                task.abort();
            }
            live
        });
    }

    fn remove(&self, id: &str) {
        if let Some((_, task)) = self.lock().remove(id) {
            task.abort();
        }
    }
}

fn new_watcher_id() -> String {
    use sha2::{Digest, Sha256};
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let d = Sha256::digest(format!("{now}:{n}:{}", std::process::id()));
    d[..8].iter().map(|b| format!("{b:02x}")).collect()
}

async fn create_watcher(s: &E2bState, ctx: Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    s.watchers.prune(&s.manager);
    if s.watchers.lock().len() >= MAX_WATCHERS {
        return Err(RpcErr::new(
            Code::ResourceExhausted,
            format!("at most {MAX_WATCHERS} watchers at once: remove some"),
        ));
    }
    let polled = Arc::new(Polled {
        sandbox: ctx.id.clone(),
        ..Default::default()
    });
    let (watch, events) = open_watch(s, ctx, bytes, false).await?;
    let id = new_watcher_id();
    let (tx, mut rx) = mpsc::channel(crate::backend::STREAM_DEPTH);
    let producer = tokio::spawn(watch.run(events, tx));
    let sink = polled.clone();
    let task = tokio::spawn(async move {
        while let Some(item) = rx.recv().await {
            sink.push(item);
        }
        producer.abort();
    });
    s.watchers
        .lock()
        .insert(id.clone(), (polled, task.abort_handle()));
    Ok(connect::unary(json!({"watcherId": id})))
}

fn watcher_events(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: WatcherReq = connect::unary_request(bytes)?;
    let w = s.watchers.get(&ctx.id, &req.watcher_id)?;
    let (events, ended) = w.take();
    if let Some(e) = ended {
        s.watchers.remove(&req.watcher_id);
        return Err(e);
    }
    Ok(connect::unary(json!({"events": events})))
}

fn remove_watcher(s: &Shared, ctx: &Ctx, bytes: &[u8]) -> Result<Response, RpcErr> {
    let req: WatcherReq = connect::unary_request(bytes)?;
    s.watchers.get(&ctx.id, &req.watcher_id)?;
    s.watchers.remove(&req.watcher_id);
    Ok(connect::unary(json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_read_like_go() {
        assert_eq!(permissions(FileKind::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(FileKind::Symlink, 0o777), "Lrwxrwxrwx");
        assert_eq!(permissions(FileKind::Dir, 0o1777), "dtrwxrwxrwx");
    }

    #[test]
    fn names_and_types() {
        assert_eq!(base_name("/home/user/a.txt"), "a.txt");
        assert_eq!(file_type(FileKind::Other), "FILE_TYPE_UNSPECIFIED");
    }
}
