//! Command-line arguments (clap derive).

use clap::Subcommand;

/// The flags every client verb takes (the binary flattens them into its own arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Print machine-readable JSON instead of tables (client verbs).
    #[arg(long, global = true)]
    pub json: bool,
    /// Daemon address: unix:///path/to.sock or http://host:port (client verbs).
    #[arg(long, global = true, env = "SANDFORK_URL")]
    pub url: Option<String>,
    /// Bearer token for a TCP daemon (client verbs).
    #[arg(long, global = true, env = "SANDFORK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a sandbox and print its id.
    Create(CreateArgs),
    /// List sandboxes.
    Ls {
        /// Only sandboxes in this state (e.g. running, failed, terminated).
        #[arg(long)]
        state: Option<String>,
        /// Only sandboxes with label K=V (`--filter label=K=V`, repeatable; all must match).
        #[arg(long = "filter", value_name = "label=K=V")]
        filters: Vec<String>,
    },
    /// Show what running sandboxes use: CPU (over half a second), memory, processes,
    /// disk, network. Without ids: every running sandbox.
    Stats {
        /// Sandbox ids or names.
        ids: Vec<String>,
    },
    /// Follow what happens to sandboxes (created, forked, started, checkpointed, suspended,
    /// resumed, terminated, failed, oom), one line each.
    Events {
        /// Only this sandbox's events.
        #[arg(long)]
        sandbox: Option<String>,
        /// Replay the kept events after this sequence number first (0: all kept; the
        /// default with --no-follow, else only new events).
        #[arg(long)]
        since: Option<u64>,
        /// Stop after the replay instead of following (replays every kept event unless
        /// --since says otherwise, as the SDKs do).
        #[arg(long)]
        no_follow: bool,
    },
    /// An interactive terminal in a sandbox (a login shell, or COMMAND); exits with its
    /// exit code. The session survives checkpoints: it reconnects where it left off.
    Shell {
        /// Sandbox id or name.
        id: String,
        /// Attach to a running terminal session (its pid) instead of starting one.
        #[arg(long, value_name = "PID", conflicts_with = "command")]
        attach: Option<String>,
        /// The program and its arguments (default: the sandbox's login shell).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Print the sandbox log: what its background processes write, line by line.
    Logs {
        /// Sandbox id or name.
        id: String,
        /// Keep printing new lines (until interrupted).
        #[arg(short, long)]
        follow: bool,
        /// Only the last N lines.
        #[arg(long)]
        tail: Option<usize>,
        /// Only this process's lines (pid or name).
        #[arg(long)]
        process: Option<String>,
    },
    /// Print changes under a directory of a sandbox as they happen (until interrupted).
    Watch {
        /// Sandbox id or name.
        id: String,
        /// Absolute path inside the sandbox.
        path: String,
        /// The directories under it too.
        #[arg(short, long)]
        recursive: bool,
    },
    /// How to reach a port of a sandbox through the daemon's gateway: a signed URL path,
    /// the host name for host-based routing, and the sandbox's access token.
    Url {
        /// Sandbox id or name.
        id: String,
        /// Port inside the sandbox.
        port: u16,
        /// Seconds the signed URL works.
        #[arg(long, default_value_t = 3600)]
        expires_in: u64,
    },
    /// Set a sandbox's idle timeout, counted from now (0 = never).
    Timeout {
        /// Sandbox id or name.
        id: String,
        /// Idle seconds (0 = never).
        secs: u64,
        /// What the timeout does.
        #[arg(long, value_parser = ["terminate", "suspend"])]
        on_timeout: Option<String>,
    },
    /// Show or replace a running sandbox's egress lists, live (no restart).
    Network {
        /// Sandbox id or name.
        id: String,
        /// Replace the allow list with these (repeatable; IPv4 address, CIDR, hostname
        /// or *.wildcard).
        #[arg(long = "allow-out", value_name = "DEST")]
        allow_out: Vec<String>,
        /// Replace the deny list with these (repeatable).
        #[arg(long = "deny-out", value_name = "DEST")]
        deny_out: Vec<String>,
        /// Empty the allow list.
        #[arg(long, conflicts_with = "allow_out")]
        clear_allow: bool,
        /// Empty the deny list.
        #[arg(long, conflicts_with = "deny_out")]
        clear_deny: bool,
    },
    /// Set (K=V) and remove (--rm K) labels of a sandbox in one step.
    Label {
        /// Sandbox id or name.
        id: String,
        #[arg(value_name = "K=V")]
        set: Vec<String>,
        #[arg(long = "rm", value_name = "K")]
        remove: Vec<String>,
    },
    /// Show one sandbox.
    Inspect {
        /// Sandbox id or name.
        id: String,
    },
    /// Run a command in a fresh sandbox, stream its output, exit with its code, clean up.
    Run(RunArgs),
    /// Run a command in a running sandbox and exit with its code.
    Exec(ExecArgs),
    /// Copy a file between the host and a sandbox (`ID:/path` names the sandbox side; `-`
    /// is stdin or stdout).
    Cp { src: String, dst: String },
    /// Terminate sandboxes.
    Rm {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Manage images.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Manage named volumes (storage that outlives sandboxes).
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Checkpoint a running sandbox into a snapshot and print its id.
    Checkpoint {
        /// Sandbox id or name.
        id: String,
        /// Capture memory and processes too (warm restores).
        #[arg(long)]
        memory: bool,
        #[arg(long)]
        name: Option<String>,
    },
    /// Start N sandboxes from a snapshot (snap-…) or from a running sandbox (memory
    /// checkpoint in place; the source keeps running).
    Fork(ForkArgs),
    /// Suspend named sandboxes (memory checkpoint, then stop).
    Suspend {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Resume suspended sandboxes.
    Resume {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Manage snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    /// Snapshot id (snap-…) or sandbox id or name.
    pub source: String,
    /// Number of children.
    #[arg(short = 'n', long = "count", default_value_t = 1)]
    pub count: u32,
    /// Environment variable K=V for the children's new processes (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Children are named PREFIX-INDEX.
    #[arg(long)]
    pub name_prefix: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// List snapshots.
    Ls {
        /// Only snapshots of this sandbox.
        #[arg(long)]
        source: Option<String>,
        /// filesystem or memory.
        #[arg(long = "type")]
        kind: Option<String>,
        /// Also those only the object store holds (other nodes' snapshots).
        #[arg(long)]
        published: bool,
    },
    /// Delete snapshots (sandboxes started from them keep working).
    Rm {
        /// Snapshot ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Out of the cluster's object store too, so no node restores them again.
        #[arg(long)]
        everywhere: bool,
    },
    /// Put snapshots in the daemon's object store (any node then restores them); waits
    /// until each is there.
    Publish {
        /// Snapshot ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Write a snapshot to one file.
    Export {
        /// Snapshot id.
        id: String,
        /// The file to write (`-o` as `image export` takes it, or as a second argument).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<String>,
        #[arg(
            hide = true,
            required_unless_present = "output",
            conflicts_with = "output"
        )]
        file: Option<String>,
        /// A snapshot this one descends from that the receiver already has: write only
        /// what differs from it (its import then needs that snapshot).
        #[arg(long, value_name = "SNAPSHOT")]
        base: Option<String>,
    },
    /// Import a snapshot file (checksums verified) and print its id.
    Import {
        /// The snapshot file (`-`: stdin).
        file: String,
    },
}

/// Resources and settings of a new sandbox.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxOpts {
    /// Image name (default: the daemon's default image, python; built on first use).
    #[arg(long)]
    pub image: Option<String>,
    /// CPU cores (default 1).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Memory limit in MiB (default 512).
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Root disk size in MiB (default: the image's).
    #[arg(long)]
    pub disk_mb: Option<u64>,
    /// Environment variable K=V (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Network access: egress to the internet (the default), or loopback only.
    #[arg(long, value_parser = ["none", "internet"])]
    pub network: Option<String>,
    /// Allow only these destinations: IPv4 address, CIDR, hostname or *.wildcard
    /// (repeatable; implies --network internet).
    #[arg(long = "allow-out", value_name = "DEST")]
    pub allow_out: Vec<String>,
    /// Deny this destination (same forms; repeatable; implies --network internet).
    #[arg(long = "deny-out", value_name = "DEST")]
    pub deny_out: Vec<String>,
    /// Mount named volume NAME at PATH, read-only with `:ro` (repeatable).
    #[arg(long = "volume", short = 'v', value_name = "NAME:PATH[:ro]")]
    pub volumes: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub opts: SandboxOpts,
    #[arg(long)]
    pub name: Option<String>,
    /// Idle seconds before --on-timeout (0 = never).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// What the idle timeout does (default: suspend when named, terminate otherwise).
    #[arg(long, value_parser = ["terminate", "suspend"])]
    pub on_timeout: Option<String>,
    /// Label K=V (repeatable).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub opts: SandboxOpts,
    /// The command and its arguments; without one, the image's entrypoint and command.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// Sandbox id or name.
    pub id: String,
    /// Environment variable K=V for the command (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long, short = 'w')]
    pub workdir: Option<String>,
    /// Kill the command after this many seconds.
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Start it in the background (a process of the sandbox: `sandfork logs ID -f`
    /// follows its output) and print its pid.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a volume.
    Create {
        /// Volume name.
        name: String,
        /// Size limit in MiB (default 1024; sparse: room not written costs nothing).
        #[arg(long)]
        size_mb: Option<u64>,
    },
    /// List volumes.
    Ls,
    /// Show a volume: size, bytes in use, the sandboxes that mount it.
    Inspect {
        /// Volume name.
        name: String,
    },
    /// Delete volumes and their data (refused while a sandbox mounts one).
    Rm {
        /// Volume names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build an image: from a Dockerfile (`-t NAME [-f FILE] DIR`; each RUN, COPY and ADD
    /// step cached as a layer) or with a built-in builder (`NAME --builder B`).
    Build {
        /// The build context directory, or with --builder the image name.
        target: Option<String>,
        /// Name of the image a Dockerfile build makes.
        #[arg(short = 't', long = "tag")]
        tag: Option<String>,
        /// The Dockerfile (default DIR/Dockerfile).
        #[arg(short = 'f', long = "file")]
        file: Option<std::path::PathBuf>,
        /// ARG value K=V for a Dockerfile build (repeatable).
        #[arg(long = "build-arg", value_name = "K=V")]
        build_arg: Vec<String>,
        /// busybox, debian, python or browser (python with headless Chromium and Playwright).
        #[arg(long, conflicts_with_all = ["tag", "file", "build_arg"])]
        builder: Option<String>,
        /// Debian package to add (repeatable).
        #[arg(long)]
        apt: Vec<String>,
        /// Python package to add (repeatable; python or browser builder).
        #[arg(long)]
        pip: Vec<String>,
    },
    /// Pull an image from an OCI registry (`python:3.12-slim`, `host:5000/team/app:v1`,
    /// `…@sha256:…`); it is recorded under its canonical reference.
    Pull {
        /// Registry reference, e.g. registry.example/app:1 (docker.io when no host is named).
        reference: String,
        /// Registry user (basic auth; the registry's token flow runs with it). Without
        /// it, the daemon's Docker config file's credentials, else anonymous.
        #[arg(long, requires = "password_stdin")]
        username: Option<String>,
        /// Read the registry password from stdin.
        #[arg(long, requires = "username")]
        password_stdin: bool,
    },
    /// Import an image archive: `docker save` output (docker-archive), an oci-archive, or
    /// an OCI layout directory; `-` reads the archive from stdin.
    Import {
        /// A docker-archive, oci-archive or OCI layout directory (`-`: an archive on stdin).
        source: String,
        /// Name of the image (default: the name the archive gives it).
        #[arg(short = 't', long = "tag")]
        tag: Option<String>,
    },
    /// Export an image: an oci-archive (`podman load`, `skopeo copy oci-archive:FILE …`),
    /// a docker-archive (`docker load`) or an OCI layout directory.
    Export {
        /// Image name.
        name: String,
        /// The archive (or, with --format oci, the directory) to write.
        #[arg(short = 'o', long = "output")]
        output: String,
        #[arg(long, default_value = "oci-archive", value_parser = ["oci-archive", "docker-archive", "oci"])]
        format: String,
    },
    /// Push an image to an OCI registry as `reference`.
    Push {
        /// Image name.
        name: String,
        /// Registry reference, e.g. registry.example/app:1 (docker.io when no host is named).
        reference: String,
        #[arg(long, requires = "password_stdin")]
        username: Option<String>,
        /// Read the registry password from stdin.
        #[arg(long, requires = "username")]
        password_stdin: bool,
    },
    /// Make an image of a snapshot's disk: a template that outlives the snapshot.
    FromSnapshot {
        /// Snapshot id.
        snapshot: String,
        /// Name of the new image.
        name: String,
    },
    /// List images.
    Ls,
    /// Show an image: its config (env, working directory, user, entrypoint, command,
    /// ports, labels) and where it came from.
    Inspect {
        /// Image name.
        name: String,
    },
    /// Remove images.
    Rm {
        /// Image names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}
