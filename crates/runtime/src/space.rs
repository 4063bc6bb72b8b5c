//! Room on the host. Free space of the filesystem holding the data directory: sandbox
//! disks grow into it as their guests write, and a guest's write that finds it full is lost
//! at writeback (the guest's page cache took it), so callers check before they let data
//! in. And the host's memory, which admission checks before it starts a sandbox.

use std::path::Path;

/// Bytes an unprivileged writer may still allocate on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    Ok(st.blocks_available().saturating_mul(st.fragment_size()))
}

/// (used, total) bytes of the filesystem mounted at `path`, as `df` counts them.
pub fn fs_usage(path: &Path) -> crate::error::Result<(u64, u64)> {
    use crate::error::IoContext;
    let st = nix::sys::statvfs::statvfs(path)
        .map_err(std::io::Error::from)
        .at(path)?;
    let block = st.fragment_size();
    let total = st.blocks().saturating_mul(block);
    let free = st.blocks_free().saturating_mul(block);
    Ok((total.saturating_sub(free), total))
}

/// The host's memory in MiB: (`MemTotal`, `MemAvailable`) from /proc/meminfo.
pub fn memory_mb() -> std::io::Result<(u64, u64)> {
    parse_meminfo(&std::fs::read_to_string("/proc/meminfo")?)
        .ok_or_else(|| std::io::Error::other("/proc/meminfo lacks MemTotal or MemAvailable"))
}

fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some((kib("MemTotal:")? >> 10, kib("MemAvailable:")? >> 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temp_dir_has_some_room_and_a_missing_path_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn host_memory_is_read_from_meminfo() {
        let text = "MemTotal:       24576000 kB\nMemFree: 1 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(parse_meminfo(text), Some((24000, 20000)));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        let (total, available) = memory_mb().unwrap();
        assert!(total > 0 && available <= total);
    }
}
