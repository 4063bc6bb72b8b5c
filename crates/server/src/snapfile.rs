//! The snapshot export file: one file holding a snapshot's manifest, its disk layers as a
//! block-store artifact and its memory images, with a SHA-256 over everything.
//!
//! ```text
//! "SFSNAP2\n"                                             (the format's version)
//! entry*: name_len u16 LE, name, data_len u64 LE, data
//!         ("manifest.json", "layers.artifact", "memory/<file>")
//! "SFSNAPZ\n", SHA-256 (32 bytes) of all bytes before this trailer
//! "SFSNAPS\n", signature (32 bytes) of that SHA-256
//! ```
//! Version 1 files ("SFSNAP1\n", written before exports were signed) are the same without
//! the signature and still read; a version 2 file must end with its signature.
//! Import checks the trailer hash before reading anything else; the block store then
//! checks every block and layer checksum of the artifact again. The signature is the
//! exporting daemon's HMAC of the hash (see `crate::snapkey`); whoever imports decides
//! what an unsigned or foreign file may carry.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"SFSNAP2\n";
/// The version before the signature trailer.
const MAGIC_V1: &[u8; 8] = b"SFSNAP1\n";
const TRAILER: &[u8; 8] = b"SFSNAPZ\n";
const TRAILER_LEN: u64 = 8 + 32;
const SIGNATURE: &[u8; 8] = b"SFSNAPS\n";
const SIGNATURE_LEN: u64 = 8 + 32;

/// What an import extracted, and what vouches for it.
#[derive(Debug)]
pub struct Extracted {
    /// Entry names in file order.
    pub names: Vec<String>,
    /// The SHA-256 of the file's body (checked).
    pub digest: [u8; 32],
    /// The exporter's signature of `digest`, if the file carries one (not checked here).
    pub signature: Option<[u8; 32]>,
}
/// Longest entry name.
const MAX_NAME: usize = 255;
/// Most entries one file may hold: far above the memory images of a sandbox at its pids
/// limit, far below what would exhaust the inodes of the daemon's disk.
const MAX_ENTRIES: usize = 65_536;

/// Why a snapshot file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SnapfileError {
    #[error("Snapshot file I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("Not a valid snapshot file: {0}")]
    Invalid(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SnapfileError + '_ {
    move |source| SnapfileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(msg: impl Into<String>) -> SnapfileError {
    SnapfileError::Invalid(msg.into())
}

/// A writer that hashes everything it writes.
struct Hashing<W: Write> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `entries` (name, source file) to `out` as a snapshot file, signed with `sign`
/// (given the body's SHA-256).
pub fn write(
    out: &Path,
    entries: &[(String, PathBuf)],
    sign: &dyn Fn(&[u8; 32]) -> [u8; 32],
) -> Result<u64, SnapfileError> {
    let file = File::create(out).map_err(io(out))?;
    let mut w = Hashing {
        inner: BufWriter::new(file),
        hash: Sha256::new(),
    };
    w.write_all(MAGIC).map_err(io(out))?;
    for (name, src) in entries {
        let mut f = File::open(src).map_err(io(src))?;
        let len = f.metadata().map_err(io(src))?.len();
        w.write_all(&(name.len() as u16).to_le_bytes())
            .and_then(|()| w.write_all(name.as_bytes()))
            .and_then(|()| w.write_all(&len.to_le_bytes()))
            .map_err(io(out))?;
        let copied = std::io::copy(&mut (&mut f).take(len), &mut w).map_err(io(src))?;
        if copied != len {
            return Err(invalid(format!(
                "{} changed while exporting",
                src.display()
            )));
        }
    }
    let digest: [u8; 32] = w.hash.clone().finalize().into();
    let mut inner = w.inner;
    inner
        .write_all(TRAILER)
        .and_then(|()| inner.write_all(&digest))
        .and_then(|()| inner.write_all(SIGNATURE))
        .and_then(|()| inner.write_all(&sign(&digest)))
        .and_then(|()| inner.flush())
        .map_err(io(out))?;
    let file = inner.into_inner().map_err(|e| io(out)(e.into_error()))?;
    file.sync_all().map_err(io(out))?;
    file.metadata().map(|m| m.len()).map_err(io(out))
}

/// Checks the file's hash, then extracts its entries into `dir` (which must exist).
pub fn read(input: &Path, dir: &Path) -> Result<Extracted, SnapfileError> {
    let mut f = File::open(input).map_err(io(input))?;
    let mut len = f.metadata().map_err(io(input))?.len();
    if len < MAGIC.len() as u64 + TRAILER_LEN {
        return Err(invalid("file is too short"));
    }
    let signature = read_signature(&mut f, input, len)?;
    if signature.is_some() {
        len -= SIGNATURE_LEN;
    }
    let digest = verify_hash(&mut f, input, len - TRAILER_LEN)?;
    f.seek(SeekFrom::Start(0)).map_err(io(input))?;
    let mut r = BufReader::new(f).take(len - TRAILER_LEN);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(io(input))?;
    match (&magic, signature.is_some()) {
        (MAGIC, true) | (MAGIC_V1, false) => {}
        (MAGIC, false) => return Err(invalid("its signature trailer is missing")),
        _ => {
            return Err(invalid(
                "wrong magic (not a snapshot file, or a newer version)",
            ))
        }
    }
    let mut names = Vec::new();
    let mut seen = std::collections::HashSet::new();
    while r.limit() > 0 {
        if names.len() == MAX_ENTRIES {
            return Err(invalid(format!("more than {MAX_ENTRIES} entries")));
        }
        let name = read_entry(&mut r, input, dir, &seen)?;
        seen.insert(name.clone());
        names.push(name);
    }
    Ok(Extracted {
        names,
        digest,
        signature,
    })
}

/// The signature at the end of a file of `len` bytes, if it ends with one. (A file without
/// one ends with the hash trailer, whose magic differs.)
fn read_signature(f: &mut File, input: &Path, len: u64) -> Result<Option<[u8; 32]>, SnapfileError> {
    if len < MAGIC.len() as u64 + TRAILER_LEN + SIGNATURE_LEN {
        return Ok(None);
    }
    f.seek(SeekFrom::Start(len - SIGNATURE_LEN))
        .map_err(io(input))?;
    let mut tail = [0u8; SIGNATURE_LEN as usize];
    f.read_exact(&mut tail).map_err(io(input))?;
    f.seek(SeekFrom::Start(0)).map_err(io(input))?;
    if &tail[..8] != SIGNATURE {
        return Ok(None);
    }
    let mut sig = [0u8; 32];
    sig.copy_from_slice(&tail[8..]);
    Ok(Some(sig))
}

fn verify_hash(f: &mut File, input: &Path, body: u64) -> Result<[u8; 32], SnapfileError> {
    let mut hash = Sha256::new();
    let copied =
        std::io::copy(&mut (&mut *f).take(body), &mut HashSink(&mut hash)).map_err(io(input))?;
    let mut trailer = [0u8; TRAILER_LEN as usize];
    f.read_exact(&mut trailer).map_err(io(input))?;
    if copied != body || &trailer[..8] != TRAILER {
        return Err(invalid("missing trailer"));
    }
    let digest: [u8; 32] = hash.finalize().into();
    if digest[..] != trailer[8..] {
        return Err(invalid(
            "checksum mismatch (the file is corrupt or truncated)",
        ));
    }
    Ok(digest)
}

struct HashSink<'a>(&'a mut Sha256);

impl Write for HashSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether an entry name is safe to extract (no traversal, one optional `memory/`).
pub fn valid_name(name: &str) -> bool {
    let file = name.strip_prefix("memory/").unwrap_or(name);
    !file.is_empty()
        && name.len() <= MAX_NAME
        && !file.starts_with('.')
        && file
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn read_entry(
    r: &mut impl Read,
    input: &Path,
    dir: &Path,
    seen: &std::collections::HashSet<String>,
) -> Result<String, SnapfileError> {
    let mut n = [0u8; 2];
    r.read_exact(&mut n)
        .map_err(|_| invalid("truncated entry"))?;
    let mut name = vec![0u8; u16::from_le_bytes(n) as usize];
    r.read_exact(&mut name)
        .map_err(|_| invalid("truncated entry"))?;
    let name = String::from_utf8(name).map_err(|_| invalid("entry name is not UTF-8"))?;
    if !valid_name(&name) {
        return Err(invalid(format!("bad entry name {name:?}")));
    }
    if seen.contains(&name) {
        return Err(invalid(format!("entry {name} appears twice")));
    }
    let mut l = [0u8; 8];
    r.read_exact(&mut l)
        .map_err(|_| invalid("truncated entry"))?;
    let len = u64::from_le_bytes(l);
    let target = dir.join(&name);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    // Entries may be memory images (holding what the processes kept in memory): root's alone.
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&target)
        .map_err(io(&target))?;
    let copied = std::io::copy(&mut r.take(len), &mut out).map_err(io(input))?;
    if copied != len {
        return Err(invalid(format!("entry {name} is truncated")));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_any_flipped_byte_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"{\"x\":1}").unwrap();
        std::fs::write(&b, vec![7u8; 5000]).unwrap();
        let file = dir.path().join("snap.sfs");
        let entries = vec![
            ("manifest.json".to_string(), a),
            ("memory/pages-1.img".to_string(), b),
        ];
        write(&file, &entries, &|d| d.map(|b| !b)).unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let got = read(&file, &out).unwrap();
        assert_eq!(got.names, vec!["manifest.json", "memory/pages-1.img"]);
        assert_eq!(got.signature, Some(got.digest.map(|b| !b)));
        assert_eq!(
            std::fs::read(out.join("memory/pages-1.img")).unwrap(),
            vec![7u8; 5000]
        );
        let good = std::fs::read(&file).unwrap();
        let hash_end = good.len() - SIGNATURE_LEN as usize;
        for pos in [0, 9, good.len() / 2, hash_end - 1] {
            let mut bad = good.clone();
            bad[pos] ^= 0xff;
            std::fs::write(&file, &bad).unwrap();
            assert!(read(&file, &out).is_err(), "flip at {pos}");
        }
        // A flipped signature is read as it is; whoever imports checks it against a key.
        let mut bad = good.clone();
        bad[good.len() - 1] ^= 0xff;
        std::fs::write(&file, &bad).unwrap();
        let got = read(&file, &out).unwrap();
        assert_ne!(got.signature, Some(got.digest.map(|b| !b)));
        std::fs::write(&file, &good[..good.len() - 10]).unwrap();
        assert!(read(&file, &out).is_err());
        // Without its signature a version 2 file is refused.
        std::fs::write(&file, &good[..good.len() - SIGNATURE_LEN as usize]).unwrap();
        let err = read(&file, &out).unwrap_err().to_string();
        assert!(err.contains("signature trailer is missing"), "{err}");
    }

    /// A version 1 file of `entries` (name, data), with its trailer.
    fn file_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut body = MAGIC_V1.to_vec();
        for (name, data) in entries {
            body.extend_from_slice(&(name.len() as u16).to_le_bytes());
            body.extend_from_slice(name.as_bytes());
            body.extend_from_slice(&(data.len() as u64).to_le_bytes());
            body.extend_from_slice(data);
        }
        let digest = Sha256::digest(&body);
        [&body[..], TRAILER, &digest[..]].concat()
    }

    #[test]
    fn version_1_files_read_unsigned() {
        let dir = tempfile::tempdir().unwrap();
        let (file, out) = (dir.path().join("f.sfs"), dir.path().join("out"));
        std::fs::create_dir(&out).unwrap();
        std::fs::write(&file, file_of(&[("manifest.json", b"{}")])).unwrap();
        let got = read(&file, &out).unwrap();
        assert_eq!((got.names.len(), got.signature), (1, None));
    }

    #[test]
    fn duplicate_and_too_many_entries_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (file, out) = (dir.path().join("f.sfs"), dir.path().join("out"));
        std::fs::create_dir(&out).unwrap();
        std::fs::write(&file, file_of(&[("a", b"1"), ("a", b"2")])).unwrap();
        let err = read(&file, &out).unwrap_err().to_string();
        assert!(err.contains("appears twice"), "{err}");
        let names: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("memory/e{i}")).collect();
        let many: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b""[..])).collect();
        std::fs::write(&file, file_of(&many)).unwrap();
        let err = read(&file, &out).unwrap_err().to_string();
        assert!(err.contains("entries"), "{err}");
    }

    #[test]
    fn names_cannot_escape() {
        for bad in [
            "../x",
            "memory/../x",
            "/etc/passwd",
            "memory/",
            ".hidden",
            "a/b",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert!(valid_name("memory/pages-1.img") && valid_name("manifest.json"));
    }
}
