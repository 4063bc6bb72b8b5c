//! Kills a child's process group, unless the child has already been reaped (its pid, and
//! so its group id, may then belong to someone else).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::reaper::ExitReceiver;

#[derive(Clone)]
pub struct Group {
    pgid: i32,
    exit: ExitReceiver,
    timed_out: Arc<AtomicBool>,
}

impl Group {
    pub fn new(pgid: i32, exit: ExitReceiver) -> Self {
        Self {
            pgid,
            exit,
            timed_out: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn signal(&self, sig: Signal) {
        if self.exit.borrow().is_none() {
            let _ = killpg(Pid::from_raw(self.pgid), sig);
        }
    }

    pub fn exit(&self) -> ExitReceiver {
        self.exit.clone()
    }

    pub fn kill(&self) {
        self.signal(Signal::SIGKILL);
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Relaxed)
    }

    /// Kills the group after `after` (if given); abort the returned task to cancel.
    pub fn arm_timeout(&self, after: Option<u64>) -> Option<tokio::task::JoinHandle<()>> {
        let group = self.clone();
        after.map(|ms| {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                group.timed_out.store(true, Ordering::Relaxed);
                group.kill();
            })
        })
    }
}
