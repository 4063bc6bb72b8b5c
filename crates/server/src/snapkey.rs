//! The daemon's snapshot key (`<data>/snapshot.key`, 32 random bytes as hex, mode 0600).
//! Every exported snapshot file is signed with it (HMAC-SHA256 of the file's SHA-256), and
//! an imported file whose memory images are not signed with it is refused: CRIU restores
//! memory images as root, and a crafted image can name host files and credentials, so
//! only files from this daemon or from hosts given the same key are restored. Copying the
//! key file to another host makes the two trust each other's exports.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The key's file name in the data directory.
pub const FILE: &str = "snapshot.key";

/// A snapshot signing key.
pub struct SnapshotKey([u8; 32]);

impl SnapshotKey {
    /// Reads the key at `path`, creating it (atomically, 0600) when missing.
    pub fn load_or_create(path: &Path) -> io::Result<SnapshotKey> {
        match std::fs::read_to_string(path) {
            Ok(text) => parse(&text).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not 64 hex digits", path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => create(path),
            Err(e) => Err(e),
        }
    }

    /// A MAC of `msg` for `purpose` (keys of other purposes than snapshot signing are
    /// derived from this one, so one file holds the daemon's secret).
    pub fn derive(&self, purpose: &str, msg: &[u8]) -> [u8; 32] {
        // An HMAC takes a key of any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("any key length");
        mac.update(purpose.as_bytes());
        mac.update(&[0]);
        mac.update(msg);
        mac.finalize().into_bytes().into()
    }

    /// The signature of a snapshot file's SHA-256.
    pub fn sign(&self, digest: &[u8; 32]) -> [u8; 32] {
        // An HMAC takes a key of any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("any key length");
        mac.update(digest);
        mac.finalize().into_bytes().into()
    }

    /// Whether `signature` is this key's signature of `digest` (in constant time).
    pub fn signed(&self, digest: &[u8; 32], signature: &[u8; 32]) -> bool {
        self.sign(digest).ct_eq(signature).into()
    }
}

fn parse(text: &str) -> Option<SnapshotKey> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(SnapshotKey(key))
}

/// Writes a fresh key next to `path` and links it into place, so that of two daemons
/// creating it at once both end up with the one that won.
fn create(path: &Path) -> io::Result<SnapshotKey> {
    let key = model::ids::random_bytes::<32>().map_err(io::Error::other)?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(format!("{hex}\n").as_bytes())
        .and_then(|()| f.sync_all())?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(SnapshotKey(key)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => SnapshotKey::load_or_create(path),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_and_signs_only_for_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let a = SnapshotKey::load_or_create(&path).unwrap();
        let again = SnapshotKey::load_or_create(&path).unwrap();
        let digest = [7u8; 32];
        assert!(again.signed(&digest, &a.sign(&digest)));
        assert!(!a.signed(&[8u8; 32], &a.sign(&digest)));
        let other = SnapshotKey::load_or_create(&dir.path().join("other.key")).unwrap();
        assert!(!other.signed(&digest, &a.sign(&digest)));
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        std::fs::write(&path, "not a key").unwrap();
        assert!(SnapshotKey::load_or_create(&path).is_err());
    }
}
