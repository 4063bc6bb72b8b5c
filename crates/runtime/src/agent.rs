//! Reaching the agent inside a sandbox.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::layout::SandboxPaths;

/// Waits until the agent accepts connections on its socket.
pub fn wait_ready(paths: &SandboxPaths, timeout: Duration) -> Result<()> {
    let socket = paths.run().join("agent.sock");
    let deadline = Instant::now() + timeout;
    loop {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Agent(format!("no answer within {timeout:?}")));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
