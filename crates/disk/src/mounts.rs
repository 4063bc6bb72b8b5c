//! Reading the mount table and the process table, for adoption and stale cleanup.

use std::path::{Path, PathBuf};

use nix::mount::{umount2, MntFlags};

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// The superblock's device number, "major:minor".
    pub dev: String,
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    /// The minor device number: the FUSE connection number for a FUSE mount.
    pub fn minor(&self) -> Option<u64> {
        self.dev.split(':').nth(1)?.parse().ok()
    }
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ').skip(2);
    let dev = l.next()?.to_owned();
    let mountpoint = PathBuf::from(unescape(l.nth(1)?));
    let mut r = right.split(' ');
    let fstype = r.next()?.to_owned();
    let source = unescape(r.next()?);
    Some(MountEntry {
        dev,
        mountpoint,
        fstype,
        source,
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space and so on).
fn unescape(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok());
        match oct.and_then(|d| u8::from_str_radix(d, 8).ok()) {
            Some(v) if b[i] == b'\\' => {
                out.push(v);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The current mount table.
pub fn mounts() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// Whether something is mounted exactly at `path`.
pub fn is_mountpoint(path: &Path) -> bool {
    let path = canonical(path);
    mounts().iter().any(|m| m.mountpoint == path)
}

/// `path` made absolute and free of symlinks where it exists.
pub fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// Aborts the FUSE connection mounted at `dir` (if any) and detaches the mount.
pub fn abort_and_detach_fuse(dir: &Path) {
    let dir = canonical(dir);
    for m in mounts().iter().rev().filter(|m| m.mountpoint == dir) {
        if m.fstype.starts_with("fuse") {
            if let Some(conn) = m.minor() {
                crate::fuse::abort_connection(conn);
            }
        }
        let _ = umount2(&m.mountpoint, MntFlags::MNT_DETACH);
    }
}

/// Whether `pid` is a live (not zombie) process.
pub fn process_alive(pid: i32) -> bool {
    procfs::process::Process::new(pid)
        .and_then(|p| p.stat())
        .is_ok_and(|s| !matches!(s.state, 'Z' | 'X'))
}

/// A running disk server: its pid and run directory, from its command line.
pub fn disk_servers() -> Vec<(i32, PathBuf)> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.flatten()
        .filter_map(|p| Some((p.pid, server_dir_of(p.pid)?)))
        .collect()
}

/// The run directory of disk server `pid`, or `None` when `pid` is no disk server.
pub fn server_dir_of(pid: i32) -> Option<PathBuf> {
    let args = procfs::process::Process::new(pid).ok()?.cmdline().ok()?;
    let exe = Path::new(args.first()?);
    if exe.file_name()? != "sandfork-disk" || args.get(1).map(String::as_str) != Some("serve") {
        return None;
    }
    let at = args.iter().position(|a| a == "--dir")?;
    Some(PathBuf::from(args.get(at + 1)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines() {
        let text = "36 35 98:0 / /mnt/a\\040b rw,noatime shared:1 - ext4 /dev/loop3 rw\n\
                    40 36 0:52 / /run/x/fuse rw - fuse sandfork-disk rw,user_id=0\n\
                    garbage\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mountpoint, Path::new("/mnt/a b"));
        assert_eq!(m[0].fstype, "ext4");
        assert_eq!(m[0].source, "/dev/loop3");
        assert_eq!(m[1].minor(), Some(52));
        assert_eq!(m[1].source, "sandfork-disk");
    }

    #[test]
    fn this_process_is_alive_and_no_server() {
        assert!(process_alive(std::process::id() as i32));
        assert!(!process_alive(i32::MAX));
        assert_eq!(server_dir_of(std::process::id() as i32), None);
    }
}
