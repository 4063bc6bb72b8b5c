//! The messages of protocol version 2. Field and variant order is the wire format: append
//! nothing, reorder nothing without bumping [`super::PROTOCOL_VERSION`].

use serde::{Deserialize, Serialize};

/// One frame's payload. The host sends [`Message::Request`] first, then only
/// [`Message::Data`] / [`Message::Eof`] (streamed stdin or file contents); everything else
/// comes from the agent. Each side rejects a frame that is not valid where it arrives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Host → agent, first frame of a connection.
    Request(Request),
    /// A chunk of a byte stream: exec stdin, or file contents in either direction.
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// End of a byte stream or of a list.
    Eof,
    /// Reply to [`Request::Hello`].
    Hello(HelloInfo),
    /// The request succeeded and has nothing more to say.
    Done,
    /// The request failed; the agent closes the connection after it.
    Error(AgentError),
    /// An exec'd process started.
    Started { pid: u32 },
    /// Output of a process; `offset` is the position of `data` in that stream since start.
    Output {
        stream: OutputStream,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Output in `from..to` of `stream` was dropped from the agent's bounded buffer.
    OutputDropped {
        stream: OutputStream,
        from: u64,
        to: u64,
    },
    /// A process ended; last frame of an exec, attach or wait.
    Exit(ExitInfo),
    /// A background process started.
    Spawned { id: u64, pid: u32 },
    /// Reply to [`Request::ListProcesses`].
    Processes(Vec<ProcessInfo>),
    /// A file write completed with this many bytes.
    Written { bytes: u64 },
    /// One batch of a directory listing; the listing ends with [`Message::Eof`].
    DirEntries(Vec<DirEntry>),
    /// Metadata of a path (reply to stat, and header of a file read).
    Stat(FileStat),
    /// Changes under a watched directory, in the order they happened.
    FsEvents(Vec<FsEvent>),
    /// Host → agent on a [`Request::PtyConnect`] connection: the terminal's new size.
    PtyResize(PtySize),
    /// Lines of the sandbox log, in order (reply to [`Request::Logs`]).
    LogLines(Vec<LogLine>),
}

/// What the host asks for. One request per connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Readiness probe → [`Message::Hello`].
    Hello,
    /// Run a process and stream its output on this connection → `Started`, `Output`*,
    /// `Exit` (or `Error`). With [`StdinMode::Stream`] the host sends `Data`* then `Eof`.
    Exec(ExecRequest),
    /// Start a background process, supervised when it has a name, a restart policy or a
    /// health check → `Spawned`.
    Spawn(SpawnRequest),
    /// → `Processes`.
    ListProcesses,
    /// Stream a background process's buffered and future output from the given offsets →
    /// `OutputDropped`?, `Output`*, then `Exit` once it ended and all output was sent, or
    /// `Eof` when caught up and `follow` is false.
    Attach {
        id: u64,
        stdout_offset: u64,
        stderr_offset: u64,
        follow: bool,
    },
    /// Write to a background process's stdin → `Done`.
    WriteStdin {
        id: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Close a background process's stdin → `Done`.
    CloseStdin { id: u64 },
    /// Send a signal to a background process (its whole process group if `group`) → `Done`.
    Signal { id: u64, signal: i32, group: bool },
    /// Wait for a background process to end → `Exit`, or `Error` (TimedOut).
    Wait { id: u64, timeout_ms: Option<u64> },
    /// Read a file → `Stat`, `Data`*, `Eof`. `limit` caps the bytes sent.
    ReadFile {
        path: String,
        offset: u64,
        limit: Option<u64>,
    },
    /// Write a file atomically (temporary file + rename) → `Done` when ready for data; the
    /// host sends `Data`* then `Eof`; → `Written`.
    WriteFile {
        path: String,
        mode: Option<u32>,
        create_parents: bool,
    },
    /// → `DirEntries`*, `Eof`.
    ListDir { path: String },
    /// → `Stat`. Symlinks are not followed.
    Stat { path: String },
    /// → `Done`.
    Remove { path: String, recursive: bool },
    /// → `Done`.
    Mkdir {
        path: String,
        parents: bool,
        mode: Option<u32>,
    },
    /// Set the sandbox's fork identity (after a restore) → `Done`.
    SetIdentity(Identity),
    /// Stop a background process (kill its group; a supervised one is not restarted) and
    /// start it again with the same request → `Spawned` (a new id and pid).
    Restart { id: u64 },
    /// Kill a background process's group; a supervised one is not restarted → `Done`.
    Stop { id: u64 },
    /// Watch a directory (and, with `recursive`, the directories under it, those made
    /// later included) → `Done` once the watch is in place, then `FsEvents`* until the
    /// host closes the connection.
    WatchDir { path: String, recursive: bool },
    /// Start a background process on a new pseudo-terminal of `size` (its stdin, stdout
    /// and stderr are the terminal; its output is one stream, `Stdout`) → `Spawned`.
    SpawnPty { spawn: SpawnRequest, size: PtySize },
    /// Attach to a terminal process → `Done`, then `Output`* from `offset` on, then `Exit`; meanwhile the
    /// host sends `Data` (typed input) and `PtyResize`. Closing the connection detaches
    /// and leaves the process running.
    PtyConnect { id: u64, offset: u64 },
    /// Resize a terminal process's terminal (its foreground group gets SIGWINCH) → `Done`.
    ResizePty { id: u64, size: PtySize },
    /// The sandbox log from line `since` (its `seq`) on → `LogLines`*, then `Eof`; with
    /// `follow`, new lines as they come until the host closes the connection.
    Logs { since: u64, follow: bool },
    /// [`Request::WriteFile`] on behalf of an account: the file, and every parent directory
    /// the write creates, belong to `uid`:`gid` (the replaced file's owner otherwise).
    WriteFileAs {
        path: String,
        mode: Option<u32>,
        create_parents: bool,
        uid: u32,
        gid: u32,
    },
}

/// One line a background process wrote (or a piece of a very long one), as the agent's
/// sandbox log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// Position in the log, from 1; consecutive.
    pub seq: u64,
    /// When the agent read it.
    pub unix_ms: u64,
    /// The agent's id of the process.
    pub process: u64,
    pub stream: OutputStream,
    /// Without its newline.
    #[serde(with = "serde_bytes")]
    pub text: Vec<u8>,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

impl PtySize {
    /// Largest side accepted (a terminal bigger than this is a mistake or an attack).
    pub const MAX: u16 = 4096;

    /// Checks both sides are within 1..=[`Self::MAX`].
    pub fn check(self) -> Result<Self, String> {
        let ok = |n: u16| (1..=Self::MAX).contains(&n);
        if ok(self.cols) && ok(self.rows) {
            Ok(self)
        } else {
            Err(format!(
                "invalid terminal size {}x{}: columns and rows must be 1-{}",
                self.cols,
                self.rows,
                Self::MAX
            ))
        }
    }
}

/// A background process to start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    pub exec: ExecRequest,
    /// Unique among the supervised processes that have not stopped; requests may name the
    /// process by it.
    pub name: Option<String>,
    pub stdout: OutputMode,
    pub stderr: OutputMode,
    /// When to start it again after it ends.
    pub restart: Option<RestartPolicy>,
    /// How to tell it works; failing it `failure_threshold` times in a row kills it (and
    /// the restart policy decides what follows).
    pub health: Option<HealthCheck>,
}

impl From<ExecRequest> for SpawnRequest {
    /// A plain (unsupervised) background process.
    fn from(exec: ExecRequest) -> Self {
        SpawnRequest {
            exec,
            ..SpawnRequest::default()
        }
    }
}

/// Longest name of a supervised process.
pub const MAX_PROCESS_NAME: usize = 64;

/// Checks a supervised process's name: 1-64 of letters, digits, `-`, `_` and `.`, not all
/// digits (numbers address processes by id).
pub fn check_process_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_PROCESS_NAME
        && !name.bytes().all(|b| b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid process name {name:?}: use 1-{MAX_PROCESS_NAME} of letters, digits, '-', '_' \
             and '.', not all digits (numbers address processes by id)"
        ))
    }
}

impl SpawnRequest {
    /// Whether the agent supervises the process (names it, restarts it, checks it).
    pub fn is_managed(&self) -> bool {
        self.name.is_some() || self.restart.is_some() || self.health.is_some()
    }
}

/// What happens to a stream of a background process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputMode {
    /// Kept in the process's output buffer.
    #[default]
    Capture,
    /// Read and dropped.
    Discard,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartWhen {
    Never,
    /// After an exit with a non-zero code or by a signal.
    OnFailure,
    Always,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartPolicy {
    pub when: RestartWhen,
    /// Restarts allowed in all; `None` = no limit.
    pub max_restarts: Option<u32>,
    /// The first wait before a restart; it doubles each time up to `max_backoff_ms`.
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HealthProbe {
    /// A TCP connection to the port on 127.0.0.1 succeeds.
    Tcp,
    /// `GET path` on 127.0.0.1:port answers with a status below 400.
    Http { path: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    pub probe: HealthProbe,
    pub port: u16,
    pub initial_delay_ms: u64,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub failure_threshold: u32,
}

/// Where a supervised process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ManagedStatus {
    Starting,
    Running,
    /// Waiting to be restarted.
    BackingOff,
    /// Not restarted again (its policy, its restart limit, or a stop).
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HealthStatus {
    Disabled,
    Starting,
    Healthy,
    Unhealthy,
}

/// What the supervisor knows of a supervised process, across its restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagedInfo {
    pub status: ManagedStatus,
    pub restart_count: u32,
    pub restart: Option<RestartPolicy>,
    pub health: Option<HealthCheck>,
    pub health_status: HealthStatus,
    pub consecutive_health_failures: u32,
    /// How the previous run ended, and when.
    pub last_exit: Option<(ExitInfo, u64)>,
    pub last_error: Option<String>,
    pub next_restart_unix_ms: Option<u64>,
}

/// A process to run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Program: a path, or a name looked up in the effective `PATH`.
    pub command: String,
    pub args: Vec<String>,
    /// Merged over the agent's base environment.
    pub env: Vec<(String, String)>,
    /// Working directory (absolute); `None` = the user's home, else `/`.
    pub cwd: Option<String>,
    /// `name`, `uid` or `uid:gid`; `None` = the agent's user (root).
    pub user: Option<String>,
    pub stdin: StdinMode,
    /// Kill the process group after this long; the exit then says `timed_out`.
    pub timeout_ms: Option<u64>,
}

/// Where a process's stdin comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StdinMode {
    /// `/dev/null`.
    #[default]
    Null,
    /// These bytes, then end of file.
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A pipe fed by the host: `Data` frames for exec, `WriteStdin` for background processes.
    Stream,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    Code(i32),
    Signal { signal: i32, core_dumped: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub status: ExitStatus,
    /// The agent killed the process group because its timeout passed.
    pub timed_out: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloInfo {
    pub agent_version: String,
    pub protocol_version: u16,
    pub uptime_ms: u64,
    /// Random per agent start (hex); a change means the sandbox rebooted.
    pub boot_id: String,
    pub pid: u32,
    /// As last set by [`Request::SetIdentity`].
    pub identity: Option<Identity>,
}

/// A sandbox's identity, set by the host after a fork or restore. The agent writes it to
/// `/etc/sandfork/fork`, mixes the seed into the kernel's entropy pool and adds `env` to the
/// environment of every later process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub sandbox_id: String,
    pub fork_index: u32,
    #[serde(with = "serde_bytes")]
    pub seed: Vec<u8>,
    pub parent_snapshot_id: Option<String>,
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub id: u64,
    pub pid: u32,
    /// Program followed by its arguments.
    pub command: Vec<String>,
    pub state: ProcessState,
    pub started_unix_ms: u64,
    /// Bytes produced so far on each stream (the offset an attach would reach).
    pub stdout_len: u64,
    pub stderr_len: u64,
    pub stdin_open: bool,
    pub name: Option<String>,
    pub ended_unix_ms: Option<u64>,
    /// For a supervised process: its supervisor's view (shared by all its runs).
    pub managed: Option<ManagedInfo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcessState {
    Running,
    Exited(ExitInfo),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_unix_ms: i64,
}

/// One change under a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEvent {
    pub kind: FsEventKind,
    /// Absolute path (lossily converted when it is not UTF-8); for a rename, the new one.
    pub path: String,
    /// For a rename within the watch, the old path.
    pub old_path: Option<String>,
    pub is_dir: bool,
}

/// What changed. A file moved into the watch is a `Create`, one moved out a `Delete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsEventKind {
    Create,
    Modify,
    Delete,
    Rename,
    /// Attributes (mode, owner, times) changed.
    Chmod,
    /// The kernel's event queue overflowed: changes were lost.
    Overflow,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// File name (lossily converted when it is not UTF-8).
    pub name: String,
    pub stat: FileStat,
}

/// Failure classes the agent reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    NotFound,
    PermissionDenied,
    TooLarge,
    IsADirectory,
    NotADirectory,
    AlreadyExists,
    InvalidInput,
    TimedOut,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
    pub kind: ErrorKind,
    pub message: String,
}

impl AgentError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}
