//! Running the host's build commands (debootstrap, tar, mkfs): their output becomes the
//! error when they fail.

use std::process::Command;

use crate::error::{Error, Result};

/// Runs a build command; on failure the end of its output is the error.
pub fn run_logged(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .output()
        .map_err(|e| Error::Image(format!("{:?}: {e}", cmd.get_program())))?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text += &String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = text.lines().rev().take(8).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(Error::Image(format!(
        "{:?} failed ({}): {}",
        cmd.get_program(),
        out.status,
        tail.join("\n")
    )))
}
