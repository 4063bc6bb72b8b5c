//! The real host: iproute2, nftables, runc, cgroupfs, and the block-store disk path.

mod checkpoint;
mod cmd;
mod disks;
mod kdat;
pub mod lazy;
mod netns;
pub mod runc_version;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use serde::Deserialize;

use self::cmd::{run, run_stdin, run_tolerant};
pub use self::disks::Disks;
use super::{ContainerState, ContainerStatus, Host, Usage};
use crate::error::{Error, IoContext, Result};
use crate::layout::SandboxPaths;
use crate::net::{self, NetAlloc};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Messages of runc, ip and nft meaning "that object does not exist".
const GONE: &[&str] = &[
    "does not exist",
    "not exist",
    "No such file",
    "not found",
    "Cannot find device",
    "not running",
    "process already finished",
];

/// Host side effects for real.
pub struct RealHost {
    disks: Disks,
    /// Serialises creation of the nftables base table across processes.
    lock_dir: PathBuf,
    /// The base table is known to exist (saves an `nft` run per sandbox).
    nft_ready: AtomicBool,
    /// Per run directory: turns true when the init started by `runc_run` has exited.
    inits: Mutex<HashMap<PathBuf, Arc<AtomicBool>>>,
    /// Sandboxes' pages may be merged with equal pages of others (see [`crate::ksm`]).
    memory_merge: bool,
    /// Memory snapshots are restored lazily (see [`lazy`]).
    lazy_pages: bool,
    /// Image directories whose lazy restore failed: restored eagerly from then on.
    lazy_refused: Mutex<HashSet<PathBuf>>,
    /// Lazy-pages daemons started ahead of their restore, by container.
    prepared: Mutex<HashMap<String, lazy::LazyPages>>,
}

impl RealHost {
    /// A host serving disks from `disks`; `lock_dir` holds host-wide lock files.
    pub fn new(disks: Disks, lock_dir: impl Into<PathBuf>) -> Self {
        kdat::ensure_cache();
        RealHost {
            disks,
            lock_dir: lock_dir.into(),
            nft_ready: AtomicBool::new(false),
            inits: Mutex::new(HashMap::new()),
            memory_merge: false,
            lazy_pages: false,
            lazy_refused: Mutex::new(HashSet::new()),
            prepared: Mutex::new(HashMap::new()),
        }
    }

    /// Marks every sandbox this host starts or restores as mergeable (`ksmd` must run for
    /// pages to be merged: [`crate::ksm::ensure_running`]).
    pub fn with_memory_merge(mut self, on: bool) -> Self {
        self.memory_merge = on;
        self
    }

    /// Restores memory snapshots lazily, their pages served by CRIU's lazy-pages daemon
    /// ([`lazy`]); callers check [`lazy::supported`] first.
    pub fn with_lazy_pages(mut self, on: bool) -> Self {
        self.lazy_pages = on;
        self
    }

    /// `runc` with `--root root`, marked mergeable when merging is on.
    fn runc_for_sandbox(&self, root: &Path) -> Command {
        let mut c = runc(root);
        if self.memory_merge {
            crate::ksm::mark_mergeable(&mut c);
        }
        c
    }

    pub fn disks(&self) -> &Disks {
        &self.disks
    }
}

fn runc(root: &Path) -> Command {
    let mut c = Command::new(runc_version::binary());
    c.arg("--root").arg(root);
    c
}

fn ip() -> Command {
    Command::new("ip")
}

#[derive(Deserialize)]
struct RuncState {
    status: String,
    pid: Option<u32>,
}

fn status_of(s: &str) -> ContainerStatus {
    match s {
        "creating" => ContainerStatus::Creating,
        "created" => ContainerStatus::Created,
        "running" => ContainerStatus::Running,
        "paused" => ContainerStatus::Paused,
        _ => ContainerStatus::Stopped,
    }
}

/// Size and inode limits of a sandbox's run directory (agent socket, fork identity).
const RUN_DIR_OPTIONS: &str = "size=4m,nr_inodes=1024,mode=0755";

impl Host for RealHost {
    fn mount_run_dir(&self, paths: &SandboxPaths) -> Result<()> {
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(
            Some("sandfork-run"),
            &paths.run(),
            Some("tmpfs"),
            flags,
            Some(RUN_DIR_OPTIONS),
        )
        .map_err(|e| Error::io(paths.run(), e.into()))
    }

    fn unmount_run_dir(&self, paths: &SandboxPaths) -> Result<()> {
        match umount2(&paths.run(), MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
            Err(e) => Err(Error::io(paths.run(), e.into())),
        }
    }

    fn create_disk(&self, disk: &str, base: &str, size_mb: u64) -> Result<()> {
        self.disks.create(disk, base, size_mb)
    }
    fn mount_disk(&self, disk: &str, paths: &SandboxPaths) -> Result<()> {
        self.disks.mount(disk, paths)
    }
    fn adopt_disk(&self, disk: &str, paths: &SandboxPaths) -> Result<()> {
        self.disks.adopt(disk, paths)
    }
    fn unmount_disk(&self, disk: &str, paths: &SandboxPaths) -> Result<()> {
        self.disks.unmount(disk, paths)
    }
    fn delete_disk(&self, disk: &str) -> Result<()> {
        self.disks.delete(disk)
    }
    fn disk_held_writes(&self, disk: &str) -> Result<u64> {
        self.disks.held_writes(disk)
    }

    fn netns_add(&self, name: &str) -> Result<()> {
        netns::add(name)
    }

    fn netns_delete(&self, name: &str) -> Result<()> {
        netns::delete(name)
    }

    fn veth_add(&self, netns: &str, a: &NetAlloc) -> Result<()> {
        let host = format!(
            "link add {h} type veth peer name {p} netns {ns}\n\
             addr add {ha}/30 dev {h}\nlink set {h} up\n",
            h = a.host_if,
            p = a.peer_if,
            ns = netns::path(netns).display(),
            ha = a.host_addr
        );
        run_stdin(ip().args(["-batch", "-"]), &host)?;
        let inside = format!(
            "link set {p} name eth0\naddr add {sa}/30 dev eth0\nlink set eth0 up\n\
             route add default via {ha}\n",
            p = a.peer_if,
            sa = a.sandbox_addr,
            ha = a.host_addr
        );
        let mut ip_inside = Command::new("nsenter");
        ip_inside
            .arg(format!("--net={}", netns::path(netns).display()))
            .args(["ip", "-batch", "-"]);
        run_stdin(&mut ip_inside, &inside)
    }

    fn veth_delete(&self, a: &NetAlloc) -> Result<()> {
        run_tolerant(ip().args(["link", "delete", &a.host_if]), GONE)
    }

    fn nft_prepare(&self) -> Result<()> {
        let forward = Path::new("/proc/sys/net/ipv4/ip_forward");
        let host_forwards = std::fs::read_to_string(forward).at(forward)?.trim() == "1";
        std::fs::write(forward, "1").at(forward)?;
        if self.nft_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        std::fs::create_dir_all(&self.lock_dir).at(&self.lock_dir)?;
        let lock_path = self.lock_dir.join("nft.lock");
        let file = std::fs::File::create(&lock_path).at(&lock_path)?;
        let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| Error::io(&lock_path, e.into()))?;
        let table = ["list", "table", "inet", net::NFT_TABLE];
        if run(Command::new("nft").args(table)).is_err() {
            // Made once per boot (the table goes with a reboot, as does forwarding), so
            // `host_forwards` is what the host had before sandfork.
            let script = net::base_table_script(host_forwards);
            run_stdin(Command::new("nft").args(["-f", "-"]), &script)?;
        } else if run(Command::new("nft").args([
            "list",
            "map",
            "inet",
            net::NFT_TABLE,
            "dns_redirect",
        ]))
        .is_err()
        {
            // Made by an earlier version, before egress rules by name.
            run_stdin(
                Command::new("nft").args(["-f", "-"]),
                &net::base_table_upgrade_script(),
            )?;
        }
        self.nft_ready.store(true, Ordering::Release);
        Ok(())
    }

    fn nft_apply(&self, script: &str) -> Result<()> {
        let applied = run_stdin(Command::new("nft").args(["-f", "-"]), script);
        if applied.is_err() {
            // Perhaps the table was removed behind our back: look again next time.
            self.nft_ready.store(false, Ordering::Release);
        }
        applied
    }

    fn nft_remove(&self, commands: &[String]) -> Result<()> {
        let mut first = Ok(());
        for c in commands {
            let r = run_tolerant(Command::new("nft").args(c.split(' ')), GONE);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    fn write_bundle(
        &self,
        paths: &SandboxPaths,
        config: &[u8],
        resolv_conf: Option<net::Nameserver>,
    ) -> Result<()> {
        let criu = paths.criu_config();
        std::fs::write(&criu, crate::oci::CRIU_OPTIONS).at(&criu)?;
        if let Some(nameserver) = resolv_conf {
            let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
            let path = paths.resolv_conf();
            std::fs::write(&path, nameserver.resolv_conf(&host)).at(&path)?;
        }
        // The process environment in it holds the sandbox's secrets.
        crate::layout::write_private(&paths.config(), config)
    }

    fn nofile_limit(&self) -> u64 {
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(_, hard)| hard.min(1 << 20))
    }

    fn runc_run(&self, root: &Path, id: &str, paths: &SandboxPaths) -> Result<()> {
        let log = paths.logs().join("runc.log");
        let mut c = self.runc_for_sandbox(root);
        c.arg("--log")
            .arg(&log)
            .args(["run", "--detach", "--bundle"]);
        c.arg(paths.bundle()).arg(id);
        let gone = cmd::run_detached_watched(c, &log, &paths.logs().join("init.log"))?;
        let mut inits = self.inits.lock().unwrap_or_else(|p| p.into_inner());
        inits.insert(paths.run(), gone);
        Ok(())
    }

    fn runc_kill(&self, root: &Path, id: &str, signal: &str) -> Result<()> {
        run_tolerant(runc(root).args(["kill", id, signal]), GONE)
    }

    fn runc_delete(&self, root: &Path, id: &str) -> Result<()> {
        let deleted = run_tolerant(runc(root).args(["delete", "--force", id]), GONE);
        lazy::stop(id);
        deleted
    }

    fn runc_state(&self, root: &Path, id: &str) -> Result<Option<ContainerState>> {
        let out = match run(runc(root).args(["state", id])) {
            Ok(out) => out,
            Err(Error::Command { detail, .. }) if GONE.iter().any(|g| detail.contains(g)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let state: RuncState = serde_json::from_str(&out).map_err(|e| Error::Command {
            command: "runc state".into(),
            detail: e.to_string(),
        })?;
        let status = status_of(&state.status);
        let pid = state
            .pid
            .filter(|p| *p != 0 && status != ContainerStatus::Stopped);
        Ok(Some(ContainerState { status, pid }))
    }

    fn runc_list(&self, root: &Path) -> Result<Vec<String>> {
        if !root.exists() {
            return Ok(Vec::new());
        }
        let out = run(runc(root).args(["list", "-q"]))?;
        Ok(out
            .lines()
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect())
    }

    fn init_exited(&self, paths: &SandboxPaths) -> Option<Arc<AtomicBool>> {
        self.inits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&paths.run())
    }

    fn cgroup_remove(&self, cgroup: &str) -> Result<()> {
        for dir in cgroup_dirs(cgroup) {
            match std::fs::remove_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io(dir, e))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn cgroup_usage(&self, cgroup: &str) -> Result<Usage> {
        let rel = cgroup.trim_start_matches('/');
        let root = Path::new(CGROUP_ROOT);
        if root.join("cgroup.controllers").exists() {
            let dir = root.join(rel);
            let cpu = keyed(&dir.join("cpu.stat"), "usage_usec");
            return Ok(Usage {
                memory_bytes: read_u64(&dir.join("memory.current"))?,
                pids: read_u64(&dir.join("pids.current"))?,
                memory_limit_bytes: read_u64(&dir.join("memory.max")).unwrap_or(0),
                cpu_nanos: cpu.unwrap_or(0).saturating_mul(1000),
                oom_kills: keyed(&dir.join("memory.events"), "oom_kill").unwrap_or(0),
            });
        }
        let memory = root.join("memory").join(rel);
        Ok(Usage {
            memory_bytes: read_u64(&memory.join("memory.usage_in_bytes"))?,
            pids: read_u64(&root.join("pids").join(rel).join("pids.current"))?,
            memory_limit_bytes: read_u64(&memory.join("memory.limit_in_bytes")).unwrap_or(0),
            cpu_nanos: read_u64(&root.join("cpuacct").join(rel).join("cpuacct.usage")).unwrap_or(0),
            oom_kills: keyed(&memory.join("memory.oom_control"), "oom_kill").unwrap_or(0),
        })
    }

    fn cgroup_freeze(&self, cgroup: &str, frozen: bool) -> Result<()> {
        let (file, value, done) = freezer(cgroup, frozen);
        match std::fs::write(&file, value) {
            Err(e) if !frozen && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            r => r.map_err(|e| Error::io(&file, e))?,
        }
        // Freezing takes effect once every task has stopped; a thaw needs no wait.
        let deadline = std::time::Instant::now() + FREEZE_TIMEOUT;
        while frozen && !done() {
            if std::time::Instant::now() >= deadline {
                let _ = std::fs::write(&file, freezer(cgroup, false).1);
                return Err(Error::Command {
                    command: format!("freeze {cgroup}"),
                    detail: format!("not frozen within {FREEZE_TIMEOUT:?}"),
                });
            }
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        Ok(())
    }

    fn netns_exists(&self, name: &str) -> bool {
        netns::path(name).exists()
    }
}

/// How long a freeze may take before it is given up (and undone).
const FREEZE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The freezer file of a cgroup (v2 `cgroup.freeze`, v1 `freezer.state`), the value that
/// asks for `frozen`, and a check that the whole cgroup has got there.
fn freezer(cgroup: &str, frozen: bool) -> (PathBuf, &'static str, impl Fn() -> bool) {
    let rel = cgroup.trim_start_matches('/');
    let root = Path::new(CGROUP_ROOT);
    let v2 = root.join("cgroup.controllers").exists();
    let (file, value, state) = if v2 {
        let dir = root.join(rel);
        let value = if frozen { "1" } else { "0" };
        (dir.join("cgroup.freeze"), value, dir.join("cgroup.events"))
    } else {
        let file = root.join("freezer").join(rel).join("freezer.state");
        let value = if frozen { "FROZEN" } else { "THAWED" };
        (file.clone(), value, file)
    };
    let done = move || {
        let text = std::fs::read_to_string(&state).unwrap_or_default();
        if v2 {
            text.lines().any(|l| l == "frozen 1")
        } else {
            text.trim() == "FROZEN"
        }
    };
    (file, value, done)
}

/// The value of `key` in a cgroup file of `key value` lines (`cpu.stat`, `memory.events`).
fn keyed(path: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
}

fn read_u64(path: &Path) -> Result<u64> {
    let s = std::fs::read_to_string(path).at(path)?;
    s.trim()
        .parse()
        .map_err(|_| Error::io(path, std::io::ErrorKind::InvalidData.into()))
}

/// The cgroup's directory in every mounted hierarchy (one on cgroup v2, one per
/// controller plus the named and unified ones on v1/hybrid).
fn cgroup_dirs(cgroup: &str) -> Vec<PathBuf> {
    let rel = cgroup.trim_start_matches('/');
    let root = Path::new(CGROUP_ROOT);
    if root.join("cgroup.controllers").exists() {
        return vec![root.join(rel)];
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path().join(rel))
        .collect()
}
