//! Root filesystem builders: busybox, Debian (debootstrap minbase), Python, extra packages.
//!
//! Nothing here runs a program of the image being built, on the host or in a chroot: the
//! host only copies files and unpacks packages (`debootstrap --foreign`). Whatever must
//! run inside the image — Debian's second stage with its maintainer scripts, apt, pip —
//! is returned as [`BuildStep`]s that the runtime runs in a build sandbox (runc, seccomp,
//! no capabilities beyond a sandbox's, its own network policy).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::command::run_logged;
use super::{report, BuildStep, ProgressFn};
use crate::error::{Error, IoContext, Result};

/// Debian release the `debian` and `python` images are built from.
pub const DEBIAN_SUITE: &str = "bookworm";

/// Debian packages of the `python` image.
/// (`python-is-python3` makes `python` work too, as most documentation assumes.)
pub const PYTHON_PACKAGES: &[&str] = &[
    "python3",
    "python3-pip",
    "python3-venv",
    "python3-numpy",
    "python-is-python3",
];

const BUSYBOX: &str = "/bin/busybox";

/// The cache directory: `$SANDFORK_CACHE`, else `/var/cache/sandfork`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("SANDFORK_CACHE").map_or_else(|| "/var/cache/sandfork".into(), PathBuf::from)
}

/// Fills `root` with busybox (static), a link per applet, and a minimal /etc.
pub fn busybox(root: &Path, progress: ProgressFn<'_>) -> Result<()> {
    report(progress, "busybox", "installing applets");
    for d in [
        "bin", "etc", "tmp", "root", "proc", "sys", "dev", "run", "var/tmp", "home",
    ] {
        let p = root.join(d);
        std::fs::create_dir_all(&p).at(&p)?;
    }
    set_mode(&root.join("tmp"), 0o1777)?;
    set_mode(&root.join("var/tmp"), 0o1777)?;
    set_mode(&root.join("root"), 0o700)?;
    let bin = root.join("bin/busybox");
    std::fs::copy(BUSYBOX, &bin).at(&bin)?;
    // The host's own busybox lists its applets; the links are made here, not by running
    // the copy inside the new root.
    let list = Command::new(BUSYBOX).arg("--list").output().at(BUSYBOX)?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet.is_empty() || applet.contains('/') || applet == "busybox" {
            continue;
        }
        let link = root.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", &link).at(&link)?;
        }
    }
    minimal_etc(root)
}

fn minimal_etc(root: &Path) -> Result<()> {
    let files = [
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        ),
        ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
        ("etc/hostname", "sandbox\n"),
        ("etc/hosts", "127.0.0.1 localhost\n::1 localhost\n"),
        ("etc/resolv.conf", ""),
    ];
    for (path, text) in files {
        let p = root.join(path);
        std::fs::write(&p, text).at(&p)?;
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).at(path)
}

/// The Debian mirror this machine's apt uses (from its `deb` entries, either format).
pub fn debian_mirror() -> Result<String> {
    let mut text = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for e in entries.flatten() {
            text += &std::fs::read_to_string(e.path()).unwrap_or_default();
        }
    }
    text.split_whitespace()
        .find(|w| w.starts_with("http") && w.trim_end_matches('/').ends_with("/debian"))
        .map(str::to_string)
        .ok_or_else(|| {
            Error::Image(
                "no Debian mirror is configured in /etc/apt/sources.list or sources.list.d".into(),
            )
        })
}

/// Fills `root` with a Debian minbase system unpacked but not configured
/// (`debootstrap --foreign`); returns the step that configures it inside a sandbox. The
/// unpacked tree is cached as a tarball under [`cache_dir`], so later builds only unpack
/// it.
pub fn debian(root: &Path, progress: ProgressFn<'_>) -> Result<Vec<BuildStep>> {
    let cache = cache_dir().join("debootstrap");
    let tarball = cache.join(format!("{DEBIAN_SUITE}-minbase-foreign.tar"));
    if !tarball.exists() {
        std::fs::create_dir_all(&cache).at(&cache)?;
        bootstrap_into_cache(&cache, &tarball, progress)?;
    }
    report(progress, "unpack", tarball.display().to_string());
    run_logged(
        Command::new("tar")
            .arg("-xpf")
            .arg(&tarball)
            .arg("--numeric-owner")
            .arg("-C")
            .arg(root),
    )?;
    // The first stage leaves /proc a symlink to the host's; the runtime mounts a procfs
    // only on a plain directory.
    for dir in ["proc", "sys"] {
        let p = root.join(dir);
        if p.symlink_metadata().is_ok_and(|m| !m.is_dir()) {
            std::fs::remove_file(&p).at(&p)?;
        }
        std::fs::create_dir_all(&p).at(&p)?;
    }
    // Inside a sandbox there is no CAP_MKNOD and the disk is nodev: `container=lxc` tells
    // debootstrap to use the /dev it is given rather than make device nodes.
    Ok(vec![BuildStep {
        what: "debootstrap --second-stage".into(),
        argv: [
            "/bin/sh",
            "-c",
            "container=lxc exec /debootstrap/debootstrap --second-stage",
        ]
        .map(String::from)
        .to_vec(),
        network: false,
    }])
}

fn bootstrap_into_cache(cache: &Path, tarball: &Path, progress: ProgressFn<'_>) -> Result<()> {
    let mirror = debian_mirror()?;
    report(
        progress,
        "debootstrap",
        format!("{DEBIAN_SUITE} minbase from {mirror} (download and unpack only)"),
    );
    let work = super::BuildDir::new(cache, "debootstrap")?;
    let target = work.path().join("root");
    run_logged(
        Command::new("debootstrap")
            .args(["--foreign", "--variant=minbase", DEBIAN_SUITE])
            .arg(&target)
            .arg(&mirror),
    )?;
    let partial = work.path().join("root.tar");
    run_logged(
        Command::new("tar")
            .arg("-cpf")
            .arg(&partial)
            .arg("--numeric-owner")
            .arg("-C")
            .arg(&target)
            .arg("."),
    )?;
    std::fs::rename(&partial, tarball).at(tarball)
}

/// The step installing Debian packages with apt-get, inside the build sandbox.
pub fn apt_step(packages: &[String]) -> Option<BuildStep> {
    if packages.is_empty() {
        return None;
    }
    let list = packages.join(" ");
    let script = format!(
        "apt-get update -qq && apt-get install -y -qq --no-install-recommends {list} && \
         apt-get clean && rm -rf /var/lib/apt/lists/* && mkdir -p /var/lib/apt/lists/partial"
    );
    Some(BuildStep {
        what: format!("apt: {list}"),
        argv: vec!["/bin/sh".into(), "-c".into(), script],
        network: true,
    })
}

/// The step installing Python packages into the system Python with pip, inside the build
/// sandbox.
pub fn pip_step(packages: &[String]) -> Option<BuildStep> {
    if packages.is_empty() {
        return None;
    }
    let mut argv: Vec<String> = [
        "python3",
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--break-system-packages",
    ]
    .map(String::from)
    .to_vec();
    argv.extend(packages.iter().cloned());
    Some(BuildStep {
        what: format!("pip: {}", packages.join(" ")),
        argv,
        network: true,
    })
}

/// The `python` image: Debian plus Python 3 with pip, venv and numpy.
pub fn python(root: &Path, progress: ProgressFn<'_>) -> Result<Vec<BuildStep>> {
    let mut steps = debian(root, progress)?;
    let pkgs: Vec<String> = PYTHON_PACKAGES.iter().map(|s| s.to_string()).collect();
    steps.extend(apt_step(&pkgs));
    Ok(steps)
}

/// Package names must look like names, not options or shell.
pub fn validate_packages(packages: &[String]) -> Result<()> {
    let ok = |p: &String| {
        !p.is_empty()
            && !p.starts_with('-')
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._+-=<>:~[],".contains(&b))
    };
    match packages.iter().find(|p| !ok(p)) {
        Some(bad) => Err(Error::Image(format!("bad package name {bad:?}"))),
        None => Ok(()),
    }
}
