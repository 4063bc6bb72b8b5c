//! Running host commands and turning their failures into errors.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

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

/// Runs a command whose children outlive it holding its stdio (runc run --detach): stdio
/// is /dev/null, and on failure the end of `log` is the detail.
pub fn run_detached(cmd: &mut Command, log: &Path) -> Result<()> {
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| Error::Command {
            command: describe(cmd),
            detail: e.to_string(),
        })?;
    if status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    let detail = format!(
        "{status}: {}",
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    );
    Err(Error::Command {
        command: describe(cmd),
        detail,
    })
}
