//! Images: named, sealed base layers in the block store, plus their metadata.
//!
//! A builder produces a root filesystem directory ([`rootfs`]); [`publish`] turns it
//! into an ext4 image, imports it as a sealed layer pinned by ref `image-<name>`, and
//! writes `<images>/<name>.json`. A build works in a temporary directory removed whatever
//! happens, so a failed build leaves no half image behind.

pub mod archive;
mod budget;
mod build;
mod builddir;
mod chain;
mod command;
pub mod dockerfile;
mod export;
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

pub use build::{BuildPlan, BuildSpec, BuildStep, Source};
use builddir::process_exists;
pub use builddir::{remove_stale_builds, BuildDir};
pub use export::Exported;
pub use fsck::check_layer;
pub use layers::{defaults_of, import_oci_layout, import_tarball, unpack_layers};
pub use unpack::UnpackError;

/// The index annotation naming an exported image as sandfork knows it (`app`, which an OCI
/// `ref.name` cannot tell from a tag), so an oci-archive imports back under its name.
pub const NAME_ANNOTATION: &str = "io.sandfork.image.name";

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
    /// Default user of the sandbox's processes (the OCI config's `User`).
    #[serde(default)]
    pub user: Option<String>,
    /// The OCI config's `Entrypoint` and `Cmd`: what `sandfork run IMAGE` starts when
    /// given no command.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    /// Ports the image declares (`80/tcp`), recorded only.
    #[serde(default)]
    pub exposed_ports: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Where a pulled or imported image came from: its canonical reference and manifest
    /// digest.
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub digest: Option<String>,
    /// The registry blobs (layer digests) a pulled image was made of: kept while it
    /// exists, so another image on the same base does not fetch it again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blobs: Vec<String>,
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
            user: self.user.clone(),
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

/// Checks an image name: a local name (1..=64 of `[a-z0-9._-]`, starting with a letter
/// or digit) or a registry reference (at most 255 of `[A-Za-z0-9._/:@-]`, starting with a
/// letter or digit, no `..`).
pub fn validate_name(name: &str) -> Result<()> {
    let ok = is_local_name(name)
        || ((1..=255).contains(&name.len())
            && name.as_bytes()[0].is_ascii_alphanumeric()
            && !name.contains("..")
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b)));
    if ok {
        Ok(())
    } else {
        Err(Error::Image(format!("bad image name {name:?}")))
    }
}

fn is_local_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// The file-system-safe key of an image name: the name itself when local, else
/// `ref-<hash of the reference>` (the record keeps the reference).
fn key(name: &str) -> String {
    use sha2::{Digest, Sha256};
    if is_local_name(name) {
        name.to_string()
    } else {
        let hash = format!("{:x}", Sha256::digest(name.as_bytes()));
        format!("ref-{}", &hash[..32])
    }
}

/// Where images of one data directory live: the block store and the metadata files.
pub struct Images {
    store: blockstore::Store,
    dir: PathBuf,
    limits: UnpackLimits,
}

/// What unpacking one image layer may take of the host: at most `max_bytes`, and never
/// the last `floor_bytes` of free space.
#[derive(Debug, Clone, Copy)]
pub struct UnpackLimits {
    pub max_bytes: u64,
    pub floor_bytes: u64,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        UnpackLimits {
            max_bytes: u64::MAX,
            floor_bytes: 0,
        }
    }
}

impl Images {
    pub fn new(store: blockstore::Store, dir: impl Into<PathBuf>) -> Self {
        Images {
            store,
            dir: dir.into(),
            limits: UnpackLimits::default(),
        }
    }

    /// These images, unpacking layers within `limits`.
    pub fn with_unpack_limits(mut self, limits: UnpackLimits) -> Self {
        self.limits = limits;
        self
    }

    pub(crate) fn limits(&self) -> UnpackLimits {
        self.limits
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
        self.dir.join(format!("{}.json", key(name)))
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

    /// Publishes image `name` made of OCI layers (tar blobs with their media types, bottom
    /// first), e.g. a pulled image's. Each layer becomes a block-store layer on top of
    /// the one below (see [`chain`]), so images that share their bottom layers share
    /// those layers' blocks, and a layer already here is not unpacked again. Nothing is
    /// left if any part fails.
    pub fn import_layers(
        &self,
        name: &str,
        layers: &[(PathBuf, String)],
        defaults: Defaults,
        progress: ProgressFn<'_>,
    ) -> Result<ImageMeta> {
        validate_name(name)?;
        // Short: the disk server's control socket lives below it.
        let work = BuildDir::new(&self.dir, "l")?;
        let (layer, size) = self.chain(layers, &work, progress)?;
        self.publish_layer(name, &layer, size, defaults)
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
        let work = BuildDir::new(&self.dir, &format!("{}-img", key(name)))?;
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
            user: defaults.user,
            entrypoint: defaults.entrypoint,
            cmd: defaults.cmd,
            exposed_ports: defaults.exposed_ports,
            labels: defaults.labels,
            source: defaults.source,
            digest: defaults.digest,
            blobs: defaults.blobs,
        };
        let work = BuildDir::new(&self.dir, &format!("{}-meta", key(name)))?;
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

/// Defaults an image gives its sandboxes, and what it records of its origin.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Defaults {
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub exposed_ports: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub source: Option<String>,
    pub digest: Option<String>,
    pub blobs: Vec<String>,
}

fn ref_name(image: &str) -> String {
    format!("image-{}", key(image))
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
