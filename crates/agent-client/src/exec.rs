//! Exec: a streamed process run on one connection.

use proto::agent::{ExecRequest, ExitInfo, Message, OutputStream, Request, StdinMode, CHUNK_SIZE};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Mutex;

use crate::{unexpected, AgentClient, ClientError, Conn, Result};
use proto::codec::{FrameReader, FrameWriter};

/// How long after its timeout an exec's exit may come: the agent kills the process
/// group at the timeout and reports at once; more means the agent is stuck or not one.
pub const EXIT_GRACE: Duration = Duration::from_secs(20);

/// What a running exec reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(ExitInfo),
}

/// Output of [`AgentClient::exec_collect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: ExitInfo,
    /// Output beyond `max_output` was discarded.
    pub truncated: bool,
}

impl ExecOutput {
    /// The exit code, or `None` when the process was killed by a signal.
    pub fn code(&self) -> Option<i32> {
        match self.exit.status {
            proto::agent::ExitStatus::Code(c) => Some(c),
            proto::agent::ExitStatus::Signal { .. } => None,
        }
    }
}

/// The host's end of a process's stdin (with [`StdinMode::Stream`]). Usable from another
/// task while the output is read, so neither side can deadlock the other.
pub struct ExecStdin {
    writer: SharedWriter,
    closed: bool,
}

/// The connection's write half, shared by the stream and its stdin handle: it is closed
/// (which the agent takes as a disconnect) only when both are dropped.
type SharedWriter = Arc<Mutex<FrameWriter<OwnedWriteHalf>>>;

impl ExecStdin {
    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        let mut w = self.writer.lock().await;
        for chunk in data.chunks(CHUNK_SIZE) {
            w.send(&Message::Data(chunk.to_vec())).await?;
        }
        Ok(())
    }

    /// Sends end of file. Dropping the handle without closing keeps stdin open.
    pub async fn close(&mut self) -> Result<()> {
        if !self.closed {
            self.closed = true;
            self.writer.lock().await.send(&Message::Eof).await?;
        }
        Ok(())
    }
}

/// A running exec: output events until [`ExecEvent::Exit`]. Dropping it disconnects,
/// which makes the agent kill the process group.
pub struct ExecStream {
    pid: u32,
    /// When the exit must have come: the exec's timeout and [`EXIT_GRACE`] (none without
    /// a timeout, as the caller asked).
    deadline: Option<tokio::time::Instant>,
    reader: FrameReader<OwnedReadHalf>,
    stdin: Option<ExecStdin>,
    _writer: SharedWriter,
    done: bool,
}

impl ExecStream {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Takes the stdin handle, to feed it from another task.
    pub fn take_stdin(&mut self) -> Option<ExecStdin> {
        self.stdin.take()
    }

    pub async fn write_stdin(&mut self, data: &[u8]) -> Result<()> {
        self.stdin_mut()?.write(data).await
    }

    pub async fn close_stdin(&mut self) -> Result<()> {
        self.stdin_mut()?.close().await
    }

    fn stdin_mut(&mut self) -> Result<&mut ExecStdin> {
        let gone = || ClientError::Unexpected("stdin is not streamed or was taken".into());
        self.stdin.as_mut().ok_or_else(gone)
    }

    /// The next event; `None` after the exit.
    pub async fn next(&mut self) -> Result<Option<ExecEvent>> {
        if self.done {
            return Ok(None);
        }
        let read = self.reader.read();
        let frame = match self.deadline {
            Some(at) => tokio::time::timeout_at(at, read)
                .await
                .map_err(|_| ClientError::Timeout(EXIT_GRACE))?,
            None => read.await,
        };
        let msg = match frame? {
            Some(Message::Error(e)) => return Err(e.into()),
            Some(m) => m,
            None => return Err(ClientError::Closed),
        };
        Ok(Some(match msg {
            Message::Output {
                stream: OutputStream::Stdout,
                data,
                ..
            } => crate::check_chunk(&data).map(|()| ExecEvent::Stdout(data))?,
            Message::Output {
                stream: OutputStream::Stderr,
                data,
                ..
            } => crate::check_chunk(&data).map(|()| ExecEvent::Stderr(data))?,
            Message::Exit(exit) => {
                self.done = true;
                ExecEvent::Exit(exit)
            }
            m => return Err(unexpected(&m)),
        }))
    }
}

impl AgentClient {
    /// Starts a process; fails with the agent's error (e.g. `NotFound`) if it cannot run.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecStream> {
        let streamed = req.stdin == StdinMode::Stream;
        let deadline = req.timeout_ms.map(|ms| {
            tokio::time::Instant::now() + Duration::from_millis(ms).saturating_add(EXIT_GRACE)
        });
        let mut conn: Conn = self.request(Request::Exec(req)).await?;
        let pid = match conn.recv_prompt().await? {
            Message::Started { pid } => pid,
            m => return Err(unexpected(&m)),
        };
        let Conn { reader, writer } = conn;
        let writer = Arc::new(Mutex::new(writer));
        let stdin = streamed.then(|| ExecStdin {
            writer: writer.clone(),
            closed: false,
        });
        Ok(ExecStream {
            pid,
            deadline,
            reader,
            stdin,
            _writer: writer,
            done: false,
        })
    }

    /// Runs a process to completion, keeping at most `max_output` bytes of each stream.
    /// A streamed stdin is closed at once (the process sees an empty stdin).
    pub async fn exec_collect(&self, req: ExecRequest, max_output: usize) -> Result<ExecOutput> {
        let mut stream = self.exec(req).await?;
        if let Some(mut stdin) = stream.take_stdin() {
            stdin.close().await?;
        }
        let (mut stdout, mut stderr, mut truncated) = (Vec::new(), Vec::new(), false);
        loop {
            let (buf, data) = match stream.next().await? {
                Some(ExecEvent::Stdout(d)) => (&mut stdout, d),
                Some(ExecEvent::Stderr(d)) => (&mut stderr, d),
                Some(ExecEvent::Exit(exit)) => {
                    return Ok(ExecOutput {
                        stdout,
                        stderr,
                        exit,
                        truncated,
                    })
                }
                None => return Err(ClientError::Closed),
            };
            let room = max_output.saturating_sub(buf.len());
            truncated |= data.len() > room;
            buf.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
}
