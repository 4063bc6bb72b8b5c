//! Supervised background processes: named, restarted by their policy with exponential
//! backoff, health-checked. The supervisor lives in the agent, so supervision goes on
//! without a host connected, across daemon restarts, and in every fork of a memory
//! checkpoint (the supervisor's task is part of the agent's restored state).
//!
//! Each run is an ordinary background process (its own id, pid and output buffer); the
//! supervisor, shared by all runs, holds what outlives a run: the restart count, the
//! last exit, the health status.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use proto::agent::{
    AgentError, ErrorKind, ExitInfo, ExitStatus, HealthCheck, HealthProbe, HealthStatus,
    ManagedStatus, RestartPolicy, SpawnRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::clock::unix_ms;
use super::errors::invalid;
use super::procs::Proc;
use super::supervisor::Supervisor;
use super::Agent;

/// How long a stopped run gets after SIGTERM before SIGKILL, on restart.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Checks what the agent cannot take from a spawn request.
pub fn validate(req: &SpawnRequest) -> Result<(), AgentError> {
    if let Some(name) = &req.name {
        proto::agent::check_process_name(name).map_err(invalid)?;
    }
    if let Some(p) = &req.restart {
        check_restart(p)?;
    }
    if let Some(h) = &req.health {
        check_health(h)?;
    }
    Ok(())
}

fn check_restart(p: &RestartPolicy) -> Result<(), AgentError> {
    if p.initial_backoff_ms == 0 || p.max_backoff_ms < p.initial_backoff_ms {
        return Err(invalid(
            "restart backoff must be at least 1 ms and max_backoff_ms at least initial_backoff_ms",
        ));
    }
    Ok(())
}

fn check_health(h: &HealthCheck) -> Result<(), AgentError> {
    if h.port == 0 || h.interval_ms == 0 || h.timeout_ms == 0 || h.failure_threshold == 0 {
        return Err(invalid(
            "health check needs a port, and interval_ms, timeout_ms and failure_threshold above 0",
        ));
    }
    if let HealthProbe::Http { path } = &h.probe {
        if !path.starts_with('/') || path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(invalid(format!("invalid health check path {path:?}")));
        }
    }
    Ok(())
}

/// Starts a background process: a plain one, or a supervised one with its supervisor.
pub fn spawn(agent: &Arc<Agent>, req: SpawnRequest) -> Result<Arc<Proc>, AgentError> {
    validate(&req)?;
    if !req.is_managed() {
        return agent.procs.start(&agent.reaper, req, &agent.base(), None);
    }
    if let Some(name) = req.name.as_deref().filter(|n| agent.procs.name_in_use(n)) {
        return Err(AgentError::new(
            ErrorKind::AlreadyExists,
            format!("a supervised process named {name} is running; stop it first"),
        ));
    }
    let supervisor = Arc::new(Supervisor::new(&req));
    let run = agent.procs.start(
        &agent.reaper,
        req.clone(),
        &agent.base(),
        Some(supervisor.clone()),
    )?;
    supervisor.state().status = ManagedStatus::Running;
    tokio::spawn(supervise(agent.clone(), supervisor.clone(), run.clone()));
    if let Some(check) = req.health {
        tokio::spawn(check_health_loop(
            agent.clone(),
            supervisor,
            run.id(),
            check,
        ));
    }
    Ok(run)
}

/// Restarts a supervised process by its policy until it stays down or is stopped.
async fn supervise(agent: Arc<Agent>, sup: Arc<Supervisor>, mut run: Arc<Proc>) {
    loop {
        let exit = run.finished().await;
        {
            let mut s = sup.state();
            s.last_exit = Some((exit, unix_ms()));
            s.consecutive_health_failures = 0;
        }
        let Some(mut delay) = (!sup.is_stopped()).then(|| sup.backoff(&exit)).flatten() else {
            break;
        };
        loop {
            {
                let mut s = sup.state();
                s.status = ManagedStatus::BackingOff;
                s.next_restart_unix_ms = Some(unix_ms() + delay.as_millis() as u64);
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = sup.wake.notified() => {}
            }
            if sup.is_stopped() {
                sup.state().status = ManagedStatus::Stopped;
                return;
            }
            let req = run.request().clone();
            let started = agent
                .procs
                .start(&agent.reaper, req, &agent.base(), Some(sup.clone()));
            let mut s = sup.state();
            s.restart_count += 1;
            s.next_restart_unix_ms = None;
            match started {
                Ok(next) => {
                    run = next;
                    s.status = ManagedStatus::Running;
                    if s.health.is_some() {
                        s.health_status = HealthStatus::Starting;
                    }
                    break;
                }
                Err(e) => {
                    s.last_error = Some(format!("restart failed: {}", e.message));
                    let failed = ExitInfo {
                        status: ExitStatus::Code(-1),
                        timed_out: false,
                    };
                    drop(s);
                    match sup.backoff(&failed) {
                        Some(d) => delay = d,
                        None => {
                            sup.state().status = ManagedStatus::Stopped;
                            return;
                        }
                    }
                }
            }
        }
    }
    sup.state().status = ManagedStatus::Stopped;
}

/// Probes a supervised process's port; after `failure_threshold` failures in a row the
/// current run is killed, and the restart policy takes over.
async fn check_health_loop(
    agent: Arc<Agent>,
    sup: Arc<Supervisor>,
    first: u64,
    check: HealthCheck,
) {
    let mut current = first;
    tokio::time::sleep(Duration::from_millis(check.initial_delay_ms)).await;
    while !sup.is_stopped() && sup.info().status != ManagedStatus::Stopped {
        if let Some(run) = agent.procs.latest_run_of(&sup) {
            if run.id() != current {
                // A new run gets its initial delay too.
                current = run.id();
                tokio::time::sleep(Duration::from_millis(check.initial_delay_ms)).await;
                continue;
            }
            let healthy = probe(&check).await;
            record_probe(&sup, &run, healthy, check.failure_threshold);
        }
        tokio::time::sleep(Duration::from_millis(check.interval_ms)).await;
    }
}

fn record_probe(sup: &Supervisor, run: &Proc, healthy: bool, threshold: u32) {
    let mut s = sup.state();
    if s.status != ManagedStatus::Running {
        return;
    }
    if healthy {
        s.health_status = HealthStatus::Healthy;
        s.consecutive_health_failures = 0;
        return;
    }
    s.consecutive_health_failures += 1;
    if s.consecutive_health_failures >= threshold {
        s.health_status = HealthStatus::Unhealthy;
        s.last_error = Some(format!(
            "health check failed {} times in a row; killed",
            s.consecutive_health_failures
        ));
        drop(s);
        run.group().kill();
    }
}

/// One probe, bounded by the check's timeout.
async fn probe(check: &HealthCheck) -> bool {
    let attempt = async {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", check.port)).await?;
        let HealthProbe::Http { path } = &check.probe else {
            return Ok::<bool, std::io::Error>(true);
        };
        let request =
            format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await?;
        let mut head = [0u8; 64];
        let n = conn.read(&mut head).await?;
        Ok(http_status(&head[..n]).is_some_and(|code| code < 400))
    };
    tokio::time::timeout(Duration::from_millis(check.timeout_ms), attempt)
        .await
        .is_ok_and(|r| r.unwrap_or(false))
}

/// The status code of an HTTP response's first line.
fn http_status(head: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(head).ok()?.lines().next()?;
    let mut words = line.split_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/"))?;
    words.next()?.parse().ok()
}

/// Stops a background process: no more restarts for a supervised one, and its group gets
/// SIGTERM, then SIGKILL after a grace period.
pub async fn stop(proc: &Proc) {
    if let Some(sup) = proc.supervisor() {
        sup.stop();
    }
    proc.group().signal(Signal::SIGTERM);
    if tokio::time::timeout(STOP_GRACE, proc.finished())
        .await
        .is_err()
    {
        proc.group().kill();
        proc.finished().await;
    }
}

/// Stops a background process and starts its request again; returns the new run.
pub async fn restart(agent: &Arc<Agent>, proc: &Proc) -> Result<Arc<Proc>, AgentError> {
    stop(proc).await;
    spawn(agent, proc.request().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_checks_are_validated() {
        let named = |n: &str| SpawnRequest {
            name: Some(n.into()),
            ..SpawnRequest::default()
        };
        assert!(validate(&named("web-1")).is_ok());
        for bad in ["", "123", "a/b", "a b", &"x".repeat(65)] {
            assert!(validate(&named(bad)).is_err(), "{bad:?}");
        }
        let mut bad_health = named("web");
        bad_health.health = Some(HealthCheck {
            probe: HealthProbe::Http {
                path: "no-slash".into(),
            },
            port: 80,
            initial_delay_ms: 0,
            interval_ms: 10,
            timeout_ms: 10,
            failure_threshold: 1,
        });
        assert!(validate(&bad_health).is_err());
    }

    #[test]
    fn http_status_lines_parse() {
        assert_eq!(http_status(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(http_status(b"HTTP/1.0 500 x"), Some(500));
        assert_eq!(http_status(b"SSH-2.0"), None);
        assert_eq!(http_status(b""), None);
    }
}
