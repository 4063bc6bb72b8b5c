//! A content-addressed store of blobs (layers, configs), `<dir>/sha256/<hex>`.
//!
//! What comes from a registry is hostile until checked, so a blob is written to
//! `<dir>/tmp/` first, hashed while it is written, and renamed to its digest's name only
//! when the hash matches and its size is the one its descriptor declared. A file under
//! `sha256/` has therefore been verified once; a crash mid-write leaves only a temporary
//! file, which the next [`BlobStore::open`] removes.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWrite;

use crate::error::{PullError, Result};

/// A verified `sha256:<64 hex>` digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`; any other algorithm or form is refused.
    pub fn parse(s: &str) -> Result<Digest> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| PullError::BadDigest(s.into()))?;
        if hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Digest(s.into()))
        } else {
            Err(PullError::BadDigest(s.into()))
        }
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{:x}", Sha256::digest(bytes)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The blob store of one data directory. A blob is kept while a pull may still read it
/// (each pull holds a [`BlobLease`]) or an image names it; [`BlobStore::collect`] removes
/// the rest, so neither `image rm` nor a failed or interrupted pull leaves compressed
/// blobs behind, while images that share a base still fetch it once.
#[derive(Debug, Clone)]
pub struct BlobStore {
    dir: PathBuf,
    leases: std::sync::Arc<std::sync::Mutex<usize>>,
    /// Free space a blob must leave on the store's filesystem.
    floor: u64,
}

/// Keeps the store's blobs while held (see [`BlobStore::lease`]).
#[derive(Debug)]
pub struct BlobLease {
    store: BlobStore,
}

impl Drop for BlobLease {
    fn drop(&mut self) {
        *self.store.leases.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
    }
}

impl BlobStore {
    /// Opens (creating) the store at `dir` and removes temporary files a crash left.
    pub fn open(dir: impl Into<PathBuf>) -> Result<BlobStore> {
        let dir = dir.into();
        let tmp = dir.join("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        for d in [dir.join("sha256"), tmp] {
            std::fs::create_dir_all(&d).map_err(|e| PullError::io(&d, e))?;
        }
        Ok(BlobStore {
            dir,
            leases: Default::default(),
            floor: 0,
        })
    }

    /// The store, keeping `floor` bytes of its filesystem free: a blob declared larger
    /// than the free space beyond it is refused before a byte is written.
    pub fn with_floor(mut self, floor: u64) -> BlobStore {
        self.floor = floor;
        self
    }

    /// Keeps every blob until the lease is dropped: [`BlobStore::collect`] does nothing
    /// while one is held.
    pub fn lease(&self) -> BlobLease {
        *self.leases.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        BlobLease {
            store: self.clone(),
        }
    }

    /// Removes every blob `keep` does not name (digests as `sha256:<hex>`), unless a lease
    /// is held; returns how many were removed.
    pub fn collect(&self, keep: &std::collections::HashSet<String>) -> usize {
        let leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        if *leases > 0 {
            return 0;
        }
        let Ok(entries) = std::fs::read_dir(self.dir.join("sha256")) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = format!("sha256:{}", e.file_name().to_string_lossy());
            if !keep.contains(&name) && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
        drop(leases);
        removed
    }

    /// Where blob `digest` lives (whether or not it is there).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join("sha256").join(digest.hex())
    }

    /// Whether blob `digest` is stored.
    pub fn has(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    /// Stores `bytes` as blob `digest`, refusing them when they hash differently.
    pub fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<PathBuf> {
        let actual = Digest::of(bytes);
        if &actual != digest {
            return Err(PullError::DigestMismatch {
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        let tmp = self.temp_path()?;
        std::fs::write(&tmp, bytes).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            PullError::io(&tmp, e)
        })?;
        self.commit(&tmp, digest)
    }

    /// A writer for blob `digest` of `size` bytes; [`BlobWriter::finish`] verifies and
    /// stores it. A writer dropped unfinished removes its temporary file.
    pub async fn writer(&self, digest: &Digest, size: u64) -> Result<BlobWriter> {
        // The size is the registry's word, checked as it streams; a blob the host disk has
        // no room for (beyond the floor) is refused before a byte is written.
        let free = nix::sys::statvfs::statvfs(&self.dir)
            .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
            .unwrap_or(u64::MAX);
        if size > free.saturating_sub(self.floor) {
            tracing::warn!(%digest, size, free, floor = self.floor, "a registry blob is declared larger than the host disk has free beyond its floor");
            return Err(PullError::io(
                &self.dir,
                std::io::Error::from_raw_os_error(nix::errno::Errno::ENOSPC as i32),
            ));
        }
        let tmp = self.temp_path()?;
        let file = tokio::fs::File::create(&tmp)
            .await
            .map_err(|e| PullError::io(&tmp, e))?;
        Ok(BlobWriter {
            store: self.clone(),
            digest: digest.clone(),
            expected_size: size,
            written: 0,
            hasher: Sha256::new(),
            file,
            tmp: Some(tmp),
        })
    }

    fn temp_path(&self) -> Result<PathBuf> {
        let name = model::ids::random_id::<8>("blob").map_err(|e| PullError::Io {
            path: self.dir.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(self.dir.join("tmp").join(name))
    }

    fn commit(&self, tmp: &Path, digest: &Digest) -> Result<PathBuf> {
        let dest = self.path(digest);
        std::fs::rename(tmp, &dest).map_err(|e| {
            let _ = std::fs::remove_file(tmp);
            PullError::io(&dest, e)
        })?;
        Ok(dest)
    }
}

/// A blob being written: hashed as it goes, and cut off once it exceeds its declared size
/// (a hostile registry cannot fill the disk with an endless body).
pub struct BlobWriter {
    store: BlobStore,
    digest: Digest,
    expected_size: u64,
    written: u64,
    hasher: Sha256,
    file: tokio::fs::File,
    tmp: Option<PathBuf>,
}

impl BlobWriter {
    /// Checks size and digest, then moves the blob into place; returns its path.
    pub async fn finish(mut self) -> Result<PathBuf> {
        use tokio::io::AsyncWriteExt;
        let tmp = self.tmp.clone().expect("an unfinished writer has its file");
        self.file
            .flush()
            .await
            .and(self.file.sync_all().await)
            .map_err(|e| PullError::io(&tmp, e))?;
        if self.written != self.expected_size {
            return Err(PullError::SizeMismatch {
                digest: self.digest.to_string(),
                expected: self.expected_size,
                actual: self.written,
            });
        }
        let actual = format!("sha256:{:x}", self.hasher.clone().finalize());
        if actual != self.digest.as_str() {
            return Err(PullError::DigestMismatch {
                expected: self.digest.to_string(),
                actual,
            });
        }
        let path = self.store.commit(&tmp, &self.digest)?;
        self.tmp = None;
        Ok(path)
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

impl AsyncWrite for BlobWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.written + buf.len() as u64 > self.expected_size {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "blob {} is larger than the {} bytes its descriptor declares",
                    self.digest, self.expected_size
                ),
            )));
        }
        let this = &mut *self;
        match Pin::new(&mut this.file).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                this.hasher.update(&buf[..n]);
                this.written += n as u64;
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn digests_are_checked() {
        assert!(Digest::parse(&format!("sha256:{}", "a".repeat(64))).is_ok());
        for bad in [
            "sha256:abc",
            "md5:0123",
            &format!("sha256:{}", "A".repeat(64)),
            &format!("sha256:../{}", "a".repeat(61)),
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn collect_keeps_named_blobs_and_everything_while_leased() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        store.put(&a, b"a").unwrap();
        store.put(&b, b"b").unwrap();
        let keep = [a.to_string()].into_iter().collect();
        let lease = store.lease();
        assert_eq!(store.collect(&keep), 0, "a pull may still read them");
        assert!(store.has(&a) && store.has(&b));
        drop(lease);
        assert_eq!(store.collect(&keep), 1);
        assert!(store.has(&a) && !store.has(&b));
    }

    #[test]
    fn put_refuses_other_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let d = Digest::of(b"hello");
        let e = store.put(&d, b"hellO").unwrap_err();
        assert!(matches!(e, PullError::DigestMismatch { .. }), "{e}");
        assert!(!store.has(&d));
        store.put(&d, b"hello").unwrap();
        assert_eq!(std::fs::read(store.path(&d)).unwrap(), b"hello");
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );
    }

    #[tokio::test]
    async fn writer_verifies_size_and_digest() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let d = Digest::of(b"0123456789");

        let mut w = store.writer(&d, 10).await.unwrap();
        w.write_all(b"0123456789").await.unwrap();
        assert!(
            w.write_all(b"x").await.is_err(),
            "writes past the size fail"
        );
        w.finish().await.unwrap();
        assert!(store.has(&d));

        let other = Digest::of(b"abcdefghij");
        let mut w = store.writer(&other, 10).await.unwrap();
        w.write_all(b"abcdefghiJ").await.unwrap();
        let e = w.finish().await.unwrap_err();
        assert!(matches!(e, PullError::DigestMismatch { .. }), "{e}");
        assert!(!store.has(&other));

        let mut w = store.writer(&other, 10).await.unwrap();
        w.write_all(b"abc").await.unwrap();
        let e = w.finish().await.unwrap_err();
        assert!(matches!(e, PullError::SizeMismatch { .. }), "{e}");

        let w = store.writer(&other, 10).await.unwrap();
        drop(w);
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );
    }
}
