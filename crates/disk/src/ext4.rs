//! ext4 on a block device: build an image from a directory, mount, unmount, freeze,
//! thaw, grow online, check.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::{Error, Result};

nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);

/// Writes an ext4 image of `size` bytes holding the tree at `rootfs_dir`, without
/// mounting anything (`mkfs.ext4 -d`).
pub fn build_ext4_image(rootfs_dir: &Path, image: &Path, size: u64) -> Result<()> {
    let f = File::create(image).map_err(Error::io(format!("create {}", image.display())))?;
    f.set_len(size)
        .map_err(Error::io(format!("size {}", image.display())))?;
    drop(f);
    run(Command::new("mkfs.ext4")
        .args([
            "-F",
            "-q",
            "-b",
            "4096",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            "-d",
        ])
        .arg(rootfs_dir)
        .arg(image))
}

/// ext4 options for a disk whose flushes are durable: the kernel's defaults.
pub const DURABLE_OPTIONS: &str = "errors=remount-ro";

/// ext4 options for a disk whose flushes are acknowledged without a host sync
/// ([`crate::fuse::FlushMode::Writeback`]). Such a disk keeps nothing across a host or
/// disk-server crash, and a seal follows a freeze, which writes and commits everything
/// first; so ordering data before metadata (`data=ordered`), waiting for journal blocks
/// before the commit block, and flush requests would only add round trips through the
/// disk server to every fsync inside (about 8% of an fsync-heavy SQLite workload).
pub const WRITEBACK_OPTIONS: &str =
    "errors=remount-ro,data=writeback,journal_async_commit,nobarrier";

/// Mounts the ext4 filesystem on `device` at `mountpoint` with `options`, `nosuid` and
/// `nodev`: a sandbox's root can plant setuid binaries and device nodes on its disk, and
/// the host must never honour them (inside, no_new_privs ignores setuid bits anyway, and
/// `/dev` is a mount of its own).
pub fn mount_ext4(device: &Path, mountpoint: &Path, options: &str) -> Result<()> {
    mount(
        Some(device),
        mountpoint,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options),
    )
    .map_err(Error::sys(format!(
        "mount {} at {}",
        device.display(),
        mountpoint.display()
    )))
}

/// Unmounts `mountpoint`, detaching lazily when it stays busy. Not mounted is fine.
pub fn unmount(mountpoint: &Path) -> Result<()> {
    for _ in 0..10 {
        match umount2(mountpoint, MntFlags::empty()) {
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => return Ok(()),
            Err(Errno::EBUSY) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(Error::sys(format!("unmount {}", mountpoint.display()))(e)),
        }
    }
    umount2(mountpoint, MntFlags::MNT_DETACH)
        .map_err(Error::sys(format!("detach {}", mountpoint.display())))
}

/// Freezes the filesystem mounted at `mountpoint`: writes block, dirty data is written.
pub fn freeze(mountpoint: &Path) -> Result<()> {
    let dir = open_dir(mountpoint)?;
    let mut arg = 0;
    // SAFETY: FIFREEZE ignores its argument pointer beyond it being valid; `dir` is an
    // open directory on the filesystem.
    unsafe { fifreeze(dir.as_raw_fd(), &mut arg) }
        .map_err(Error::sys(format!("freeze {}", mountpoint.display())))?;
    Ok(())
}

/// Thaws a frozen filesystem. Thawing one that is not frozen is fine.
pub fn thaw(mountpoint: &Path) -> Result<()> {
    let dir = open_dir(mountpoint)?;
    let mut arg = 0;
    // SAFETY: as for FIFREEZE.
    match unsafe { fithaw(dir.as_raw_fd(), &mut arg) } {
        Ok(_) | Err(Errno::EINVAL) => Ok(()),
        Err(e) => Err(Error::sys(format!("thaw {}", mountpoint.display()))(e)),
    }
}

/// Grows the (mounted) filesystem on `device` to fill the device.
pub fn resize(device: &Path) -> Result<()> {
    match run(Command::new("resize2fs").arg(device)) {
        Err(Error::Tool { output, .. }) if output.contains("Permission denied") => {
            Err(Error::ResizeRefused)
        }
        r => r,
    }
}

/// Grows the unmounted filesystem in `image` (a file or device) when it is smaller
/// than `image` itself. Returns whether it grew.
pub fn grow_offline(image: &Path) -> Result<bool> {
    let (fs_bytes, dev_bytes) = (fs_size(image)?, file_size(image)?);
    if fs_bytes >= dev_bytes {
        return Ok(false);
    }
    run(Command::new("resize2fs").arg("-f").arg(image))?;
    Ok(true)
}

fn file_size(path: &Path) -> Result<u64> {
    let f = File::open(path).map_err(Error::io(format!("open {}", path.display())))?;
    let end = std::io::Seek::seek(&mut &f, std::io::SeekFrom::End(0))
        .map_err(Error::io(format!("size {}", path.display())))?;
    Ok(end)
}

/// The size of the ext4 filesystem in `image`, from its superblock.
pub fn fs_size(image: &Path) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let f = File::open(image).map_err(Error::io(format!("open {}", image.display())))?;
    let mut sb = [0u8; 1024];
    f.read_exact_at(&mut sb, 1024)
        .map_err(Error::io("read the ext4 superblock"))?;
    let u32_at = |o: usize| u32::from_le_bytes([sb[o], sb[o + 1], sb[o + 2], sb[o + 3]]);
    if u16::from_le_bytes([sb[0x38], sb[0x39]]) != 0xEF53 {
        return Err(Error::Invalid(format!(
            "{} holds no ext4 filesystem",
            image.display()
        )));
    }
    let wide = u32_at(0x60) & 0x80 != 0; // INCOMPAT_64BIT
    let blocks = u64::from(u32_at(0x04))
        | if wide {
            u64::from(u32_at(0x150)) << 32
        } else {
            0
        };
    Ok(blocks << (10 + u32_at(0x18).min(6)))
}

/// Checks the (unmounted) filesystem on `device` without changing it.
pub fn fsck(device: &Path) -> Result<()> {
    run(Command::new("e2fsck").args(["-fn"]).arg(device))
}

fn open_dir(path: &Path) -> Result<File> {
    File::open(path).map_err(Error::io(format!("open {}", path.display())))
}

fn run(cmd: &mut Command) -> Result<()> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(Error::io(format!("run {tool}")))?;
    if out.status.success() {
        return Ok(());
    }
    let mut output = String::from_utf8_lossy(&out.stderr).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stdout));
    Err(Error::Tool {
        tool,
        output: format!("{} ({})", output.trim(), out.status),
    })
}
