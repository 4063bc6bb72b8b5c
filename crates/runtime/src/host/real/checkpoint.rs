//! [`CheckpointHost`] on the real host: runc + CRIU, and the block-store disks.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cmd::{self, run};
use super::{runc, RealHost};
use crate::error::{Error, IoContext, Result};
use crate::host::checkpoint::{CheckpointHost, CriuPaths};
use crate::host::Host;
use crate::layout::SandboxPaths;

/// Whether a CRIU log line is an error worth quoting (every CRIU log has a harmless
/// RLIMIT_NOFILE error line).
fn is_criu_error(line: &str) -> bool {
    line.contains("Error (") && !line.contains("RLIMIT_NOFILE")
}

/// Lines of a CRIU log worth quoting in an error: its first errors (the cause; later ones
/// are consequences) and its last, else its last lines.
fn criu_log_tail(text: &str) -> String {
    let errors: Vec<&str> = text.lines().filter(|l| is_criu_error(l)).collect();
    let picked: Vec<&str> = match errors.len() {
        0 => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(3)..].to_vec()
        }
        1..=3 => errors,
        n => vec![errors[0], errors[1], errors[n - 1]],
    };
    picked
        .iter()
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// The process CRIU was working on when it first failed, from the last "(pid: N" header
/// before the first error line (CRIU logs one per process it dumps).
fn failing_pid(text: &str) -> Option<u32> {
    let before: Vec<&str> = text.lines().take_while(|l| !is_criu_error(l)).collect();
    let header = before
        .iter()
        .rev()
        .find(|l| l.contains("Dumping") && l.contains("(pid: "))?;
    let rest = header.split("(pid: ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// CRIU failures that come from what a sandbox's process holds: a plain sentence saying
/// what to do about it (the checkpoint is then refused as a conflict, not a host failure).
fn known_cause(text: &str) -> Option<String> {
    let line = text.lines().find(|l| is_criu_error(l))?;
    if line.contains("Can't dump ghost file") {
        let what = line.split("ghost file ").nth(1).unwrap_or("").trim();
        return Some(format!(
            "it holds a deleted file open ({what}); files deleted while open are carried \
             in a memory snapshot up to {GHOST_LIMIT}: close it, or keep it smaller"
        ));
    }
    if line.contains("ctty inheritance detected") {
        return Some(
            "a terminal session is running a job in its foreground; a terminal can be \
             checkpointed at its prompt (let the job finish, or put it in the background)"
                .into(),
        );
    }
    if line.contains("Stopped tasks are not supported") {
        return Some("it is stopped; continue it (kill -CONT) first".into());
    }
    if line.contains("external") && line.contains("unix") {
        return Some(format!(
            "it holds a Unix socket connected to something outside the sandbox ({}); close it first",
            line.trim()
        ));
    }
    None
}

/// The size up to which CRIU carries a deleted-but-open file (`ghost-limit` in
/// [`crate::oci::CRIU_OPTIONS`]).
pub const GHOST_LIMIT: &str = "64 MiB";

/// Free bytes below which a failed dump is blamed on a full disk: CRIU (and the tar it
/// runs for tmpfs contents) often logs only that a write or a helper failed.
const NEARLY_FULL: u64 = 2 << 20;

/// Whether a failed CRIU run into `images` ran out of disk space.
fn out_of_space(images: &Path, log: &str) -> bool {
    let said = ["No space left on device", "Wrote only", "ENOSPC"]
        .iter()
        .any(|s| log.contains(s));
    let free = crate::space::free_bytes(images).unwrap_or(u64::MAX);
    said || free < NEARLY_FULL
}

/// Turns a failed runc checkpoint or restore into what CRIU refused, from its log in the
/// work dir: the process it was working on and its first errors; a refusal caused by what
/// a process holds becomes [`Error::NotCheckpointable`]; a full image disk is said plainly.
fn with_criu_log(e: Error, log: &Path, images: &Path) -> Error {
    let Error::Command { command, detail } = e else {
        return e;
    };
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let verb = if command.contains(" restore") {
        "restore"
    } else {
        "dump"
    };
    let who = failing_pid(&text).map(describe_process);
    if let (Some(who), Some(cause)) = (&who, known_cause(&text)) {
        return Error::NotCheckpointable(format!("{who}: {cause}"));
    }
    let tail = criu_log_tail(&text);
    let mut message = match (&who, tail.is_empty()) {
        (_, true) => format!("runc {verb} failed: {}", first_line(&detail)),
        (Some(who), false) => format!("CRIU could not {verb} {who}: {tail}"),
        (None, false) => format!("CRIU could not {verb} the sandbox: {tail}"),
    };
    if out_of_space(images, &text) {
        message.push_str("; No space left on device for the memory images");
    }
    Error::Checkpoint(message)
}

/// runc's error without the log lines it quotes after it.
fn first_line(detail: &str) -> &str {
    detail.split(" time=").next().unwrap_or(detail).trim()
}

/// "process `comm` (pid N in the sandbox)" for host pid `pid`, as far as /proc tells.
pub(crate) fn describe_process(pid: u32) -> String {
    let status = procfs::process::Process::new(pid as i32).and_then(|p| p.status());
    let comm = status.as_ref().map(|s| s.name.clone()).unwrap_or_default();
    // NSpid lists the pid in each nested namespace; the last is the sandbox's.
    let inside = status
        .ok()
        .and_then(|s| s.nspid)
        .and_then(|ns| ns.last().map(i32::to_string));
    match (comm.trim(), inside) {
        ("", _) => format!("process {pid} (host pid)"),
        (comm, Some(p)) => format!("process {comm} (pid {p} in the sandbox)"),
        (comm, None) => format!("process {comm} (host pid {pid})"),
    }
}

fn disk_err(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Disk(Box::new(e))
}

impl RealHost {
    fn init_pid(&self, root: &Path, id: &str, op: &str) -> Result<u32> {
        self.runc_state(root, id)?
            .and_then(|s| s.pid)
            .ok_or_else(|| Error::Command {
                command: format!("runc {op}"),
                detail: "the container has no init process".into(),
            })
    }

    /// CRIU restores the UTS and IPC namespaces of the checkpointed container: a restored
    /// copy gets its own hostname (its id) as a fresh sandbox has, and System V segments
    /// go with their last process again (see [`Self::shm_rmid_forced`]), both set from
    /// the host side by a thread of our own that joins the two namespaces (no process
    /// spawned on the restore path).
    fn name_restored(&self, root: &Path, id: &str) -> Result<()> {
        let pid = self.init_pid(root, id, "restore")?;
        let open = |kind: &str| {
            let path = format!("/proc/{pid}/ns/{kind}");
            std::fs::File::open(&path).at(&path)
        };
        let (uts, ipc) = (open("uts")?, open("ipc")?);
        let (key, value) = SHM_RMID_FORCED;
        let sysctl = Path::new("/proc/sys").join(key);
        let hostname = id.to_string();
        in_namespaces(move || {
            setns(&uts, nix::sched::CloneFlags::CLONE_NEWUTS)?;
            setns(&ipc, nix::sched::CloneFlags::CLONE_NEWIPC)?;
            nix::unistd::sethostname(&hostname).map_err(|e| Error::Command {
                command: "sethostname".into(),
                detail: e.to_string(),
            })?;
            std::fs::write(&sysctl, value).at(&sysctl)
        })
    }

    /// Sets `kernel.shm_rmid_forced` in the sandbox's IPC namespace. It is off while CRIU
    /// dumps: CRIU restores it before the System V segments, and fills each segment
    /// through an attach of its own, which with it on removes the segment before the
    /// process re-attaches it. Turning it on again removes only segments nobody attached.
    /// Done from a thread of our own that joins the namespace (no process spawned on the
    /// checkpoint path): /proc/sys/kernel answers for the writing thread's IPC namespace.
    fn shm_rmid_forced(&self, root: &Path, id: &str, on: bool) -> Result<()> {
        let pid = self.init_pid(root, id, "checkpoint")?;
        let ns_path = format!("/proc/{pid}/ns/ipc");
        let ns = std::fs::File::open(&ns_path).at(&ns_path)?;
        let (key, value) = SHM_RMID_FORCED;
        let value = if on { value } else { "0" };
        let sysctl = Path::new("/proc/sys").join(key);
        in_namespaces(move || {
            setns(&ns, nix::sched::CloneFlags::CLONE_NEWIPC)?;
            std::fs::write(&sysctl, value).at(&sysctl)
        })
    }
}

/// Runs `f` on a thread of its own, which may join other namespaces (a thread's UTS and
/// IPC namespaces are its own; it ends with `f`, so no other work runs in them).
fn in_namespaces(f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    std::thread::spawn(f).join().unwrap_or_else(|_| {
        Err(Error::Command {
            command: "a thread in the sandbox's namespaces".into(),
            detail: "panicked".into(),
        })
    })
}

fn setns(ns: &std::fs::File, kind: nix::sched::CloneFlags) -> Result<()> {
    nix::sched::setns(ns, kind).map_err(|e| Error::Command {
        command: format!("setns({kind:?})"),
        detail: e.to_string(),
    })
}

/// How long a dump waits for a lazy restore of the same sandbox to copy its last pages.
const LAZY_WAIT: Duration = Duration::from_secs(300);

impl RealHost {
    /// `runc restore` into the bundle; with `lazy`, its memory left to a lazy-pages daemon
    /// already listening.
    fn run_restore(
        &self,
        root: &Path,
        id: &str,
        paths: &SandboxPaths,
        criu: CriuPaths<'_>,
        lazy: bool,
    ) -> Result<()> {
        let log = paths.logs().join("runc.log");
        let mut c = self.runc_for_sandbox(root);
        c.arg("--log")
            .arg(&log)
            .args(["restore", "--detach", "--image-path"]);
        c.arg(criu.images).arg("--work-path").arg(criu.work);
        if lazy {
            c.arg("--lazy-pages");
        }
        c.arg("--bundle").arg(paths.bundle()).arg(id);
        cmd::run_detached(c, &log, &paths.logs().join("init.log"))
            .map_err(|e| with_criu_log(e, &criu.work.join("restore.log"), criu.work))
    }

    /// A lazy restore: its daemon started first, then left serving the sandbox.
    fn restore_lazily(
        &self,
        root: &Path,
        id: &str,
        paths: &SandboxPaths,
        criu: CriuPaths<'_>,
    ) -> Result<()> {
        let prepared = self.take_prepared(id);
        let lazy = match prepared {
            Some(lazy) => lazy,
            None => super::lazy::LazyPages::start(criu.images, criu.work, id)?,
        };
        self.run_restore(root, id, paths, criu, true)?;
        lazy.serve();
        Ok(())
    }

    /// The lazy-pages daemon started for container `id` ahead of its restore, if any.
    fn take_prepared(&self, id: &str) -> Option<super::lazy::LazyPages> {
        let mut prepared = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
        prepared.remove(id)
    }

    /// Whether the images in `images` may be restored lazily (none has failed so).
    fn lazy_allowed(&self, images: &Path) -> bool {
        let refused = self.lazy_refused.lock().unwrap_or_else(|e| e.into_inner());
        !refused.contains(images)
    }

    /// Restores of `images` are eager from now on.
    fn refuse_lazy(&self, images: &Path) {
        let mut refused = self.lazy_refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.insert(images.to_path_buf());
    }
}

/// Tries at freezing a sandbox before its failure is the caller's.
const PAUSE_ATTEMPTS: u64 = 8;

/// The sandbox's `kernel.shm_rmid_forced` (see [`crate::oci::SYSCTLS`]), as a /proc/sys path.
const SHM_RMID_FORCED: (&str, &str) = ("kernel/shm_rmid_forced", "1");

impl CheckpointHost for RealHost {
    fn runc_pause(&self, root: &Path, id: &str) -> Result<()> {
        // A lazily restored sandbox is frozen only once every page is copied in: a task
        // that faults on a page not copied yet waits for it unfreezably (userfaultfd), and
        // a dump would record such a page as empty. Every dump follows this pause, so
        // this is the one place that waits.
        if !super::lazy::wait_done(id, LAZY_WAIT) {
            return Err(Error::Checkpoint(format!(
                "the sandbox's memory is still being restored after {} s; try again later",
                LAZY_WAIT.as_secs()
            )));
        }
        // The freezer can miss a task that is mid-fork or in an uninterruptible wait (disk
        // I/O), and runc then gives up with "unable to freeze" (and thaws): a moment later
        // it works.
        let mut attempt = 1;
        loop {
            match run(runc(root).args(["pause", id])) {
                Err(e) if e.to_string().contains("unable to freeze") => {
                    if attempt == PAUSE_ATTEMPTS {
                        return Err(Error::NotCheckpointable(format!(
                            "a process could not be frozen after {PAUSE_ATTEMPTS} tries (it is \
                             in an uninterruptible wait, such as disk I/O); try again"
                        )));
                    }
                    tracing::debug!(sandbox = id, attempt, "freezing failed, trying again: {e}");
                    std::thread::sleep(Duration::from_millis(50 * attempt));
                    attempt += 1;
                }
                other => return other.map(drop),
            }
        }
    }

    fn runc_resume(&self, root: &Path, id: &str) -> Result<()> {
        run(runc(root).args(["resume", id])).map(drop)
    }

    fn runc_checkpoint(&self, root: &Path, id: &str, criu: CriuPaths<'_>) -> Result<()> {
        // `runc_pause`, which comes first, waited for a lazy restore's last pages.
        self.shm_rmid_forced(root, id, false)?;
        let mut c = runc(root);
        c.args(["checkpoint", "--leave-running", "--image-path"])
            .arg(criu.images)
            .arg("--work-path")
            .arg(criu.work)
            .arg(id);
        let dumped = run(&mut c)
            .map(drop)
            .map_err(|e| with_criu_log(e, &criu.work.join("dump.log"), criu.images));
        let restored = self.shm_rmid_forced(root, id, true);
        dumped.and(restored)
    }

    fn runc_restore(
        &self,
        root: &Path,
        id: &str,
        paths: &SandboxPaths,
        criu: CriuPaths<'_>,
    ) -> Result<()> {
        if self.lazy_pages && self.lazy_allowed(criu.images) {
            match self.restore_lazily(root, id, paths, criu) {
                Ok(()) => return self.name_restored(root, id),
                Err(e) => {
                    // What CRIU refused lazily it may restore eagerly: a process that
                    // reserves more address space than the host would commit (Chromium's
                    // cages) fails to map its memory writable for userfaultfd.
                    tracing::warn!("lazy restore of {id} failed, restoring eagerly: {e}");
                    self.refuse_lazy(criu.images);
                    let _ = self.runc_delete(root, id);
                    self.criu_work_dir(criu.work)?;
                }
            }
        }
        self.run_restore(root, id, paths, criu, false)?;
        self.name_restored(root, id)
    }

    fn prepare_restore(&self, id: &str, criu: CriuPaths<'_>) {
        if !self.lazy_pages || !self.lazy_allowed(criu.images) {
            return;
        }
        match super::lazy::LazyPages::start(criu.images, criu.work, id) {
            Ok(lazy) => {
                let mut prepared = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
                prepared.insert(id.to_string(), lazy);
            }
            Err(e) => tracing::debug!("lazy-pages daemon for {id} not started ahead: {e}"),
        }
    }

    fn cancel_restore(&self, id: &str) {
        drop(self.take_prepared(id));
    }

    fn disk_freeze(&self, disk: &str) -> Result<()> {
        self.disks()
            .with_mounted(disk, |m| m.freeze().map_err(disk_err))
    }

    fn disk_thaw(&self, disk: &str) -> Result<()> {
        self.disks()
            .with_mounted(disk, |m| m.thaw().map_err(disk_err))
    }

    fn disk_seal_frozen(&self, disk: &str) -> Result<String> {
        self.disks().with_mounted(disk, |m| {
            m.seal_frozen().map(|l| l.to_string()).map_err(disk_err)
        })
    }

    fn undumpable_processes(&self, cgroup: &str) -> Vec<String> {
        let procs = super::cgroup_dirs(cgroup)
            .into_iter()
            .find_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .unwrap_or_default();
        procs
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .filter_map(|pid| {
                let state = procfs::process::Process::new(pid as i32)
                    .ok()?
                    .stat()
                    .ok()?
                    .state;
                matches!(state, 'T' | 't').then(|| {
                    let how = if state == 'T' {
                        "stopped by a signal"
                    } else {
                        "stopped by a debugger"
                    };
                    format!(
                        "{} is {how}; continue it (kill -CONT) first",
                        describe_process(pid)
                    )
                })
            })
            .collect()
    }

    fn layer_bytes(&self, layer: &str) -> Result<u64> {
        let id: blockstore::LayerId = layer
            .parse()
            .map_err(|_| Error::InvalidSpec(format!("bad layer id {layer:?}")))?;
        let info = self.disks().store().layer_info(&id).map_err(disk_err)?;
        Ok(info.bytes_on_disk)
    }

    fn runc_busy(&self, root: &Path, id: &str, verb: Option<&str>) -> bool {
        let root = root.to_string_lossy();
        let Ok(all) = procfs::process::all_processes() else {
            return false;
        };
        all.flatten().any(|p| {
            let args = p.cmdline().unwrap_or_default();
            let has = |s: &str| args.iter().any(|a| a == s);
            verb.is_none_or(has) && has(id) && has(&root)
        })
    }

    fn criu_work_dir(&self, work: &Path) -> Result<()> {
        let _ = std::fs::remove_dir_all(work);
        std::fs::create_dir(work).at(work)
    }

    fn keep_criu_log(&self, paths: &SandboxPaths, work: &Path, log: &str) {
        let _ = std::fs::rename(work.join(log), paths.logs().join(log));
        let _ = std::fs::remove_dir_all(work);
    }

    fn images_dir(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).at(dir)?;
        dir.canonicalize().at(dir)
    }

    fn discard_images(&self, dir: &Path) {
        let _ = std::fs::remove_dir_all(dir);
    }

    fn seal_images(&self, dir: &Path) -> Result<u64> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).at(dir)?;
        let mut bytes = 0;
        // CRIU's images are flat: regular files only.
        for entry in std::fs::read_dir(dir).at(dir)?.flatten() {
            let path = entry.path();
            let meta = entry.metadata().at(&path)?;
            if meta.is_file() {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .at(&path)?;
                bytes += meta.len();
            }
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_with_a_foreground_job_is_named() {
        let log = "(00.15) Error (criu/tty.c:2281): tty: ctty inheritance detected sid/pgrp 6, \
                   no PTY peer with sid/pgrp needed\n";
        let cause = known_cause(log).unwrap();
        assert!(
            cause.contains("terminal session is running a job"),
            "{cause}"
        );
    }

    #[test]
    fn a_dump_is_blamed_on_a_full_disk_when_its_log_or_the_disk_says_so() {
        let dir = tempfile::tempdir().unwrap();
        assert!(out_of_space(
            dir.path(),
            "tar: -: Wrote only 4096 of 10240 bytes"
        ));
        assert!(out_of_space(dir.path(), "write: No space left on device"));
        assert!(!out_of_space(
            dir.path(),
            "Error (criu/cr-dump.c:1975): Dumping FAILED."
        ));
    }

    #[test]
    fn the_error_gains_the_plain_reason() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("dump.log");
        std::fs::write(
            &log,
            "(00.1) Error (criu/util.c:657): exited, status=2\nWrote only 1 of 2 bytes\n",
        )
        .unwrap();
        let e = Error::Command {
            command: "runc checkpoint".into(),
            detail: "exit status: 1".into(),
        };
        let msg = with_criu_log(e, &log, dir.path()).to_string();
        assert!(msg.contains("exited, status=2"), "{msg}");
        assert!(msg.contains("No space left on device"), "{msg}");
    }

    #[test]
    fn a_ghost_file_names_the_process_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("dump.log");
        let me = std::process::id();
        std::fs::write(
            &log,
            format!(
                "(00.1) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE\n\
                 (00.2) Dumping task (pid: {me} comm: python3)\n\
                 (00.3) Error (criu/files-reg.c:1031): Can't dump ghost file /tmp/big of 2002944 size, increase limit\n\
                 (00.4) Error (criu/cr-dump.c:1975): Dumping FAILED.\n"
            ),
        )
        .unwrap();
        let e = Error::Command {
            command: "runc checkpoint".into(),
            detail: "exit status: 1: time=... level=warning".into(),
        };
        let e = with_criu_log(e, &log, dir.path());
        assert!(matches!(e, Error::NotCheckpointable(_)), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("/tmp/big of 2002944 size"), "{msg}");
        assert!(msg.contains("process "), "{msg}");
        assert!(msg.contains("64 MiB"), "{msg}");
    }

    #[test]
    fn the_first_errors_are_quoted_and_the_process_named() {
        let text = "Dumping task (pid: 1 comm: init)\n(1) Error (a.c:1): cause\n\
                    (2) Error (b.c:2): then\n(3) Error (c.c:3): more\n(4) Error (d.c:4): FAILED.\n";
        assert_eq!(
            criu_log_tail(text),
            "(1) Error (a.c:1): cause | (2) Error (b.c:2): then | (4) Error (d.c:4): FAILED."
        );
        assert_eq!(failing_pid(text), Some(1));
        assert_eq!(failing_pid("(1) Error (a.c:1): before any process\n"), None);
    }
}
