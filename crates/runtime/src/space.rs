//! Free space of the host filesystem holding the data directory: sandbox disks grow into
//! it as their guests write, and a guest's write that finds it full is lost at writeback
//! (the guest's page cache took it), so callers check before they let data in.

use std::path::Path;

/// Bytes an unprivileged writer may still allocate on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    Ok(st.blocks_available().saturating_mul(st.fragment_size()))
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
}
