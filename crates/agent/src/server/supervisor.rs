//! What outlives one run of a supervised process: its restart count, last exit and
//! health, and whether it may run again. The runs themselves are ordinary processes
//! (`procs`); `supervise` starts, restarts and health-checks them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use proto::agent::{
    ExitInfo, ExitStatus, HealthStatus, ManagedInfo, ManagedStatus, RestartWhen, SpawnRequest,
};
use tokio::sync::Notify;

/// What outlives one run of a supervised process.
pub struct Supervisor {
    state: Mutex<ManagedInfo>,
    stopped: AtomicBool,
    pub(super) wake: Notify,
}

impl Supervisor {
    pub(super) fn new(req: &SpawnRequest) -> Self {
        let health_status = match req.health {
            Some(_) => HealthStatus::Starting,
            None => HealthStatus::Disabled,
        };
        Supervisor {
            state: Mutex::new(ManagedInfo {
                status: ManagedStatus::Starting,
                restart_count: 0,
                restart: req.restart,
                health: req.health.clone(),
                health_status,
                consecutive_health_failures: 0,
                last_exit: None,
                last_error: None,
                next_restart_unix_ms: None,
            }),
            stopped: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, ManagedInfo> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn info(&self) -> ManagedInfo {
        self.state().clone()
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// No more restarts; the supervisor's task ends once the current run has.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    /// The wait before restart number `n + 1` after `exit`, or `None` when the policy
    /// (or its limit) says the process stays down.
    pub(super) fn backoff(&self, exit: &ExitInfo) -> Option<Duration> {
        let s = self.state();
        let p = s.restart?;
        let failed = !matches!(exit.status, ExitStatus::Code(0));
        let again = match p.when {
            RestartWhen::Never => false,
            RestartWhen::OnFailure => failed,
            RestartWhen::Always => true,
        };
        if !again || p.max_restarts.is_some_and(|max| s.restart_count >= max) {
            return None;
        }
        let factor = 1u64 << s.restart_count.min(20);
        Some(Duration::from_millis(
            p.initial_backoff_ms
                .saturating_mul(factor)
                .min(p.max_backoff_ms.max(p.initial_backoff_ms)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use proto::agent::RestartPolicy;

    use super::*;

    fn policy(when: RestartWhen, max: Option<u32>) -> SpawnRequest {
        SpawnRequest {
            restart: Some(RestartPolicy {
                when,
                max_restarts: max,
                initial_backoff_ms: 100,
                max_backoff_ms: 1000,
            }),
            ..SpawnRequest::default()
        }
    }

    fn exit(code: i32) -> ExitInfo {
        ExitInfo {
            status: ExitStatus::Code(code),
            timed_out: false,
        }
    }

    #[test]
    fn backoff_follows_the_policy_and_doubles_up_to_its_cap() {
        let s = Supervisor::new(&policy(RestartWhen::OnFailure, Some(5)));
        assert_eq!(s.backoff(&exit(0)), None, "a clean exit stays down");
        assert_eq!(s.backoff(&exit(1)), Some(Duration::from_millis(100)));
        s.state().restart_count = 3;
        assert_eq!(s.backoff(&exit(1)), Some(Duration::from_millis(800)));
        s.state().restart_count = 4;
        assert_eq!(s.backoff(&exit(1)), Some(Duration::from_millis(1000)));
        s.state().restart_count = 5;
        assert_eq!(s.backoff(&exit(1)), None, "limit reached");
        let always = Supervisor::new(&policy(RestartWhen::Always, None));
        assert!(always.backoff(&exit(0)).is_some());
        let never = Supervisor::new(&policy(RestartWhen::Never, None));
        assert_eq!(never.backoff(&exit(1)), None);
    }
}
