//! An image tarball or OCI layer: any bytes are unpacked or refused with a typed error,
//! and unpacking never creates, changes or deletes anything outside the root (not through
//! `..`, symlinks, hard links or whiteouts), never makes a special file, and writes no more
//! than a bounded multiple of the tar stream.
//!
//! The first byte is a mode, the rest tar streams, one per layer: the input is split at
//! each end-of-archive block (512 zero bytes), up to four layers applied in order to the
//! same root, so that whiteouts of a later layer meet what earlier ones left.
//! - bit 0 clear: the header checksums are fixed up (else nearly every mutation of a
//!   header is refused by its checksum before the unpacker sees it); set: bytes as given.
//! - bit 1: each layer is gzip-compressed (a stream that is already gzip stays as is).
//! - bit 2: whiteouts off (a tarball import: `.wh.` files are ordinary files).
//!
//! Before the layers, the root holds a lower layer made here: a directory, a file and
//! symlinks that point out of the root (`up` to `../sentinel`, `abs` to its absolute
//! path, `victim` to the file in it). `sentinel/` is a sibling of the root with one file;
//! both must stay exactly as they were.
#![no_main]

#[path = "../../src/image/unpack.rs"]
#[allow(dead_code)]
mod unpack;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

const BLOCK: usize = 512;
const MAX_LAYERS: usize = 4;

struct Scratch {
    /// Holds `in/` (the layer files) and `box/` only.
    dir: tempfile::TempDir,
    input: PathBuf,
    /// Holds `root/` and `sentinel/` only.
    boxed: PathBuf,
    root: PathBuf,
    sentinel: PathBuf,
    /// `sentinel/` and its file, as they were made.
    before: Vec<Stat>,
}

/// What changes when a file or directory is written, linked, chmod-ed, chown-ed or has
/// entries added or removed.
#[derive(Debug, PartialEq)]
struct Stat {
    ino: u64,
    mode: u32,
    nlink: u64,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn stat(path: &Path) -> Stat {
    let m = std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{} is gone: {e}", path.display()));
    Stat {
        ino: m.ino(),
        mode: m.mode(),
        nlink: m.nlink(),
        uid: m.uid(),
        gid: m.gid(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    }
}

fn scratch() -> &'static Scratch {
    static S: OnceLock<Scratch> = OnceLock::new();
    S.get_or_init(|| {
        // Under $TMPDIR, which scripts/fuzz points at a memory-backed directory it removes.
        let dir = tempfile::tempdir().expect("temp dir");
        let input = dir.path().join("in");
        let boxed = dir.path().join("box");
        let root = boxed.join("root");
        let sentinel = boxed.join("sentinel");
        for d in [&input, &boxed, &sentinel] {
            std::fs::create_dir(d).expect("create scratch dir");
        }
        std::fs::write(sentinel.join("victim"), "victim").expect("write victim");
        let before = vec![stat(&sentinel), stat(&sentinel.join("victim"))];
        Scratch {
            dir,
            input,
            boxed,
            root,
            sentinel,
            before,
        }
    })
}

/// Sets the checksum of a 512-byte header as tar writes it.
fn fix_checksum(header: &mut [u8]) {
    header[148..156].fill(b' ');
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// Splits the input into layers at end-of-archive blocks, walking the headers as `tar`
/// does (header, GNU sparse extension blocks, data rounded up to 512 bytes), fixing
/// each header's checksum if `fix`. A PAX `size` record that disagrees with its header
/// makes the walk lose step; those headers keep their checksum as given.
fn layers(body: &[u8], fix: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut off = 0;
    while off < body.len() {
        let end = (off + BLOCK).min(body.len());
        let mut block = body[off..end].to_vec();
        off = end;
        if block.len() < BLOCK {
            cur.extend_from_slice(&block);
            break;
        }
        if block.iter().all(|&b| b == 0) {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            if out.len() == MAX_LAYERS - 1 {
                cur.extend_from_slice(&body[off..]);
                break;
            }
            continue;
        }
        if fix {
            fix_checksum(&mut block);
        }
        let header = tar::Header::from_byte_slice(&block);
        let size = header.entry_size().unwrap_or(0);
        let mut extended = header.as_gnu().is_some_and(|g| g.is_extended())
            && header.entry_type() == tar::EntryType::GNUSparse;
        cur.extend_from_slice(&block);
        while extended && off + BLOCK <= body.len() {
            let ext = &body[off..off + BLOCK];
            extended = ext[504] != 0;
            cur.extend_from_slice(ext);
            off += BLOCK;
        }
        let data = usize::try_from(size.div_ceil(BLOCK as u64).saturating_mul(BLOCK as u64))
            .unwrap_or(usize::MAX)
            .min(body.len() - off);
        cur.extend_from_slice(&body[off..off + data]);
        off += data;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

/// Length of the tar stream in a layer file: decompressed if it is gzip, as the
/// unpacker reads it.
fn stream_len(layer: &[u8]) -> u64 {
    if !layer.starts_with(&[0x1f, 0x8b]) {
        return layer.len() as u64;
    }
    let mut n = 0;
    let mut d = flate2::read::GzDecoder::new(layer);
    let mut buf = [0u8; 8192];
    while let Ok(k) = d.read(&mut buf) {
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    n
}

/// The lower layer made before the input's layers.
fn lower(s: &Scratch) {
    let root = &s.root;
    std::fs::create_dir(root).expect("create root");
    std::fs::create_dir(root.join("dir")).expect("create root/dir");
    std::fs::write(root.join("dir/file"), "lower").expect("write root/dir/file");
    symlink("../sentinel", root.join("up")).expect("symlink up");
    symlink(&s.sentinel, root.join("abs")).expect("symlink abs");
    symlink("../sentinel/victim", root.join("victim")).expect("symlink victim");
}

/// Bytes allocated to the regular files under `dir` (each inode once); panics on a file
/// that is not a regular file, directory or symlink.
fn allocated(dir: &Path, seen: &mut HashSet<u64>) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).expect("read unpacked dir").flatten() {
        let m = std::fs::symlink_metadata(e.path()).expect("metadata");
        let t = m.file_type();
        if t.is_dir() {
            total += allocated(&e.path(), seen);
        } else if t.is_file() {
            if seen.insert(m.ino()) {
                total += m.blocks() * 512;
            }
        } else {
            assert!(
                t.is_symlink(),
                "unpacked a special file {:?}: {t:?}",
                e.path()
            );
        }
    }
    total
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{} is gone: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Removes the root whatever modes the layers gave its directories.
fn remove_root(root: &Path) {
    if std::fs::remove_dir_all(root).is_ok() || !root.exists() {
        return;
    }
    fn open_up(dir: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                open_up(&e.path());
            }
        }
    }
    open_up(root);
    std::fs::remove_dir_all(root).expect("remove the root");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let s = scratch();
    let whiteouts = mode & 4 == 0;
    let mut streamed = 0;
    let files: Vec<PathBuf> = layers(body, mode & 1 == 0)
        .into_iter()
        .enumerate()
        .map(|(i, layer)| {
            let bytes = if mode & 2 != 0 && !layer.starts_with(&[0x1f, 0x8b]) {
                gzip(&layer)
            } else {
                layer
            };
            streamed += stream_len(&bytes);
            let file = s.input.join(format!("layer{i}"));
            std::fs::write(&file, &bytes).expect("write layer");
            file
        })
        .collect();

    lower(s);
    for file in &files {
        // A build stops at the first layer that fails.
        if unpack::unpack_layer_within(file, &s.root, whiteouts, u64::MAX).is_err() {
            break;
        }
    }

    let root = std::fs::symlink_metadata(&s.root).expect("the root is gone");
    assert!(root.is_dir(), "the root is no longer a directory");
    assert_eq!(names(s.dir.path()), ["box", "in"], "in the scratch dir");
    assert_eq!(names(&s.boxed), ["root", "sentinel"], "beside the root");
    assert_eq!(names(&s.sentinel), ["victim"], "in the sentinel dir");
    let after = vec![stat(&s.sentinel), stat(&s.sentinel.join("victim"))];
    assert_eq!(s.before, after, "the sentinel dir or its file changed");
    assert_eq!(
        std::fs::read(s.sentinel.join("victim")).expect("read victim"),
        b"victim"
    );
    // A file allocates whole 4 KiB pages; each of its data blocks (a GNU sparse file's
    // chunks are 512-byte aligned) comes with at least 512 bytes of the stream.
    let written = allocated(&s.root, &mut HashSet::new());
    let bound = 32 * streamed + (64 << 10);
    assert!(
        written <= bound,
        "{written} bytes allocated from a {streamed}-byte stream"
    );

    remove_root(&s.root);
    for file in &files {
        let _ = std::fs::remove_file(file);
    }
});
