//! Root filesystem builders: busybox, Debian (debootstrap minbase), Python, extra packages.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::chroot::{run_logged, Chroot};
use super::{report, ProgressFn};
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

/// Fills `root` with busybox (static) and a minimal /etc.
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
    run_logged(
        Command::new("chroot")
            .arg(root)
            .args([BUSYBOX, "--install", "-s", "/bin"]),
    )?;
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

/// Fills `root` with a Debian minbase system. The debootstrap result is cached as a
/// tarball under [`cache_dir`], so later builds only unpack it.
pub fn debian(root: &Path, progress: ProgressFn<'_>) -> Result<()> {
    let cache = cache_dir().join("debootstrap");
    let tarball = cache.join(format!("{DEBIAN_SUITE}-minbase.tar"));
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
    )
}

fn bootstrap_into_cache(cache: &Path, tarball: &Path, progress: ProgressFn<'_>) -> Result<()> {
    let mirror = debian_mirror()?;
    report(
        progress,
        "debootstrap",
        format!("{DEBIAN_SUITE} minbase from {mirror}"),
    );
    let work = super::BuildDir::new(cache, "debootstrap")?;
    let target = work.path().join("root");
    run_logged(
        Command::new("debootstrap")
            .args(["--variant=minbase", DEBIAN_SUITE])
            .arg(&target)
            .arg(&mirror),
    )?;
    let _ = std::fs::remove_dir_all(target.join("var/cache/apt/archives"));
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

/// Installs Debian packages into `root` with apt-get inside a chroot.
pub fn apt_install(root: &Path, packages: &[String], progress: ProgressFn<'_>) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    validate_packages(packages)?;
    report(progress, "apt", packages.join(" "));
    let chroot = Chroot::enter(root)?;
    chroot.run(&["apt-get", "update", "-qq"])?;
    let mut install = vec!["apt-get", "install", "-y", "-qq", "--no-install-recommends"];
    install.extend(packages.iter().map(String::as_str));
    chroot.run(&install)?;
    chroot.run(&["apt-get", "clean"])?;
    let lists = root.join("var/lib/apt/lists");
    let _ = std::fs::remove_dir_all(&lists);
    std::fs::create_dir_all(lists.join("partial")).at(&lists)
}

/// Installs Python packages into `root`'s system Python with pip inside a chroot.
pub fn pip_install(root: &Path, packages: &[String], progress: ProgressFn<'_>) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    validate_packages(packages)?;
    report(progress, "pip", packages.join(" "));
    let chroot = Chroot::enter(root)?;
    let mut cmd = vec![
        "python3",
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--break-system-packages",
    ];
    cmd.extend(packages.iter().map(String::as_str));
    chroot.run(&cmd)
}

/// The `python` image: Debian plus Python 3 with pip, venv and numpy.
pub fn python(root: &Path, progress: ProgressFn<'_>) -> Result<()> {
    debian(root, progress)?;
    let pkgs: Vec<String> = PYTHON_PACKAGES.iter().map(|s| s.to_string()).collect();
    apt_install(root, &pkgs, progress)
}

/// Package names must look like names, not options or shell.
fn validate_packages(packages: &[String]) -> Result<()> {
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
