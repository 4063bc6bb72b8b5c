//! Named volumes: storage that outlives sandboxes.
//!
//! A volume is an ext4 file system in a sparse image file of the volume's size
//! (`<dir>/<name>/volume.ext4`; the size limit is the file system's own, so a full volume
//! is ENOSPC inside the sandbox and nothing else), loop-mounted once on the host at
//! `<dir>/<name>/mnt` and bound from there into every sandbox that mounts it. Sandboxes
//! sharing a volume share that one file system. A volume is never part of a sandbox's
//! snapshot: the snapshot records which volumes were mounted where, and a restore binds
//! them again by name.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};

/// Largest volume, in MiB (1 TiB; the image file is sparse).
pub const MAX_SIZE_MB: u64 = 1 << 20;
/// Smallest volume, in MiB (room for ext4's own structures).
pub const MIN_SIZE_MB: u64 = 16;

/// A volume's record, `<dir>/<name>/volume.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeInfo {
    pub name: String,
    pub size_mb: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// Bytes in use in its file system (not recorded: read when asked).
    #[serde(skip)]
    pub used_bytes: u64,
}

/// Checks a volume name: 1..=63 of `[a-z0-9._-]`, starting with a letter or digit.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = (1..=63).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidSpec(format!(
            "bad volume name {name:?}: use 1-63 of lowercase letters, digits, '.', '_' and '-'"
        )))
    }
}

/// The volumes of one data directory.
#[derive(Debug, Clone)]
pub struct Volumes {
    dir: PathBuf,
}

impl Volumes {
    pub fn new(dir: impl Into<PathBuf>) -> Volumes {
        Volumes { dir: dir.into() }
    }

    fn home(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Where volume `name` is mounted on the host (the source of sandboxes' binds).
    pub fn mount_point(&self, name: &str) -> PathBuf {
        self.home(name).join("mnt")
    }

    /// Creates volume `name` of `size_mb` MiB and mounts it.
    pub fn create(&self, name: &str, size_mb: u64) -> Result<VolumeInfo> {
        validate_name(name)?;
        if !(MIN_SIZE_MB..=MAX_SIZE_MB).contains(&size_mb) {
            return Err(Error::InvalidSpec(format!(
                "volume size {size_mb} MiB out of range ({MIN_SIZE_MB}..={MAX_SIZE_MB})"
            )));
        }
        std::fs::create_dir_all(&self.dir).at(&self.dir)?;
        let home = self.home(name);
        // The directory is the name's claim: a second create of the same name fails here.
        match std::fs::create_dir(&home) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::Exists(format!("volume {name}")))
            }
            Err(e) => return Err(e).at(&home),
        }
        let made = self.make(name, size_mb);
        if made.is_err() {
            let _ = disk::ext4::unmount(&self.mount_point(name));
            let _ = std::fs::remove_dir_all(&home);
        }
        made
    }

    fn make(&self, name: &str, size_mb: u64) -> Result<VolumeInfo> {
        let home = self.home(name);
        let image = home.join("volume.ext4");
        let file = std::fs::File::create(&image).at(&image)?;
        file.set_len(size_mb << 20).at(&image)?;
        drop(file);
        let out = Command::new("mkfs.ext4")
            .args(["-F", "-q", "-b", "4096", "-m", "0"])
            .args([
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
            ])
            .arg(&image)
            .output()
            .at(&image)?;
        if !out.status.success() {
            return Err(Error::Command {
                command: "mkfs.ext4".into(),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        let info = VolumeInfo {
            name: name.into(),
            size_mb,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            used_bytes: 0,
        };
        let record = home.join("volume.json");
        let tmp = home.join("volume.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&info).expect("serialises"))
            .at(&tmp)
            .and_then(|()| std::fs::rename(&tmp, &record).at(&record))?;
        self.ensure_mounted(name)?;
        Ok(info)
    }

    /// Mounts volume `name` on the host unless it is mounted; returns the mount point.
    pub fn ensure_mounted(&self, name: &str) -> Result<PathBuf> {
        self.get_record(name)?;
        let mnt = self.mount_point(name);
        if is_mounted(&mnt) {
            return Ok(mnt);
        }
        std::fs::create_dir_all(&mnt).at(&mnt)?;
        let image = self.home(name).join("volume.ext4");
        let mut dev = disk::loopdev::LoopDevice::attach(&image).map_err(disk_err)?;
        let mounted = disk::ext4::mount_ext4(dev.path(), &mnt, "errors=remount-ro");
        // Mounted or not, the device goes with its last user (autoclear).
        dev.release();
        mounted.map_err(disk_err)?;
        Ok(mnt)
    }

    /// Unmounts volume `name` from the host (sandboxes' binds keep the file system).
    pub fn unmount(&self, name: &str) -> Result<()> {
        disk::ext4::unmount(&self.mount_point(name)).map_err(disk_err)
    }

    fn get_record(&self, name: &str) -> Result<VolumeInfo> {
        validate_name(name)?;
        let path = self.home(name).join("volume.json");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(format!("volume {name}")))
            }
            Err(e) => return Err(e).at(&path),
        };
        serde_json::from_slice(&bytes).map_err(|source| Error::Record { path, source })
    }

    /// Volume `name`, with the bytes in use when it is mounted.
    pub fn get(&self, name: &str) -> Result<VolumeInfo> {
        let mut info = self.get_record(name)?;
        let mnt = self.mount_point(name);
        if is_mounted(&mnt) {
            if let Ok(s) = nix::sys::statvfs::statvfs(&mnt) {
                let used = s.blocks().saturating_sub(s.blocks_free());
                info.used_bytes = used * s.fragment_size();
            }
        }
        Ok(info)
    }

    /// Every volume, by name.
    pub fn list(&self) -> Result<Vec<VolumeInfo>> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<VolumeInfo> = entries
            .flatten()
            .filter_map(|e| self.get(&e.file_name().to_string_lossy()).ok())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes volume `name` and its data (the caller checks no sandbox mounts it).
    pub fn remove(&self, name: &str) -> Result<()> {
        self.get_record(name)?;
        self.unmount(name)?;
        let home = self.home(name);
        std::fs::remove_dir_all(&home).at(&home)
    }
}

fn is_mounted(path: &Path) -> bool {
    procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map(|m| m.into_iter().any(|m| m.mount_point == path))
        .unwrap_or(false)
}

fn disk_err(e: disk::Error) -> Error {
    Error::Disk(Box::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sizes_are_checked() {
        for ok in ["data", "a", "x.y_z-1"] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "Data", "../x", "a/b", "-x", &"a".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        let v = Volumes::new(dir.path());
        assert!(v.create("small", 1).is_err());
        assert!(v.create("huge", MAX_SIZE_MB + 1).is_err());
        assert!(matches!(v.get("none"), Err(Error::NotFound(_))));
        assert!(v.list().unwrap().is_empty());
    }
}
