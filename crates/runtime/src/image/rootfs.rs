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

/// Debian packages the `browser` image adds to the `python` one: Chromium (headless) and
/// the fonts pages need to lay out, and what Playwright's driver (node) links against.
pub const BROWSER_PACKAGES: &[&str] = &[
    "chromium",
    "fonts-liberation",
    "fonts-dejavu-core",
    "libatomic1",
];

/// Python packages of the `browser` image: Playwright drives the image's Chromium over CDP
/// (`chromium.launch(executable_path="/usr/bin/chromium")`; Playwright's own browser
/// downloads are not used).
pub const BROWSER_PIP: &[&str] = &["playwright>=1.40,<2"];

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

/// Where a build's copy of the host's pip CA bundle lives in the image while it builds
/// (removed by [`cleanup_step`]).
pub const BUILD_DIR_IN_IMAGE: &str = "etc/sandfork-build";

/// The host's pip settings a build sandbox's pip needs to use the same package index:
/// `index-url`, `extra-index-url` and `trusted-host` as given, and `cert` (a CA bundle the
/// index's proxy may need) copied into the image under [`BUILD_DIR_IN_IMAGE`]. Read from
/// pip's configuration files and `PIP_*` variables, later ones winning, as pip does.
fn host_pip_args(root: &Path) -> Result<Vec<String>> {
    let mut settings = std::collections::BTreeMap::new();
    for file in pip_config_files() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        settings.extend(pip_settings(&text));
    }
    for key in ["index-url", "extra-index-url", "trusted-host", "cert"] {
        let var = format!("PIP_{}", key.replace('-', "_").to_uppercase());
        if let Some(v) = std::env::var(&var).ok().filter(|v| !v.is_empty()) {
            settings.insert(key.to_string(), v);
        }
    }
    let mut args = Vec::new();
    for (key, value) in settings {
        if key == "cert" {
            let inside = Path::new("/").join(BUILD_DIR_IN_IMAGE).join("pip-ca.pem");
            let dir = root.join(BUILD_DIR_IN_IMAGE);
            std::fs::create_dir_all(&dir).at(&dir)?;
            let target = dir.join("pip-ca.pem");
            std::fs::copy(&value, &target).at(Path::new(&value))?;
            args.push(format!("--cert={}", inside.display()));
        } else {
            args.extend(value.split_whitespace().map(|v| format!("--{key}={v}")));
        }
    }
    Ok(args)
}

fn pip_config_files() -> Vec<PathBuf> {
    let mut files = vec![
        PathBuf::from("/etc/xdg/pip/pip.conf"),
        PathBuf::from("/etc/pip.conf"),
    ];
    if let Some(home) = std::env::var_os("HOME") {
        let home = PathBuf::from(home);
        files.push(home.join(".pip/pip.conf"));
        files.push(home.join(".config/pip/pip.conf"));
    }
    files.extend(std::env::var_os("PIP_CONFIG_FILE").map(PathBuf::from));
    files
}

/// The settings of a pip configuration file's `[global]` and `[install]` sections that
/// say where packages come from. (Hand-parsed: four keys of an INI file.)
fn pip_settings(text: &str) -> Vec<(String, String)> {
    let (mut section, mut out) = (String::new(), Vec::new());
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
        } else if let Some((key, value)) = line.split_once('=') {
            let key = key.trim().replace('_', "-");
            let wanted = ["index-url", "extra-index-url", "trusted-host", "cert"];
            if (section == "global" || section == "install") && wanted.contains(&key.as_str()) {
                out.push((key, value.trim().to_string()));
            }
        }
    }
    out
}

/// The step installing Python packages into the system Python with pip, inside the build
/// sandbox, from the host's package index (see [`host_pip_args`]).
pub fn pip_step(root: &Path, packages: &[String]) -> Result<Option<BuildStep>> {
    if packages.is_empty() {
        return Ok(None);
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
    argv.extend(host_pip_args(root)?);
    argv.push("--".into());
    argv.extend(packages.iter().cloned());
    Ok(Some(BuildStep {
        what: format!("pip: {}", packages.join(" ")),
        argv,
        network: true,
    }))
}

/// The last step of a build that ran pip: removes what the build put in the image for it.
pub fn cleanup_step(root: &Path) -> Option<BuildStep> {
    root.join(BUILD_DIR_IN_IMAGE).exists().then(|| BuildStep {
        what: "cleanup".into(),
        argv: vec!["rm".into(), "-rf".into(), format!("/{BUILD_DIR_IN_IMAGE}")],
        network: false,
    })
}

/// The `python` image: Debian plus Python 3 with pip, venv and numpy.
pub fn python(root: &Path, progress: ProgressFn<'_>) -> Result<Vec<BuildStep>> {
    let mut steps = debian(root, progress)?;
    let pkgs: Vec<String> = PYTHON_PACKAGES.iter().map(|s| s.to_string()).collect();
    steps.extend(apt_step(&pkgs));
    Ok(steps)
}

/// The `browser` image: the `python` image plus Chromium and Playwright.
pub fn browser(root: &Path, progress: ProgressFn<'_>) -> Result<Vec<BuildStep>> {
    let mut steps = python(root, progress)?;
    let owned = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    steps.extend(apt_step(&owned(BROWSER_PACKAGES)));
    steps.extend(pip_step(root, &owned(BROWSER_PIP))?);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_settings_come_from_global_and_install_only() {
        let text = "[global]\ncert = /etc/ssl/ca.pem\nindex_url=https://idx/simple\ntimeout = 3\n\
                    [install]\ntrusted-host = idx\n[freeze]\nindex-url = nope\n";
        assert_eq!(
            pip_settings(text),
            vec![
                ("cert".into(), "/etc/ssl/ca.pem".into()),
                ("index-url".into(), "https://idx/simple".into()),
                ("trusted-host".into(), "idx".into()),
            ]
        );
    }

    #[test]
    fn the_pip_step_ends_its_options_before_the_packages() {
        let root = tempfile::tempdir().unwrap();
        let step = pip_step(root.path(), &["numpy==2.0".into()])
            .unwrap()
            .unwrap();
        let dashes = step.argv.iter().position(|a| a == "--").unwrap();
        assert_eq!(step.argv[dashes + 1..], ["numpy==2.0".to_string()]);
        assert!(pip_step(root.path(), &[]).unwrap().is_none());
    }
}
