//! Loop devices through their ioctls: attach a file with direct I/O and 4 KiB logical
//! blocks, refresh the capacity after a grow, detach.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use crate::{Error, Result};

const LOOP_MAJOR: u64 = 7;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const ATTACH_TRIES: usize = 50;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

nix::ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);
nix::ioctl_none_bad!(loop_clr_fd, 0x4C01);
nix::ioctl_none_bad!(loop_set_capacity, 0x4C07);
nix::ioctl_none_bad!(loop_ctl_get_free, 0x4C82);

/// An attached loop device. Attached with autoclear: it detaches by itself once the
/// last user lets go, and [`LoopDevice::detach`] makes sure of it. The handle from
/// [`LoopDevice::attach`] holds the device open (else autoclear would detach it at
/// once) until [`LoopDevice::release`] — call that once a filesystem is mounted on it.
#[derive(Debug)]
pub struct LoopDevice {
    path: PathBuf,
    hold: Option<File>,
}

impl LoopDevice {
    /// Attaches `backing` (opened read-write with O_DIRECT) to a free loop device.
    pub fn attach(backing: &Path) -> Result<LoopDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(backing)
            .map_err(Error::io(format!("open {}", backing.display())))?;
        for _ in 0..ATTACH_TRIES {
            let n = free_number()?;
            let path = node(n)?;
            match configure(&path, &file) {
                Ok(hold) => {
                    return Ok(LoopDevice {
                        path,
                        hold: Some(hold),
                    })
                }
                // Another process took this device between GET_FREE and CONFIGURE.
                Err(Errno::EBUSY) | Err(Errno::ENXIO) => continue,
                Err(e) => return Err(Error::sys(format!("configure {}", path.display()))(e)),
            }
        }
        Err(Error::Invalid(
            "no free loop device after many tries".into(),
        ))
    }

    /// A handle on an already attached device.
    pub fn from_path(path: &Path) -> LoopDevice {
        LoopDevice {
            path: path.to_path_buf(),
            hold: None,
        }
    }

    /// Stops holding the device open, so it detaches when its last user goes.
    pub fn release(&mut self) {
        self.hold = None;
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-reads the backing file's size after it grew.
    pub fn refresh_capacity(&self) -> Result<()> {
        let dev = open_node(&self.path)?;
        // SAFETY: LOOP_SET_CAPACITY takes no argument; `dev` is an open loop device.
        unsafe { loop_set_capacity(dev.as_raw_fd()) }.map_err(Error::sys(format!(
            "refresh capacity of {}",
            self.path.display()
        )))?;
        Ok(())
    }

    /// Detaches the backing file. A device still in use (a lazily unmounted filesystem)
    /// is left to autoclear; a device already free is fine.
    pub fn detach(&self) -> Result<()> {
        let dev = match open_node(&self.path) {
            Ok(d) => d,
            Err(_) if !self.path.exists() => return Ok(()),
            Err(e) => return Err(e),
        };
        for _ in 0..20 {
            // SAFETY: LOOP_CLR_FD takes no argument; `dev` is an open loop device.
            match unsafe { loop_clr_fd(dev.as_raw_fd()) } {
                Ok(_) | Err(Errno::ENXIO) => return Ok(()),
                Err(Errno::EBUSY) => std::thread::sleep(Duration::from_millis(25)),
                Err(e) => return Err(Error::sys(format!("detach {}", self.path.display()))(e)),
            }
        }
        Ok(())
    }

    /// The file backing this device, if attached.
    pub fn backing_file(&self) -> Option<PathBuf> {
        let name = self.path.file_name()?.to_str()?;
        backing_file_of(name)
    }
}

/// The backing file of loop device `name` (e.g. "loop3") from sysfs.
pub fn backing_file_of(name: &str) -> Option<PathBuf> {
    let raw = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let raw = raw.trim_end_matches('\n');
    Some(PathBuf::from(raw.strip_suffix(" (deleted)").unwrap_or(raw)))
}

/// Every attached loop device, with its backing file.
pub fn attached() -> Vec<(LoopDevice, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("loop"))
        .filter_map(|n| {
            let backing = backing_file_of(&n)?;
            Some((LoopDevice::from_path(&Path::new("/dev").join(&n)), backing))
        })
        .collect()
}

fn free_number() -> Result<u32> {
    let ctl = open_node(Path::new("/dev/loop-control"))?;
    // SAFETY: LOOP_CTL_GET_FREE takes no argument; `ctl` is /dev/loop-control.
    let n = unsafe { loop_ctl_get_free(ctl.as_raw_fd()) }
        .map_err(Error::sys("find a free loop device"))?;
    Ok(n as u32)
}

/// `/dev/loopN`, created when missing (only a few nodes exist on some hosts).
fn node(n: u32) -> Result<PathBuf> {
    let path = PathBuf::from(format!("/dev/loop{n}"));
    match std::fs::metadata(&path) {
        Ok(m) if m.file_type().is_block_device() => return Ok(path),
        Ok(_) => {
            return Err(Error::Invalid(format!(
                "{} is not a block device",
                path.display()
            )))
        }
        Err(_) => {}
    }
    let dev = makedev(LOOP_MAJOR, n.into());
    match mknod(&path, SFlag::S_IFBLK, Mode::from_bits_truncate(0o660), dev) {
        Ok(()) | Err(Errno::EEXIST) => Ok(path),
        Err(e) => Err(Error::sys(format!("create {}", path.display()))(e)),
    }
}

fn open_node(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(Error::io(format!("open {}", path.display())))
}

/// Configures the device at `path` and returns it, still open.
fn configure(path: &Path, backing: &File) -> nix::Result<File> {
    let dev = open_node(path).map_err(|_| Errno::ENXIO)?;
    // SAFETY: all-zero bytes are a valid value of this plain C struct of integers.
    let mut config: LoopConfig = unsafe { std::mem::zeroed() };
    config.fd = backing.as_raw_fd() as u32;
    config.block_size = blockstore::BLOCK_SIZE as u32;
    config.info.flags = LO_FLAGS_DIRECT_IO | LO_FLAGS_AUTOCLEAR;
    // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, which `config` is; both
    // fds are open for the duration of the call.
    unsafe { loop_configure(dev.as_raw_fd(), &config) }?;
    Ok(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_config_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }
}
