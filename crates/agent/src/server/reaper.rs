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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn children_that_exit_at_once_are_never_lost() {
        let reaper = Reaper::default();
        let done = std::sync::atomic::AtomicBool::new(false);
        let mut exits: Vec<ExitReceiver> = std::thread::scope(|s| {
            // Reap continuously while spawning, as SIGCHLD would.
            s.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    reaper.reap();
                }
            });
            let exits = (0..40)
                .map(|i| {
                    let mut cmd = Command::new("/bin/sh");
                    cmd.args(["-c", &format!("exit {}", i % 3)]);
                    let exit = reaper.spawn(&mut cmd).unwrap().1;
                    // An exec failure makes std wait for that child itself: it must not
                    // race the reaper.
                    assert!(reaper.spawn(&mut Command::new("/nonexistent/x")).is_err());
                    exit
                })
                .collect();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            exits
        });
        for _ in 0..500 {
            reaper.reap();
            if exits.iter().all(|e| e.borrow().is_some()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        for (i, e) in exits.iter_mut().enumerate() {
            assert_eq!(*e.borrow(), Some(ExitStatus::Code(i as i32 % 3)));
        }
        assert!(reaper.live_pids().is_empty());
    }
}
