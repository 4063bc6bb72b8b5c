//! The host side of the agent protocol: [`AgentClient`], what the daemon and the runtime
//! use to talk to a sandbox's agent. It treats the agent as hostile: bounded reads and
//! waits, and it never follows a symlink planted in the socket directory.
//!
//! Every call opens a fresh connection (no state depends on one staying open, so the
//! client keeps working across a checkpoint/restore of the sandbox). The socket is reached
//! without following symlinks: the sandbox can write to the socket directory and could
//! otherwise point `agent.sock` at any socket on the host.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod connect;
mod exec;
mod files;
mod procs;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use proto::agent::{AgentError, HelloInfo, Identity, Message, Request, SOCKET_NAME};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use proto::codec::{CodecError, FrameReader, FrameWriter};

pub use exec::{ExecEvent, ExecOutput, ExecStdin, ExecStream};
pub use files::{FileDownload, LogStream, WatchStream, WriteOptions};
pub use procs::{AttachEvent, AttachStream, PtyInput, PtyOutput};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the agent socket {path}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is not a socket; refusing to use it")]
    NotASocket(PathBuf),
    #[error("agent connection failed")]
    Io(#[from] std::io::Error),
    #[error("agent sent an invalid frame")]
    Protocol(#[from] proto::agent::ProtoError),
    #[error("agent closed the connection unexpectedly")]
    Closed,
    #[error("agent sent an unexpected {0} frame")]
    Unexpected(String),
    /// The agent refused or failed the request; its message is for the user.
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("agent output exceeds the limit of {0} bytes")]
    TooLarge(u64),
    #[error("agent did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the socket at {path} is not the agent's (it belongs to host pid {found}, the agent is {expected}); refusing to use it")]
    Impostor {
        path: PathBuf,
        found: i32,
        expected: u32,
    },
    #[error("agent not ready after {waited:?}")]
    NotReady {
        waited: Duration,
        source: Box<ClientError>,
    },
}

impl ClientError {
    /// Whether the agent could not read the request at all: an agent older than the
    /// request (one appended to the protocol after it was built), as a restored memory
    /// snapshot may run. Nothing was done.
    pub fn predates_request(&self) -> bool {
        matches!(self, ClientError::Agent(e)
            if e.kind == proto::agent::ErrorKind::InvalidInput
                && e.message.starts_with("malformed frame payload"))
    }
}

impl ClientError {
    /// Whether retrying may help: the agent is not listening (yet) or went away.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Connect { .. } | Self::Io(_) | Self::Closed | Self::Timeout(_)
        )
    }
}

impl From<CodecError> for ClientError {
    fn from(e: CodecError) -> Self {
        match e {
            CodecError::Io(e) => Self::Io(e),
            CodecError::Proto(e) => Self::Protocol(e),
            CodecError::Truncated => Self::Closed,
        }
    }
}

/// How long the agent may take to answer a connection with its preamble (it does so at
/// once; more means it is stuck or not an agent).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request answered by one frame may take (stopping a process takes up to its
/// 2 s grace; everything else is immediate).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// One open request: the agent's frames come in on `reader`.
pub(crate) struct Conn {
    pub reader: FrameReader<OwnedReadHalf>,
    pub writer: FrameWriter<OwnedWriteHalf>,
}

impl Conn {
    /// The next frame; an agent `Error` frame becomes `Err`.
    pub async fn recv(&mut self) -> Result<Message> {
        recv_from(&mut self.reader).await
    }

    /// As [`Self::recv`], for a frame the agent sends at once (it is a reply to a request,
    /// or the next chunk of a file): within [`REPLY_TIMEOUT`].
    pub async fn recv_prompt(&mut self) -> Result<Message> {
        within(REPLY_TIMEOUT, self.recv()).await
    }

    pub async fn send(&mut self, msg: &Message) -> Result<()> {
        Ok(self.writer.send(msg).await?)
    }

    /// As [`Self::send`], within [`REPLY_TIMEOUT`] (an agent that stops reading cannot
    /// hold the caller).
    pub async fn send_prompt(&mut self, msg: &Message) -> Result<()> {
        within(REPLY_TIMEOUT, self.send(msg)).await
    }
}

/// The next frame on `reader`; an agent `Error` frame becomes `Err`.
pub(crate) async fn recv_from(reader: &mut FrameReader<OwnedReadHalf>) -> Result<Message> {
    match reader.read().await? {
        Some(Message::Error(e)) => Err(ClientError::Agent(e)),
        Some(m) => Ok(m),
        None => Err(ClientError::Closed),
    }
}

/// Runs `f`, failing with [`ClientError::Timeout`] after `limit`.
pub(crate) async fn within<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| ClientError::Timeout(limit))?
}

/// Refuses an output or data chunk larger than the agent ever sends ([`CHUNK_SIZE`]): the
/// daemon queues chunks by count, so their size must be bounded for the queue to be.
pub(crate) fn check_chunk(data: &[u8]) -> Result<()> {
    if data.len() > proto::agent::CHUNK_SIZE {
        return Err(ClientError::Unexpected(format!(
            "oversized ({} bytes, over {})",
            data.len(),
            proto::agent::CHUNK_SIZE
        )));
    }
    Ok(())
}

pub(crate) fn unexpected(m: &Message) -> ClientError {
    let dbg = format!("{m:?}");
    ClientError::Unexpected(dbg.split(['(', ' ', '{']).next().unwrap_or("").to_string())
}

/// A handle on one sandbox's agent. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AgentClient {
    dir: Arc<PathBuf>,
    /// The agent's host pid, when known: the socket connected to must be one that process
    /// listens on (a sandbox can put a socket of its own at `agent.sock`).
    pinned: Option<u32>,
}

impl AgentClient {
    /// A client for the agent listening on `socket_dir/agent.sock`.
    pub fn new(socket_dir: &Path) -> Self {
        Self {
            dir: Arc::new(socket_dir.to_path_buf()),
            pinned: None,
        }
    }

    /// The same client, talking only to a socket that host process `pid` (the agent, the
    /// sandbox's init) listens on: anything else at `agent.sock` is an impostor planted by
    /// the sandbox, refused with [`ClientError::Impostor`].
    pub fn pinned_to(mut self, pid: u32) -> Self {
        self.pinned = Some(pid);
        self
    }

    /// The agent's host pid, when pinned (see [`Self::pinned_to`]).
    pub fn pid(&self) -> Option<u32> {
        self.pinned
    }

    pub fn socket_path(&self) -> PathBuf {
        self.dir.join(SOCKET_NAME)
    }

    /// Connects and sends `req`; the rest of the exchange is the caller's.
    pub(crate) async fn request(&self, req: Request) -> Result<Conn> {
        let stream = connect::connect(&self.dir).await?;
        if let Some(expected) = self.pinned {
            // For a listening socket, the peer is the process that called listen().
            let found = stream.peer_cred()?.pid().unwrap_or(0);
            if u32::try_from(found).ok() != Some(expected) {
                return Err(ClientError::Impostor {
                    path: self.socket_path(),
                    found,
                    expected,
                });
            }
        }
        let (r, w) = stream.into_split();
        let mut conn = Conn {
            reader: FrameReader::new(r),
            writer: FrameWriter::new(w),
        };
        conn.writer.send_first(&Message::Request(req)).await?;
        let answer = tokio::time::timeout(ANSWER_TIMEOUT, conn.reader.read_preamble());
        answer
            .await
            .map_err(|_| ClientError::Timeout(ANSWER_TIMEOUT))??;
        Ok(conn)
    }

    /// Sends `req` and returns the single reply frame, which must come within
    /// [`REPLY_TIMEOUT`] (a stuck or hostile agent cannot hold the caller).
    pub(crate) async fn call(&self, req: Request) -> Result<Message> {
        let reply = async { self.request(req).await?.recv().await };
        tokio::time::timeout(REPLY_TIMEOUT, reply)
            .await
            .map_err(|_| ClientError::Timeout(REPLY_TIMEOUT))?
    }

    /// As [`Self::call`], for requests whose answer legitimately takes as long as the
    /// caller asked (a wait for a process).
    pub(crate) async fn call_unbounded(&self, req: Request) -> Result<Message> {
        self.request(req).await?.recv().await
    }

    /// Sends `req`, which must be answered by `Done`.
    pub(crate) async fn call_done(&self, req: Request) -> Result<()> {
        match self.call(req).await? {
            Message::Done => Ok(()),
            m => Err(unexpected(&m)),
        }
    }

    pub async fn hello(&self) -> Result<HelloInfo> {
        match self.call(Request::Hello).await? {
            Message::Hello(h) => Ok(h),
            m => Err(unexpected(&m)),
        }
    }

    /// Polls [`Self::hello`] until it answers or `timeout` passes. Only "not there yet"
    /// errors are retried; a socket that is not a socket or an agent that speaks another
    /// protocol fails at once.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<HelloInfo> {
        self.wait_ready_unless(timeout, || false).await
    }

    /// [`Self::wait_ready`] that also stops, with the last error, once `gave_up()` says
    /// waiting is pointless (e.g. the sandbox's init exited). Polled closely at first (an
    /// agent listens within milliseconds of its container starting), then less often.
    pub async fn wait_ready_unless(
        &self,
        timeout: Duration,
        gave_up: impl Fn() -> bool,
    ) -> Result<HelloInfo> {
        let start = tokio::time::Instant::now();
        let mut pause = Duration::from_micros(500);
        loop {
            let err = match self.hello().await {
                Ok(h) => return Ok(h),
                Err(e) if e.is_transient() => e,
                Err(e) => return Err(e),
            };
            if gave_up() {
                return Err(err);
            }
            if start.elapsed() + pause > timeout {
                let waited = start.elapsed();
                return Err(ClientError::NotReady {
                    waited,
                    source: Box::new(err),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Sets the sandbox's fork identity (after a fork or restore).
    pub async fn set_identity(&self, identity: Identity) -> Result<()> {
        self.call_done(Request::SetIdentity(identity)).await
    }
}
