//! Builds the statically linked `sandfork-agent` and puts it in `OUT_DIR` for
//! `include_bytes!`, so that host binaries carry the agent instead of finding it in a
//! build tree.
//!
//! The agent is another package of this workspace; cargo cannot depend on a binary, so
//! this script runs a nested `cargo build` of it, for the host triple with a static C
//! runtime, in a target directory of its own next to the outer one (the outer build holds
//! the lock on its own). `SANDFORK_EMBED_AGENT=/path` embeds a prebuilt static agent
//! instead (packagers).

use std::path::{Path, PathBuf};
use std::process::Command;

const TRIPLE: &str = "x86_64-unknown-linux-gnu";

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dest = out.join("sandfork-agent");
    println!("cargo:rerun-if-env-changed=SANDFORK_EMBED_AGENT");
    if let Some(prebuilt) = std::env::var_os("SANDFORK_EMBED_AGENT") {
        println!("cargo:rerun-if-changed={}", Path::new(&prebuilt).display());
        std::fs::copy(&prebuilt, &dest).expect("copy SANDFORK_EMBED_AGENT");
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let workspace = manifest.join("../..");
    for watched in ["crates/agent", "crates/proto", "Cargo.lock"] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    let target_dir = nested_target_dir(&out);
    let status = nested_cargo(&workspace, &target_dir)
        .status()
        .expect("run cargo for the agent");
    assert!(
        status.success(),
        "building the static sandfork-agent failed"
    );
    let built = target_dir
        .join(TRIPLE)
        .join("release")
        .join("sandfork-agent");
    std::fs::copy(&built, &dest).expect("copy the built agent");
}

/// `cargo build --release` of the agent alone, static and stripped, with none of the outer
/// build's flags. Always optimized: it runs in every sandbox, and a debug build would be
/// ten times the size to write out and bind-mount.
fn nested_cargo(workspace: &Path, target_dir: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["build", "-p", "sandfork-agent", "--bin", "sandfork-agent"])
        .args(["--target", TRIPLE])
        .arg("--target-dir")
        .arg(target_dir);
    cmd.arg("--release");
    // What cargo sets for this build script, and the outer build's flags and wrappers
    // (clippy's among them), must not leak in; registry and network settings may.
    const OUTER: [&str; 8] = [
        "CARGO_PKG_",
        "CARGO_CFG_",
        "CARGO_FEATURE_",
        "CARGO_MANIFEST_",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_",
        "CARGO_TARGET_",
        "RUSTC_",
    ];
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if OUTER.iter().any(|p| key.starts_with(p)) || key == "RUSTFLAGS" {
            cmd.env_remove(&*key);
        }
    }
    cmd.env(
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
        "-C target-feature=+crt-static",
    )
    .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
    .env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    cmd
}

/// `<outer target dir>/embedded-agent`: found from OUT_DIR, which is
/// `<target>[/<triple>]/<profile>/build/<pkg>-<hash>/out`.
fn nested_target_dir(out: &Path) -> PathBuf {
    let build = out
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .expect("OUT_DIR below a build directory");
    let profile_dir = build.parent().expect("profile directory");
    let base = profile_dir.parent().expect("target directory");
    base.join("embedded-agent")
}
