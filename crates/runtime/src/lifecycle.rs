//! Create, stop, start and destroy of one sandbox as an ordered list of host steps.
//!
//! Every step is recorded before it is attempted and undone in reverse order when a later
//! step fails; undo steps tolerate objects that are already gone, so destroy is the same
//! undo run over all steps and works for half-created sandboxes too.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::warn;

use crate::error::{Error, Result};
use crate::host::{ContainerStatus, CriuPaths, Host};
use crate::layout::{Layout, Names, Record, SandboxPaths};
use crate::net::{self, NetConfig};
use crate::oci;
use crate::spec::{NetworkMode, SandboxSpec};
use crate::steps;

/// One host-side step of creating a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    RunDir,
    Disk,
    Mount,
    Netns,
    Lease,
    Veth,
    Nft,
    Container,
}

/// All steps, in creation order.
pub const STEPS: [Step; 8] = [
    Step::RunDir,
    Step::Disk,
    Step::Mount,
    Step::Netns,
    Step::Lease,
    Step::Veth,
    Step::Nft,
    Step::Container,
];

/// What the lifecycle functions need besides the host.
pub struct Ctx<'a> {
    pub host: &'a dyn Host,
    pub layout: &'a Layout,
    pub net: &'a NetConfig,
    pub agent_bin: &'a Path,
    pub ready_timeout: Duration,
    /// Memory images to restore instead of booting the init (a warm restore).
    pub restore_images: Option<&'a Path>,
}

impl Ctx<'_> {
    pub(crate) fn runc_root(&self) -> PathBuf {
        self.layout.runc_root()
    }
}

/// Creates a sandbox and starts its container; on failure nothing is left behind. The
/// runtime waits for its agent (and destroys it if the agent never answers).
pub fn create(ctx: &Ctx<'_>, spec: SandboxSpec) -> Result<Record> {
    spec.validate()?;
    let paths = ctx.layout.sandbox(&spec.id);
    paths.create(&spec.id)?;
    let mut record = Record {
        names: Names::for_id(&spec.id),
        spec,
        net: None,
        agent_bin: ctx.agent_bin.to_path_buf(),
        created_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        stopped: false,
    };
    let mut done = Vec::new();
    let result = record
        .save(&paths.record())
        .and_then(|()| build(ctx, &paths, &mut record, &mut done));
    if let Err(e) = result {
        warn!(id = %record.spec.id, error = %e, "create failed, rolling back");
        if ctx.restore_images.is_some() {
            ctx.host.cancel_restore(&record.names.container);
        }
        let _ = undo(ctx, &paths, &record, done.iter().rev().copied());
        let _ = paths.remove();
        return Err(e);
    }
    Ok(record)
}

fn build(
    ctx: &Ctx<'_>,
    paths: &SandboxPaths,
    record: &mut Record,
    done: &mut Vec<Step>,
) -> Result<()> {
    let t = std::time::Instant::now();
    done.push(Step::RunDir);
    ctx.host.mount_run_dir(paths)?;
    steps::done("run directory mounted", t);
    // Before any process is spawned for this sandbox: the store holds a file lock while
    // it creates the disk, and a child forked meanwhile keeps it until it execs.
    let t = std::time::Instant::now();
    done.push(Step::Disk);
    let (names, spec) = (record.names.clone(), record.spec.clone());
    ctx.host
        .create_disk(&names.disk, &spec.image.layer, spec.resources.disk_mb)?;
    steps::done("disk forked from its layer", t);
    if ctx.restore_images.is_some() {
        ctx.host.criu_work_dir(&restore_work(paths))?;
    }
    // Mounting the disk, making the network and getting a restore ready do not depend on
    // each other: side by side.
    let (mut disk_done, mut net_done) = (Vec::new(), Vec::new());
    let (disk, net) = std::thread::scope(|s| {
        let disk = s.spawn(|| mount_disk(ctx, paths, &names, &mut disk_done));
        if let Some(images) = ctx.restore_images {
            s.spawn(|| prepare_restore(ctx, paths, &names, images));
        }
        let net = build_net(ctx, paths, record, &mut net_done);
        (disk.join(), net)
    });
    done.extend(disk_done.into_iter().chain(net_done));
    disk.unwrap_or_else(|_| {
        Err(Error::Command {
            command: "disk setup".into(),
            detail: "panicked".into(),
        })
    })?;
    net?;
    start(ctx, paths, record, done)
}

/// CRIU's work directory for a restore.
fn restore_work(paths: &SandboxPaths) -> PathBuf {
    paths.dir.join("criu-restore")
}

fn prepare_restore(ctx: &Ctx<'_>, paths: &SandboxPaths, names: &Names, images: &Path) {
    let t = std::time::Instant::now();
    let work = restore_work(paths);
    let criu = CriuPaths {
        images,
        work: &work,
    };
    ctx.host.prepare_restore(&names.container, criu);
    steps::done("restore prepared (lazy-pages daemon)", t);
}

fn mount_disk(
    ctx: &Ctx<'_>,
    paths: &SandboxPaths,
    names: &Names,
    done: &mut Vec<Step>,
) -> Result<()> {
    let t = std::time::Instant::now();
    done.push(Step::Mount);
    ctx.host.mount_disk(&names.disk, paths)?;
    steps::done("disk mounted (disk server, loop device, ext4)", t);
    Ok(())
}

fn build_net(
    ctx: &Ctx<'_>,
    paths: &SandboxPaths,
    record: &mut Record,
    done: &mut Vec<Step>,
) -> Result<()> {
    let t = std::time::Instant::now();
    // Made atomically, and possibly refused because the name is taken (by a sandbox of
    // another data directory with the same id): recorded only once it is ours.
    ctx.host.netns_add(&record.names.netns)?;
    done.push(Step::Netns);
    if let NetworkMode::Internet {
        allow_out,
        deny_out,
        by_name,
    } = &record.spec.network
    {
        done.push(Step::Lease);
        let alloc = net::lease(ctx.net, &owner(paths))?;
        record.net = Some(alloc.clone());
        record.save(&paths.record())?;
        done.push(Step::Veth);
        ctx.host.veth_add(&record.names.netns, &alloc)?;
        done.push(Step::Nft);
        ctx.host.nft_prepare()?;
        let host = net::HostNet::of_host();
        let egress = net::Egress {
            allow: allow_out,
            deny: deny_out,
            host: &host,
            by_name: *by_name,
        };
        ctx.host
            .nft_apply(&net::sandbox_rules_script(&alloc, &egress))?;
    }
    steps::done("network namespace and network", t);
    Ok(())
}

/// Writes the bundle and runs the container (the runtime then waits for its agent).
fn start(ctx: &Ctx<'_>, paths: &SandboxPaths, record: &Record, done: &mut Vec<Step>) -> Result<()> {
    let t = std::time::Instant::now();
    let netns = net::netns_path(&record.names.netns);
    let rootfs = paths.rootfs();
    let run_dir = paths.run();
    let resolv = record.net.as_ref().map(|_| paths.resolv_conf());
    let criu_config = paths.criu_config();
    let host_paths = oci::HostPaths {
        rootfs: &rootfs,
        run_dir: &run_dir,
        agent_bin: &record.agent_bin,
        netns: &netns,
        cgroup: &record.names.cgroup,
        resolv_conf: resolv.as_deref(),
        criu_config: &criu_config,
        nofile: ctx.host.nofile_limit(),
    };
    let config = oci::config(&record.spec, &host_paths)?;
    let nameserver = record.net.as_ref().map(|alloc| match &record.spec.network {
        NetworkMode::Internet {
            by_name: Some(_), ..
        } => net::Nameserver::Resolver(alloc.host_addr),
        _ => net::Nameserver::Host,
    });
    ctx.host
        .write_bundle(paths, &oci::to_json(&config), nameserver)?;
    steps::done("bundle written", t);
    done.push(Step::Container);
    let t = std::time::Instant::now();
    match ctx.restore_images {
        Some(images) => {
            runc_restore(ctx, paths, record, images)?;
            steps::done("runc restore (CRIU)", t);
        }
        None => {
            ctx.host
                .runc_run(&ctx.runc_root(), &record.names.container, paths)?;
            steps::done("runc run", t);
        }
    }
    Ok(())
}

/// Adds the end of the init's output (host-owned `logs/init.log`) to an agent error: why
/// an agent never answered is usually there.
pub(crate) fn with_init_output(e: Error, paths: &SandboxPaths) -> Error {
    let Error::Agent(msg) = e else { return e };
    let log = std::fs::read_to_string(paths.logs().join("init.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(3).collect();
    if tail.is_empty() {
        return Error::Agent(msg);
    }
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Error::Agent(format!("{msg}; init output: {}", tail.join(" | ")))
}

/// Boots a stopped sandbox again on its disk (a cold boot).
pub fn restart(ctx: &Ctx<'_>, id: &str) -> Result<Record> {
    let paths = ctx.layout.sandbox(id);
    let mut record = load(ctx, id)?;
    if ctx
        .host
        .runc_state(&ctx.runc_root(), &record.names.container)?
        .is_some()
    {
        return Err(Error::NotStopped(id.into()));
    }
    let mut done = Vec::new();
    if let Err(e) = start(ctx, &paths, &record, &mut done) {
        let _ = stop(ctx, id);
        return Err(e);
    }
    record.stopped = false;
    record.save(&paths.record())?;
    Ok(record)
}

/// Kills every process of the sandbox and deletes its container; disk and network stay.
pub fn stop(ctx: &Ctx<'_>, id: &str) -> Result<()> {
    let mut record = load(ctx, id)?;
    stop_container(ctx, &record)?;
    record.stopped = true;
    record.save(&ctx.layout.sandbox(id).record())
}

fn stop_container(ctx: &Ctx<'_>, record: &Record) -> Result<()> {
    let root = ctx.runc_root();
    let name = &record.names.container;
    ctx.host.runc_kill(&root, name, "KILL")?;
    ctx.host.runc_delete(&root, name)
}

/// Removes everything a sandbox holds on the host. Idempotent; continues past failures
/// and reports the first one. The directory is kept if its disk is still mounted.
pub fn destroy(ctx: &Ctx<'_>, id: &str) -> Result<()> {
    let paths = ctx.layout.sandbox(id);
    let record = match Record::load(&paths.record()) {
        Ok(r) => r,
        Err(_) if !paths.dir.exists() => return Ok(()),
        Err(_) => fallback_record(ctx, id),
    };
    undo(ctx, &paths, &record, STEPS.iter().rev().copied())?;
    paths.remove()
}

/// A record for a sandbox whose record file is missing or torn: names follow from the id,
/// a lease is found by owner.
fn fallback_record(ctx: &Ctx<'_>, id: &str) -> Record {
    let paths = ctx.layout.sandbox(id);
    let owner = owner(&paths);
    let net = net::leases_owned(ctx.net, &owner)
        .into_iter()
        .find(|(_, o)| *o == owner)
        .map(|(a, _)| a);
    Record {
        spec: SandboxSpec {
            id: id.into(),
            image: crate::spec::ImageRef {
                name: String::new(),
                layer: String::new(),
                env: Default::default(),
                cwd: "/".into(),
                user: None,
            },
            resources: Default::default(),
            env: Default::default(),
            network: Default::default(),
            volumes: Vec::new(),
        },
        names: Names::for_id(id),
        net,
        agent_bin: ctx.agent_bin.to_path_buf(),
        created_at: 0,
        stopped: false,
    }
}

fn undo(
    ctx: &Ctx<'_>,
    paths: &SandboxPaths,
    record: &Record,
    steps: impl Iterator<Item = Step>,
) -> Result<()> {
    let mut first = None;
    for step in steps {
        if let Err(e) = undo_step(ctx, paths, record, step) {
            warn!(id = %record.spec.id, ?step, error = %e, "undo failed");
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

fn undo_step(ctx: &Ctx<'_>, paths: &SandboxPaths, record: &Record, step: Step) -> Result<()> {
    let host = ctx.host;
    let names = &record.names;
    match (step, &record.net) {
        (Step::Container, _) => {
            stop_container(ctx, record)?;
            host.cgroup_remove(&names.cgroup)
        }
        (Step::Nft, Some(alloc)) => host.nft_remove(&net::sandbox_rules_removal(alloc)),
        (Step::Veth, Some(alloc)) => host.veth_delete(alloc),
        (Step::Lease, Some(alloc)) => net::release(alloc, &owner(paths)),
        (Step::Netns, _) => host.netns_delete(&names.netns),
        (Step::Mount, _) => host.unmount_disk(&names.disk, paths),
        (Step::Disk, _) => host.delete_disk(&names.disk),
        (Step::RunDir, _) => host.unmount_run_dir(paths),
        (Step::Nft | Step::Veth | Step::Lease, None) => Ok(()),
    }
}

/// Loads the record of an existing sandbox.
pub fn load(ctx: &Ctx<'_>, id: &str) -> Result<Record> {
    crate::spec::validate_id(id).map_err(|_| Error::NotFound(id.into()))?;
    let paths = ctx.layout.sandbox(id);
    if !paths.record().exists() {
        return Err(Error::NotFound(id.into()));
    }
    Record::load(&paths.record())
}

/// Whether the sandbox's container is running.
pub fn is_running(ctx: &Ctx<'_>, record: &Record) -> Result<bool> {
    let state = ctx
        .host
        .runc_state(&ctx.runc_root(), &record.names.container)?;
    Ok(matches!(
        state.map(|s| s.status),
        Some(ContainerStatus::Running)
    ))
}

/// Identifies a lease holder host-wide: the sandbox's directory.
fn owner(paths: &SandboxPaths) -> String {
    paths.dir.to_string_lossy().into_owned()
}

/// `runc restore` into a prepared bundle (the start step of a sandbox made from memory images).
fn runc_restore(ctx: &Ctx<'_>, paths: &SandboxPaths, record: &Record, images: &Path) -> Result<()> {
    // Made fresh by `build`, and maybe already holding the lazy-pages daemon's socket.
    let work = restore_work(paths);
    let criu = CriuPaths {
        images,
        work: &work,
    };
    let r = ctx
        .host
        .runc_restore(&ctx.runc_root(), &record.names.container, paths, criu);
    ctx.host.keep_criu_log(paths, &work, "restore.log");
    r
}

#[cfg(test)]
pub(crate) mod tests;
