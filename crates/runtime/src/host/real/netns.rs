//! Network namespaces made in-process, the way `ip netns add` makes them (a bind mount of
//! the namespace on a file), without spawning a process per sandbox — but pinned in
//! sandfork's own [`crate::net::NETNS_DIR`], not /run/netns.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use crate::error::{Error, IoContext, Result};

use crate::net::NETNS_DIR;

/// Where sandfork versions before 0.2 pinned namespaces; still removed from there.
const LEGACY_DIR: &str = "/run/netns";

pub fn path(name: &str) -> PathBuf {
    crate::net::netns_path(name)
}

fn sys(what: &str) -> impl FnOnce(nix::Error) -> Error + '_ {
    move |e| Error::Command {
        command: what.into(),
        detail: e.to_string(),
    }
}

/// Creates namespace `name` with loopback up. Fails if it exists.
pub fn add(name: &str) -> Result<()> {
    std::fs::create_dir_all(NETNS_DIR).at(NETNS_DIR)?;
    let target = path(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&target)
        .at(&target)?;
    // A thread of its own enters the new namespace and ends with it pinned by the mount.
    let t = target.clone();
    let made = std::thread::spawn(move || enter_new_and_pin(&t))
        .join()
        .unwrap_or_else(|_| {
            Err(Error::Command {
                command: "netns".into(),
                detail: "panicked".into(),
            })
        });
    if made.is_err() {
        let _ = umount2(&target, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&target);
    }
    made
}

fn enter_new_and_pin(target: &Path) -> Result<()> {
    unshare(CloneFlags::CLONE_NEWNET).map_err(sys("unshare(CLONE_NEWNET)"))?;
    let own = "/proc/thread-self/ns/net";
    mount(
        Some(own),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(sys("bind netns"))?;
    loopback_up()
}

/// Sets IFF_UP on `lo` of the calling thread's network namespace.
fn loopback_up() -> Result<()> {
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(sys("socket"))?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `sock` is an open socket and `req` a valid ifreq naming "lo"; the kernel
    // writes only within it.
    let got = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    if got < 0 {
        return Err(sys("SIOCGIFFLAGS")(nix::Error::last()));
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; the kernel reads the name and flags.
    let set = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    if set < 0 {
        return Err(sys("SIOCSIFFLAGS")(nix::Error::last()));
    }
    Ok(())
}

/// Removes namespace `name` (from the legacy directory too); succeeds if it does not
/// exist.
pub fn delete(name: &str) -> Result<()> {
    delete_at(&Path::new(LEGACY_DIR).join(name))?;
    delete_at(&path(name))
}

fn delete_at(target: &Path) -> Result<()> {
    if !target.exists() {
        return Ok(());
    }
    match umount2(target, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => {}
        Err(e) => return Err(sys("umount netns")(e)),
    }
    match std::fs::remove_file(target) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(target, e)),
        _ => Ok(()),
    }
}
