//! The in-sandbox agent, carried inside the host binaries.
//!
//! Sandboxes boot the statically linked `sandfork-agent` as their init; images may have no
//! C library, and the host must not look for the agent in a build tree. `build.rs` builds
//! it and this crate embeds it, so any binary that links the runtime carries its own
//! agent. [`install`] writes it out once into [`AGENT_DIR`], under a name made of its
//! digest, so daemons of different builds can share the directory and a file that does
//! not hash to its name is rewritten. The directory is host-wide and outside every data
//! directory on purpose: a sandbox sees the agent's host path in its mount table, and it
//! must not learn where the daemon keeps its data.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The agent executable, statically linked.
pub static AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sandfork-agent"));

/// Why the agent could not be written out.
#[derive(Debug, thiserror::Error)]
#[error("Cannot write the sandbox agent to {path}")]
pub struct InstallError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// SHA-256 of [`AGENT`], in hex.
pub fn digest() -> String {
    hex(&Sha256::digest(AGENT))
}

/// Where [`install`] writes the agent (a tmpfs: written again after a reboot).
pub const AGENT_DIR: &str = "/run/sandfork/agent";

/// The file [`install_in`] writes in `dir`.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(format!("sandfork-agent-{}", &digest()[..16]))
}

/// Writes the embedded agent to `/run/sandfork/agent/sandfork-agent-<digest>` (see
/// [`install_in`]); returns its path.
pub fn install() -> Result<PathBuf, InstallError> {
    install_in(Path::new(AGENT_DIR))
}

/// Writes the embedded agent to `<dir>/sandfork-agent-<digest>` unless a file with exactly
/// those bytes is there already; returns its path. The directory is private to root (runc
/// bind-mounts the file into sandboxes read-only).
pub fn install_in(dir: &Path) -> Result<PathBuf, InstallError> {
    let path = path_in(dir);
    if file_digest(&path).is_some_and(|d| d == digest()) {
        return Ok(path);
    }
    let at = |source| InstallError {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(at)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(at)?;
    // Written beside its final name and renamed, so a reader never sees half a file.
    let tmp = dir.join(format!(".sandfork-agent.{}.tmp", std::process::id()));
    let written = write_executable(&tmp, AGENT).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(at(e));
    }
    match file_digest(&path) {
        Some(d) if d == digest() => Ok(path),
        _ => Err(at(std::io::Error::other(
            "the written file does not match the embedded agent",
        ))),
    }
}

fn write_executable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn file_digest(path: &Path) -> Option<String> {
    std::fs::read(path).ok().map(|b| hex(&Sha256::digest(&b)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_once_and_repairs_a_changed_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = install_in(dir.path()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), AGENT);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        let dir_mode = std::fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(dir_mode.permissions().mode() & 0o777, 0o700);
        std::fs::write(&path, b"tampered").unwrap();
        assert_eq!(install_in(dir.path()).unwrap(), path);
        assert_eq!(std::fs::read(&path).unwrap(), AGENT, "rewritten");
    }

    #[test]
    fn the_embedded_agent_is_a_static_executable() {
        const PT_INTERP: u32 = 3;
        assert_eq!(&AGENT[..5], b"\x7fELF\x02", "an ELF64 file");
        let u16_at = |o: usize| usize::from(u16::from_le_bytes([AGENT[o], AGENT[o + 1]]));
        let phoff = u64::from_le_bytes(AGENT[0x20..0x28].try_into().unwrap()) as usize;
        let (size, count) = (u16_at(0x36), u16_at(0x38));
        assert!(count > 0);
        for i in 0..count {
            let o = phoff + i * size;
            let kind = u32::from_le_bytes(AGENT[o..o + 4].try_into().unwrap());
            assert_ne!(kind, PT_INTERP, "the agent needs a dynamic loader");
        }
    }
}
