//! Memory snapshots that store only what changed: pages shared with a parent snapshot.
//!
//! CRIU writes each process's memory as a page map (`pagemap-<pid>.img`: runs of pages by
//! address, with flags) and the pages themselves (`pages-<n>.img`, raw). Its own
//! incremental dumps mark a run `PE_PARENT`: those pages are read, at restore, from the
//! same process's images in the directory that `parent` (a symlink) points to, following
//! the chain. CRIU finds unchanged pages with the kernel's soft-dirty bits, which this
//! kernel lacks; so sandfork finds them after the dump by content instead: a page equal to
//! the page at the same address of the same process in the parent snapshot is marked
//! `PE_PARENT` and dropped from the pages file. Restores stay CRIU's own (nothing is
//! reassembled on the restore path), and comparing contents, not bits, is exact.
//!
//! The image format handled here is the small part of CRIU's that this needs: an image is
//! two 32-bit magics, then entries, each a 32-bit length and a protobuf message; a page
//! map's first entry is its head (`pages_id`), the others are `{vaddr, flags, nr_pages}`.
//! Anything else (an unknown field type, a shared-memory page map) is left as it was: the
//! sharing is an optimisation, never a risk to a snapshot.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The link CRIU follows from an image directory to its parent's.
pub const PARENT_LINK: &str = "parent";

const PAGE: u64 = 4096;
/// `pagemap_entry.flags`: the pages are in the parent's images.
const PE_PARENT: u64 = 1;
/// `pagemap_entry.flags`: the pages are in this directory's pages file.
const PE_PRESENT: u64 = 4;
/// Longest parent chain followed when reading pages.
const MAX_CHAIN: usize = 64;
/// A parent already this deep in a chain gets no children: the new snapshot is stored
/// whole and starts a chain of its own (restores open one page map per level).
pub const MAX_DEPTH: usize = 16;

/// What went wrong reading or rewriting memory images.
#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a page map this version understands ({what})")]
    Format { path: PathBuf, what: String },
}

type Result<T> = std::result::Result<T, ImagesError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ImagesError + '_ {
    move |source| ImagesError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What sharing with a parent saved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shared {
    /// Pages now read from the parent.
    pub pages: u64,
    /// Pages still stored here.
    pub kept: u64,
}

impl Shared {
    pub fn bytes_saved(&self) -> u64 {
        self.pages * PAGE
    }
}

/// One run of pages of a page map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    vaddr: u64,
    pages: u64,
    flags: u64,
}

/// A parsed page map: its magics, its pages file id and its runs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PageMap {
    magics: [u8; 8],
    pages_id: u64,
    runs: Vec<Run>,
}

fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let c = *b.get(*i)?;
        *i += 1;
        v |= u64::from(c & 0x7f) << shift;
        if c < 0x80 {
            return Some(v);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let c = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(c);
            return;
        }
        out.push(c | 0x80);
    }
}

/// A message of varint fields only, as (tag, value); `None` for anything else.
fn fields(b: &[u8]) -> Option<Vec<(u64, u64)>> {
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let key = varint(b, &mut i)?;
        if key & 7 != 0 {
            return None;
        }
        out.push((key >> 3, varint(b, &mut i)?));
    }
    Some(out)
}

fn encode(fields: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(tag, v) in fields {
        put_varint(&mut out, tag << 3);
        put_varint(&mut out, v);
    }
    out
}

impl PageMap {
    fn parse(b: &[u8], path: &Path) -> Result<PageMap> {
        let bad = |what: &str| ImagesError::Format {
            path: path.to_path_buf(),
            what: what.into(),
        };
        let magics: [u8; 8] = b.get(..8).ok_or_else(|| bad("short"))?.try_into().unwrap();
        let mut i = 8;
        let mut messages = Vec::new();
        while i < b.len() {
            let len = b.get(i..i + 4).ok_or_else(|| bad("torn entry"))?;
            let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
            i += 4;
            let body = b.get(i..i + len).ok_or_else(|| bad("torn entry"))?;
            messages.push(fields(body).ok_or_else(|| bad("unknown field type"))?);
            i += len;
        }
        let mut it = messages.into_iter();
        let head = it.next().ok_or_else(|| bad("no head"))?;
        let pages_id = field(&head, 1).ok_or_else(|| bad("no pages id"))?;
        let runs = it
            .map(|m| {
                if m.iter().any(|(t, _)| !matches!(t, 1..=5)) {
                    return Err(bad("unknown field"));
                }
                // nr_pages (5) replaced the 32-bit compat_nr_pages (2).
                let pages = field(&m, 5)
                    .filter(|n| *n > 0)
                    .or_else(|| field(&m, 2))
                    .unwrap_or(0);
                Ok(Run {
                    vaddr: field(&m, 1).ok_or_else(|| bad("run without address"))?,
                    pages,
                    flags: field(&m, 4).unwrap_or(PE_PRESENT),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PageMap {
            magics,
            pages_id,
            runs,
        })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = self.magics.to_vec();
        let mut entry = |m: Vec<u8>| {
            out.extend_from_slice(&(m.len() as u32).to_le_bytes());
            out.extend_from_slice(&m);
        };
        entry(encode(&[(1, self.pages_id)]));
        for r in &self.runs {
            entry(encode(&[(1, r.vaddr), (2, 0), (4, r.flags), (5, r.pages)]));
        }
        out
    }
}

fn field(m: &[(u64, u64)], tag: u64) -> Option<u64> {
    m.iter().find(|(t, _)| *t == tag).map(|(_, v)| *v)
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(io(path))
}

/// The pids that have a page map in `dir` (shared-memory page maps are not per process).
fn pids(dir: &Path) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let name = e.map_err(io(dir))?.file_name();
        let name = name.to_string_lossy();
        if let Some(pid) = name
            .strip_prefix("pagemap-")
            .and_then(|n| n.strip_suffix(".img"))
            .and_then(|n| n.parse().ok())
        {
            out.push(pid);
        }
    }
    out.sort();
    Ok(out)
}

fn pagemap_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("pagemap-{pid}.img"))
}

fn pages_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("pages-{id}.img"))
}

/// The parent image directory `dir` reads pages from, if it has one.
pub fn parent_of(dir: &Path) -> Option<PathBuf> {
    let link = std::fs::read_link(dir.join(PARENT_LINK)).ok()?;
    Some(dir.join(link))
}

/// Links the image directory `dir` to `parent` (relative, so the data directory may move
/// as a whole): for images whose runs were already marked `PE_PARENT` against it.
pub fn link_parent(dir: &Path, parent: &Path) -> Result<()> {
    let at = dir.join(PARENT_LINK);
    std::os::unix::fs::symlink(relative(parent, dir), &at).map_err(io(&at))
}

/// How many parents `dir` reads through (0 for a directory without a parent).
pub fn depth(dir: &Path) -> usize {
    let mut n = 0;
    let mut at = dir.to_path_buf();
    while let Some(p) = parent_of(&at) {
        n += 1;
        if n > MAX_CHAIN {
            break;
        }
        at = p;
    }
    n
}

/// Where each page of one process lives, across a chain of image directories.
struct Pages {
    /// Page address → (pages file, offset).
    at: HashMap<u64, (usize, u64)>,
    files: Vec<(PathBuf, File)>,
}

impl Pages {
    /// The pages of process `pid` as the images in `dir` give them (parents followed);
    /// `None` when `dir` has no page map for it.
    fn of(dir: &Path, pid: u32) -> Result<Option<Pages>> {
        let mut pages = Pages {
            at: HashMap::new(),
            files: Vec::new(),
        };
        let mut wanted: Option<Vec<u64>> = None;
        let mut dir = dir.to_path_buf();
        for _ in 0..MAX_CHAIN {
            let path = pagemap_path(&dir, pid);
            if !path.exists() {
                return Ok((!pages.at.is_empty()).then_some(pages));
            }
            let map = PageMap::parse(&read(&path)?, &path)?;
            let file_path = pages_path(&dir, map.pages_id);
            let file = File::open(&file_path).map_err(io(&file_path))?;
            let index = pages.files.len();
            pages.files.push((file_path, file));
            let mut offset = 0;
            let mut from_parent = Vec::new();
            for r in &map.runs {
                for p in 0..r.pages {
                    let va = r.vaddr + p * PAGE;
                    let want = wanted.as_ref().is_none_or(|w| w.binary_search(&va).is_ok());
                    if r.flags & PE_PRESENT != 0 {
                        if want {
                            pages.at.entry(va).or_insert((index, offset));
                        }
                        offset += PAGE;
                    } else if r.flags & PE_PARENT != 0 && want {
                        from_parent.push(va);
                    }
                }
            }
            if from_parent.is_empty() {
                return Ok(Some(pages));
            }
            from_parent.sort_unstable();
            wanted = Some(from_parent);
            match parent_of(&dir) {
                Some(p) => dir = p,
                None => return Ok(Some(pages)),
            }
        }
        Ok(Some(pages))
    }

    fn read(&self, va: u64, buf: &mut [u8]) -> Result<bool> {
        let Some(&(file, offset)) = self.at.get(&va) else {
            return Ok(false);
        };
        let (path, f) = &self.files[file];
        f.read_exact_at(buf, offset).map_err(io(path))?;
        Ok(true)
    }
}

/// Rewrites the memory images in `dir` so that every page equal to the page at the same
/// address of the same process in `parent` (an image directory, itself possibly linked
/// to a parent) is read from there, and links `dir/parent` to it. Call it before the
/// snapshot is committed: files are replaced one at a time.
///
/// A page map either side that this code does not understand leaves that process's
/// images as they were. An I/O error may leave one process's images half rewritten: the
/// caller then discards the snapshot.
pub fn share_with_parent(dir: &Path, parent: &Path) -> Result<Shared> {
    if depth(parent) >= MAX_DEPTH {
        return Ok(Shared::default());
    }
    // The link first: a run marked `PE_PARENT` must never be without it.
    let at = dir.join(PARENT_LINK);
    let _ = std::fs::remove_file(&at);
    std::os::unix::fs::symlink(relative(parent, dir), &at).map_err(io(&at))?;
    let mut total = Shared::default();
    for pid in pids(dir)? {
        let shared = match Pages::of(parent, pid).and_then(|theirs| match theirs {
            Some(theirs) => share_process(dir, pid, &theirs),
            None => Ok(Shared::default()),
        }) {
            Ok(s) => s,
            Err(e @ ImagesError::Format { .. }) => {
                tracing::info!(error = %e, "memory images kept whole");
                continue;
            }
            Err(e) => return Err(e),
        };
        total.pages += shared.pages;
        total.kept += shared.kept;
    }
    if total.pages == 0 {
        std::fs::remove_file(&at).map_err(io(&at))?;
    }
    Ok(total)
}

/// `to` as seen from `from` (both absolute; the data directory may move as a whole).
fn relative(to: &Path, from: &Path) -> PathBuf {
    let (to, from): (Vec<_>, Vec<_>) = (to.components().collect(), from.components().collect());
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}

fn share_process(dir: &Path, pid: u32, theirs: &Pages) -> Result<Shared> {
    let map_path = pagemap_path(dir, pid);
    let map = PageMap::parse(&read(&map_path)?, &map_path)?;
    if map.runs.iter().any(|r| r.flags & PE_PARENT != 0) {
        return Ok(Shared::default());
    }
    let pages_file = pages_path(dir, map.pages_id);
    let mut mine = std::io::BufReader::new(File::open(&pages_file).map_err(io(&pages_file))?);
    let tmp = dir.join(format!(".pages-{}.img.tmp", map.pages_id));
    let mut out = BufWriter::new(File::create(&tmp).map_err(io(&tmp))?);
    let (mut page, mut parents) = (vec![0u8; PAGE as usize], vec![0u8; PAGE as usize]);
    let mut runs: Vec<Run> = Vec::new();
    let mut shared = Shared::default();
    for r in &map.runs {
        for p in 0..r.pages {
            let va = r.vaddr + p * PAGE;
            let mut flags = r.flags;
            if r.flags & PE_PRESENT != 0 {
                mine.read_exact(&mut page).map_err(io(&pages_file))?;
                if theirs.read(va, &mut parents)? && parents == page {
                    flags = PE_PARENT;
                    shared.pages += 1;
                } else {
                    out.write_all(&page).map_err(io(&tmp))?;
                    shared.kept += 1;
                }
            }
            match runs.last_mut() {
                Some(last) if last.flags == flags && last.vaddr + last.pages * PAGE == va => {
                    last.pages += 1
                }
                _ => runs.push(Run {
                    vaddr: va,
                    pages: 1,
                    flags,
                }),
            }
        }
    }
    if shared.pages == 0 {
        drop(out);
        let _ = std::fs::remove_file(&tmp);
        return Ok(shared);
    }
    out.into_inner()
        .map_err(|e| io(&tmp)(e.into_error()))?
        .sync_all()
        .map_err(io(&tmp))?;
    let new_map = PageMap { runs, ..map };
    let map_tmp = dir.join(format!(".pagemap-{pid}.img.tmp"));
    std::fs::write(&map_tmp, new_map.encode()).map_err(io(&map_tmp))?;
    std::fs::rename(&tmp, &pages_file).map_err(io(&pages_file))?;
    std::fs::rename(&map_tmp, &map_path).map_err(io(&map_path))?;
    Ok(shared)
}

/// Copies the images of `dir` into the empty directory `out`, self-contained: every page
/// read from a parent chain is copied back in, and `out` has no parent link.
pub fn flatten_into(dir: &Path, out: &Path) -> Result<()> {
    let maps: HashMap<u32, PageMap> = pids(dir)?
        .into_iter()
        .map(|pid| {
            let p = pagemap_path(dir, pid);
            Ok((pid, PageMap::parse(&read(&p)?, &p)?))
        })
        .collect::<Result<_>>()?;
    let rewritten: Vec<u64> = maps
        .values()
        .filter(|m| m.runs.iter().any(|r| r.flags & PE_PARENT != 0))
        .map(|m| m.pages_id)
        .collect();
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let e = e.map_err(io(dir))?;
        let name = e.file_name();
        let name_str = name.to_string_lossy();
        let is_rewritten = rewritten
            .iter()
            .any(|id| name_str == format!("pages-{id}.img"));
        if name_str == PARENT_LINK || !e.file_type().map_err(io(dir))?.is_file() || is_rewritten {
            continue;
        }
        let to = out.join(&name);
        std::fs::copy(e.path(), &to).map_err(io(&to))?;
    }
    for (pid, map) in maps {
        if !map.runs.iter().any(|r| r.flags & PE_PARENT != 0) {
            continue;
        }
        let all = Pages::of(dir, pid)?.ok_or_else(|| ImagesError::Format {
            path: pagemap_path(dir, pid),
            what: "no pages".into(),
        })?;
        let pages_file = pages_path(out, map.pages_id);
        let mut w = BufWriter::new(File::create(&pages_file).map_err(io(&pages_file))?);
        let mut page = vec![0u8; PAGE as usize];
        let mut runs: Vec<Run> = Vec::new();
        for r in &map.runs {
            let flags = if r.flags & PE_PARENT != 0 {
                PE_PRESENT
            } else {
                r.flags
            };
            if flags & PE_PRESENT != 0 {
                for p in 0..r.pages {
                    let va = r.vaddr + p * PAGE;
                    if !all.read(va, &mut page)? {
                        return Err(ImagesError::Format {
                            path: pagemap_path(dir, pid),
                            what: format!("page {va:#x} is in no image of the chain"),
                        });
                    }
                    w.write_all(&page).map_err(io(&pages_file))?;
                }
            }
            runs.push(Run { flags, ..*r });
        }
        w.flush().map_err(io(&pages_file))?;
        let map_path = pagemap_path(out, pid);
        std::fs::write(&map_path, PageMap { runs, ..map }.encode()).map_err(io(&map_path))?;
    }
    Ok(())
}

/// A SHA-256 of the pages the images in `dir` hold (parents followed): per process in pid
/// order, each page's address and content in address order. Two image directories with
/// equal digests give every process the same pages, however their chains store them; a
/// file exported relative to a snapshot (see `share_with_parent`) names its base's digest.
pub fn pages_digest(dir: &Path) -> Result<[u8; 32]> {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    let mut page = vec![0u8; PAGE as usize];
    let mut all = pids(dir)?;
    all.sort_unstable();
    for pid in all {
        let Some(pages) = Pages::of(dir, pid)? else {
            continue;
        };
        let mut at: Vec<u64> = pages.at.keys().copied().collect();
        at.sort_unstable();
        hash.update(pid.to_le_bytes());
        hash.update((at.len() as u64).to_le_bytes());
        for va in at {
            pages.read(va, &mut page)?;
            hash.update(va.to_le_bytes());
            hash.update(&page);
        }
    }
    Ok(hash.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAGICS: [u8; 8] = [0x19, 0x43, 0x56, 0x54, 0x25, 0x40, 0x08, 0x56];

    /// Writes process `pid`'s images: `pages` as (address, content byte) runs, all present.
    fn write_process(dir: &Path, pid: u32, pages_id: u64, pages: &[(u64, &[u8])]) {
        let mut runs = Vec::new();
        let mut data = Vec::new();
        for (va, bytes) in pages {
            runs.push(Run {
                vaddr: *va,
                pages: bytes.len() as u64,
                flags: PE_PRESENT | 2,
            });
            for b in *bytes {
                data.extend(std::iter::repeat_n(*b, PAGE as usize));
            }
        }
        let map = PageMap {
            magics: MAGICS,
            pages_id,
            runs,
        };
        std::fs::write(pagemap_path(dir, pid), map.encode()).unwrap();
        std::fs::write(pages_path(dir, pages_id), data).unwrap();
        std::fs::write(dir.join("core-1.img"), b"core").unwrap();
    }

    /// Every page of `pid` as `dir` gives it (parents followed): address → first byte.
    fn contents(dir: &Path, pid: u32) -> Vec<(u64, u8)> {
        let map = PageMap::parse(&read(&pagemap_path(dir, pid)).unwrap(), dir).unwrap();
        let all = Pages::of(dir, pid).unwrap().unwrap();
        let mut out = Vec::new();
        let mut page = vec![0u8; PAGE as usize];
        for r in map.runs {
            for p in 0..r.pages {
                let va = r.vaddr + p * PAGE;
                assert!(all.read(va, &mut page).unwrap(), "{va:#x}");
                assert!(page.iter().all(|b| *b == page[0]));
                out.push((va, page[0]));
            }
        }
        out
    }

    #[test]
    fn page_maps_round_trip() {
        let map = PageMap {
            magics: MAGICS,
            pages_id: 3,
            runs: vec![
                Run {
                    vaddr: 0x5555_0000_0000,
                    pages: 300,
                    flags: PE_PRESENT,
                },
                Run {
                    vaddr: 0x7fff_0000_0000,
                    pages: 1,
                    flags: PE_PARENT,
                },
            ],
        };
        let path = Path::new("pagemap-1.img");
        assert_eq!(PageMap::parse(&map.encode(), path).unwrap(), map);
        assert!(PageMap::parse(&map.encode()[..12], path).is_err(), "torn");
    }

    #[test]
    fn equal_pages_are_read_from_the_parent_and_a_chain_flattens_back() {
        let root = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            root.path().join("a"),
            root.path().join("b"),
            root.path().join("c"),
        );
        for d in [&a, &b, &c] {
            std::fs::create_dir(d).unwrap();
        }
        let base = 0x10_0000;
        write_process(&a, 1, 1, &[(base, &[1, 2, 3, 4]), (base + 0x10_0000, &[9])]);
        // b: one page changed, one appended, one run gone; pid 7 is new.
        write_process(&b, 1, 5, &[(base, &[1, 2, 8, 4, 5])]);
        write_process(&b, 7, 6, &[(base, &[1])]);
        let before_b = contents(&b, 1);
        let shared = share_with_parent(&b, &a).unwrap();
        assert_eq!(shared, Shared { pages: 3, kept: 2 });
        assert_eq!(
            contents(&b, 1),
            before_b,
            "same memory, read through the parent"
        );
        assert_eq!(
            std::fs::metadata(pages_path(&b, 5)).unwrap().len(),
            2 * PAGE
        );
        assert_eq!(
            std::fs::read_link(b.join(PARENT_LINK)).unwrap(),
            Path::new("../a")
        );
        // c shares with b, and through b with a.
        write_process(&c, 1, 2, &[(base, &[1, 2, 8, 6, 5])]);
        let before_c = contents(&c, 1);
        assert_eq!(share_with_parent(&c, &b).unwrap().pages, 4);
        assert_eq!(contents(&c, 1), before_c);
        assert_eq!(std::fs::metadata(pages_path(&c, 2)).unwrap().len(), PAGE);

        let flat = root.path().join("flat");
        std::fs::create_dir(&flat).unwrap();
        flatten_into(&c, &flat).unwrap();
        assert!(parent_of(&flat).is_none());
        assert_eq!(contents(&flat, 1), before_c);
        assert_eq!(std::fs::read(flat.join("core-1.img")).unwrap(), b"core");
        // The flat copy stands alone.
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
        assert_eq!(contents(&flat, 1), before_c);
    }

    #[test]
    fn the_pages_digest_is_the_same_however_a_chain_stores_the_pages() {
        let tmp = tempfile::tempdir().unwrap();
        let (parent, child, flat) = (
            tmp.path().join("p"),
            tmp.path().join("c"),
            tmp.path().join("f"),
        );
        for d in [&parent, &child, &flat] {
            std::fs::create_dir(d).unwrap();
        }
        write_process(&parent, 1, 1, &[(0x1000, b"abc"), (0x9000, b"z")]);
        write_process(&child, 1, 1, &[(0x1000, b"abd"), (0x9000, b"z")]);
        let whole = pages_digest(&child).unwrap();
        assert!(share_with_parent(&child, &parent).unwrap().pages > 0);
        assert_eq!(pages_digest(&child).unwrap(), whole);
        flatten_into(&child, &flat).unwrap();
        assert_eq!(pages_digest(&flat).unwrap(), whole);
        assert_ne!(pages_digest(&parent).unwrap(), whole);
    }

    #[test]
    fn a_chain_stops_growing_at_its_depth_limit() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..=MAX_DEPTH + 1)
            .map(|i| root.path().join(format!("s{i}")))
            .collect();
        for (i, d) in dirs.iter().enumerate() {
            std::fs::create_dir(d).unwrap();
            write_process(d, 1, 1, &[(0x1000, &[1, 2, i as u8 + 3])]);
            if i > 0 {
                let shared = share_with_parent(d, &dirs[i - 1]).unwrap();
                let whole = i == MAX_DEPTH + 1;
                assert_eq!(shared.pages, if whole { 0 } else { 2 }, "level {i}");
            }
        }
        assert_eq!(depth(&dirs[MAX_DEPTH]), MAX_DEPTH);
        assert_eq!(depth(&dirs[MAX_DEPTH + 1]), 0, "stored whole: a new chain");
        assert_eq!(
            contents(&dirs[MAX_DEPTH], 1)[2],
            (0x3000, MAX_DEPTH as u8 + 3)
        );
    }

    #[test]
    fn nothing_shared_leaves_the_images_untouched() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        write_process(&a, 1, 1, &[(0x1000, &[1])]);
        write_process(&b, 1, 1, &[(0x1000, &[2])]);
        let before = std::fs::read(pagemap_path(&b, 1)).unwrap();
        assert_eq!(share_with_parent(&b, &a).unwrap().pages, 0);
        assert_eq!(std::fs::read(pagemap_path(&b, 1)).unwrap(), before);
        assert!(parent_of(&b).is_none());
        let names: Vec<_> = std::fs::read_dir(&b)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 3, "no temporary files left: {names:?}");
    }

    #[test]
    fn a_page_map_this_code_does_not_understand_is_refused_not_guessed() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        write_process(&a, 1, 1, &[(0x1000, &[1])]);
        let mut odd = MAGICS.to_vec();
        let head = encode(&[(1, 1)]);
        odd.extend_from_slice(&(head.len() as u32).to_le_bytes());
        odd.extend_from_slice(&head);
        let entry = [0x0a, 0x01, 0x00]; // field 1 as bytes: not a page map entry
        odd.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        odd.extend_from_slice(&entry);
        std::fs::write(pagemap_path(&b, 1), &odd).unwrap();
        std::fs::write(pages_path(&b, 1), vec![1u8; PAGE as usize]).unwrap();
        assert_eq!(share_with_parent(&b, &a).unwrap(), Shared::default());
        assert_eq!(
            std::fs::read(pagemap_path(&b, 1)).unwrap(),
            odd,
            "untouched"
        );
        assert!(parent_of(&b).is_none());
    }
}
