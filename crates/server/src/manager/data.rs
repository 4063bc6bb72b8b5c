//! Data-plane work inside running sandboxes. The manager only checks the state and records
//! activity; bytes flow between the backend's bounded channels and the HTTP bodies.

use std::time::{Duration, Instant};

use bytes::Bytes;
use proto::agent::{DirEntry, ExecRequest, ExitInfo, FileStat, ProcessInfo, SpawnRequest};
use tokio::sync::mpsc;

use super::Manager;
use crate::backend::{BackendError, BackendResult, ExecEvent, Stream, WriteAs, STREAM_DEPTH};
use crate::error::{Error, Result};
use model::{plan, Op};

/// How long a memory checkpoint waits for the data-plane requests in flight to end.
/// CRIU cannot dump an agent holding a connection from the host, so a request still open
/// after this (a process wait, a followed output) makes the checkpoint answer 409; new
/// requests wait behind the checkpoint meanwhile.
pub const DRAIN: Duration = Duration::from_secs(3);

/// A data-plane request's share of its sandbox's agent (see `Entry::plane`).
pub type PlaneGuard = tokio::sync::OwnedRwLockReadGuard<()>;

/// A memory checkpoint's hold on its sandbox's agent: no data-plane request is in flight.
pub type Drained = tokio::sync::OwnedRwLockWriteGuard<()>;

impl Manager {
    /// Resolves a running sandbox for data-plane use and records the activity; a
    /// suspended one is resumed first (resume on access). The guard is held while the
    /// request talks to the agent; it waits for a memory checkpoint in progress, so the
    /// state is checked after it.
    pub async fn using(&self, id_or_name: &str) -> Result<(String, PlaneGuard)> {
        self.check_open()?;
        let entry = self.find(id_or_name)?;
        if entry.state() == model::State::Suspended {
            self.resume_on_access(&entry.view().id).await?;
        }
        let guard = entry.plane.clone().read_owned().await;
        let view = entry.view();
        if plan(view.state, Op::Use).is_none() {
            return Err(Error::WrongState {
                id: view.id,
                state: view.state,
            });
        }
        entry.touch();
        Ok((view.id, guard))
    }

    /// Resumes a suspended sandbox for a request that needs it running. Concurrent
    /// requests wait for the one resume (it holds the sandbox's operation lock); whoever
    /// finds it already resumed goes on.
    async fn resume_on_access(&self, id: &str) -> Result<()> {
        match self.resume(id).await {
            Ok(_) => {
                tracing::info!(sandbox = %id, "resumed on access");
                Ok(())
            }
            Err(Error::WrongState { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits up to [`DRAIN`] for the data-plane requests of `entry` to end, and holds new
    /// ones back until the returned guard is dropped.
    pub(super) async fn drain(&self, entry: &super::Entry) -> Result<Drained> {
        let id = entry.view().id;
        entry.preempt.send_modify(|n| *n += 1);
        tokio::time::timeout(DRAIN, entry.plane.clone().write_owned())
            .await
            .map_err(|_| {
                Error::Conflict(format!(
                    "Sandbox {id} has a request in progress (a process wait, a followed \
                     output or a long exec) after {} s; a memory checkpoint needs it to \
                     end first",
                    DRAIN.as_secs()
                ))
            })
    }

    fn touch(&self, id: &str) {
        if let Some(e) = self.registry().entries.get(id) {
            e.touch();
        }
    }

    /// Runs a command; the stream ends with the exit event.
    pub async fn exec(&self, id_or_name: &str, req: ExecRequest) -> Result<Stream<ExecEvent>> {
        let (id, plane) = self.using(id_or_name).await?;
        let started = Instant::now();
        let inner = match self.backend.exec(&id, req).await {
            Ok(s) => s,
            Err(e) => {
                crate::guest_warn!(self.guest_logs, &id, sandbox = %id, error = %e, "exec refused");
                if matches!(e, BackendError::Unavailable(_)) {
                    self.probe_soon(&id);
                }
                return Err(e.into());
            }
        };
        Ok(self.observe_exec(id, started, inner, plane))
    }

    /// Forwards an exec stream, timing it and touching the sandbox when it ends.
    fn observe_exec(
        &self,
        id: String,
        started: Instant,
        mut inner: Stream<ExecEvent>,
        plane: PlaneGuard,
    ) -> Stream<ExecEvent> {
        let (tx, rx) = mpsc::channel(STREAM_DEPTH);
        let metrics = self.metrics.clone();
        let manager = self.weak_self();
        tokio::spawn(async move {
            let _plane = plane;
            while let Some(item) = next_for(&tx, &mut inner).await {
                if matches!(item, Ok(ExecEvent::Exit(_))) {
                    metrics.exec.observe(started.elapsed());
                }
                if tx.send(item).await.is_err() {
                    break;
                }
            }
            if let Some(m) = manager.upgrade() {
                m.touch(&id);
            }
        });
        rx
    }

    pub async fn spawn(&self, id_or_name: &str, req: SpawnRequest) -> Result<ProcessInfo> {
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.spawn(&id, req).await?)
    }

    /// The pid a route's `{pid}` names: a number, or a supervised process's name (its
    /// latest run).
    pub async fn resolve_pid(&self, id_or_name: &str, pid_or_name: &str) -> Result<u64> {
        if let Ok(pid) = pid_or_name.parse() {
            return Ok(pid);
        }
        if pid_or_name.is_empty()
            || pid_or_name
                .bytes()
                .any(|b| b.is_ascii_control() || b == b'/')
        {
            return Err(Error::InvalidArgument(format!(
                "Invalid process id or name {pid_or_name:?}"
            )));
        }
        self.processes(id_or_name)
            .await?
            .into_iter()
            .filter(|p| p.name.as_deref() == Some(pid_or_name))
            .map(|p| p.id)
            .max()
            .ok_or_else(|| Error::NotFound(format!("No process named {pid_or_name}")))
    }

    /// Stops process `pid` and starts its request again; returns the new run.
    pub async fn restart_process(&self, id_or_name: &str, pid: u64) -> Result<ProcessInfo> {
        self.process(id_or_name, pid).await?;
        let new_pid = {
            let (id, _plane) = self.using(id_or_name).await?;
            self.backend.restart(&id, pid).await?
        };
        self.process(id_or_name, new_pid).await
    }

    /// Stops process `pid` (a supervised one for good).
    pub async fn stop_process(&self, id_or_name: &str, pid: u64) -> Result<()> {
        self.process(id_or_name, pid).await?;
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.stop(&id, pid).await?)
    }

    pub async fn processes(&self, id_or_name: &str) -> Result<Vec<ProcessInfo>> {
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.processes(&id).await?)
    }

    pub async fn process(&self, id_or_name: &str, pid: u64) -> Result<ProcessInfo> {
        self.processes(id_or_name)
            .await?
            .into_iter()
            .find(|p| p.id == pid)
            .ok_or_else(|| Error::NotFound(format!("Process {pid} not found")))
    }

    pub async fn attach(
        &self,
        id_or_name: &str,
        pid: u64,
        offsets: (u64, u64),
        follow: bool,
    ) -> Result<Stream<ExecEvent>> {
        let (id, plane) = self.using(id_or_name).await?;
        Ok(holding(
            plane,
            self.backend.attach(&id, pid, offsets, follow).await?,
        ))
    }

    pub async fn write_stdin(&self, id_or_name: &str, pid: u64, data: Bytes) -> Result<()> {
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.write_stdin(&id, pid, data).await?)
    }

    pub async fn close_stdin(&self, id_or_name: &str, pid: u64) -> Result<()> {
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.close_stdin(&id, pid).await?)
    }

    pub async fn signal(&self, id_or_name: &str, pid: u64, signal: i32) -> Result<()> {
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.signal(&id, pid, signal).await?)
    }

    pub async fn wait(
        &self,
        id_or_name: &str,
        pid: u64,
        timeout_ms: Option<u64>,
    ) -> Result<ExitInfo> {
        let (id, _plane) = self.using(id_or_name).await?;
        let r = self.backend.wait(&id, pid, timeout_ms).await;
        self.touch(&id);
        Ok(r?)
    }

    pub async fn read_file(
        &self,
        id_or_name: &str,
        path: &str,
    ) -> Result<(FileStat, Stream<Bytes>)> {
        let (id, plane) = self.using(id_or_name).await?;
        let (stat, data) = self.backend.read_file(&id, path).await?;
        Ok((stat, holding(plane, data)))
    }

    pub async fn write_file(
        &self,
        id_or_name: &str,
        path: &str,
        how: WriteAs,
        data: Stream<Bytes>,
    ) -> Result<u64> {
        let (id, _plane) = self.using(id_or_name).await?;
        let data_dir = self.config.data_dir.clone();
        check_host_space(&data_dir)?;
        let data = guard_host_space(data_dir, data);
        let r = self.backend.write_file(&id, path, how, data).await;
        self.touch(&id);
        Ok(r?)
    }

    pub async fn list_dir(&self, id_or_name: &str, path: &str) -> Result<Vec<DirEntry>> {
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.list_dir(&id, path).await?)
    }

    /// Watches a directory: batches of changes for as long as the caller reads (like a
    /// followed output, an open watch holds the sandbox's agent: a memory checkpoint waits
    /// up to [`DRAIN`] for it to end, then answers 409).
    pub async fn watch_dir(
        &self,
        id_or_name: &str,
        path: &str,
        recursive: bool,
    ) -> Result<Stream<Vec<proto::agent::FsEvent>>> {
        let (id, plane) = self.using(id_or_name).await?;
        Ok(holding(
            plane,
            self.backend.watch_dir(&id, path, recursive).await?,
        ))
    }

    pub async fn stat(&self, id_or_name: &str, path: &str) -> Result<FileStat> {
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.stat(&id, path).await?)
    }

    pub async fn remove(&self, id_or_name: &str, path: &str, recursive: bool) -> Result<()> {
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.remove(&id, path, recursive).await?)
    }

    pub async fn mkdir(&self, id_or_name: &str, path: &str, parents: bool) -> Result<()> {
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.mkdir(&id, path, parents).await?)
    }
}

/// Forwards `inner`, holding `plane` until it ends or its reader goes away.
fn holding<T: Send + 'static>(plane: PlaneGuard, mut inner: Stream<T>) -> Stream<T> {
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        let _plane = plane;
        while let Some(item) = next_for(&tx, &mut inner).await {
            if tx.send(item).await.is_err() {
                break;
            }
        }
    });
    rx
}

/// The next item of `inner`, or `None` as soon as the reader of `tx` goes away — not at
/// the next item: dropping `inner` then lets its producer close the agent connection, and
/// the plane guard go, at once.
pub(super) async fn next_for<T, U>(
    tx: &mpsc::Sender<U>,
    inner: &mut Stream<T>,
) -> Option<BackendResult<T>> {
    tokio::select! {
        item = inner.recv() => item,
        () = tx.closed() => None,
    }
}

/// Free space the host disk must keep for an upload to go on: a sandbox's disk takes its
/// room there only at writeback, after the guest's write succeeded, so an upload is
/// refused (507) before the host disk is full rather than lost after.
pub const HOST_SPACE_FLOOR: u64 = 32 << 20;

/// How often (in uploaded bytes) an upload checks the host's free space.
const SPACE_CHECK_EVERY: u64 = 8 << 20;

fn host_space_error(data_dir: &std::path::Path) -> Option<String> {
    let free = runtime::space::free_bytes(data_dir).ok()?;
    (free < HOST_SPACE_FLOOR).then(|| {
        format!(
            "No space left on device: the host disk of {} has {} MiB free",
            data_dir.display(),
            free >> 20
        )
    })
}

fn check_host_space(data_dir: &std::path::Path) -> Result<()> {
    match host_space_error(data_dir) {
        Some(m) => Err(BackendError::Host(m).into()),
        None => Ok(()),
    }
}

/// Forwards an upload's chunks, ending it with an error once the host disk runs low (the
/// backend then drops the partial file).
fn guard_host_space(data_dir: std::path::PathBuf, mut data: Stream<Bytes>) -> Stream<Bytes> {
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        let (mut seen, mut next_check) = (0u64, SPACE_CHECK_EVERY);
        while let Some(item) = data.recv().await {
            if let Ok(chunk) = &item {
                seen += chunk.len() as u64;
            }
            if seen >= next_check {
                next_check = seen + SPACE_CHECK_EVERY;
                if let Some(m) = host_space_error(&data_dir) {
                    let _ = tx.send(Err(BackendError::Host(m))).await;
                    return;
                }
            }
            if tx.send(item).await.is_err() {
                return;
            }
        }
    });
    rx
}
