//! The `/v1` wire types, shared by the daemon (which derives its OpenAPI document from
//! them), the command line and the SDK generators. Requests refuse unknown fields.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

pub use model::{SnapshotType, State};

mod error_code;
pub use error_code::ErrorCode;

/// Error body of every non-2xx response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Machine-readable kind (see [`ErrorCode`]; clients keep working when a newer daemon
    /// sends a code they do not know, so this stays a string on the wire).
    #[schema(value_type = ErrorCode)]
    pub code: String,
    /// What was wrong, in a sentence.
    pub message: String,
}

/// Network settings of a new sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// `internet` (egress through the host, the default) or `none` (loopback only).
    #[serde(default)]
    pub mode: NetworkModeName,
    /// The only destinations allowed, when not empty: IPv4 addresses, CIDRs, hostnames
    /// and wildcards (`*.example.com`).
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// Destinations denied (wins over `allow_out`), in the same forms.
    #[serde(default)]
    pub deny_out: Vec<String>,
}

/// What happens to a sandbox when its idle timeout passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Deleted, with its disk and processes.
    Terminate,
    /// Suspended (a memory checkpoint; its RAM is freed); the next exec, file or process
    /// request, or a resume, brings it back.
    Suspend,
}

/// Network mode names. A new sandbox gets `internet` unless told otherwise (egress to the
/// host's guarded ranges stays refused; see docs/SECURITY.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkModeName {
    None,
    #[default]
    Internet,
}

/// CPU cores of a new sandbox unless told otherwise (every client leaves it to the daemon).
pub const DEFAULT_CPUS: f64 = 1.0;
/// Memory limit, in MiB, of a new sandbox unless told otherwise.
pub const DEFAULT_MEMORY_MB: u64 = 512;

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Image name (default: the daemon's `default_image`, `python` unless configured;
    /// built-in images are built on first use); exclusive with `snapshot_id`.
    pub image: Option<String>,
    /// Start from this snapshot instead of an image.
    pub snapshot_id: Option<String>,
    /// A command (program and arguments) started in the background once the sandbox has
    /// booted, as a container's entrypoint; with an image only.
    pub entrypoint: Option<Vec<String>>,
    /// Unique among live sandboxes; usable wherever an id is.
    #[schema(pattern = "^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,62}$")]
    pub name: Option<String>,
    /// CPU cores (default 1).
    #[schema(minimum = 0.01, maximum = 1024)]
    pub cpus: Option<f64>,
    /// Memory limit in MiB (default 512).
    #[schema(minimum = 16)]
    pub memory_mb: Option<u64>,
    /// Root disk size in MiB (0 or absent: the image's); at most 1 TiB.
    #[schema(maximum = 1048576)]
    pub disk_mb: Option<u64>,
    /// Idle seconds (no API request touching the sandbox) before `on_timeout`; 0 = never.
    pub timeout_secs: Option<u64>,
    /// What the idle timeout does (default: `suspend` for a named sandbox, `terminate`
    /// for an unnamed one).
    pub on_timeout: Option<OnTimeout>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Named volumes to mount (with an image; a snapshot brings the volumes it had).
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
    /// Like `env`, but never echoed back.
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    pub network: Option<NetworkRequest>,
    /// SDK spelling of `network.mode = internet`.
    pub allow_internet_access: Option<bool>,
    /// SDK spelling of `network.allow_out`.
    pub allow_out: Option<Vec<String>>,
    /// SDK spelling of `network.deny_out`.
    pub deny_out: Option<Vec<String>>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Serve the sandbox's ports through the gateway without an access token (default:
    /// private).
    pub public_ports: Option<bool>,
    /// The only ports the gateway serves (default: any port).
    pub exposed_ports: Option<Vec<u16>>,
}

/// A sandbox's network as reported.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NetworkView {
    pub mode: NetworkModeName,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
}

/// Where a forked sandbox came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForkInfo {
    pub index: u32,
    pub parent_snapshot_id: String,
    /// The fork call that made it (children of one call share it); absent for a single
    /// create from a snapshot. A call cut short before it answered (its client gone, or
    /// the daemon restarted) has its children terminated: its caller never heard of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_id: Option<String>,
}

/// A sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub state: State,
    pub image: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    pub cpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub timeout_secs: u64,
    /// What the idle timeout does; absent in records from before it could be chosen (then
    /// named sandboxes suspend and unnamed ones terminate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
    /// RFC 3339; when the idle timeout passes unless a request touches the sandbox first
    /// (running sandboxes with a timeout only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    pub network: NetworkView,
    pub labels: BTreeMap<String, String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339; the last API request that touched this sandbox.
    pub last_active_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkInfo>,
    /// Why the sandbox failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The command started in the background when the sandbox booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// Whether the gateway serves its ports without an access token.
    #[serde(default)]
    pub public_ports: bool,
    /// The only ports the gateway serves; absent: any port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_ports: Option<Vec<u16>>,
    /// Set while the host's data directory is full and the sandbox's disk writes wait
    /// for space (they are kept, never dropped, and go on once space is freed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disk_full: bool,
    /// How many times its access token was rotated (`POST /v1/sandboxes/{id}/access-token`):
    /// the access tokens and signed URLs made before the last rotation open nothing.
    #[serde(default)]
    pub access_epoch: u32,
}

/// `PATCH /v1/sandboxes/{id}`: what to change on a live sandbox; absent fields stay.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSandbox {
    /// A new name (unique among live sandboxes); naming an unnamed sandbox lets it suspend.
    pub name: Option<String>,
    /// Replaces the labels.
    pub labels: Option<BTreeMap<String, String>>,
    /// Replaces the egress allow list (IPv4 addresses, CIDRs, hostnames, `*.` wildcards)
    /// of a sandbox with internet access, at once and without a restart.
    pub allow_out: Option<Vec<String>>,
    /// Replaces the egress deny list (same forms) of a sandbox with internet access.
    pub deny_out: Option<Vec<String>>,
    /// A new idle timeout, counted from now (0 = never).
    pub timeout_secs: Option<u64>,
    /// A new action for the idle timeout.
    pub on_timeout: Option<OnTimeout>,
    /// Serve its ports without an access token (true) or with one only (false).
    pub public_ports: Option<bool>,
    /// The only ports the gateway serves (an empty list: none).
    pub exposed_ports: Option<Vec<u16>>,
}

/// `PATCH /v1/sandboxes/{id}/labels`: labels to set and keys to remove, applied in one step
/// (no read-modify-write race between clients tagging the same sandbox).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelsPatch {
    /// Added, or replacing the value of a key already there.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Removed; a key that is not there is ignored. A key may not be both set and removed.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A sandbox's labels.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Labels {
    pub labels: BTreeMap<String, String>,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// `GET /v1/sandboxes/{id}/stats`: what a running sandbox uses, read when asked.
/// Counters (CPU time, network) run from the sandbox's boot, or from its restore for a
/// restored, forked or resumed sandbox; a client gets rates from two readings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxStats {
    pub id: String,
    /// RFC 3339.
    pub sampled_at: String,
    /// Its CPU limit, in cores.
    pub cpus: f64,
    #[serde(flatten)]
    pub usage: ResourceUse,
}

/// What a running sandbox uses, read now (counters run from its boot or restore).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResourceUse {
    /// CPU time used by every process of the sandbox.
    pub cpu_seconds: f64,
    pub memory_bytes: u64,
    pub memory_limit_bytes: u64,
    pub pids: u64,
    /// Processes the kernel's OOM killer killed for want of memory.
    pub oom_kills: u64,
    /// Of the root disk, as its file system counts.
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
    /// Through its network interfaces (loopback not counted).
    pub net_rx_bytes: u64,
    pub net_tx_bytes: u64,
    pub net_rx_packets: u64,
    pub net_tx_packets: u64,
}

/// What happened to a sandbox, as `GET /v1/events` streams it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Admitted; booting from an image or restoring from `snapshot_id`.
    Created,
    /// Made from a snapshot as one child of a fork (`snapshot_id` is its parent).
    Forked,
    /// Running for the first time.
    Started,
    /// A checkpoint of it was taken (`snapshot_id`).
    Checkpointed,
    Suspended,
    Resumed,
    /// Terminated (deleted, or by its idle timeout).
    Terminated,
    /// Failed; `message` says why.
    Failed,
    /// The kernel's OOM killer killed a process in it; `message` says how many so far.
    Oom,
    /// The host's data directory is full: its disk writes wait for space (`disk_full`).
    DiskFull,
    /// Space is back and its held disk writes went through.
    DiskRecovered,
    /// Not an event of a sandbox: this stream fell behind and `message` says how many
    /// events it missed.
    Lagged,
}

/// One event of `GET /v1/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxEvent {
    /// Increasing from 1 within one daemon run; `since` resumes after it.
    pub seq: u64,
    /// RFC 3339.
    pub at: String,
    #[serde(rename = "type")]
    pub kind: EventKind,
    pub sandbox_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Query of `GET /v1/events`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only this sandbox's events (its id).
    pub sandbox: Option<String>,
    /// Replay the kept events after this `seq` first (the last 1000 are kept).
    pub since: Option<u64>,
    /// Stop after replaying instead of following new events.
    #[serde(default)]
    pub no_follow: bool,
}

/// Filters of `GET /v1/sandboxes` (terminated ones are listed only when asked for).
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub state: Option<String>,
    pub name: Option<String>,
    /// A JSON object of labels every listed sandbox has, e.g. `{"team":"rl"}`.
    pub labels: Option<String>,
}

/// `POST /v1/sandboxes/{id}/exec` and `/processes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program: an absolute path or a name looked up in `PATH`.
    #[schema(min_length = 1)]
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Absolute path.
    #[schema(pattern = "^/")]
    pub working_dir: Option<String>,
    /// `name`, `uid` or `uid:gid`.
    pub user: Option<String>,
    /// Standard input as UTF-8 text.
    pub stdin: Option<String>,
    /// Standard input as base64 (exclusive with `stdin`).
    #[schema(pattern = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")]
    pub stdin_b64: Option<String>,
    /// Kill the command after this many seconds.
    #[schema(exclusive_minimum = 0)]
    pub timeout_secs: Option<f64>,
    /// Stream NDJSON events instead of one result (exec only).
    #[serde(default)]
    pub stream: bool,
}

/// `POST /v1/sandboxes/{id}/processes`: a background process. With a `name`, a `restart`
/// policy or a `health_check` it is supervised by the sandbox's agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnProcess {
    /// Program: an absolute path or a name looked up in `PATH`.
    #[schema(min_length = 1)]
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Absolute path.
    #[schema(pattern = "^/")]
    pub working_dir: Option<String>,
    /// `name`, `uid` or `uid:gid`.
    pub user: Option<String>,
    /// Fixed standard input as UTF-8 text, then end of file.
    pub stdin: Option<String>,
    /// Fixed standard input as base64 (exclusive with `stdin`).
    #[schema(pattern = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")]
    pub stdin_b64: Option<String>,
    /// Kill the process after this many seconds.
    #[schema(exclusive_minimum = 0)]
    pub timeout_secs: Option<f64>,
    /// Unique among supervised processes that run; usable wherever a pid is. Not all
    /// digits.
    pub name: Option<String>,
    /// `pipe` (default): standard input fed through the stdin routes; `closed`: end of file.
    pub stdin_mode: Option<StdinModeName>,
    /// `capture` (default) or `discard`.
    pub stdout_mode: Option<OutputModeName>,
    pub stderr_mode: Option<OutputModeName>,
    pub restart: Option<RestartConfig>,
    pub health_check: Option<HealthCheckConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StdinModeName {
    Closed,
    Pipe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputModeName {
    Capture,
    Discard,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestartPolicyName {
    Never,
    OnFailure,
    Always,
}

/// When a supervised process is started again after it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartConfig {
    pub policy: RestartPolicyName,
    /// Restarts allowed in all (none: no limit).
    pub max_restarts: Option<u32>,
    /// The first wait before a restart; it doubles each time up to `max_backoff_ms`.
    #[serde(default = "default_initial_backoff_ms")]
    pub initial_backoff_ms: u64,
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
}

fn default_initial_backoff_ms() -> u64 {
    500
}

fn default_max_backoff_ms() -> u64 {
    30_000
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthCheckKind {
    Http,
    Tcp,
}

/// How the agent tells a supervised process works: a TCP connection to `port` on the
/// sandbox's loopback, or `GET path` answered below 400. `failure_threshold` failures in a
/// row kill the process (its restart policy decides what follows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckConfig {
    #[serde(rename = "type")]
    pub kind: HealthCheckKind,
    pub port: u16,
    /// For `http` (default `/`).
    pub path: Option<String>,
    #[serde(default = "default_initial_delay_ms")]
    pub initial_delay_ms: u64,
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_failure_threshold")]
    pub failure_threshold: u32,
}

fn default_initial_delay_ms() -> u64 {
    5_000
}

fn default_interval_ms() -> u64 {
    1_000
}

fn default_timeout_ms() -> u64 {
    500
}

fn default_failure_threshold() -> u32 {
    3
}

/// How a supervised process's previous run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProcessExit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub ended_at: String,
}

/// The supervisor's view of a supervised process, across its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ManagedProcess {
    /// Its name, or its first pid when it has none.
    pub id: String,
    pub name: Option<String>,
    /// `starting`, `running`, `backing_off` or `stopped`.
    pub status: String,
    pub restart_count: u32,
    pub restart: RestartConfig,
    pub health_check: Option<HealthCheckConfig>,
    /// `disabled`, `starting`, `healthy` or `unhealthy`.
    pub health_status: String,
    pub consecutive_health_failures: u32,
    pub last_exit: Option<ProcessExit>,
    pub last_error: Option<String>,
    pub next_restart_at: Option<String>,
}

/// Result of a non-streaming exec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    pub stdout: String,
    pub stderr: String,
    /// Present when the output was not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_b64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_b64: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// One line of an NDJSON output stream (exec, process output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    Stdout {
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        data_b64: Option<String>,
        offset: u64,
    },
    Stderr {
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        data_b64: Option<String>,
        offset: u64,
    },
    /// Output in `from..to` of `stream` was dropped by the agent's bounded buffer.
    Dropped {
        stream: String,
        from: u64,
        to: u64,
    },
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        duration_ms: u64,
    },
    Error {
        code: String,
        message: String,
    },
}

/// A background process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Process {
    /// The agent's process id (stable for the sandbox's life).
    pub pid: u64,
    /// The process id inside the sandbox.
    pub os_pid: u32,
    pub command: String,
    pub args: Vec<String>,
    /// `running` or `exited`.
    pub state: String,
    /// `running`, `exited` (by itself) or `signaled` (by a signal).
    pub status: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub stdout_len: u64,
    pub stderr_len: u64,
    /// Whether the stdin routes still reach its standard input.
    pub stdin_writable: bool,
    /// The name of a supervised process.
    pub name: Option<String>,
    /// Present for a supervised process.
    pub managed: Option<ManagedProcess>,
}

/// `GET /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<Process>,
}

/// A terminal session to start: a process on a new pseudo-terminal (its stdin, stdout and
/// stderr), attached over `GET .../pty/{pid}/connect` (a WebSocket).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePty {
    /// Program; default: `bash -l` where the sandbox has bash, else `sh -l`.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// `TERM` defaults to `xterm-256color`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Absolute path.
    #[schema(pattern = "^/")]
    pub working_dir: Option<String>,
    /// `name`, `uid` or `uid:gid`.
    pub user: Option<String>,
    /// Terminal width in columns (default 80).
    #[schema(minimum = 1, maximum = 4096)]
    pub cols: Option<u16>,
    /// Terminal height in rows (default 24).
    #[schema(minimum = 1, maximum = 4096)]
    pub rows: Option<u16>,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    #[schema(minimum = 1, maximum = 4096)]
    pub cols: u16,
    #[schema(minimum = 1, maximum = 4096)]
    pub rows: u16,
}

/// `POST /v1/sandboxes/{id}/port-urls`: a URL to one port of a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortUrlRequest {
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u16,
    /// How long the signed URL works (default 3600, at most 30 days).
    #[schema(minimum = 1, maximum = 2592000)]
    pub expires_in_secs: Option<u64>,
}

/// How to reach one port of a sandbox through the gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PortUrl {
    pub port: u16,
    /// Path-based route: `/v1/sandboxes/{id}/ports/{port}/`.
    pub path: String,
    /// `path` with a signature that opens this port until `expires_at`.
    pub signed_path: String,
    /// Host-based route: `{port}-{id}.<gateway domain>` (the daemon's port appended by
    /// the client).
    pub host: String,
    /// Opens every port of the sandbox as `X-Sandfork-Access-Token` (or
    /// `sandfork_token=`); the same until it is rotated (`POST .../access-token`).
    pub access_token: String,
    /// RFC 3339.
    pub expires_at: String,
    /// The sandbox's ports need no token.
    pub public: bool,
    /// Where a browser opens `path` and `signed_path`: the daemon's `public_url`, else its
    /// TCP listener; absent for a daemon on its Unix socket alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
}

/// `POST /v1/sandboxes/{id}/access-token`: the sandbox's new access token; every earlier
/// one, and every signed URL made before, opens nothing any more.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AccessToken {
    pub access_token: String,
    /// The sandbox's access epoch after the rotation.
    pub access_epoch: u32,
}

/// Query of `GET .../pty/{pid}/connect`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PtyConnectQuery {
    /// Output offset to replay from (0 = everything still buffered, up to 1 MiB); a client
    /// that reconnects passes the offset it has seen up to.
    #[serde(default)]
    pub offset: u64,
}

/// Query of `GET .../processes/{pid}/output`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    /// Offset into stdout to start from.
    #[serde(default)]
    pub offset: u64,
    /// Offset into stderr to start from.
    #[serde(default)]
    pub stderr_offset: u64,
    /// Keep streaming until the process exits.
    #[serde(default = "yes")]
    pub follow: bool,
}

fn yes() -> bool {
    true
}

/// Query of `POST .../processes/{pid}/wait`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    pub timeout_secs: Option<f64>,
}

/// A signal, by number or name (`TERM`, `SIGKILL`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum SignalSpec {
    Number(i32),
    Name(String),
}

/// `POST .../processes/{pid}/signal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    pub signal: SignalSpec,
}

/// Query of `GET /v1/sandboxes/{id}/logs`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    /// Start at this line (`seq`); default: the oldest kept.
    pub since: Option<u64>,
    /// Only the last this many lines (before following).
    pub tail: Option<usize>,
    /// Keep streaming new lines.
    #[serde(default)]
    pub follow: bool,
    /// Only this process's lines (a pid or a supervised process's name).
    pub process: Option<String>,
    /// Only `stdout` or `stderr`.
    pub stream: Option<String>,
}

/// One line of the sandbox log (`GET /v1/sandboxes/{id}/logs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LogEntry {
    /// Position in the sandbox log, from 1; consecutive (a gap: lines no longer kept).
    pub seq: u64,
    /// RFC 3339, when the agent read it.
    pub timestamp: String,
    /// The process's pid (as in the process routes).
    pub pid: u64,
    /// Its name, else its command line.
    pub process: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// `info` (stdout) or `error` (stderr).
    pub level: String,
    /// The line, without its newline (invalid UTF-8 replaced).
    pub message: String,
}

/// One change under a watched directory (`GET /v1/sandboxes/{id}/files/watch`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileEvent {
    /// `create` (also a file moved in), `modify`, `delete` (also moved out), `rename`
    /// (within the watch; `old_path` is where it was), `chmod` (attributes), or
    /// `overflow` (the kernel's queue overflowed: changes were lost).
    #[serde(rename = "type")]
    pub kind: String,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
    pub is_dir: bool,
}

/// Query of the file routes.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// Absolute path inside the sandbox.
    #[param(pattern = "^/", max_length = 4096)]
    pub path: String,
    /// Octal permission bits for uploads, e.g. `0644`.
    pub mode: Option<String>,
    /// Remove directories with their contents.
    #[serde(default)]
    pub recursive: bool,
}

/// A file's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileEntry {
    pub name: String,
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    pub mode: u32,
    pub modified_at: String,
}

/// `GET .../files/list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    pub entries: Vec<FileEntry>,
}

/// `POST .../files/mkdir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// Absolute path inside the sandbox.
    #[schema(pattern = "^/", max_length = 4096)]
    pub path: String,
    #[serde(default = "yes")]
    pub parents: bool,
}

/// An image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Image {
    pub name: String,
    pub layer_id: String,
    /// Size of the root disk its sandboxes get: what the disk holds room for, not what its
    /// layers store (a small image may come with a roomy disk; blocks never written cost
    /// nothing).
    pub size_bytes: u64,
    pub created_at: String,
    pub builder: String,
}

/// `GET /v1/images/{name}`: an image and what its sandboxes get from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImageDetails {
    #[serde(flatten)]
    pub image: Image,
    /// Canonical reference a pulled image came from, and its manifest digest.
    pub source: Option<String>,
    pub digest: Option<String>,
    /// Every process's environment before the sandbox's own.
    pub env: BTreeMap<String, String>,
    /// Default working directory and user of the sandbox's processes.
    pub working_dir: String,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// Declared only (`8080/tcp`).
    pub exposed_ports: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// `GET /v1/images`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImageList {
    pub images: Vec<Image>,
}

/// `POST /v1/images`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildImage {
    pub name: String,
    /// `busybox`, `debian`, `python` or `browser`.
    pub builder: String,
    #[serde(default)]
    pub apt: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
}

/// `POST /v1/images/pull`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullImage {
    /// `registry/repository:tag` or `…@sha256:…`; Docker Hub short names (`python:3.12`)
    /// resolve as Docker resolves them. The image is recorded under the canonical form.
    #[schema(max_length = 255)]
    pub reference: String,
    /// Basic credentials for the registry (its token flow runs with them); without
    /// them, the daemon's Docker config file's, else anonymous.
    pub username: Option<String>,
    pub password: Option<String>,
}

/// `POST /v1/images/push`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushImage {
    /// The image to push (a reference may be given in short form).
    pub name: String,
    /// Where to: `registry/repository:tag`.
    #[schema(max_length = 255)]
    pub reference: String,
    /// Basic credentials for the registry; without them, the Docker config file's.
    pub username: Option<String>,
    pub password: Option<String>,
}

/// The answer to `POST /v1/images/push`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PushedImage {
    /// The canonical reference pushed to.
    pub reference: String,
    pub manifest_url: String,
}

/// `POST /v1/images/from-snapshot`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageFromSnapshot {
    /// Name of the image (`[a-z0-9._-]`, 1-64); an image of that name is replaced.
    pub name: String,
    pub snapshot_id: String,
}

/// One line of an image build's NDJSON stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildEvent {
    Progress { message: String },
    Done { image: Image },
    Error { code: String, message: String },
}

/// A named volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    pub name: String,
    /// Absolute path in the sandbox (not `/`, nor over `/proc`, `/sys`, `/dev`).
    #[schema(pattern = "^/", max_length = 4096)]
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// `POST /v1/volumes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pub name: String,
    /// Size limit in MiB (default 1024; 16 to 1048576). The volume is sparse: room not
    /// written costs nothing.
    pub size_mb: Option<u64>,
}

/// A named volume: storage that outlives sandboxes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    pub name: String,
    pub size_mb: u64,
    /// Bytes in use in its file system.
    pub used_bytes: u64,
    pub created_at: String,
    /// Live sandboxes that mount it (suspended ones included).
    pub mounted_by: Vec<String>,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub api_version: u32,
    /// The image of sandboxes created without one.
    pub default_image: String,
}

// Snapshots -------------------------------------------------------------------------

/// `POST /v1/sandboxes/{id}/checkpoint`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRequest {
    /// `filesystem` (default) or `memory`.
    #[serde(rename = "type")]
    pub kind: Option<SnapshotType>,
    pub name: Option<String>,
    /// Commands run, in order, in every sandbox started from the snapshot, right after it
    /// resumes and before it is handed out.
    #[serde(default)]
    pub hooks: Vec<ExecRequest>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    /// The persistent snapshot id (`snap-…`).
    pub id: String,
    #[serde(rename = "type")]
    pub kind: SnapshotType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub source_sandbox_id: Option<String>,
    pub image: String,
    /// Bytes the snapshot's own disk layer and memory images occupy.
    pub size_bytes: u64,
    /// RFC 3339.
    pub created_at: String,
    pub cpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub labels: BTreeMap<String, String>,
    /// In the cluster's object store, so that any node restores it (docs/scale-out.md).
    #[serde(default)]
    pub published: bool,
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

/// Query of `GET /v1/snapshots`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SnapshotQuery {
    /// Only snapshots of this sandbox.
    pub source: Option<String>,
    /// Only snapshots of this type.
    #[serde(rename = "type")]
    pub kind: Option<SnapshotType>,
    /// Also the snapshots only the object store holds (published by other nodes).
    pub published: Option<bool>,
}

/// Query of `DELETE /v1/snapshots/{id}`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeleteSnapshotQuery {
    /// Also remove it from the object store, for every node (its copies already pulled
    /// elsewhere stay until those nodes drop them).
    pub everywhere: Option<bool>,
}

/// Settings of one child of a fork.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChildSpec {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `POST /v1/snapshots/{id}/fork` and `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    pub count: u32,
    /// For every child's new processes.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub secrets: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Per child, by index: added to `env` and `labels`.
    #[serde(default)]
    pub per_child: Vec<ChildSpec>,
    /// Children are named `<prefix>-<index>`.
    pub name_prefix: Option<String>,
    /// Idle timeout of every child.
    pub timeout_secs: Option<u64>,
    /// What every child's idle timeout does (default as at create).
    pub on_timeout: Option<OnTimeout>,
    /// Fork index of the first child (default 0): a gateway spreading one fork over
    /// several nodes gives each its share of the indices. `per_child[i]` is child
    /// `first_index + i`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_index: Option<u32>,
}

/// Why one child of a fork failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChildError {
    pub code: String,
    pub message: String,
}

/// One child of a fork: its sandbox, or why it failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForkChild {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ChildError>,
}

/// The answer to a fork.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForkResult {
    /// The snapshot the children started from.
    pub snapshot_id: String,
    pub children: Vec<ForkChild>,
}
