//! The one place that calls `waitpid`: reaps every child (including orphans reparented to
//! the agent as init or subreaper) and hands exit statuses to whoever spawned them.
//!
//! Spawning and reaping take the same lock, so a child that exits at once is registered
//! before `waitpid(-1)` can collect it, and std's own `waitpid` on a child whose `exec`
//! failed never races with the reaper.

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use proto::agent::ExitStatus;
use tokio::sync::watch;

/// Receives a child's exit status once it has been reaped.
pub type ExitReceiver = watch::Receiver<Option<ExitStatus>>;

#[derive(Default)]
pub struct Reaper {
    children: Mutex<HashMap<i32, watch::Sender<Option<ExitStatus>>>>,
}

impl Reaper {
    fn lock(&self) -> MutexGuard<'_, HashMap<i32, watch::Sender<Option<ExitStatus>>>> {
        self.children
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Spawns `cmd` and registers the child before anything can reap it.
    pub fn spawn(&self, cmd: &mut Command) -> std::io::Result<(Child, ExitReceiver)> {
        let mut children = self.lock();
        let child = cmd.spawn()?;
        let (tx, rx) = watch::channel(None);
        // Pids fit in i32 (pid_max <= 2^22).
        children.insert(child.id() as i32, tx);
        Ok((child, rx))
    }

    /// Collects every child that has exited; call on SIGCHLD.
    pub fn reap(&self) {
        let mut children = self.lock();
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    deliver(&mut children, pid, ExitStatus::Code(code));
                }
                Ok(WaitStatus::Signaled(pid, sig, core_dumped)) => {
                    let status = ExitStatus::Signal {
                        signal: sig as i32,
                        core_dumped,
                    };
                    deliver(&mut children, pid, status);
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!("waitpid failed: {e}");
                    return;
                }
            }
        }
    }

    /// Pids of the registered children still running.
    pub fn live_pids(&self) -> Vec<i32> {
        self.lock().keys().copied().collect()
    }
}

fn deliver(
    children: &mut HashMap<i32, watch::Sender<Option<ExitStatus>>>,
    pid: Pid,
    status: ExitStatus,
) {
    if let Some(tx) = children.remove(&pid.as_raw()) {
        tx.send_replace(Some(status));
    }
}
