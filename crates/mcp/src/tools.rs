//! The tools: each a thin call (or two) of the daemon's `/v1` API, with bounded answers.
//! A failure is a tool result with `isError` naming what went wrong (the daemon's own
//! code and message, or the feature sandfork lacks).

use std::collections::BTreeMap;

use api_types::{
    CheckpointRequest, CreateSandbox, ExecRequest, FileEntry, ForkRequest, ForkResult,
    NetworkModeName, NetworkRequest, PortUrl, PortUrlRequest, Process, Sandbox, SandboxList,
    Snapshot, SnapshotType, SpawnProcess, StdinModeName, StreamEvent,
};
use base64::Engine as _;
use cli::client::full;
use hyper::Method;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::daemon::{next_line, query, sandbox_path, segment};
use crate::error::{Error, Result};
use crate::files::{absolute, list_dir, read_file};
use crate::limits::{self, Capped};
use crate::server::Sandfork;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A tool's answer: the JSON as text (for clients that read text) and as structured
/// content; a failure as an error result.
fn answer(result: Result<Value>) -> CallToolResult {
    match result {
        Ok(value) => {
            let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string());
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            r.structured_content = Some(value);
            r
        }
        Err(e) => e.into_tool_result(),
    }
}

fn to_value(v: &impl Serialize) -> Result<Value> {
    serde_json::to_value(v).map_err(|e| Error::BadReply(e.to_string()))
}

// Parameters ---------------------------------------------------------------------------

/// Network of a new sandbox.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Egress through the host (the default), limited by `allow_out`/`deny_out`.
    Internet,
    /// Loopback only.
    None,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateParams {
    /// Image name or registry reference (default: the daemon's default image). Exclusive
    /// with `snapshot_id`.
    pub image: Option<String>,
    /// Start from this snapshot (filesystem or memory) instead of an image.
    pub snapshot_id: Option<String>,
    /// A name unique among live sandboxes, usable wherever an id is.
    pub name: Option<String>,
    /// CPU cores (default 1).
    pub cpus: Option<f64>,
    /// Memory limit in MiB (default 512).
    pub memory_mb: Option<u64>,
    /// Root disk size in MiB (default: the image's).
    pub disk_mb: Option<u64>,
    /// Environment of every process of the sandbox.
    pub env: Option<BTreeMap<String, String>>,
    /// `internet` (default) or `none`.
    pub network: Option<NetworkMode>,
    /// With `internet`: the only destinations allowed (IPv4 addresses, CIDRs, hostnames,
    /// `*.example.com` wildcards).
    pub allow_out: Option<Vec<String>>,
    /// With `internet`: destinations denied (wins over `allow_out`).
    pub deny_out: Option<Vec<String>>,
    /// Idle seconds before the sandbox is ended (0 or absent: never).
    pub timeout_secs: Option<u64>,
    /// Labels (key to value).
    pub labels: Option<BTreeMap<String, String>>,
    /// GPUs: sandfork has none to give; any value above 0 is refused, naming the feature.
    pub gpus: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only sandboxes in this state (e.g. running, suspended, terminated).
    pub state: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// Sandbox id or name.
    pub sandbox: String,
    /// The program and its arguments (argv), run without a shell. Exclusive with `shell`.
    pub command: Option<Vec<String>>,
    /// A shell script, run by `/bin/sh -c`. Exclusive with `command`.
    pub shell: Option<String>,
    /// Kill the command after this many seconds (default 300, at most 3600).
    pub timeout_secs: Option<f64>,
    /// Absolute working directory (default: the image's).
    pub working_dir: Option<String>,
    /// Extra environment of the command.
    pub env: Option<BTreeMap<String, String>>,
    /// Standard input, as text.
    pub stdin: Option<String>,
    /// Bytes of stdout and of stderr returned (each; default 65536, at most 1048576).
    /// Output past it is counted, not returned.
    pub max_output_bytes: Option<u64>,
    /// Start it in the background instead (a server, a warm worker): answers its pid at
    /// once; what it writes goes to the sandbox log (the logs resource), and it is in
    /// every memory checkpoint and fork. Its timeout is then none unless given.
    pub background: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadParams {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Absolute path of a file in the sandbox.
    pub path: String,
    /// Bytes returned at most (default 262144, at most 4194304); a longer file is cut,
    /// with a note saying so.
    pub max_bytes: Option<u64>,
}

/// How `content` is written.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// `content` is the text of the file.
    #[default]
    Utf8,
    /// `content` is base64 of the file's bytes.
    Base64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Absolute path of the file (parent directories are made; an existing file is
    /// replaced atomically).
    pub path: String,
    /// The file's content.
    pub content: String,
    /// `utf8` (default) or `base64`.
    pub encoding: Option<Encoding>,
    /// Octal permission bits, e.g. `0755` (default 0644).
    pub mode: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesParams {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Absolute path of a directory (default `/`).
    pub path: Option<String>,
}

/// Kind of checkpoint.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// The disk only: sandboxes started from it boot fresh on that disk.
    #[default]
    Filesystem,
    /// The disk and the running processes with their memory: sandboxes started from it
    /// carry on warm, where it was taken.
    Memory,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointParams {
    /// Sandbox id or name.
    pub sandbox: String,
    /// `filesystem` (default) or `memory`.
    #[serde(rename = "type")]
    pub kind: Option<CheckpointKind>,
    /// A name for the snapshot.
    pub name: Option<String>,
    /// Labels of the snapshot.
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkParams {
    /// How many children (1 to 64).
    pub count: u32,
    /// Fork from this snapshot. Exclusive with `sandbox`.
    pub snapshot_id: Option<String>,
    /// Fork from this live sandbox (id or name): its memory is checkpointed in place
    /// first. Exclusive with `snapshot_id`.
    pub sandbox: Option<String>,
    /// Children are named `<prefix>-<index>`.
    pub name_prefix: Option<String>,
    /// Environment added for every child's new processes.
    pub env: Option<BTreeMap<String, String>>,
    /// Labels of every child.
    pub labels: Option<BTreeMap<String, String>>,
    /// Idle seconds before each child is ended (0 or absent: never).
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxParams {
    /// Sandbox id or name.
    pub sandbox: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortUrlParams {
    /// Sandbox id or name.
    pub sandbox: String,
    /// A TCP port the sandbox listens on (on its own loopback or any address).
    pub port: u16,
    /// How long the signed URL works, in seconds (default 3600, at most 30 days).
    pub expires_in_secs: Option<u64>,
}

// Tools --------------------------------------------------------------------------------

#[tool_router(vis = "pub(crate)")]
impl Sandfork {
    #[tool(
        description = "Create a sandbox (an isolated Linux machine) from an image or a snapshot; \
                       answers the sandbox (its `id` is what the other tools take).",
        annotations(
            title = "Create a sandbox",
            destructive_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_sandbox(&self, Parameters(p): Parameters<CreateParams>) -> CallToolResult {
        answer(self.create(p).await)
    }

    #[tool(
        description = "List sandboxes (live ones unless `state` asks for others).",
        annotations(
            title = "List sandboxes",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_sandboxes(&self, Parameters(p): Parameters<ListParams>) -> CallToolResult {
        answer(self.list(p).await)
    }

    #[tool(
        description = "Run a command in a sandbox and wait for it: argv (`command`) or a shell \
                       script (`shell`), with a timeout. Answers exit_code (null when killed \
                       by a signal), signal, timed_out, stdout and stderr (each cut at \
                       max_output_bytes, with *_truncated and the full byte counts). With \
                       `background`, starts it and answers its pid (its output goes to the \
                       sandbox log).",
        annotations(
            title = "Run a command",
            destructive_hint = true,
            open_world_hint = false
        )
    )]
    async fn run_command(&self, Parameters(p): Parameters<RunParams>) -> CallToolResult {
        answer(self.run(p).await)
    }

    #[tool(
        description = "Read a file of a sandbox: its text, or base64 when it is not UTF-8, cut \
                       at max_bytes with a note saying how big it is.",
        annotations(title = "Read a file", read_only_hint = true, open_world_hint = false)
    )]
    async fn read_file(&self, Parameters(p): Parameters<ReadParams>) -> CallToolResult {
        answer(self.read(p).await)
    }

    #[tool(
        description = "Write a file in a sandbox (text, or base64 bytes), making its parent \
                       directories; an existing file is replaced.",
        annotations(
            title = "Write a file",
            destructive_hint = true,
            open_world_hint = false
        )
    )]
    async fn write_file(&self, Parameters(p): Parameters<WriteParams>) -> CallToolResult {
        answer(self.write(p).await)
    }

    #[tool(
        description = "List a directory of a sandbox: name, path, type (file, dir, symlink, \
                       other), size, mode and modification time of each entry (at most 1000).",
        annotations(title = "List files", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_files(&self, Parameters(p): Parameters<ListFilesParams>) -> CallToolResult {
        answer(self.list_dir(p).await)
    }

    #[tool(
        description = "Checkpoint a sandbox into a snapshot: `filesystem` (its disk) or \
                       `memory` (its disk and its running processes with their memory, so \
                       forks carry on warm). Answers the snapshot (its `id` is what \
                       fork and create_sandbox take).",
        annotations(
            title = "Checkpoint",
            destructive_hint = false,
            open_world_hint = false
        )
    )]
    async fn checkpoint(&self, Parameters(p): Parameters<CheckpointParams>) -> CallToolResult {
        answer(self.checkpoint_sandbox(p).await)
    }

    #[tool(
        description = "Fork N sandboxes from a snapshot or from a live sandbox: each child starts \
                       where the snapshot was taken (with a memory snapshot, its processes \
                       running, their memory as it was). Answers one entry per child: its \
                       sandbox id, or why it failed.",
        annotations(title = "Fork", destructive_hint = false, open_world_hint = false)
    )]
    async fn fork(&self, Parameters(p): Parameters<ForkParams>) -> CallToolResult {
        answer(self.fork_children(p).await)
    }

    #[tool(
        description = "Suspend a sandbox: its processes and memory are saved and its RAM freed; \
                       resume (or any command or file call) brings it back as it was.",
        annotations(
            title = "Suspend",
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn suspend(&self, Parameters(p): Parameters<SandboxParams>) -> CallToolResult {
        answer(self.lifecycle(&p.sandbox, "/suspend").await)
    }

    #[tool(
        description = "Resume a suspended sandbox, its processes and memory as they were.",
        annotations(
            title = "Resume",
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn resume(&self, Parameters(p): Parameters<SandboxParams>) -> CallToolResult {
        answer(self.lifecycle(&p.sandbox, "/resume").await)
    }

    #[tool(
        description = "Terminate a sandbox: its processes and disk are gone (its snapshots stay).",
        annotations(
            title = "Terminate",
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn terminate(&self, Parameters(p): Parameters<SandboxParams>) -> CallToolResult {
        answer(self.end(&p.sandbox).await)
    }

    #[tool(
        description = "A URL to a TCP port of a sandbox through the daemon's gateway (a signed \
                       URL for that port, until expires_at), with the access token that opens \
                       every port of the sandbox.",
        annotations(title = "Port URL", read_only_hint = true, open_world_hint = false)
    )]
    async fn get_port_url(&self, Parameters(p): Parameters<PortUrlParams>) -> CallToolResult {
        answer(self.port_url(p).await)
    }
}

// What the tools do --------------------------------------------------------------------

impl Sandfork {
    async fn create(&self, p: CreateParams) -> Result<Value> {
        if p.gpus.unwrap_or(0) > 0 {
            return Err(Error::Unsupported {
                feature: "GPUs",
                detail: "its sandboxes have no GPU to give (CPU and memory only)".into(),
            });
        }
        if p.image.is_some() && p.snapshot_id.is_some() {
            return Err(Error::invalid("give image or snapshot_id, not both"));
        }
        let network = match (p.network, p.allow_out.is_some() || p.deny_out.is_some()) {
            (Some(NetworkMode::None), true) => {
                return Err(Error::invalid(
                    "allow_out and deny_out need network `internet`",
                ))
            }
            (None, false) => None,
            (mode, _) => Some(NetworkRequest {
                mode: match mode {
                    Some(NetworkMode::None) => NetworkModeName::None,
                    _ => NetworkModeName::Internet,
                },
                allow_out: p.allow_out.unwrap_or_default(),
                deny_out: p.deny_out.unwrap_or_default(),
            }),
        };
        let req = CreateSandbox {
            image: p.image,
            snapshot_id: p.snapshot_id,
            name: p.name,
            cpus: p.cpus,
            memory_mb: p.memory_mb,
            disk_mb: p.disk_mb,
            timeout_secs: p.timeout_secs,
            env: p.env.unwrap_or_default(),
            labels: p.labels.unwrap_or_default(),
            network,
            ..CreateSandbox::default()
        };
        let sandbox: Sandbox = self
            .daemon
            .json(Method::POST, "/v1/sandboxes", Some(&req))
            .await?;
        to_value(&sandbox)
    }

    async fn list(&self, p: ListParams) -> Result<Value> {
        let path = match &p.state {
            Some(s) => format!("/v1/sandboxes?state={}", query(s)),
            None => "/v1/sandboxes".to_string(),
        };
        let list: SandboxList = self.daemon.json(Method::GET, &path, None::<&()>).await?;
        let sandboxes: Vec<Value> = list
            .sandboxes
            .iter()
            .map(|s| {
                json!({"id": s.id, "name": s.name, "state": s.state, "image": s.image,
                       "cpus": s.cpus, "memory_mb": s.memory_mb, "created_at": s.created_at})
            })
            .collect();
        Ok(json!({ "sandboxes": sandboxes }))
    }

    async fn run(&self, p: RunParams) -> Result<Value> {
        let (command, args) = match (p.command, p.shell) {
            (Some(_), Some(_)) => return Err(Error::invalid("give command or shell, not both")),
            (None, None) => {
                return Err(Error::invalid(
                    "give command (argv) or shell (a script for /bin/sh -c)",
                ))
            }
            (Some(argv), None) => {
                let mut it = argv.into_iter();
                match it.next() {
                    Some(c) if !c.is_empty() => (c, it.collect()),
                    _ => return Err(Error::invalid("command is empty: give the program first")),
                }
            }
            (None, Some(script)) => ("/bin/sh".to_string(), vec!["-c".to_string(), script]),
        };
        if p.background.unwrap_or(false) {
            if p.max_output_bytes.is_some() {
                return Err(Error::invalid(
                    "a background command's output goes to the sandbox log: read the logs \
                     resource instead of giving max_output_bytes",
                ));
            }
            if let Some(t) = p.timeout_secs {
                if t.is_nan() || t <= 0.0 {
                    return Err(Error::invalid("timeout_secs must be above 0"));
                }
            }
            let req = SpawnProcess {
                command,
                args,
                env: p.env.unwrap_or_default(),
                working_dir: p.working_dir,
                stdin: p.stdin.clone(),
                timeout_secs: p.timeout_secs,
                stdin_mode: p.stdin.is_none().then_some(StdinModeName::Closed),
                ..SpawnProcess::default()
            };
            let process: Process = self
                .daemon
                .json(
                    Method::POST,
                    &sandbox_path(&p.sandbox, "/processes")?,
                    Some(&req),
                )
                .await?;
            return Ok(json!({
                "pid": process.pid,
                "os_pid": process.os_pid,
                "status": process.status,
                "logs": crate::resources::logs_uri(&p.sandbox),
            }));
        }
        let timeout = p.timeout_secs.unwrap_or(limits::DEFAULT_TIMEOUT_SECS);
        if timeout.is_nan() || timeout <= 0.0 || timeout > limits::MAX_TIMEOUT_SECS {
            return Err(Error::invalid(format!(
                "timeout_secs must be above 0 and at most {}",
                limits::MAX_TIMEOUT_SECS
            )));
        }
        let cap = bounded(
            p.max_output_bytes,
            limits::DEFAULT_OUTPUT_BYTES,
            limits::MAX_OUTPUT_BYTES,
            "max_output_bytes",
        )?;
        let req = ExecRequest {
            command,
            args,
            env: p.env.unwrap_or_default(),
            working_dir: p.working_dir,
            stdin: p.stdin,
            timeout_secs: Some(timeout),
            stream: true,
            ..ExecRequest::default()
        };
        let body = serde_json::to_vec(&req).map_err(|e| Error::invalid(e.to_string()))?;
        let path = sandbox_path(&p.sandbox, "/exec")?;
        // The daemon kills the command at its timeout; this one only bounds a daemon
        // that never answers.
        let grace = std::time::Duration::from_secs_f64(timeout + 60.0);
        match tokio::time::timeout(grace, self.collect_exec(&path, full(body), cap)).await {
            Ok(r) => r,
            Err(_) => Err(Error::Unreachable(format!(
                "no answer from the daemon within {}s of the command's timeout",
                60
            ))),
        }
    }

    async fn collect_exec(&self, path: &str, body: cli::client::Body, cap: usize) -> Result<Value> {
        let mut lines = self.daemon.lines(Method::POST, path, Some(body)).await?;
        let (mut out, mut err) = (Capped::new(cap), Capped::new(cap));
        let mut dropped = Vec::new();
        while let Some(line) = next_line(&mut lines).await? {
            let event: StreamEvent =
                serde_json::from_value(line).map_err(|e| Error::BadReply(e.to_string()))?;
            match event {
                StreamEvent::Stdout { data, data_b64, .. } => {
                    out.push(&chunk(data, data_b64)?);
                }
                StreamEvent::Stderr { data, data_b64, .. } => {
                    err.push(&chunk(data, data_b64)?);
                }
                StreamEvent::Dropped { stream, from, to } => {
                    dropped.push(json!({"stream": stream, "from": from, "to": to}));
                }
                StreamEvent::Exit {
                    exit_code,
                    signal,
                    timed_out,
                    duration_ms,
                } => {
                    let mut v = json!({
                        "exit_code": exit_code,
                        "signal": signal,
                        "timed_out": timed_out,
                        "duration_ms": duration_ms,
                    });
                    put_stream(&mut v, "stdout", out);
                    put_stream(&mut v, "stderr", err);
                    if !dropped.is_empty() {
                        v["dropped"] = Value::Array(dropped);
                    }
                    return Ok(v);
                }
                StreamEvent::Error { code, message } => {
                    return Err(Error::Daemon {
                        status: 200,
                        code,
                        message,
                    })
                }
            }
        }
        Err(Error::Unreachable(
            "the command's output ended without its exit status".into(),
        ))
    }

    async fn read(&self, p: ReadParams) -> Result<Value> {
        let cap = bounded(
            p.max_bytes,
            limits::DEFAULT_READ_BYTES,
            limits::MAX_READ_BYTES,
            "max_bytes",
        )?;
        let file = read_file(&self.daemon, &p.sandbox, &p.path, cap).await?;
        let mut v = json!({
            "path": file.entry.path,
            "size": file.entry.size,
            "truncated": file.data.truncated(),
        });
        let (kept, total, truncated) = (
            file.data.kept_len(),
            file.data.total(),
            file.data.truncated(),
        );
        match file.data.text() {
            Some(text) => {
                v["encoding"] = json!("utf8");
                v["content"] = json!(text);
            }
            None => {
                v["encoding"] = json!("base64");
                v["content"] = json!(B64.encode(file.data.into_bytes()));
            }
        }
        if truncated {
            v["note"] = json!(format!(
                "{} (the file has {} bytes; ask for up to {} with max_bytes, or read the rest \
                 with run_command, e.g. tail -c)",
                limits::truncation_note("file", kept, total),
                file.entry.size,
                limits::MAX_READ_BYTES
            ));
        }
        Ok(v)
    }

    async fn write(&self, p: WriteParams) -> Result<Value> {
        absolute(&p.path)?;
        let bytes = match p.encoding.unwrap_or_default() {
            Encoding::Utf8 => p.content.into_bytes(),
            Encoding::Base64 => B64
                .decode(p.content.trim())
                .map_err(|e| Error::invalid(format!("content is not base64: {e}")))?,
        };
        let mut path = format!(
            "{}?path={}",
            sandbox_path(&p.sandbox, "/files")?,
            query(&p.path)
        );
        if let Some(mode) = &p.mode {
            if mode.is_empty()
                || mode.len() > 4
                || !mode.bytes().all(|b| (b'0'..=b'7').contains(&b))
            {
                return Err(Error::invalid(format!(
                    "mode {mode:?} is not octal permission bits (e.g. 0644)"
                )));
            }
            path.push_str(&format!("&mode={mode}"));
        }
        let len = bytes.len();
        self.daemon
            .send(Method::PUT, &path, "application/octet-stream", full(bytes))
            .await?;
        Ok(json!({"path": p.path, "bytes_written": len}))
    }

    async fn list_dir(&self, p: ListFilesParams) -> Result<Value> {
        let dir = p.path.unwrap_or_else(|| "/".to_string());
        let entries = list_dir(&self.daemon, &p.sandbox, &dir).await?;
        let total = entries.len();
        let shown: Vec<&FileEntry> = entries.iter().take(limits::MAX_LIST_ENTRIES).collect();
        let mut v = json!({"path": dir, "entries": shown, "total": total});
        if total > shown.len() {
            v["truncated"] = json!(true);
            v["note"] = json!(format!(
                "[listing truncated: showing {} of {total} entries]",
                shown.len()
            ));
        }
        Ok(v)
    }

    async fn checkpoint_sandbox(&self, p: CheckpointParams) -> Result<Value> {
        let req = CheckpointRequest {
            kind: Some(match p.kind.unwrap_or_default() {
                CheckpointKind::Filesystem => SnapshotType::Filesystem,
                CheckpointKind::Memory => SnapshotType::Memory,
            }),
            name: p.name,
            labels: p.labels.unwrap_or_default(),
            ..CheckpointRequest::default()
        };
        let snap: Snapshot = self
            .daemon
            .json(
                Method::POST,
                &sandbox_path(&p.sandbox, "/checkpoint")?,
                Some(&req),
            )
            .await?;
        to_value(&snap)
    }

    async fn fork_children(&self, p: ForkParams) -> Result<Value> {
        if p.count == 0 || p.count > limits::MAX_FORK_COUNT {
            return Err(Error::invalid(format!(
                "count must be 1 to {}",
                limits::MAX_FORK_COUNT
            )));
        }
        let path = match (&p.snapshot_id, &p.sandbox) {
            (Some(s), None) => format!("/v1/snapshots/{}/fork", segment(s, "snapshot")?),
            (None, Some(s)) => sandbox_path(s, "/fork")?,
            _ => {
                return Err(Error::invalid(
                    "give snapshot_id or sandbox (exactly one) to fork from",
                ))
            }
        };
        let req = ForkRequest {
            count: p.count,
            env: p.env.unwrap_or_default(),
            labels: p.labels.unwrap_or_default(),
            name_prefix: p.name_prefix,
            timeout_secs: p.timeout_secs,
            ..ForkRequest::default()
        };
        let result: ForkResult = self.daemon.json(Method::POST, &path, Some(&req)).await?;
        let children: Vec<Value> = result
            .children
            .iter()
            .map(|c| match (&c.sandbox, &c.error) {
                (Some(s), _) => json!({"index": c.index, "id": s.id, "name": s.name, "state": s.state}),
                (None, Some(e)) => json!({"index": c.index, "error": {"code": e.code, "message": e.message}}),
                (None, None) => json!({"index": c.index, "error": {"code": "internal", "message": "no sandbox and no error"}}),
            })
            .collect();
        let failed = children.iter().filter(|c| c.get("error").is_some()).count();
        Ok(json!({
            "snapshot_id": result.snapshot_id,
            "children": children,
            "failed": failed,
        }))
    }

    async fn lifecycle(&self, id: &str, verb: &str) -> Result<Value> {
        let sandbox: Sandbox = self
            .daemon
            .json(Method::POST, &sandbox_path(id, verb)?, None::<&()>)
            .await?;
        to_value(&sandbox)
    }

    async fn end(&self, id: &str) -> Result<Value> {
        let sandbox: Sandbox = self
            .daemon
            .json(Method::DELETE, &sandbox_path(id, "")?, None::<&()>)
            .await?;
        Ok(json!({"id": sandbox.id, "state": sandbox.state}))
    }

    async fn port_url(&self, p: PortUrlParams) -> Result<Value> {
        if p.port == 0 {
            return Err(Error::invalid("port must be 1 to 65535"));
        }
        let req = PortUrlRequest {
            port: p.port,
            expires_in_secs: p.expires_in_secs,
        };
        let url: PortUrl = self
            .daemon
            .json(
                Method::POST,
                &sandbox_path(&p.sandbox, "/port-urls")?,
                Some(&req),
            )
            .await?;
        let base = url
            .base_url
            .clone()
            .or_else(|| self.daemon.http_base().map(str::to_string));
        let mut v = to_value(&url)?;
        match base {
            Some(base) => {
                let base = base.trim_end_matches('/');
                v["url"] = json!(format!("{base}{}", url.signed_path));
            }
            None => {
                v["note"] = json!(
                    "the daemon is reached on its Unix socket alone, so there is no URL a \
                     browser can open: start it with a TCP listener (--listen) or a \
                     public_url; until then `path` works over the socket with the access \
                     token (X-Sandfork-Access-Token)"
                );
            }
        }
        Ok(v)
    }
}

/// A stream's bytes in the answer: text when UTF-8, else base64 under `<name>_b64`.
fn put_stream(v: &mut Value, name: &str, data: Capped) {
    let (total, truncated) = (data.total(), data.truncated());
    v[format!("{name}_bytes")] = json!(total);
    v[format!("{name}_truncated")] = json!(truncated);
    match data.text() {
        Some(text) => {
            let note = truncated.then(|| limits::truncation_note(name, text.len(), total));
            v[name] = json!(match note {
                Some(n) => format!("{text}\n{n}"),
                None => text,
            });
        }
        None => {
            v[name] = json!("");
            v[format!("{name}_b64")] = json!(B64.encode(data.into_bytes()));
        }
    }
}

fn chunk(data: Option<String>, data_b64: Option<String>) -> Result<Vec<u8>> {
    match (data, data_b64) {
        (Some(d), _) => Ok(d.into_bytes()),
        (None, Some(b)) => B64
            .decode(b)
            .map_err(|e| Error::BadReply(format!("output not base64: {e}"))),
        (None, None) => Ok(Vec::new()),
    }
}

fn bounded(asked: Option<u64>, default: usize, max: usize, what: &str) -> Result<usize> {
    match asked {
        None => Ok(default),
        Some(0) => Err(Error::invalid(format!("{what} must be at least 1"))),
        Some(n) if n > max as u64 => Err(Error::invalid(format!("{what} is at most {max}"))),
        Some(n) => Ok(n as usize),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        assert_eq!(bounded(None, 5, 10, "x").ok(), Some(5));
        assert_eq!(bounded(Some(7), 5, 10, "x").ok(), Some(7));
        assert!(bounded(Some(0), 5, 10, "x").is_err());
        assert!(bounded(Some(11), 5, 10, "x").is_err());
    }

    #[test]
    fn binary_output_goes_as_base64() {
        let mut v = json!({});
        let mut c = Capped::new(10);
        c.push(&[0xff, 0xfe]);
        put_stream(&mut v, "stdout", c);
        assert_eq!(v["stdout"], "");
        assert_eq!(v["stdout_b64"], "//4=");
        assert_eq!(v["stdout_truncated"], false);
    }

    #[test]
    fn unknown_arguments_are_refused() {
        let r: std::result::Result<RunParams, _> =
            serde_json::from_value(json!({"sandbox": "x", "shell": "true", "bogus": 1}));
        assert!(r.is_err());
    }
}
