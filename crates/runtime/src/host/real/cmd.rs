//! Running host commands and turning their failures into errors.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn check(cmd: &Command, out: std::io::Result<Output>) -> Result<String> {
    let out = out.map_err(|e| Error::Command {
        command: describe(cmd),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let detail = format!("{}: {}", out.status, stderr.trim());
    Err(Error::Command {
        command: describe(cmd),
        detail,
    })
}

/// Runs a command to completion; its stdout on success.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output();
    check(cmd, out)
}

/// Runs a command with `input` on stdin.
pub fn run_stdin(cmd: &mut Command, input: &str) -> Result<()> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = cmd.spawn().and_then(|mut child| {
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.as_bytes())?;
        }
        child.wait_with_output()
    });
    check(cmd, out).map(drop)
}

/// Runs a command; a failure whose message contains one of `gone` counts as success.
pub fn run_tolerant(cmd: &mut Command, gone: &[&str]) -> Result<()> {
    match run(cmd) {
        Err(Error::Command { detail, .. }) if gone.iter().any(|g| detail.contains(g)) => Ok(()),
        r => r.map(drop),
    }
}

/// Most of the sandbox init's output kept in its log file; the rest is dropped.
const INIT_LOG_MAX: u64 = 1 << 20;

/// Runs a command whose children outlive it holding its stdio (`runc run --detach`).
/// Their stdio are pipes, never host files (a memory checkpoint cannot restore a host
/// file it cannot see): stdin at end of file, stdout and stderr drained by a thread into
/// `init_log` (at most 1 MiB) until the last writer is gone. On failure the end of
/// `log` (runc's own log) is the detail.
pub fn run_detached(cmd: Command, log: &Path, init_log: &Path) -> Result<()> {
    run_detached_watched(cmd, log, init_log).map(drop)
}

/// [`run_detached`], returning a flag that turns true once the output ends, i.e. once the
/// init has exited.
pub fn run_detached_watched(
    mut cmd: Command,
    log: &Path,
    init_log: &Path,
) -> Result<Arc<AtomicBool>> {
    let command = describe(&cmd);
    let fail = |e: std::io::Error| Error::Command {
        command: command.clone(),
        detail: e.to_string(),
    };
    let (stdin_r, stdin_w) = pipe().map_err(|e| fail(e.into()))?;
    drop(stdin_w);
    let (out_r, out_w) = pipe().map_err(|e| fail(e.into()))?;
    let err_w = out_w.try_clone().map_err(fail)?;
    cmd.stdin(Stdio::from(stdin_r))
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w));
    let status = cmd.status().map_err(fail)?;
    // Our copies of the write ends go with the command, so the drain ends with the init.
    drop(cmd);
    let file = std::fs::File::create(init_log).map_err(|e| Error::io(init_log, e))?;
    let gone = Arc::new(AtomicBool::new(false));
    let flag = gone.clone();
    std::thread::spawn(move || {
        drain(std::fs::File::from(out_r), file);
        flag.store(true, Ordering::Release);
    });
    if status.success() {
        return Ok(gone);
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    let detail = format!(
        "{status}: {}",
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    );
    Err(Error::Command { command, detail })
}

fn pipe() -> nix::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
}

fn drain(from: std::fs::File, to: std::fs::File) {
    let mut limited = std::io::Read::take(&from, INIT_LOG_MAX);
    let mut to = to;
    let _ = std::io::copy(&mut limited, &mut to);
    // Past the cap, keep reading so the writer never blocks, and drop the bytes.
    let _ = std::io::copy(&mut &from, &mut std::io::sink());
}
