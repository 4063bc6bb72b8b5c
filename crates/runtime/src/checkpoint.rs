//! Checkpoints and restores of sandboxes.
//!
//! FILESYSTEM: freeze the sandbox's ext4, seal its disk (the overlay becomes a sealed
//! layer), thaw. MEMORY: `runc pause`, freeze + seal + thaw the disk while every process is
//! stopped, `runc checkpoint --leave-running` (CRIU) of the still-paused tree, `runc
//! resume`: the dump and the sealed layer describe the same instant (a restored copy must
//! see exactly the disk its open files were dumped against). The source keeps running.
//!
//! A restore forks a new disk from the snapshot's layer, makes a fresh network namespace
//! (and address) first, writes a bundle like a create, and runs `runc restore` of the
//! memory images instead of booting the init; FILESYSTEM snapshots boot cold on the layer.
//! Afterwards the agent is told the sandbox's fork identity and the after-restore hooks run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::host::CriuPaths;
use crate::layout::Record;
use crate::lifecycle::{self, Ctx};
use crate::spec::SandboxSpec;

/// What a checkpoint captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// The disk only; restores boot cold.
    Filesystem,
    /// Disk, memory and the running process tree; restores resume warm.
    Memory,
}

/// How long the steps of a checkpoint took, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointTimes {
    /// Time the sandbox's processes were stopped (memory) or its disk frozen (filesystem).
    pub paused_ms: f64,
    pub seal_ms: f64,
    pub dump_ms: f64,
    pub total_ms: f64,
}

/// A completed checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub kind: CheckpointKind,
    /// The sealed disk layer (the disk's state at the checkpoint).
    pub layer: String,
    /// CRIU images, for memory checkpoints.
    pub memory_dir: Option<PathBuf>,
    /// Bytes of the sealed layer on the host.
    pub disk_bytes: u64,
    /// Bytes of the memory images.
    pub memory_bytes: u64,
    pub times: CheckpointTimes,
}

/// What a restore starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSource {
    /// Sealed layer the new disk forks from.
    pub layer: String,
    /// CRIU images of a memory snapshot; `None` boots cold.
    pub memory_dir: Option<PathBuf>,
}

/// What happens in a restored sandbox before it is handed out.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Fork identity told to the agent (written to /etc/sandfork/fork inside).
    pub identity: Option<proto::agent::Identity>,
    /// Commands run in order right after the restore; a failing one fails the restore.
    pub hooks: Vec<proto::agent::ExecRequest>,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn fail(msg: impl Into<String>) -> Error {
    Error::Checkpoint(msg.into())
}

/// Checkpoints running sandbox `id`. Memory images go to `memory_dir` (created; absolute
/// after canonicalisation). On failure nothing is left in `memory_dir` and the sandbox
/// runs on.
pub fn checkpoint(
    ctx: &Ctx<'_>,
    id: &str,
    kind: CheckpointKind,
    memory_dir: Option<&Path>,
) -> Result<CheckpointInfo> {
    let record = lifecycle::load(ctx, id)?;
    if !lifecycle::is_running(ctx, &record)? {
        return Err(fail(format!("sandbox {id} is not running")));
    }
    match (kind, memory_dir) {
        (CheckpointKind::Filesystem, _) => checkpoint_fs(ctx, &record),
        (CheckpointKind::Memory, Some(dir)) => {
            let dir = ctx.host.images_dir(dir)?;
            let r = ensure_room(ctx, &record, &dir)
                .and_then(|()| checkpoint_memory(ctx, &record, &dir));
            if r.is_err() {
                ctx.host.discard_images(&dir);
            }
            r
        }
        (CheckpointKind::Memory, None) => Err(fail("a memory checkpoint needs an image directory")),
    }
}

/// Free space a memory checkpoint leaves on the disk of its images, beyond their size.
const ROOM_FLOOR: u64 = 32 << 20;

/// Refuses a memory checkpoint the images' disk cannot hold: a dump that fills the disk
/// fails anyway, and meanwhile every sandbox's writeback finds the host disk full. The
/// images are estimated by the sandbox's memory use (an upper bound: it counts page
/// cache, which CRIU does not dump).
fn ensure_room(ctx: &Ctx<'_>, record: &Record, dir: &Path) -> Result<()> {
    let need = ctx
        .host
        .cgroup_usage(&record.names.cgroup)
        .map_or(0, |u| u.memory_bytes);
    let Ok(free) = crate::space::free_bytes(dir) else {
        return Ok(());
    };
    if free >= need.saturating_add(ROOM_FLOOR) {
        return Ok(());
    }
    Err(fail(format!(
        "No space left on device for the memory images: about {} MiB needed, {} MiB free",
        (need + ROOM_FLOOR) >> 20,
        free >> 20
    )))
}

/// Whether the sandbox's container is paused (a checkpoint in progress, or one whose
/// daemon died before resuming it).
pub(crate) fn is_paused(ctx: &Ctx<'_>, record: &Record) -> Result<bool> {
    let state = ctx
        .host
        .runc_state(&ctx.runc_root(), &record.names.container)?;
    Ok(matches!(
        state.map(|s| s.status),
        Some(crate::host::ContainerStatus::Paused)
    ))
}

/// Whether a checkpoint whose daemon died left the sandbox paused, or is still dumping it
/// (CRIU holds the processes stopped while runc reports the container running).
///
/// A runc command the dead daemon started (pause, checkpoint, resume) runs on as an
/// orphan; it is waited for first, or a pause landing just after this check would leave
/// the adopted sandbox frozen.
pub(crate) fn interrupted(ctx: &Ctx<'_>, record: &Record) -> Result<bool> {
    let root = ctx.runc_root();
    let name = &record.names.container;
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while ctx.host.runc_busy(&root, name, None) && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(is_paused(ctx, record)? || ctx.host.runc_busy(&root, name, Some("checkpoint")))
}

/// Finishes what an interrupted checkpoint left: waits for its `runc checkpoint` (which
/// outlives a killed daemon) to end, then thaws the disk and resumes the container.
pub(crate) fn unpause(ctx: &Ctx<'_>, record: &Record) -> Result<()> {
    let root = ctx.runc_root();
    let name = &record.names.container;
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while ctx.host.runc_busy(&root, name, Some("checkpoint")) && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ctx.host.disk_thaw(&record.names.disk)?;
    if is_paused(ctx, record)? {
        ctx.host.runc_resume(&root, name)?;
    }
    warn!(id = %record.spec.id, "resumed after an interrupted checkpoint");
    Ok(())
}

/// Seals the frozen disk, thawing it whatever happens.
fn seal(ctx: &Ctx<'_>, record: &Record) -> Result<String> {
    let disk = &record.names.disk;
    ctx.host.disk_freeze(disk)?;
    let sealed = ctx.host.disk_seal_frozen(disk);
    let thawed = ctx.host.disk_thaw(disk);
    let layer = sealed?;
    thawed?;
    Ok(layer)
}

fn checkpoint_fs(ctx: &Ctx<'_>, record: &Record) -> Result<CheckpointInfo> {
    let t = Instant::now();
    let layer = seal(ctx, record)?;
    let total = ms(t);
    Ok(CheckpointInfo {
        kind: CheckpointKind::Filesystem,
        disk_bytes: ctx.host.layer_bytes(&layer).unwrap_or(0),
        layer,
        memory_dir: None,
        memory_bytes: 0,
        times: CheckpointTimes {
            paused_ms: total,
            seal_ms: total,
            dump_ms: 0.0,
            total_ms: total,
        },
    })
}

fn checkpoint_memory(ctx: &Ctx<'_>, record: &Record, dir: &Path) -> Result<CheckpointInfo> {
    let (root, name) = (ctx.runc_root(), &record.names.container);
    let paths = ctx.layout.sandbox(&record.spec.id);
    let stopped = ctx.host.undumpable_processes(&record.names.cgroup);
    if !stopped.is_empty() {
        return Err(Error::NotCheckpointable(stopped.join("; ")));
    }
    let work = paths.dir.join("criu-dump");
    ctx.host.criu_work_dir(&work)?;
    let t = Instant::now();
    ctx.host.runc_pause(&root, name)?;
    let mut times = CheckpointTimes::default();
    let mut memory_bytes = 0;
    let dumped = seal(ctx, record).and_then(|layer| {
        times.seal_ms = ms(t);
        let criu = CriuPaths {
            images: dir,
            work: &work,
        };
        ctx.host.runc_checkpoint(&root, name, criu)?;
        memory_bytes = ctx.host.seal_images(dir)?;
        times.dump_ms = ms(t) - times.seal_ms;
        Ok(layer)
    });
    // Whatever happened, the source runs on.
    let _ = ctx.host.disk_thaw(&record.names.disk);
    let resumed = ctx.host.runc_resume(&root, name);
    times.paused_ms = ms(t);
    ctx.host.keep_criu_log(&paths, &work, "dump.log");
    let layer = dumped?;
    resumed?;
    times.total_ms = ms(t);
    debug!(id = %record.spec.id, ?times, "memory checkpoint");
    Ok(CheckpointInfo {
        kind: CheckpointKind::Memory,
        disk_bytes: ctx.host.layer_bytes(&layer).unwrap_or(0),
        layer,
        memory_dir: Some(dir.to_path_buf()),
        memory_bytes,
        times,
    })
}

/// Creates sandbox `spec.id` from a snapshot: a disk forked from its layer, then a warm
/// restore of its memory images or a cold boot. On failure nothing is left behind.
pub fn restore(ctx: &Ctx<'_>, mut spec: SandboxSpec, from: &SnapshotSource) -> Result<Record> {
    spec.image.layer.clone_from(&from.layer);
    let Some(images) = &from.memory_dir else {
        return lifecycle::create(ctx, spec);
    };
    if !images.is_absolute() {
        return Err(fail(format!(
            "memory image directory {} is not absolute",
            images.display()
        )));
    }
    let warm = Ctx {
        host: ctx.host,
        layout: ctx.layout,
        net: ctx.net,
        agent_bin: ctx.agent_bin,
        ready_timeout: ctx.ready_timeout,
        restore_images: Some(images),
    };
    let r = lifecycle::create(&warm, spec);
    if let Err(e) = &r {
        warn!(error = %e, "restore failed");
    }
    r
}

/// Tells a restored sandbox's agent its identity and runs the after-restore hooks.
pub async fn after_restore(agent: &agent_client::AgentClient, opts: RestoreOptions) -> Result<()> {
    if let Some(identity) = opts.identity {
        agent
            .set_identity(identity)
            .await
            .map_err(|e| Error::Agent(format!("setting the fork identity: {e}")))?;
    }
    for hook in opts.hooks {
        let what = std::iter::once(hook.command.clone())
            .chain(hook.args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        let out = agent
            .exec_collect(hook, 1 << 16)
            .await
            .map_err(|e| fail(format!("after-restore hook {what:?}: {e}")))?;
        if out.code() != Some(0) {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(fail(format!(
                "after-restore hook {what:?} failed ({:?}): {}",
                out.exit.status,
                stderr.trim()
            )));
        }
    }
    Ok(())
}
