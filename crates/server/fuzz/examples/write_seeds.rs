//! Writes the seed corpus of `snapshot_file` into `seeds/snapshot_file/`: snapshot file
//! bodies (first byte 0: the target appends the trailer), as the daemon exports them.
//! `cargo run --example write_seeds` from crates/server/fuzz.

use std::path::Path;

fn entry(name: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (name.len() as u16).to_le_bytes().to_vec();
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(data);
    out
}

fn body(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(b"SFSNAP1\n");
    for (name, data) in entries {
        out.extend(entry(name, data));
    }
    out
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/snapshot_file");
    std::fs::create_dir_all(&dir).expect("create seeds dir");
    let manifest = br#"{"view":{"id":"snap-0123456789abcdef","type":"filesystem"}}"#;
    let artifact = b"SFARTIF1\x01\x00\x00\x00\x01\x00\x00\x00";
    let seeds: [(&str, Vec<u8>); 3] = [
        (
            "filesystem",
            body(&[("manifest.json", manifest), ("layers.artifact", artifact)]),
        ),
        (
            "memory",
            body(&[
                ("manifest.json", manifest),
                ("layers.artifact", artifact),
                ("memory/pages-1.img", &[7u8; 64]),
                ("memory/inventory.img", b"inv"),
            ]),
        ),
        ("empty", body(&[])),
    ];
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).expect("write seed");
    }
}
