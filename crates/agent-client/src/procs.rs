//! Background processes: spawn, list, attach, stdin, signal, wait.

use std::time::Duration;

use proto::agent::{ExitInfo, Message, OutputStream, ProcessInfo, PtySize, Request, SpawnRequest};
use proto::codec::{FrameReader, FrameWriter};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::{unexpected, AgentClient, ClientError, Conn, Result};

/// What an attached client receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachEvent {
    Output {
        stream: OutputStream,
        offset: u64,
        data: Vec<u8>,
    },
    /// Bytes `from..to` of `stream` were dropped from the agent's bounded buffer.
    Dropped {
        stream: OutputStream,
        from: u64,
        to: u64,
    },
    /// The process ended and all its output was delivered. Last event.
    Exit(ExitInfo),
    /// Caught up with the output so far (attach without `follow`). Last event.
    CaughtUp,
}

/// Output of a background process, as it arrives.
pub struct AttachStream {
    conn: Conn,
    done: bool,
}

impl AttachStream {
    /// The next event; `None` after [`AttachEvent::Exit`] or [`AttachEvent::CaughtUp`].
    pub async fn next(&mut self) -> Result<Option<AttachEvent>> {
        if self.done {
            return Ok(None);
        }
        let ev = attach_event(self.conn.recv().await?)?;
        self.done = matches!(ev, AttachEvent::Exit(_) | AttachEvent::CaughtUp);
        Ok(Some(ev))
    }
}

fn attach_event(msg: Message) -> Result<AttachEvent> {
    Ok(match msg {
        Message::Output {
            stream,
            offset,
            data,
        } => {
            crate::check_chunk(&data)?;
            AttachEvent::Output {
                stream,
                offset,
                data,
            }
        }
        Message::OutputDropped { stream, from, to } => AttachEvent::Dropped { stream, from, to },
        Message::Exit(e) => AttachEvent::Exit(e),
        Message::Eof => AttachEvent::CaughtUp,
        m => return Err(unexpected(&m)),
    })
}

/// A terminal session's output, as it arrives.
pub struct PtyOutput {
    reader: FrameReader<OwnedReadHalf>,
    done: bool,
}

impl PtyOutput {
    /// The next event; `None` after [`AttachEvent::Exit`] or when the agent closed the
    /// session (the sandbox is being checkpointed or went away).
    pub async fn next(&mut self) -> Result<Option<AttachEvent>> {
        if self.done {
            return Ok(None);
        }
        let msg = match crate::recv_from(&mut self.reader).await {
            Err(ClientError::Closed) => return Ok(None),
            r => r?,
        };
        let ev = attach_event(msg)?;
        self.done = matches!(ev, AttachEvent::Exit(_));
        Ok(Some(ev))
    }
}

/// A terminal session's input: keystrokes and resizes. Dropping it detaches the session
/// (the process keeps running).
pub struct PtyInput {
    writer: FrameWriter<OwnedWriteHalf>,
}

impl PtyInput {
    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        for chunk in data.chunks(proto::agent::CHUNK_SIZE) {
            self.writer.send(&Message::Data(chunk.to_vec())).await?;
        }
        Ok(())
    }

    pub async fn resize(&mut self, size: PtySize) -> Result<()> {
        Ok(self.writer.send(&Message::PtyResize(size)).await?)
    }
}

impl AgentClient {
    /// Starts a background process and returns its `(id, pid)`. It keeps running, and
    /// its output keeps being buffered, whether or not any client is connected.
    pub async fn spawn(&self, req: impl Into<SpawnRequest>) -> Result<(u64, u32)> {
        match self.call(Request::Spawn(req.into())).await? {
            Message::Spawned { id, pid } => Ok((id, pid)),
            m => Err(unexpected(&m)),
        }
    }

    /// Stops process `id` (a supervised one for good) and starts its request again;
    /// returns the new `(id, pid)`.
    pub async fn restart(&self, id: u64) -> Result<(u64, u32)> {
        match self.call(Request::Restart { id }).await? {
            Message::Spawned { id, pid } => Ok((id, pid)),
            m => Err(unexpected(&m)),
        }
    }

    /// Stops process `id`: SIGTERM to its group, SIGKILL after a grace period; a
    /// supervised one is not restarted.
    pub async fn stop(&self, id: u64) -> Result<()> {
        self.call_done(Request::Stop { id }).await
    }

    pub async fn list_processes(&self) -> Result<Vec<ProcessInfo>> {
        match self.call(Request::ListProcesses).await? {
            Message::Processes(p) => Ok(p),
            m => Err(unexpected(&m)),
        }
    }

    /// Streams output of process `id` from the given offsets (0, 0 = everything still
    /// buffered). With `follow`, until the process ends; otherwise until caught up.
    pub async fn attach(&self, id: u64, offsets: (u64, u64), follow: bool) -> Result<AttachStream> {
        let (stdout_offset, stderr_offset) = offsets;
        let req = Request::Attach {
            id,
            stdout_offset,
            stderr_offset,
            follow,
        };
        Ok(AttachStream {
            conn: self.request(req).await?,
            done: false,
        })
    }

    /// Starts a background process on a new terminal of `size`; returns its `(id, pid)`.
    pub async fn spawn_pty(
        &self,
        req: impl Into<SpawnRequest>,
        size: PtySize,
    ) -> Result<(u64, u32)> {
        let req = Request::SpawnPty {
            spawn: req.into(),
            size,
        };
        match self.call(req).await? {
            Message::Spawned { id, pid } => Ok((id, pid)),
            m => Err(unexpected(&m)),
        }
    }

    /// Attaches to terminal process `id` from output `offset` (0 = all still buffered).
    pub async fn pty_connect(&self, id: u64, offset: u64) -> Result<(PtyOutput, PtyInput)> {
        let mut conn = self.request(Request::PtyConnect { id, offset }).await?;
        match conn.recv_prompt().await? {
            Message::Done => Ok((
                PtyOutput {
                    reader: conn.reader,
                    done: false,
                },
                PtyInput {
                    writer: conn.writer,
                },
            )),
            m => Err(unexpected(&m)),
        }
    }

    pub async fn resize_pty(&self, id: u64, size: PtySize) -> Result<()> {
        self.call_done(Request::ResizePty { id, size }).await
    }

    pub async fn write_stdin(&self, id: u64, data: &[u8]) -> Result<()> {
        self.call_done(Request::WriteStdin {
            id,
            data: data.to_vec(),
        })
        .await
    }

    pub async fn close_stdin(&self, id: u64) -> Result<()> {
        self.call_done(Request::CloseStdin { id }).await
    }

    /// Sends `signal` to the process (to its whole process group if `group`).
    pub async fn signal(&self, id: u64, signal: i32, group: bool) -> Result<()> {
        self.call_done(Request::Signal { id, signal, group }).await
    }

    /// Waits for the process to end; `Agent` error of kind `TimedOut` when `timeout`
    /// passes first.
    pub async fn wait(&self, id: u64, timeout: Option<Duration>) -> Result<ExitInfo> {
        let timeout_ms = timeout.map(|t| t.as_millis().min(u64::MAX as u128) as u64);
        match self
            .call_unbounded(Request::Wait { id, timeout_ms })
            .await?
        {
            Message::Exit(e) => Ok(e),
            m => Err(unexpected(&m)),
        }
    }
}
