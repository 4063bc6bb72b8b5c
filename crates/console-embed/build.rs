//! Builds the web console (`console/`, a Vite project) and lists its files for
//! `include_bytes!`, so that the daemon serves it from its own binary.
//!
//! `npm ci` installs exactly what `console/package-lock.json` names, then `vite build`
//! writes the assets into `OUT_DIR`. `SANDFORK_EMBED_CONSOLE=/path/to/dist` embeds a
//! console built elsewhere instead (packagers).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let console = manifest.join("../../console");
    println!("cargo:rerun-if-env-changed=SANDFORK_EMBED_CONSOLE");
    let dist = match std::env::var_os("SANDFORK_EMBED_CONSOLE") {
        Some(prebuilt) => PathBuf::from(prebuilt),
        None => {
            for watched in [
                "src",
                "index.html",
                "package.json",
                "package-lock.json",
                "vite.config.ts",
                "tsconfig.json",
            ] {
                println!("cargo:rerun-if-changed={}", console.join(watched).display());
            }
            let dist = out.join("ui");
            build(&console, &dist);
            dist
        }
    };
    let mut files = Vec::new();
    collect(&dist, &dist, &mut files);
    files.sort();
    let mut listing = String::from("&[\n");
    for (name, path) in &files {
        let _ = writeln!(
            listing,
            "    ({name:?}, include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    listing.push(']');
    std::fs::write(out.join("assets.rs"), listing).expect("write assets.rs");
}

fn build(console: &Path, dist: &Path) {
    if !console.join("node_modules/.package-lock.json").exists()
        || modified(&console.join("package-lock.json"))
            > modified(&console.join("node_modules/.package-lock.json"))
    {
        run(Command::new("npm")
            .args([
                "ci",
                "--prefer-offline",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ])
            .current_dir(console));
    }
    run(Command::new("node_modules/.bin/tsc")
        .args(["--noEmit"])
        .current_dir(console));
    run(Command::new("node_modules/.bin/vite")
        .args(["build", "--logLevel", "warn", "--emptyOutDir", "--outDir"])
        .arg(dist)
        .current_dir(console));
}

fn modified(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(std::time::UNIX_EPOCH)
}

fn run(command: &mut Command) {
    let status = command.status().unwrap_or_else(|e| {
        panic!("cannot run {command:?} (Node.js 20 and npm are needed to build the console): {e}")
    });
    assert!(status.success(), "{command:?} failed: {status}");
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    for entry in std::fs::read_dir(dir).expect("read the console's build") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect(root, &path, files);
        } else {
            let name = path
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            files.push((name, path));
        }
    }
}
