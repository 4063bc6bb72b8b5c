//! Connecting to the agent socket without trusting the socket directory's contents.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};
use proto::agent::SOCKET_NAME;
use tokio::net::UnixStream;

use crate::{ClientError, Result};

/// Opens `dir/agent.sock` as an `O_PATH` handle without following symlinks and checks it
/// is a socket.
fn open_socket(dir: &Path) -> Result<OwnedFd> {
    let path = dir.join(SOCKET_NAME);
    let fail = |e: nix::Error| ClientError::Connect {
        path: path.clone(),
        source: e.into(),
    };
    let dirfd = open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail)?;
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(&dirfd, SOCKET_NAME, flags, Mode::empty()).map_err(fail)?;
    let st = fstat(&fd).map_err(fail)?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
        return Err(ClientError::NotASocket(path));
    }
    Ok(fd)
}

/// Connects to exactly the socket inode that was checked, through its `/proc/self/fd`
/// link (a path lookup of `agent.sock` could be raced by a swap).
pub async fn connect(dir: &Path) -> Result<UnixStream> {
    let fd = open_socket(dir)?;
    let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let stream = UnixStream::connect(&via).await;
    drop(fd);
    stream.map_err(|source| ClientError::Connect {
        path: dir.join(SOCKET_NAME),
        source,
    })
}
