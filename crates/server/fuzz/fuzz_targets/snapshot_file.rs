//! An imported snapshot file: any bytes are refused with a typed error or extracted, and
//! extraction never writes outside its directory nor more than the file holds.
//!
//! The hash check would stop nearly every mutation before the entries are parsed, so an
//! input whose first byte is even is the file's body: the target appends the trailer with
//! its correct SHA-256. An odd first byte takes the rest of the input as the whole file.
#![no_main]

#[path = "../../src/snapfile.rs"]
#[allow(dead_code)]
mod snapfile;

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

fn scratch() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    // Under $TMPDIR, which scripts/fuzz points at a memory-backed directory it removes.
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
}

fn file_bytes(data: &[u8]) -> Vec<u8> {
    match data.split_first() {
        Some((&mode, body)) if mode % 2 == 0 => {
            let digest = Sha256::digest(body);
            [body, b"SFSNAPZ\n", &digest[..]].concat()
        }
        Some((_, raw)) => raw.to_vec(),
        None => Vec::new(),
    }
}

/// Total bytes of the regular files under `dir`; panics on anything else.
fn extracted_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir)
        .expect("read extraction dir")
        .flatten()
    {
        let t = e.file_type().expect("file type");
        total += if t.is_dir() {
            extracted_bytes(&e.path())
        } else {
            assert!(t.is_file(), "extracted a non-file {:?}", e.path());
            e.metadata().expect("metadata").len()
        };
    }
    total
}

fuzz_target!(|data: &[u8]| {
    let root = scratch().path();
    let file = root.join("in.sfs");
    let out = root.join("out");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir(&out).expect("create extraction dir");
    let bytes = file_bytes(data);
    std::fs::write(&file, &bytes).expect("write input");
    if let Ok(got) = snapfile::read(&file, &out) {
        assert!(got.names.iter().all(|n| snapfile::valid_name(n)));
    }
    assert!(extracted_bytes(&out) <= bytes.len() as u64);
    let escaped: Vec<_> = std::fs::read_dir(root)
        .expect("read scratch dir")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "in.sfs" && n != "out")
        .collect();
    assert!(
        escaped.is_empty(),
        "extraction wrote {escaped:?} outside its directory"
    );
});
