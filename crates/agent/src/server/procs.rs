//! Background processes: they run detached from any connection, their output goes to a
//! bounded ring buffer per stream, and any number of clients attach from any offset.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use proto::agent::{
    AgentError, ErrorKind, ExitInfo, ExitStatus, Message, OutputMode, OutputStream, ProcessInfo,
    ProcessState, PtySize, SpawnRequest, StdinMode, CHUNK_SIZE,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use super::clock::unix_ms;
use super::errors::invalid;
use super::group::Group;
use super::logbook::LogBook;
use super::pump::{pump, OutputSink};
use super::reaper::Reaper;
use super::ring::Ring;
use super::spawn::{Child, Input};
use super::supervisor::Supervisor;
use super::wire::{Reader, Writer};
use proto::codec::CodecError;

/// Output kept per stream of each background process.
pub const RING_CAPACITY: usize = 1 << 20;
/// Exited processes kept in the table for `list`/`attach`/`wait`; older ones are dropped.
const MAX_EXITED: usize = 256;

struct Output {
    streams: [Ring; 2],
    /// The pump finished: the process exited and its output is complete.
    done: bool,
}

pub struct Proc {
    id: u64,
    pid: i32,
    command: Vec<String>,
    started_unix_ms: u64,
    ended_unix_ms: Mutex<Option<u64>>,
    /// What started it (a restart starts the same again).
    request: SpawnRequest,
    /// The supervisor of a supervised process (shared by all its runs).
    supervisor: Option<Arc<Supervisor>>,
    group: Group,
    output: Mutex<Output>,
    /// Bumped whenever output arrives or the pump finishes.
    changed: watch::Sender<u64>,
    stdin: tokio::sync::Mutex<Option<Input>>,
    /// A terminal keeper (see [`super::pty`]): stdin takes protocol frames.
    terminal: bool,
    /// Where its output is logged (not for a terminal).
    logs: Option<Arc<LogBook>>,
}

impl Proc {
    fn output(&self) -> MutexGuard<'_, Output> {
        self.output.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn exit_info(&self) -> Option<ExitInfo> {
        let status = (*self.group.exit().borrow())?;
        Some(ExitInfo {
            status,
            timed_out: self.group.timed_out(),
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn pid(&self) -> u32 {
        // Pids are positive.
        self.pid as u32
    }

    pub fn request(&self) -> &SpawnRequest {
        &self.request
    }

    pub fn supervisor(&self) -> Option<&Arc<Supervisor>> {
        self.supervisor.as_ref()
    }

    pub fn group(&self) -> &Group {
        &self.group
    }

    fn info(&self) -> ProcessInfo {
        let (stdout_len, stderr_len) = {
            let o = self.output();
            (o.streams[0].end(), o.streams[1].end())
        };
        ProcessInfo {
            id: self.id,
            // Pids are positive.
            pid: self.pid as u32,
            command: self.command.clone(),
            state: self
                .exit_info()
                .map_or(ProcessState::Running, ProcessState::Exited),
            started_unix_ms: self.started_unix_ms,
            stdout_len,
            stderr_len,
            stdin_open: self.stdin.try_lock().map_or(true, |s| s.is_some()),
            name: self.request.name.clone(),
            ended_unix_ms: *self.ended_unix_ms.lock().unwrap_or_else(|p| p.into_inner()),
            managed: self.supervisor.as_ref().map(|s| s.info()),
        }
    }
}

struct RingSink(Arc<Proc>);

impl OutputSink for RingSink {
    async fn output(&mut self, stream: OutputStream, data: &[u8]) -> Result<(), ()> {
        let mode = match stream {
            OutputStream::Stdout => self.0.request.stdout,
            OutputStream::Stderr => self.0.request.stderr,
        };
        if mode == OutputMode::Discard {
            return Ok(());
        }
        self.0.output().streams[stream as usize].push(data);
        self.0.changed.send_modify(|v| *v += 1);
        if let Some(logs) = &self.0.logs {
            logs.push(self.0.id, stream, data);
        }
        Ok(())
    }
}

#[derive(Default)]
pub struct ProcTable {
    next_id: AtomicU64,
    procs: Mutex<BTreeMap<u64, Arc<Proc>>>,
    /// The sandbox log: what the background processes write.
    pub logs: Arc<LogBook>,
}

impl ProcTable {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Proc>>> {
        self.procs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, id: u64) -> Result<Arc<Proc>, AgentError> {
        let not_found = || AgentError::new(ErrorKind::NotFound, format!("no process with id {id}"));
        self.lock().get(&id).cloned().ok_or_else(not_found)
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        self.lock().values().map(|p| p.info()).collect()
    }

    /// The latest run of the supervised process named `name`.
    pub fn by_name(&self, name: &str) -> Option<Arc<Proc>> {
        self.lock()
            .values()
            .rev()
            .find(|p| p.request.name.as_deref() == Some(name))
            .cloned()
    }

    /// The latest run supervised by `sup`.
    pub fn latest_run_of(&self, sup: &Arc<Supervisor>) -> Option<Arc<Proc>> {
        self.lock()
            .values()
            .rev()
            .find(|p| p.supervisor.as_ref().is_some_and(|s| Arc::ptr_eq(s, sup)))
            .cloned()
    }

    /// Whether a supervised process named `name` is still supervised (not stopped).
    pub fn name_in_use(&self, name: &str) -> bool {
        self.by_name(name)
            .and_then(|p| p.supervisor.clone())
            .is_some_and(|s| !s.is_stopped())
    }

    /// Starts one run of `req` in the background (under `supervisor`, for a supervised
    /// process) and returns it.
    pub fn start(
        &self,
        reaper: &Reaper,
        req: SpawnRequest,
        base: &super::spawn::Base,
        supervisor: Option<Arc<Supervisor>>,
    ) -> Result<Arc<Proc>, AgentError> {
        let child = super::spawn::spawn(reaper, &req.exec, base)?;
        Ok(self.run(child, req, supervisor))
    }

    /// Starts `req` on a new terminal of `size` in the background (never supervised).
    pub fn start_pty(
        &self,
        reaper: &Reaper,
        req: SpawnRequest,
        base: &super::spawn::Base,
        size: PtySize,
    ) -> Result<Arc<Proc>, AgentError> {
        if req.is_managed() {
            return Err(invalid(
                "a terminal session cannot be supervised: drop name, restart and health",
            ));
        }
        size.check().map_err(invalid)?;
        let child = super::spawn::spawn_pty(reaper, &req.exec, base, size)?;
        Ok(self.run(child, req, None))
    }

    /// Enters a started child in the table and moves its output to its buffers.
    fn run(
        &self,
        child: Child,
        req: SpawnRequest,
        supervisor: Option<Arc<Supervisor>>,
    ) -> Arc<Proc> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let group = Group::new(child.pid, child.exit.clone());
        let (stdin, initial) = match &req.exec.stdin {
            _ if child.terminal => (child.stdin, None),
            StdinMode::Stream => (child.stdin, None),
            StdinMode::Bytes(b) => (None, child.stdin.map(|p| (p, b.clone()))),
            StdinMode::Null => (None, None),
        };
        let command = std::iter::once(req.exec.command.clone())
            .chain(req.exec.args.iter().cloned())
            .collect();
        let timeout_ms = req.exec.timeout_ms;
        let proc = Arc::new(Proc {
            id,
            pid: child.pid,
            command,
            started_unix_ms: unix_ms(),
            ended_unix_ms: Mutex::new(None),
            request: req,
            supervisor,
            group: group.clone(),
            output: Mutex::new(Output {
                streams: [Ring::new(RING_CAPACITY), Ring::new(RING_CAPACITY)],
                done: false,
            }),
            changed: watch::Sender::new(0),
            stdin: tokio::sync::Mutex::new(stdin),
            terminal: child.terminal,
            logs: (!child.terminal).then(|| self.logs.clone()),
        });
        self.insert(proc.clone());
        if let Some((mut pipe, bytes)) = initial {
            tokio::spawn(async move { pipe.write_all(&bytes).await });
        }
        let timer = group.arm_timeout(timeout_ms);
        let run = proc.clone();
        tokio::spawn(async move {
            let mut sink = RingSink(run.clone());
            let _ = pump(child.stdout, child.stderr, child.exit, &mut sink).await;
            timer.inspect(|t| t.abort());
            *run.stdin.lock().await = None;
            *run.ended_unix_ms.lock().unwrap_or_else(|p| p.into_inner()) = Some(unix_ms());
            if let Some(logs) = &run.logs {
                logs.finish(run.id);
            }
            run.output().done = true;
            run.changed.send_modify(|v| *v += 1);
        });
        proc
    }

    fn insert(&self, proc: Arc<Proc>) {
        let mut procs = self.lock();
        procs.insert(proc.id, proc);
        let exited: Vec<u64> = procs
            .values()
            .filter(|p| p.output().done)
            .map(|p| p.id)
            .collect();
        for id in exited.iter().take(exited.len().saturating_sub(MAX_EXITED)) {
            procs.remove(id);
        }
    }
}

/// Operations on one background process.
impl Proc {
    /// Writes to the process's stdin; for a terminal, typed input (framed for its keeper).
    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), AgentError> {
        if self.terminal {
            return self.send_keeper(&Message::Data(data.to_vec())).await;
        }
        self.write_raw(data).await
    }

    async fn send_keeper(&self, msg: &Message) -> Result<(), AgentError> {
        let frame = proto::agent::encode_frame(msg).map_err(|e| invalid(e.to_string()))?;
        self.write_raw(&frame).await
    }

    async fn write_raw(&self, data: &[u8]) -> Result<(), AgentError> {
        let mut stdin = self.stdin.lock().await;
        let pipe = stdin
            .as_mut()
            .ok_or_else(|| invalid(format!("stdin of process {} is closed", self.id)))?;
        if let Err(e) = pipe.write_all(data).await {
            *stdin = None;
            return Err(super::errors::io_error(
                &format!("stdin of process {}", self.id),
                &e,
            ));
        }
        Ok(())
    }

    pub async fn close_stdin(&self) {
        *self.stdin.lock().await = None;
    }

    pub fn signal(&self, signal: i32, group: bool) -> Result<(), AgentError> {
        let sig = nix::sys::signal::Signal::try_from(signal)
            .map_err(|_| invalid(format!("invalid signal {signal}")))?;
        if self.exit_info().is_some() {
            return Err(invalid(format!("process {} has exited", self.id)));
        }
        if group {
            self.group.signal(sig);
        } else {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), sig);
        }
        Ok(())
    }

    /// Waits until the process has exited and all its output is in its buffer.
    pub async fn finished(&self) -> ExitInfo {
        let mut changed = self.changed.subscribe();
        while !self.output().done {
            if changed.changed().await.is_err() {
                break;
            }
        }
        self.exit_info().unwrap_or(ExitInfo {
            status: ExitStatus::Code(-1),
            timed_out: false,
        })
    }

    pub async fn wait(&self, timeout_ms: Option<u64>) -> Result<ExitInfo, AgentError> {
        let mut exit = self.group.exit();
        let exited = super::pump::exited(&mut exit);
        if let Some(ms) = timeout_ms {
            if tokio::time::timeout(Duration::from_millis(ms), exited)
                .await
                .is_err()
            {
                let msg = format!("process {} is still running", self.id);
                return Err(AgentError::new(ErrorKind::TimedOut, msg));
            }
        } else {
            exited.await;
        }
        self.exit_info().ok_or_else(|| invalid("exit status lost"))
    }

    /// The frames that bring an attached client from `offsets` up to date (bounded per
    /// call), and whether the output is complete.
    fn catch_up(&self, offsets: &mut [u64; 2]) -> (Vec<Message>, bool) {
        let out = self.output();
        let mut frames = Vec::new();
        for (i, stream) in [OutputStream::Stdout, OutputStream::Stderr]
            .into_iter()
            .enumerate()
        {
            let ring = &out.streams[i];
            if offsets[i] < ring.start() {
                frames.push(Message::OutputDropped {
                    stream,
                    from: offsets[i],
                    to: ring.start(),
                });
            }
            for _ in 0..4 {
                let (offset, data) = ring.read_from(offsets[i], CHUNK_SIZE);
                if data.is_empty() {
                    break;
                }
                offsets[i] = offset + data.len() as u64;
                frames.push(Message::Output {
                    stream,
                    offset,
                    data,
                });
            }
            offsets[i] = offsets[i].max(ring.start());
        }
        (frames, out.done)
    }

    /// Streams output from `offsets` until the process ended (then its exit) or, without
    /// `follow`, until caught up (then `Eof`). Stops when the client goes away.
    pub async fn attach(
        &self,
        offsets: [u64; 2],
        follow: bool,
        reader: &mut Reader,
        writer: &mut Writer,
    ) -> Result<(), CodecError> {
        let gone = reader.read();
        self.stream_output(offsets, follow, writer, std::pin::pin!(gone))
            .await
    }

    /// Output from `offsets` until the process ended (then its exit), or without
    /// `follow` until caught up (then `Eof`), or until `gone` completes (the client left).
    async fn stream_output<G: std::future::Future>(
        &self,
        mut offsets: [u64; 2],
        follow: bool,
        writer: &mut Writer,
        mut gone: std::pin::Pin<&mut G>,
    ) -> Result<(), CodecError> {
        let mut changed = self.changed.subscribe();
        loop {
            changed.borrow_and_update();
            let (frames, done) = self.catch_up(&mut offsets);
            let caught_up = frames.is_empty();
            for f in frames {
                writer.send(&f).await?;
            }
            if !caught_up {
                continue;
            }
            if done {
                let lost = ExitInfo {
                    status: ExitStatus::Code(-1),
                    timed_out: false,
                };
                return writer
                    .send(&Message::Exit(self.exit_info().unwrap_or(lost)))
                    .await;
            }
            if !follow {
                return writer.send(&Message::Eof).await;
            }
            tokio::select! {
                r = changed.changed() => r.map_err(|_| CodecError::Truncated)?,
                _ = gone.as_mut() => return Ok(()),
            }
        }
    }

    fn check_terminal(&self) -> Result<(), AgentError> {
        if self.terminal {
            Ok(())
        } else {
            Err(invalid(format!("process {} has no terminal", self.id)))
        }
    }

    pub async fn resize(&self, size: PtySize) -> Result<(), AgentError> {
        let size = size.check().map_err(invalid)?;
        self.check_terminal()?;
        self.send_keeper(&Message::PtyResize(size)).await
    }

    /// A terminal session: output from `offset` until the process ended (then its exit),
    /// while the client's `Data` frames are typed into the terminal and its `PtyResize`
    /// frames resize it. Ends, leaving the process running, when the client goes away.
    pub async fn pty_session(
        self: &Arc<Self>,
        offset: u64,
        reader: Reader,
        writer: &mut Writer,
    ) -> Result<(), CodecError> {
        if let Err(e) = self.check_terminal() {
            super::wire::send_error(writer, e).await;
            return Ok(());
        }
        writer.send(&Message::Done).await?;
        let mut input = tokio::spawn(self.clone().pty_input(reader));
        // The stdout stream only: a terminal's output is one stream.
        let result = self
            .stream_output([offset, 0], true, writer, std::pin::pin!(&mut input))
            .await;
        input.abort();
        result
    }

    /// Applies a terminal client's frames until it goes away or breaks the protocol.
    async fn pty_input(self: Arc<Self>, mut reader: Reader) {
        loop {
            match reader.read().await {
                Ok(Some(Message::Data(data))) => {
                    if self.write_stdin(&data).await.is_err() {
                        return;
                    }
                }
                Ok(Some(Message::PtyResize(size))) => {
                    let _ = self.resize(size).await;
                }
                _ => return,
            }
        }
    }
}
