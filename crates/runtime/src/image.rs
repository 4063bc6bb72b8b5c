//! Images: named, sealed base layers in the block store, plus their metadata.
//!
//! A builder produces a root filesystem directory ([`rootfs`]); [`publish`] turns it
//! into an ext4 image, imports it as a sealed layer pinned by ref `image-<name>`, and
//! writes `<images>/<name>.json`. A build works in a temporary directory removed whatever
//! happens, so a failed build leaves no half image behind.

mod command;
mod fsck;
mod layers;
pub mod rootfs;
pub(crate) mod unpack;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::spec::ImageRef;

pub use fsck::check_layer;
pub use layers::{import_oci_layout, import_tarball};
pub use unpack::UnpackError;

/// Image metadata, stored as `<images dir>/<name>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageMeta {
    pub name: String,
    /// Sealed base layer id in the block store.
    pub layer: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// Size of the root disk image, in bytes.
    pub size: u64,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default = "root_dir")]
    pub cwd: String,
}

fn root_dir() -> String {
    "/".into()
}

impl ImageMeta {
    /// What a sandbox spec needs of this image.
    pub fn to_ref(&self) -> ImageRef {
        ImageRef {
            name: self.name.clone(),
            layer: self.layer.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
        }
    }
}

/// One progress report of a build.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Short stage name, e.g. "debootstrap", "mkfs", "import".
    pub stage: &'static str,
    pub detail: String,
}

/// Receives progress reports.
pub type ProgressFn<'a> = &'a (dyn Fn(Progress) + Sync);

pub(crate) fn report(progress: ProgressFn<'_>, stage: &'static str, detail: impl Into<String>) {
    progress(Progress {
        stage,
        detail: detail.into(),
    });
}

/// Checks an image name: 1..=64 of `[a-z0-9._-]`, starting with a letter or digit.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::Image(format!("bad image name {name:?}")))
    }
}

/// A temporary build directory under `parent`, removed (after unmounting anything left
/// below it) when dropped.
pub struct BuildDir {
    path: PathBuf,
    serial: u64,
}

impl BuildDir {
    /// A fresh directory `.build-<name>-<pid>-<n>`: concurrent builds never share one.
    pub fn new(parent: &Path, name: &str) -> Result<BuildDir> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        std::fs::create_dir_all(parent).at(parent)?;
        loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = parent.join(format!(".build-{name}-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(BuildDir { path, serial: n }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(path, e)),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A number no other build directory of this process has.
    pub fn serial(&self) -> u64 {
        self.serial
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        // Never recurse into something still mounted below (a build chroot's /dev).
        if !mounts_below(&self.path).is_empty() {
            for m in mounts_below(&self.path).iter().rev() {
                let _ = Command::new("umount").arg("-l").arg(m).status();
            }
            if !mounts_below(&self.path).is_empty() {
                return;
            }
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes build directories under `dir` whose building process is gone (a daemon killed
/// mid-build cannot drop its [`BuildDir`]); builds of live processes are kept. Returns
/// the directories removed.
pub fn remove_stale_builds(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if build_owner(&name).is_some_and(|pid| !process_exists(pid)) {
            let path = e.path();
            tracing::info!(path = %path.display(), "removing an interrupted image build");
            // Its commands (a chroot, mkfs, debootstrap) outlive the killed daemon and
            // would go on writing into the directory while it is removed.
            kill_processes_in(&path);
            drop(BuildDir {
                path: path.clone(),
                serial: 0,
            });
            removed.push(path);
        }
    }
    removed
}

/// Kills every process working in `dir` (its root, working directory or command line
/// there) and waits, briefly, for them to be gone.
fn kill_processes_in(dir: &Path) {
    for _ in 0..100 {
        let found = processes_in(dir);
        if found.is_empty() {
            return;
        }
        for pid in found {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Processes rooted in, working in, or naming `dir` on their command line.
fn processes_in(dir: &Path) -> Vec<i32> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    let text = dir.to_string_lossy().into_owned();
    all.flatten()
        .filter(|p| p.pid != std::process::id() as i32)
        .filter(|p| {
            let inside = |link: procfs::ProcResult<std::path::PathBuf>| link.is_ok_and(|l| l.starts_with(dir));
            inside(p.root())
                || inside(p.cwd())
                || p.cmdline().is_ok_and(|args| args.iter().any(|a| a.contains(&text)))
        })
        .map(|p| p.pid)
        .collect()
}

fn process_exists(pid: u32) -> bool {
    procfs::process::Process::new(pid as i32).is_ok()
}

/// The process id in a build directory's name (`.build-<name>-<pid>-<n>`).
fn build_owner(dir_name: &str) -> Option<u32> {
    let rest = dir_name.strip_prefix(".build-")?;
    let mut parts = rest.rsplitn(3, '-');
    parts.next()?.parse::<u64>().ok()?;
    let pid = parts.next()?.parse().ok()?;
    parts.next().filter(|n| !n.is_empty()).map(|_| pid)
}

/// Mount points at or below `dir`, from /proc/self/mountinfo.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect()
}

/// Where images of one data directory live: the block store and the metadata files.
pub struct Images {
    store: blockstore::Store,
    dir: PathBuf,
}

impl Images {
    pub fn new(store: blockstore::Store, dir: impl Into<PathBuf>) -> Self {
        Images {
            store,
            dir: dir.into(),
        }
    }

    pub fn store(&self) -> &blockstore::Store {
        &self.store
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes what builds interrupted by a crash left: their work directories here and
    /// in the debootstrap cache. Returns the directories removed.
    pub fn remove_stale_builds(&self) -> Vec<PathBuf> {
        let mut removed = remove_stale_builds(&self.dir);
        removed.extend(remove_stale_builds(
            &rootfs::cache_dir().join("debootstrap"),
        ));
        // The pins of builds whose process is gone (`build-<pid>-<n>`).
        for (name, _) in self.store.list_refs().unwrap_or_default() {
            let owner = name
                .strip_prefix("build-")
                .and_then(|r| r.split('-').next());
            if owner
                .and_then(|p| p.parse().ok())
                .is_some_and(|pid| !process_exists(pid))
            {
                let _ = self.store.delete_ref(&name);
            }
        }
        removed
    }

    fn meta_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    /// The image named `name`.
    pub fn get(&self, name: &str) -> Result<ImageMeta> {
        validate_name(name)?;
        let path = self.meta_path(name);
        let bytes = std::fs::read(&path).at(&path)?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Record { path, source })
    }

    /// All images, by name; unreadable records are skipped.
    pub fn list(&self) -> Result<Vec<ImageMeta>> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(n) = name.strip_suffix(".json") else {
                continue;
            };
            match self.get(n) {
                Ok(meta) => out.push(meta),
                // One unreadable record must not hide the other images.
                Err(e) => tracing::warn!(image = n, error = %e, "skipping image record"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes an image's metadata and unpins its layer (freed by the store's gc once no
    /// disk uses it).
    pub fn remove(&self, name: &str) -> Result<()> {
        self.get(name)?;
        let path = self.meta_path(name);
        std::fs::remove_file(&path).at(&path)?;
        self.store
            .delete_ref(&ref_name(name))
            .map_err(|e| Error::Disk(Box::new(e)))
    }

    /// Turns a finished root filesystem into image `name` (replacing any older one).
    pub fn publish(
        &self,
        name: &str,
        rootfs: &Path,
        defaults: Defaults,
        progress: ProgressFn<'_>,
    ) -> Result<ImageMeta> {
        validate_name(name)?;
        let (layer, size) = self.import_rootfs(name, rootfs, &ref_name(name), progress)?;
        let meta = self.publish_layer(name, &layer, size, defaults);
        if meta.is_err() && !self.meta_path(name).exists() {
            // A new image without its metadata is no image: unpin its layer.
            let _ = self.store.delete_ref(&ref_name(name));
        }
        meta
    }

    /// Makes an ext4 image of `rootfs` and imports it as a sealed layer pinned by `pin`;
    /// returns the layer and the disk size.
    fn import_rootfs(
        &self,
        name: &str,
        rootfs: &Path,
        pin: &str,
        progress: ProgressFn<'_>,
    ) -> Result<(blockstore::LayerId, u64)> {
        let work = BuildDir::new(&self.dir, &format!("{name}-img"))?;
        let image = work.path().join("root.ext4");
        let size = ext4_size(rootfs)?;
        report(progress, "mkfs", format!("{} MiB ext4", size >> 20));
        disk::build_ext4_image(rootfs, &image, size).map_err(|e| Error::Disk(Box::new(e)))?;
        report(progress, "import", "sealing base layer");
        let layer = self
            .store
            .import_image_as(&image, pin)
            .map_err(|e| Error::Disk(Box::new(e)))?;
        Ok((layer, size))
    }

    /// Publishes sealed layer `layer` (a disk of `size` bytes) as image `name`: pins it as
    /// the image's layer and writes its metadata atomically.
    pub fn publish_layer(
        &self,
        name: &str,
        layer: &blockstore::LayerId,
        size: u64,
        defaults: Defaults,
    ) -> Result<ImageMeta> {
        validate_name(name)?;
        self.store
            .set_ref(&ref_name(name), layer)
            .map_err(|e| Error::Disk(Box::new(e)))?;
        let meta = ImageMeta {
            name: name.into(),
            layer: layer.to_string(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            size,
            env: defaults.env,
            cwd: defaults.cwd.unwrap_or_else(root_dir),
        };
        let work = BuildDir::new(&self.dir, &format!("{name}-meta"))?;
        let (path, tmp) = (self.meta_path(name), work.path().join("meta.json"));
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(&meta).expect("meta serialises"),
        )
        .at(&tmp)
        .and_then(|()| std::fs::rename(&tmp, &path).at(&path))?;
        Ok(meta)
    }
}

/// What to build an image from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "path", rename_all = "snake_case")]
pub enum Source {
    /// busybox-static and a minimal /etc; builds in seconds.
    Busybox,
    /// Debian minbase (debootstrap).
    Debian,
    /// Debian with python3, pip, venv and numpy.
    Python,
    /// `Python` plus headless Chromium and Playwright.
    Browser,
    /// A root filesystem tarball (`docker export` format), optionally gzip-compressed.
    Tarball(PathBuf),
    /// An OCI image layout directory.
    OciLayout(PathBuf),
}

/// A user-defined image: a source plus extra packages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildSpec {
    pub name: String,
    pub source: Source,
    #[serde(default)]
    pub apt: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
}

/// One command of a build that runs inside a build sandbox (never on the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildStep {
    /// What it does, for progress and errors.
    pub what: String,
    pub argv: Vec<String>,
    /// Whether it needs the package mirrors (the build sandbox gets internet access).
    pub network: bool,
}

/// A build as the host prepares it: a base layer made without running anything of the
/// image, then the steps that must run inside a sandbox booted from that layer (package
/// managers, maintainer scripts). `Images::finish` publishes the result.
#[derive(Debug)]
pub struct BuildPlan {
    pub name: String,
    pub base: blockstore::LayerId,
    pub size: u64,
    pub defaults: Defaults,
    pub steps: Vec<BuildStep>,
    /// Pins `base` until the build ends.
    pin: String,
}

impl Images {
    /// Builds and publishes an image whose build needs no step inside a sandbox (it has
    /// none: otherwise the runtime runs them, see [`Images::prepare`]). Nothing is left
    /// behind if any part fails.
    pub fn build(&self, spec: &BuildSpec, progress: ProgressFn<'_>) -> Result<ImageMeta> {
        let plan = self.prepare(spec, progress)?;
        if !plan.steps.is_empty() {
            let steps: Vec<&str> = plan.steps.iter().map(|s| s.what.as_str()).collect();
            let e = Error::Image(format!(
                "these steps need a build sandbox: {}",
                steps.join(", ")
            ));
            self.abandon(plan);
            return Err(e);
        }
        let (layer, size) = (plan.base.clone(), plan.size);
        let meta = self.finish(plan, &layer, size)?;
        report(progress, "done", meta.layer.clone());
        Ok(meta)
    }

    /// The host's part of a build: the base root filesystem (busybox applets linked, a
    /// Debian system unpacked but not configured, a tarball or OCI layout unpacked — no
    /// program of the image is run), imported as a pinned layer; and the steps left.
    pub fn prepare(&self, spec: &BuildSpec, progress: ProgressFn<'_>) -> Result<BuildPlan> {
        validate_name(&spec.name)?;
        rootfs::validate_packages(&spec.apt)?;
        rootfs::validate_packages(&spec.pip)?;
        let work = BuildDir::new(&self.dir, &spec.name)?;
        let root = work.path().join("rootfs");
        std::fs::create_dir(&root).at(&root)?;
        let mut defaults = Defaults::default();
        let mut steps = Vec::new();
        match &spec.source {
            Source::Busybox => rootfs::busybox(&root, progress)?,
            Source::Debian => steps.extend(rootfs::debian(&root, progress)?),
            Source::Python => steps.extend(rootfs::python(&root, progress)?),
            Source::Browser => steps.extend(rootfs::browser(&root, progress)?),
            Source::Tarball(t) => import_tarball(t, &root, progress)?,
            Source::OciLayout(l) => defaults = import_oci_layout(l, &root, progress)?,
        }
        steps.extend(rootfs::apt_step(&spec.apt));
        steps.extend(rootfs::pip_step(&root, &spec.pip)?);
        steps.extend(rootfs::cleanup_step(&root));
        let pin = format!("build-{}-{}", std::process::id(), work.serial());
        let (base, size) = self.import_rootfs(&spec.name, &root, &pin, progress)?;
        Ok(BuildPlan {
            name: spec.name.clone(),
            base,
            size,
            defaults,
            steps,
            pin,
        })
    }

    /// Publishes `layer` (what the steps made of the plan's base, or the base itself) as
    /// the plan's image and drops the plan's pin.
    pub fn finish(
        &self,
        plan: BuildPlan,
        layer: &blockstore::LayerId,
        size: u64,
    ) -> Result<ImageMeta> {
        let meta = self.publish_layer(&plan.name, layer, size, plan.defaults.clone());
        self.abandon(plan);
        meta
    }

    /// Drops a plan's pin (its layers go at the next garbage collection).
    pub fn abandon(&self, plan: BuildPlan) {
        let _ = self.store.delete_ref(&plan.pin);
    }
}

/// Defaults an image gives its sandboxes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Defaults {
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
}

fn ref_name(image: &str) -> String {
    format!("image-{image}")
}

/// Disk size for a root filesystem: its contents plus half again and 64 MiB of room,
/// rounded to MiB. Sandboxes that need more room ask for a larger `disk_mb`.
fn ext4_size(rootfs: &Path) -> Result<u64> {
    let out = Command::new("du")
        .args(["-sxb", "--apparent-size"])
        .arg(rootfs)
        .output()
        .at(rootfs)?;
    let used: u64 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Image("cannot measure the root filesystem".into()))?;
    Ok((used + used / 2 + (64 << 20)).div_ceil(1 << 20) << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_dir_names_give_their_owner() {
        assert_eq!(build_owner(".build-py-12-0"), Some(12));
        assert_eq!(build_owner(".build-my-img-img-345-7"), Some(345));
        assert_eq!(build_owner(".build-12-0"), None);
        assert_eq!(build_owner("py.json"), None);
        assert_eq!(build_owner(".build-py-x-0"), None);
    }

    #[test]
    fn only_builds_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let live = BuildDir::new(dir.path(), "live").unwrap();
        // Above the kernel's pid limit (2^22), so no process can own it.
        let dead = dir.path().join(".build-dead-img-99999999-0");
        std::fs::create_dir_all(dead.join("rootfs/bin")).unwrap();
        std::fs::write(dir.path().join("dead.json"), "{}").unwrap();
        assert_eq!(remove_stale_builds(dir.path()), vec![dead.clone()]);
        assert!(!dead.exists());
        assert!(live.path().exists());
        assert!(dir.path().join("dead.json").exists());
    }

    #[test]
    fn commands_still_working_in_a_stale_build_are_killed_first() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dir.path().join(".build-dead-99999999-0");
        std::fs::create_dir_all(dead.join("rootfs")).unwrap();
        // Like an orphaned build command: keeps writing into the directory.
        let script = "while :; do touch f$RANDOM; sleep 0.01; done";
        let mut child = Command::new("sh")
            .args(["-c", script])
            .current_dir(dead.join("rootfs"))
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(remove_stale_builds(dir.path()), vec![dead.clone()]);
        let status = child.wait().unwrap();
        assert!(!status.success(), "killed");
        assert!(!dead.exists());
    }
}
