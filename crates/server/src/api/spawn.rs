//! Background processes between the API's shapes and the agent's: spawn requests in,
//! process views (supervision included) out.

use proto::agent as wire;
use proto::agent::{ProcessInfo, ProcessState};

use super::exec::to_agent;
use super::ndjson::exit_parts;
use crate::error::Error;
use api_types::{
    ExecRequest, HealthCheckConfig, HealthCheckKind, ManagedProcess, OutputModeName, Process,
    ProcessExit, RestartConfig, RestartPolicyName, SpawnProcess, StdinModeName,
};

/// The agent's spawn request for an API one.
pub fn to_spawn(req: SpawnProcess) -> Result<wire::SpawnRequest, Error> {
    if let Some(name) = &req.name {
        wire::check_process_name(name).map_err(Error::InvalidArgument)?;
    }
    let fixed_stdin = req.stdin.is_some() || req.stdin_b64.is_some();
    if fixed_stdin && req.stdin_mode == Some(StdinModeName::Pipe) {
        return Err(Error::InvalidArgument(
            "stdin_mode pipe and a fixed stdin exclude each other".into(),
        ));
    }
    let mut exec = to_agent(ExecRequest {
        command: req.command,
        args: req.args,
        env: req.env,
        working_dir: req.working_dir,
        user: req.user,
        stdin: req.stdin,
        stdin_b64: req.stdin_b64,
        timeout_secs: req.timeout_secs,
        stream: false,
    })?;
    if !fixed_stdin && req.stdin_mode != Some(StdinModeName::Closed) {
        exec.stdin = wire::StdinMode::Stream;
    }
    Ok(wire::SpawnRequest {
        exec,
        name: req.name,
        stdout: output_mode(req.stdout_mode),
        stderr: output_mode(req.stderr_mode),
        restart: req.restart.map(restart_policy),
        health: req.health_check.map(health_check),
    })
}

fn output_mode(m: Option<OutputModeName>) -> wire::OutputMode {
    match m {
        Some(OutputModeName::Discard) => wire::OutputMode::Discard,
        _ => wire::OutputMode::Capture,
    }
}

fn restart_policy(r: RestartConfig) -> wire::RestartPolicy {
    wire::RestartPolicy {
        when: match r.policy {
            RestartPolicyName::Never => wire::RestartWhen::Never,
            RestartPolicyName::OnFailure => wire::RestartWhen::OnFailure,
            RestartPolicyName::Always => wire::RestartWhen::Always,
        },
        max_restarts: r.max_restarts,
        initial_backoff_ms: r.initial_backoff_ms,
        max_backoff_ms: r.max_backoff_ms,
    }
}

fn health_check(h: HealthCheckConfig) -> wire::HealthCheck {
    wire::HealthCheck {
        probe: match h.kind {
            HealthCheckKind::Tcp => wire::HealthProbe::Tcp,
            HealthCheckKind::Http => wire::HealthProbe::Http {
                path: h.path.unwrap_or_else(|| "/".into()),
            },
        },
        port: h.port,
        initial_delay_ms: h.initial_delay_ms,
        interval_ms: h.interval_ms,
        timeout_ms: h.timeout_ms,
        failure_threshold: h.failure_threshold,
    }
}

fn restart_config(r: Option<wire::RestartPolicy>) -> RestartConfig {
    let Some(r) = r else {
        return RestartConfig {
            policy: RestartPolicyName::Never,
            max_restarts: None,
            initial_backoff_ms: 500,
            max_backoff_ms: 30_000,
        };
    };
    RestartConfig {
        policy: match r.when {
            wire::RestartWhen::Never => RestartPolicyName::Never,
            wire::RestartWhen::OnFailure => RestartPolicyName::OnFailure,
            wire::RestartWhen::Always => RestartPolicyName::Always,
        },
        max_restarts: r.max_restarts,
        initial_backoff_ms: r.initial_backoff_ms,
        max_backoff_ms: r.max_backoff_ms,
    }
}

fn health_config(h: wire::HealthCheck) -> HealthCheckConfig {
    let (kind, path) = match h.probe {
        wire::HealthProbe::Tcp => (HealthCheckKind::Tcp, None),
        wire::HealthProbe::Http { path } => (HealthCheckKind::Http, Some(path)),
    };
    HealthCheckConfig {
        kind,
        port: h.port,
        path,
        initial_delay_ms: h.initial_delay_ms,
        interval_ms: h.interval_ms,
        timeout_ms: h.timeout_ms,
        failure_threshold: h.failure_threshold,
    }
}

fn rfc3339_ms(ms: u64) -> String {
    model::timestamp::from_unix_millis(ms as i64)
}

fn managed_view(first_pid: u64, name: Option<String>, m: wire::ManagedInfo) -> ManagedProcess {
    let status = match m.status {
        wire::ManagedStatus::Starting => "starting",
        wire::ManagedStatus::Running => "running",
        wire::ManagedStatus::BackingOff => "backing_off",
        wire::ManagedStatus::Stopped => "stopped",
    };
    let health_status = match m.health_status {
        wire::HealthStatus::Disabled => "disabled",
        wire::HealthStatus::Starting => "starting",
        wire::HealthStatus::Healthy => "healthy",
        wire::HealthStatus::Unhealthy => "unhealthy",
    };
    let last_exit = m.last_exit.map(|(e, at)| {
        let (exit_code, signal) = exit_parts(&e);
        ProcessExit {
            exit_code,
            signal,
            oom_killed: false,
            ended_at: rfc3339_ms(at),
        }
    });
    ManagedProcess {
        id: name.clone().unwrap_or_else(|| first_pid.to_string()),
        name,
        status: status.into(),
        restart_count: m.restart_count,
        restart: restart_config(m.restart),
        health_check: m.health.map(health_config),
        health_status: health_status.into(),
        consecutive_health_failures: m.consecutive_health_failures,
        last_exit,
        last_error: m.last_error,
        next_restart_at: m.next_restart_unix_ms.map(rfc3339_ms),
    }
}

/// The API view of a process.
pub fn view(p: ProcessInfo) -> Process {
    let mut argv = p.command.into_iter();
    let command = argv.next().unwrap_or_default();
    let (state, status, exit_code, signal) = match p.state {
        ProcessState::Running => ("running", "running", None, None),
        ProcessState::Exited(e) => {
            let (c, s) = exit_parts(&e);
            let status = if s.is_some() { "signaled" } else { "exited" };
            ("exited", status, c, s)
        }
    };
    let managed = p.managed.map(|m| managed_view(p.id, p.name.clone(), m));
    Process {
        pid: p.id,
        os_pid: p.pid,
        command,
        args: argv.collect(),
        state: state.into(),
        status: status.into(),
        exit_code,
        signal,
        started_at: rfc3339_ms(p.started_unix_ms),
        ended_at: p.ended_unix_ms.map(rfc3339_ms),
        stdout_len: p.stdout_len,
        stderr_len: p.stderr_len,
        stdin_writable: p.stdin_open,
        name: p.name,
        managed,
    }
}
