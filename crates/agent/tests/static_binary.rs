//! The agent that goes into sandboxes is linked statically (images may lack a C library).
//! Checks the binary built by `make build` (or named by SANDFORK_AGENT_BIN) when present.

mod common;

use common::static_agent_path;

/// Program header types of an ELF64 little-endian file.
fn program_headers(elf: &[u8]) -> Vec<u32> {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not ELF64");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (entsize, count) = (u16_at(0x36), u16_at(0x38));
    (0..count)
        .map(|i| {
            let o = phoff + i * entsize;
            u32::from_le_bytes(elf[o..o + 4].try_into().unwrap())
        })
        .collect()
}

const PT_INTERP: u32 = 3;

#[test]
fn built_agent_is_static() {
    let path = static_agent_path();
    let Ok(elf) = std::fs::read(&path) else {
        eprintln!(
            "{} not built (make build builds it); skipping",
            path.display()
        );
        return;
    };
    let headers = program_headers(&elf);
    assert!(!headers.is_empty());
    assert!(
        !headers.contains(&PT_INTERP),
        "{} needs a dynamic loader",
        path.display()
    );
    // And it runs without one.
    let out = std::process::Command::new(&path)
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("sandfork-agent "));
}

#[test]
fn the_check_detects_a_dynamic_binary() {
    let elf = std::fs::read(env!("CARGO_BIN_EXE_sandfork-agent")).unwrap();
    // The test build is dynamically linked, so the same check must see an interpreter.
    assert!(program_headers(&elf).contains(&PT_INTERP));
}
