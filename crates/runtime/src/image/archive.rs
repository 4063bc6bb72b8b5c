//! Image archives, unpacked: a `docker save` tarball (docker-archive: `manifest.json`,
//! a config and layer tars) or an OCI image layout (`oci-layout`, `index.json`, blobs;
//! also an oci-archive, which is a layout in a tar). What comes out of an archive is
//! hostile: every path is taken only inside the archive and never through a symlink,
//! every OCI blob must match its digest and every docker-archive layer the config's
//! `diff_ids`, before anything is unpacked.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Component, Path, PathBuf};

use oci_spec::image::{Arch, ImageConfiguration, Os};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{defaults_of, Defaults};
use crate::error::{Error, IoContext, Result};

/// The image an archive holds, ready for [`super::Images::import_layers`].
#[derive(Debug)]
pub struct ArchiveImage {
    /// Layer tars (gzip or not) and their media types, bottom first.
    pub layers: Vec<(PathBuf, String)>,
    pub defaults: Defaults,
    /// The name the archive gives it (`RepoTags`, or an OCI `ref.name` that is a full
    /// reference), if any.
    pub name: Option<String>,
}

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::Image(format!("image archive: {msg}"))
}

/// Reads the unpacked archive at `dir`.
pub fn read_archive(dir: &Path) -> Result<ArchiveImage> {
    if inside(dir, "index.json").is_ok() {
        read_oci(dir)
    } else if inside(dir, "manifest.json").is_ok() {
        read_docker(dir)
    } else {
        Err(bad(
            "neither an OCI layout (index.json) nor a docker-archive (manifest.json)",
        ))
    }
}

/// `rel` inside `dir`: relative, normal, and no component a symlink.
fn inside(dir: &Path, rel: &str) -> Result<PathBuf> {
    let mut path = dir.to_path_buf();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(p) => path.push(p),
            Component::CurDir => {}
            _ => return Err(bad(format!("path {rel:?} leaves the archive"))),
        }
        let m = std::fs::symlink_metadata(&path).map_err(|_| bad(format!("{rel} is missing")))?;
        if m.file_type().is_symlink() {
            return Err(bad(format!("{rel} is or passes through a symlink")));
        }
    }
    Ok(path)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let meta = std::fs::metadata(path).at(path)?;
    if meta.len() > 16 << 20 {
        return Err(bad(format!(
            "{} is too large for a manifest",
            path.display()
        )));
    }
    let bytes = std::fs::read(path).at(path)?;
    serde_json::from_slice(&bytes).map_err(|source| Error::Record {
        path: path.into(),
        source,
    })
}

fn sha256_of(reader: impl Read, path: &Path) -> Result<String> {
    let mut h = Sha256::new();
    std::io::copy(&mut BufReader::new(reader), &mut h).at(path)?;
    Ok(format!("sha256:{:x}", h.finalize()))
}

/// The digest of the uncompressed tar (a layer's diff id).
fn diff_id(path: &Path) -> Result<String> {
    let mut magic = [0u8; 2];
    let gz = File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == [0x1f, 0x8b];
    let file = File::open(path).at(path)?;
    if gz {
        sha256_of(flate2::read::GzDecoder::new(file), path)
    } else {
        sha256_of(file, path)
    }
}

// OCI ---------------------------------------------------------------------------------

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: Option<String>,
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
    #[serde(default)]
    annotations: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Deserialize, Clone)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// A verified blob of the layout.
fn blob(dir: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| bad(format!("unsupported digest {digest:?}")))?;
    let path = inside(dir, &format!("blobs/sha256/{hex}"))?;
    let actual = sha256_of(File::open(&path).at(&path)?, &path)?;
    if actual != digest {
        return Err(bad(format!(
            "blob {digest} does not match its digest (got {actual})"
        )));
    }
    Ok(path)
}

fn host_platform(d: &Descriptor) -> bool {
    d.platform.as_ref().is_some_and(|p| {
        p.os == Os::Linux.to_string() && p.architecture == Arch::default().to_string()
    })
}

fn read_oci(dir: &Path) -> Result<ArchiveImage> {
    let index: Index = read_json(&inside(dir, "index.json")?)?;
    let top = index
        .manifests
        .iter()
        .find(|d| d.platform.is_none() || host_platform(d))
        .cloned()
        .ok_or_else(|| bad("index.json lists no image for this platform"))?;
    // sandfork's own name annotation first (any image name, `app` too); else a `ref.name`
    // that is a full reference (one that is only a tag, `1.0`, names nothing).
    let annotations = top.annotations.as_ref();
    let name = annotations
        .and_then(|a| a.get(super::NAME_ANNOTATION))
        .or_else(|| {
            annotations
                .and_then(|a| a.get("org.opencontainers.image.ref.name"))
                .filter(|n| n.contains(['/', ':']))
        })
        .cloned();
    let mut entry = top;
    // A nested index (a multi-platform image): the host's platform from it.
    for _ in 0..4 {
        if !INDEX_TYPES.contains(&entry.media_type.as_deref().unwrap_or("")) {
            break;
        }
        let nested: Index = read_json(&blob(dir, &entry.digest)?)?;
        entry = nested
            .manifests
            .iter()
            .find(|d| host_platform(d))
            .cloned()
            .ok_or_else(|| {
                bad(format!(
                    "no image for linux/{} in the index",
                    Arch::default()
                ))
            })?;
    }
    let manifest: Manifest = read_json(&blob(dir, &entry.digest)?)?;
    let config: ImageConfiguration = read_json(&blob(dir, &manifest.config.digest)?)?;
    let layers = manifest
        .layers
        .iter()
        .map(|l| {
            Ok((
                blob(dir, &l.digest)?,
                l.media_type.clone().unwrap_or_default(),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ArchiveImage {
        layers,
        defaults: defaults_of(&config),
        name,
    })
}

// docker-archive ----------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn read_docker(dir: &Path) -> Result<ArchiveImage> {
    let entries: Vec<DockerEntry> = read_json(&inside(dir, "manifest.json")?)?;
    let entry = entries
        .first()
        .ok_or_else(|| bad("manifest.json lists no image"))?;
    let config: ImageConfiguration = read_json(&inside(dir, &entry.config)?)?;
    let diff_ids = config.rootfs().diff_ids();
    if diff_ids.len() != entry.layers.len() {
        return Err(bad(format!(
            "{} layers, but the config names {}",
            entry.layers.len(),
            diff_ids.len()
        )));
    }
    let mut layers = Vec::new();
    for (rel, want) in entry.layers.iter().zip(diff_ids) {
        let path = inside(dir, rel)?;
        let got = diff_id(&path)?;
        if &got != want {
            return Err(bad(format!(
                "layer {rel} does not match its diff id {want} (got {got})"
            )));
        }
        layers.push((
            path,
            "application/vnd.docker.image.rootfs.diff.tar".to_string(),
        ));
    }
    Ok(ArchiveImage {
        layers,
        defaults: defaults_of(&config),
        name: entry.repo_tags.as_ref().and_then(|t| t.first()).cloned(),
    })
}
