//! Unpacking one layer or root filesystem tarball (raw or gzip) into a directory: the tar
//! entry walk, path cleaning and whiteouts. The input is hostile (an imported tarball, an
//! OCI layer), so this module refuses paths with `..` (an absolute path is made relative
//! to the root), writes through symlinks or hard links that leave the root, and whiteouts
//! that name no file; a whiteout under a symlink or a non-directory deletes nothing.
//! Character and block devices, FIFOs and unknown entry types are unpacked as regular
//! files (what the `tar` crate does), never as special files.
//!
//! It depends on std, `tar`, `flate2` and `thiserror` only: `crates/runtime/fuzz` compiles
//! it alone (target `layer_unpack`).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Component, Path, PathBuf};

/// Name prefix of a whiteout: `.wh.<name>` deletes `<name>` of the lower layers.
pub const WHITEOUT: &str = ".wh.";
/// A whiteout that empties its directory (of what lower layers left there).
pub const OPAQUE: &str = ".wh..wh..opq";

/// Why a layer was not (completely) unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A malformed tar stream (header checksum, sizes, extensions, gzip).
    #[error("cannot read tar entry {index}")]
    Read {
        index: usize,
        #[source]
        source: io::Error,
    },
    /// An entry path with `..`.
    #[error("unsafe path in layer: {0}")]
    UnsafePath(PathBuf),
    /// A whiteout naming no file: `.wh.`, `.wh..`, `.wh...`.
    #[error("whiteout names no file: {0}")]
    BadWhiteout(PathBuf),
    /// `tar` refused or failed the entry: a write or hard link that would leave the root,
    /// a type clash with what is there, an I/O error.
    #[error("cannot unpack entry {entry}")]
    Entry {
        entry: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The layer's tar stream, uncompressed, runs past what the unpack may write.
    #[error("the layer unpacks to more than the {limit} bytes allowed for it")]
    TooLarge { limit: u64 },
    #[error("whiteout {entry}: cannot remove {path}")]
    Whiteout {
        entry: PathBuf,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Unpacks the tarball `layer` (gzip-compressed or not) into `root`. With `whiteouts`
/// (an OCI layer), a first pass applies the layer's deletions to what lower layers left,
/// a second pass unpacks everything else; without, `.wh.` files are ordinary files.
#[cfg(test)]
pub fn unpack_layer(layer: &Path, root: &Path, whiteouts: bool) -> Result<(), UnpackError> {
    unpack_layer_within(layer, root, whiteouts, u64::MAX)
}

/// [`unpack_layer`], stopped with [`UnpackError::TooLarge`] once the uncompressed tar
/// stream passes `limit` bytes (which bound what the unpack writes: every byte of file
/// data is in the stream), whatever its headers or its gzip stream claim.
pub fn unpack_layer_within(
    layer: &Path,
    root: &Path,
    whiteouts: bool,
    limit: u64,
) -> Result<(), UnpackError> {
    if whiteouts {
        for_each_entry(layer, limit, |entry, rel| {
            apply_whiteout(root, rel, &entry.path_lossy())
        })?;
    }
    for_each_entry(layer, limit, |entry, rel| {
        let is_wh = rel
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(WHITEOUT));
        if whiteouts && is_wh {
            return Ok(());
        }
        // `unpack_in` refuses paths that leave `root`, also through symlinks.
        entry
            .unpack_in(root)
            .map(drop)
            .map_err(|source| UnpackError::Entry {
                entry: entry.path_lossy(),
                source,
            })
    })
}

/// Calls `f` with every entry of `layer` and its cleaned path; stops at the first error.
fn for_each_entry(
    layer: &Path,
    limit: u64,
    f: impl FnMut(&mut Entry<'_>, &Path) -> Result<(), UnpackError>,
) -> Result<(), UnpackError> {
    let over = std::rc::Rc::new(std::cell::Cell::new(false));
    let capped = Capped {
        inner: open_maybe_gzip(layer)?,
        left: limit,
        over: over.clone(),
    };
    let walked = walk(archive(Box::new(capped)), f);
    match walked {
        Err(_) if over.get() => Err(UnpackError::TooLarge { limit }),
        other => other,
    }
}

fn walk(
    mut archive: tar::Archive<Box<dyn Read>>,
    mut f: impl FnMut(&mut Entry<'_>, &Path) -> Result<(), UnpackError>,
) -> Result<(), UnpackError> {
    let read = |index| move |source| UnpackError::Read { index, source };
    for (index, entry) in archive.entries().map_err(read(0))?.enumerate() {
        let mut entry = entry.map_err(read(index))?;
        let rel = clean(&entry.path().map_err(read(index))?)?;
        f(&mut entry, &rel)?;
    }
    Ok(())
}

/// A reader that fails once more than its budget was asked of it, and says so.
struct Capped {
    inner: Box<dyn Read>,
    left: u64,
    over: std::rc::Rc<std::cell::Cell<bool>>,
}

impl Read for Capped {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            // One byte more than the budget would be too much: look for it.
            let mut probe = [0u8; 1];
            if self.inner.read(&mut probe)? == 0 {
                return Ok(0);
            }
            self.over.set(true);
            return Err(io::Error::other("layer larger than its budget"));
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

type Entry<'a> = tar::Entry<'a, Box<dyn Read>>;

trait PathLossy {
    /// The entry's path as written in the archive, for messages.
    fn path_lossy(&self) -> PathBuf;
}

impl PathLossy for Entry<'_> {
    fn path_lossy(&self) -> PathBuf {
        self.path().map(|p| p.into_owned()).unwrap_or_default()
    }
}

fn open_maybe_gzip(path: &Path) -> Result<Box<dyn Read>, UnpackError> {
    let open = |source| UnpackError::Open {
        path: path.into(),
        source,
    };
    let mut file = File::open(path).map_err(open)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(open)?;
    let file = File::open(path).map_err(open)?;
    let reader = BufReader::new(file);
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(flate2::read::GzDecoder::new(reader)))
    } else {
        Ok(Box::new(reader))
    }
}

fn archive(stream: Box<dyn Read>) -> tar::Archive<Box<dyn Read>> {
    let mut a = tar::Archive::new(stream);
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(true);
    a.set_unpack_xattrs(true);
    a.set_overwrite(true);
    a
}

/// A tar path made relative, without `.` and refusing `..`.
fn clean(path: &Path) -> Result<PathBuf, UnpackError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            _ => return Err(UnpackError::UnsafePath(path.into())),
        }
    }
    Ok(out)
}

/// Applies the whiteout `rel` (if it is one) to `root`. `entry` is its path as written.
fn apply_whiteout(root: &Path, rel: &Path, entry: &Path) -> Result<(), UnpackError> {
    let Some(name) = rel.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    let hidden = if name == OPAQUE {
        None
    } else if let Some(hidden) = name.strip_prefix(WHITEOUT) {
        // `.wh..` would name the directory itself, `.wh...` its parent (outside `root`
        // for a whiteout at the top).
        if matches!(hidden, "" | "." | "..") {
            return Err(UnpackError::BadWhiteout(entry.into()));
        }
        Some(hidden)
    } else {
        return Ok(());
    };
    let parent = rel.parent().unwrap_or(Path::new(""));
    if !safe_dir(root, parent) {
        return Ok(());
    }
    let dir = root.join(parent);
    let remove = |path: PathBuf| {
        remove_any(&path).map_err(|source| UnpackError::Whiteout {
            entry: entry.into(),
            path,
            source,
        })
    };
    match hidden {
        Some(hidden) => remove(dir.join(hidden))?,
        None => {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    remove(e.path())?;
                }
            }
        }
    }
    Ok(())
}

/// Whether every component of `rel` under `root` is a real directory (no symlink that
/// could point a deletion outside `root`).
fn safe_dir(root: &Path, rel: &Path) -> bool {
    let mut p = root.to_path_buf();
    for c in rel.components() {
        p.push(c);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_dir() => {}
            _ => return false,
        }
    }
    true
}

/// Removes a file, symlink (not its target) or directory tree; nothing if absent.
fn remove_any(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    enum E<'a> {
        Dir(&'a str),
        File(&'a str, &'a str),
        Symlink(&'a str, &'a str),
        Hardlink(&'a str, &'a str),
        Char(&'a str),
    }

    /// A tar of `entries`; names are written as bytes, so `..` and `/` pass.
    fn tar(entries: &[E<'_>]) -> Vec<u8> {
        // Owned by us, so that unpacking also works unprivileged.
        let me = std::fs::metadata("/proc/self").unwrap();
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_uid(me.uid().into());
            h.set_gid(me.gid().into());
            let (name, data, link) = match *e {
                E::Dir(n) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    (n, "", None)
                }
                E::File(n, d) => (n, d, None),
                E::Symlink(n, l) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    (n, "", Some(l))
                }
                E::Hardlink(n, l) => {
                    h.set_entry_type(tar::EntryType::Link);
                    (n, "", Some(l))
                }
                E::Char(n) => {
                    h.set_entry_type(tar::EntryType::Char);
                    h.set_device_major(1).unwrap();
                    h.set_device_minor(3).unwrap();
                    (n, "", None)
                }
            };
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name.as_bytes());
            if let Some(l) = link {
                gnu.linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append(&h, data.as_bytes()).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// A scratch dir with `root/` and `outside/keep` (a directory a layer must not touch).
    struct Fixture {
        tmp: tempfile::TempDir,
        layers: usize,
    }

    impl Fixture {
        fn new() -> Fixture {
            let tmp = tempfile::tempdir().unwrap();
            std::fs::create_dir(tmp.path().join("root")).unwrap();
            std::fs::create_dir(tmp.path().join("outside")).unwrap();
            std::fs::write(tmp.path().join("outside/keep"), "keep").unwrap();
            Fixture { tmp, layers: 0 }
        }

        fn root(&self) -> PathBuf {
            self.tmp.path().join("root")
        }

        fn outside(&self) -> PathBuf {
            self.tmp.path().join("outside")
        }

        fn unpack_bytes(&mut self, bytes: &[u8], whiteouts: bool) -> Result<(), UnpackError> {
            self.layers += 1;
            let layer = self.tmp.path().join(format!("layer{}", self.layers));
            std::fs::write(&layer, bytes).unwrap();
            unpack_layer(&layer, &self.root(), whiteouts)
        }

        fn unpack(&mut self, entries: &[E<'_>]) -> Result<(), UnpackError> {
            self.unpack_bytes(&tar(entries), true)
        }

        /// `outside/` still holds `keep` only, unchanged.
        fn assert_outside_untouched(&self) {
            let names: Vec<_> = std::fs::read_dir(self.outside())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["keep"]);
            let keep = self.outside().join("keep");
            assert_eq!(std::fs::read_to_string(&keep).unwrap(), "keep");
            assert_eq!(std::fs::symlink_metadata(&keep).unwrap().len(), 4);
            let names: Vec<_> = std::fs::read_dir(self.tmp.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| !n.starts_with("layer"))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            assert_eq!(names, ["outside", "root"]);
        }
    }

    /// A gzip bomb: a layer of one 8 MiB file of zeros, a few KiB compressed.
    fn bomb() -> Vec<u8> {
        let zeros = "\0".repeat(8 << 20);
        let bytes = tar(&[E::File("big", &zeros)]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&bytes).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_unpack_limit_and_fits_under_a_larger_one() {
        let mut f = Fixture::new();
        let gz = bomb();
        assert!(gz.len() < 64 << 10, "{}", gz.len());
        let layer = f.tmp.path().join("layer-bomb");
        std::fs::write(&layer, &gz).unwrap();
        let e = unpack_layer_within(&layer, &f.root(), true, 1 << 20).unwrap_err();
        assert!(
            matches!(e, UnpackError::TooLarge { limit } if limit == 1 << 20),
            "{e:?}"
        );
        let written = std::fs::metadata(f.root().join("big")).map_or(0, |m| m.len());
        assert!(written <= 1 << 20, "{written} bytes written past the limit");
        unpack_layer_within(&layer, &f.root(), true, 9 << 20).unwrap();
        assert_eq!(
            std::fs::metadata(f.root().join("big")).unwrap().len(),
            8 << 20
        );
        f.layers += 1;
        f.assert_outside_untouched();
    }

    #[test]
    fn unpacks_files_dirs_links_and_gzip() {
        let mut f = Fixture::new();
        let bytes = tar(&[
            E::Dir("a/"),
            E::File("a/f", "data"),
            E::Symlink("a/s", "f"),
            E::Hardlink("a/h", "a/f"),
        ]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        f.unpack_bytes(&gz.finish().unwrap(), true).unwrap();
        let root = f.root();
        assert_eq!(std::fs::read_to_string(root.join("a/f")).unwrap(), "data");
        assert_eq!(
            std::fs::read_link(root.join("a/s")).unwrap(),
            Path::new("f")
        );
        assert_eq!(std::fs::read_to_string(root.join("a/h")).unwrap(), "data");
    }

    #[test]
    fn refuses_dotdot() {
        let mut f = Fixture::new();
        let e = f.unpack(&[E::File("../escape", "x")]).unwrap_err();
        assert!(matches!(&e, UnpackError::UnsafePath(p) if p == Path::new("../escape")));
        assert_eq!(e.to_string(), "unsafe path in layer: ../escape");
        let e = f.unpack(&[E::File("a/../../escape", "x")]).unwrap_err();
        assert!(matches!(e, UnpackError::UnsafePath(_)), "{e:?}");
        // Also as a whiteout (refused in the first pass, before anything is removed).
        let e = f.unpack(&[E::File("../.wh.outside", "")]).unwrap_err();
        assert!(matches!(e, UnpackError::UnsafePath(_)), "{e:?}");
        f.assert_outside_untouched();
    }

    #[test]
    fn absolute_paths_land_inside_the_root() {
        let mut f = Fixture::new();
        f.unpack(&[E::File("/abs", "x"), E::File("//./b", "y")])
            .unwrap();
        assert_eq!(std::fs::read_to_string(f.root().join("abs")).unwrap(), "x");
        assert_eq!(std::fs::read_to_string(f.root().join("b")).unwrap(), "y");
        f.assert_outside_untouched();
    }

    #[test]
    fn refuses_writes_through_a_symlink_out_of_the_root() {
        for absolute in [false, true] {
            let mut f = Fixture::new();
            let target = match absolute {
                false => "../outside".to_string(),
                true => f.outside().to_str().unwrap().to_string(),
            };
            let e = f
                .unpack(&[E::Symlink("esc", &target), E::File("esc/new", "x")])
                .unwrap_err();
            match &e {
                UnpackError::Entry { entry, .. } => assert_eq!(entry, Path::new("esc/new")),
                e => panic!("{e:?}"),
            }
            // Nor a directory under it, nor a file in a later layer.
            let e = f.unpack(&[E::Dir("esc/d/")]).unwrap_err();
            assert!(matches!(e, UnpackError::Entry { .. }), "{e:?}");
            let e = f.unpack(&[E::File("esc/keep", "x")]).unwrap_err();
            assert!(matches!(e, UnpackError::Entry { .. }), "{e:?}");
            f.assert_outside_untouched();
        }
    }

    #[test]
    fn a_file_over_a_symlink_replaces_the_link_not_its_target() {
        let mut f = Fixture::new();
        f.unpack(&[E::Symlink("s", "../outside/keep"), E::File("s", "new")])
            .unwrap();
        let s = f.root().join("s");
        assert!(std::fs::symlink_metadata(&s).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&s).unwrap(), "new");
        f.assert_outside_untouched();
    }

    #[test]
    fn refuses_hard_links_out_of_the_root() {
        let mut f = Fixture::new();
        let e = f
            .unpack(&[E::Hardlink("h", "../outside/keep")])
            .unwrap_err();
        assert!(matches!(e, UnpackError::Entry { .. }), "{e:?}");
        // Nor through a symlink inside the root.
        let e = f
            .unpack(&[E::Symlink("s", "../outside"), E::Hardlink("h", "s/keep")])
            .unwrap_err();
        assert!(matches!(e, UnpackError::Entry { .. }), "{e:?}");
        let keep = std::fs::symlink_metadata(f.outside().join("keep")).unwrap();
        assert_eq!(keep.nlink(), 1);
        f.assert_outside_untouched();
    }

    #[test]
    fn whiteouts_remove_lower_files_and_opaque_dirs_empty() {
        let mut f = Fixture::new();
        f.unpack(&[
            E::Dir("a/"),
            E::File("a/gone", "g"),
            E::File("a/keep", "k"),
            E::Dir("b/"),
            E::File("b/old", "o"),
            E::Symlink("l", "../outside"),
        ])
        .unwrap();
        f.unpack(&[
            E::File("a/.wh.gone", ""),
            E::File(".wh.l", ""),
            E::File("b/.wh..wh..opq", ""),
            E::File("b/new", "n"),
        ])
        .unwrap();
        let root = f.root();
        assert!(!root.join("a/gone").exists() && root.join("a/keep").exists());
        assert!(std::fs::symlink_metadata(root.join("l")).is_err());
        assert!(!root.join("b/old").exists() && root.join("b/new").exists());
        assert!(!root.join("a/.wh.gone").exists());
        f.assert_outside_untouched();
    }

    #[test]
    fn whiteouts_are_ordinary_files_without_whiteouts() {
        let mut f = Fixture::new();
        f.unpack_bytes(&tar(&[E::File("x", "x"), E::File(".wh.x", "")]), false)
            .unwrap();
        assert!(f.root().join("x").exists() && f.root().join(".wh.x").exists());
    }

    #[test]
    fn whiteouts_through_a_symlink_delete_nothing() {
        let mut f = Fixture::new();
        f.unpack(&[E::Symlink("l", "../outside")]).unwrap();
        f.unpack(&[E::File("l/.wh.keep", "")]).unwrap();
        f.unpack(&[E::File("l/.wh..wh..opq", "")]).unwrap();
        f.assert_outside_untouched();
        assert!(std::fs::symlink_metadata(f.root().join("l")).is_ok());
    }

    #[test]
    fn whiteouts_through_a_non_directory_delete_nothing() {
        let mut f = Fixture::new();
        f.unpack(&[E::File("f", "f"), E::File("g", "g")]).unwrap();
        f.unpack(&[E::File("f/.wh.g", ""), E::File("f/.wh..wh..opq", "")])
            .unwrap();
        assert!(f.root().join("f").is_file() && f.root().join("g").is_file());
    }

    /// Found while writing the `layer_unpack` fuzz target (its seed `whiteout-dots`):
    /// `.wh...` removed the root's parent directory (`root/..`), `.wh.` and `.wh..` the
    /// directory holding the whiteout (the root itself for one at the top).
    #[test]
    fn refuses_whiteouts_naming_no_file() {
        for name in [".wh.", ".wh..", ".wh...", "a/.wh...", "a/.wh."] {
            let mut f = Fixture::new();
            f.unpack(&[E::Dir("a/"), E::File("a/f", "f")]).unwrap();
            let e = f.unpack(&[E::File(name, "")]).unwrap_err();
            match &e {
                UnpackError::BadWhiteout(p) => assert_eq!(p, Path::new(name)),
                e => panic!("{name}: {e:?}"),
            }
            assert_eq!(e.to_string(), format!("whiteout names no file: {name}"));
            assert!(f.root().join("a/f").is_file(), "{name}");
            f.assert_outside_untouched();
            // Without whiteouts such a name is just a file.
            f.unpack_bytes(&tar(&[E::File(name, "")]), false).unwrap();
        }
    }

    #[test]
    fn devices_are_unpacked_as_regular_files() {
        let mut f = Fixture::new();
        f.unpack(&[E::Char("null")]).unwrap();
        let t = std::fs::symlink_metadata(f.root().join("null"))
            .unwrap()
            .file_type();
        assert!(t.is_file() && !t.is_char_device());
    }

    #[test]
    fn malformed_streams_are_typed_errors() {
        let mut f = Fixture::new();
        let mut bytes = tar(&[E::File("a", "a"), E::File("b", "b")]);
        bytes[1024] ^= 1; // the second header's checksum no longer matches
        let e = f.unpack_bytes(&bytes, true).unwrap_err();
        assert!(matches!(e, UnpackError::Read { index: 1, .. }), "{e:?}");
        let e = f.unpack_bytes(&[0x1f, 0x8b, 0, 1, 2], true).unwrap_err();
        assert!(matches!(e, UnpackError::Read { .. }), "{e:?}");
        let e = unpack_layer(&f.root().join("missing"), &f.root(), true).unwrap_err();
        assert!(matches!(e, UnpackError::Open { .. }), "{e:?}");
    }
}
