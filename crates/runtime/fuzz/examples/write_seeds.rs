//! Writes the seed corpus of `layer_unpack` into `seeds/layer_unpack/`: a mode byte, then
//! layers separated by one end-of-archive block (see the target). Valid layers (files,
//! directories, links, whiteouts, gzip, long names, a sparse file) and hostile ones (`..`,
//! absolute paths, writes and whiteouts through symlinks, hard links out of the root).
//! `cargo run --example write_seeds` from crates/runtime/fuzz.

use std::path::Path;

enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    Special(&'a str, tar::EntryType),
    /// A file whose name is set by a PAX `path` record, with a user xattr.
    Pax(&'a str, &'a str),
    /// A file whose name goes into a GNU long-name entry.
    Long(&'a str, &'a str),
    /// A GNU sparse file: 512 bytes of data, a hole, one more byte.
    Sparse(&'a str),
}

fn octal(field: &mut [u8], n: u64) {
    let s = format!("{n:0w$o}\0", w = field.len() - 1);
    field.copy_from_slice(s.as_bytes());
}

/// One layer, without its end-of-archive blocks. Names are written as bytes, so `..`
/// and a leading `/` pass.
fn layer(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1);
        let mut data: Vec<u8> = Vec::new();
        let (name, link) = match *e {
            E::Dir(n) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                (n, None)
            }
            E::File(n, d) => {
                data = d.into();
                (n, None)
            }
            E::Symlink(n, l) => {
                h.set_entry_type(tar::EntryType::Symlink);
                (n, Some(l))
            }
            E::Hardlink(n, l) => {
                h.set_entry_type(tar::EntryType::Link);
                (n, Some(l))
            }
            E::Special(n, t) => {
                h.set_entry_type(t);
                (n, None)
            }
            E::Pax(n, d) => {
                b.append_pax_extensions([("path", n.as_bytes()), ("SCHILY.xattr.user.seed", b"1")])
                    .unwrap();
                data = d.into();
                ("pax-placeholder", None)
            }
            E::Long(n, d) => {
                h.set_size(d.len() as u64);
                b.append_data(&mut h, n, d.as_bytes()).unwrap();
                continue;
            }
            E::Sparse(n) => {
                h.set_entry_type(tar::EntryType::GNUSparse);
                let gnu = h.as_gnu_mut().unwrap();
                octal(&mut gnu.sparse[0].offset, 0);
                octal(&mut gnu.sparse[0].numbytes, 512);
                octal(&mut gnu.sparse[1].offset, 8192);
                octal(&mut gnu.sparse[1].numbytes, 1);
                octal(&mut gnu.realsize, 8193);
                data = vec![b's'; 513];
                (n, None)
            }
        };
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            gnu.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, &data[..]).unwrap();
    }
    let mut bytes = b.into_inner().unwrap();
    bytes.truncate(bytes.len() - 1024);
    bytes
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A seed: the mode byte, then the layers, one zero block between two.
fn seed(mode: u8, layers: &[&[E<'_>]]) -> Vec<u8> {
    let mut out = vec![mode];
    for (i, l) in layers.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(&[0u8; 512]);
        }
        out.extend(layer(l));
    }
    out
}

fn main() {
    use E::*;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/layer_unpack");
    std::fs::create_dir_all(&dir).expect("create seeds dir");
    let long = format!("{}/long", "d".repeat(120));
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "files",
            seed(0, &[&[Dir("a/"), File("a/f", "data"), File("top", "t")]]),
        ),
        (
            "links",
            seed(
                0,
                &[&[
                    Dir("a/"),
                    File("a/f", "data"),
                    Symlink("a/s", "f"),
                    Hardlink("a/h", "a/f"),
                ]],
            ),
        ),
        (
            "whiteout",
            seed(
                0,
                &[
                    &[Dir("a/"), File("a/x", "x"), File("a/y", "y")],
                    &[File("a/.wh.x", ""), File(".wh.top", "")],
                ],
            ),
        ),
        (
            "opaque",
            seed(
                0,
                &[
                    &[Dir("b/"), File("b/old", "o")],
                    &[Dir("b/"), File("b/.wh..wh..opq", ""), File("b/new", "n")],
                ],
            ),
        ),
        // Gzip-compressed by the target (mode bit 1), and a layer that is gzip already.
        ("gzip", seed(2, &[&[Dir("a/"), File("a/f", "data")]])),
        ("gzip-raw", {
            let mut s = vec![1u8];
            s.extend(gzip(&layer(&[Dir("z/"), File("z/f", "zz")])));
            s
        }),
        // A tarball import (whiteouts off): `.wh.` files are ordinary files.
        (
            "import",
            seed(
                4,
                &[&[File("x", "x"), File(".wh.x", ""), File(".wh...", "")]],
            ),
        ),
        (
            "names",
            seed(
                0,
                &[&[
                    Pax("pax/named/file", "p"),
                    Long(&long, "l"),
                    Sparse("sparse"),
                ]],
            ),
        ),
        (
            "special",
            seed(
                0,
                &[&[
                    Special("chr", tar::EntryType::Char),
                    Special("blk", tar::EntryType::Block),
                    Special("fifo", tar::EntryType::Fifo),
                ]],
            ),
        ),
        // Hostile.
        ("dotdot", seed(0, &[&[File("../escape", "x")]])),
        (
            "absolute",
            seed(0, &[&[File("/abs", "x"), Dir("/abs-dir/")]]),
        ),
        (
            "symlink-write",
            seed(
                0,
                &[&[
                    Symlink("esc", "../sentinel"),
                    File("esc/x", "x"),
                    Dir("esc/d/"),
                ]],
            ),
        ),
        // Through the symlinks of the target's lower layer.
        (
            "lower-links",
            seed(
                0,
                &[&[
                    File("up/x", "x"),
                    File("abs/x", "x"),
                    File("victim", "overwritten"),
                    Dir("dir/"),
                    File("dir/file", "upper"),
                ]],
            ),
        ),
        (
            "hardlink-out",
            seed(
                0,
                &[&[
                    Hardlink("h1", "../sentinel/victim"),
                    Hardlink("h2", "up/victim"),
                    Hardlink("h3", "victim"),
                ]],
            ),
        ),
        (
            "whiteout-symlink",
            seed(
                0,
                &[
                    &[Symlink("l", "../sentinel")],
                    &[
                        File("l/.wh.victim", ""),
                        File("up/.wh.victim", ""),
                        File("abs/.wh..wh..opq", ""),
                    ],
                ],
            ),
        ),
        (
            "whiteout-dots",
            seed(
                0,
                &[
                    &[File("dir/.wh.", "")],
                    &[File("dir/.wh..", "")],
                    &[File(".wh...", "")],
                ],
            ),
        ),
    ];
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).expect("write seed");
    }
}
