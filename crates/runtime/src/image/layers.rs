//! Importing root filesystems from a tarball (`docker export`) or an OCI image layout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{report, unpack, Defaults, ProgressFn};
use crate::error::{Error, IoContext, Result};

/// Unpacks a (possibly gzip-compressed) root filesystem tarball into `root`.
pub fn import_tarball(tarball: &Path, root: &Path, progress: ProgressFn<'_>) -> Result<()> {
    report(progress, "unpack", tarball.display().to_string());
    unpack_layer(tarball, root, false)
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: Option<String>,
    digest: String,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// The image config blob: lowercase at the top, Docker-style PascalCase inside `config`.
#[derive(Deserialize, Default)]
struct ImageConfig {
    #[serde(default)]
    config: Option<RunConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
}

/// Applies the layers of the first image in an OCI image layout directory to `root`, in
/// order, honouring whiteouts. Returns the image's default env and working directory.
pub fn import_oci_layout(layout: &Path, root: &Path, progress: ProgressFn<'_>) -> Result<Defaults> {
    let index: Index = read_json(&layout.join("index.json"))?;
    let first = index
        .manifests
        .first()
        .ok_or_else(|| bad("index.json lists no manifest"))?;
    let manifest: Manifest = read_json(&blob(layout, &first.digest)?)?;
    let n = manifest.layers.len();
    for (i, layer) in manifest.layers.iter().enumerate() {
        report(progress, "layer", format!("{}/{n} {}", i + 1, layer.digest));
        let media = layer.media_type.as_deref().unwrap_or("");
        if media.contains("zstd") {
            return Err(bad("zstd-compressed layers are not supported"));
        }
        unpack_layer(&blob(layout, &layer.digest)?, root, true)?;
    }
    let config: ImageConfig = read_json(&blob(layout, &manifest.config.digest)?)?;
    Ok(defaults(config.config.unwrap_or_default()))
}

fn defaults(c: RunConfig) -> Defaults {
    let env = c
        .env
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<BTreeMap<_, _>>();
    Defaults {
        env,
        cwd: c.working_dir.filter(|w| w.starts_with('/')),
    }
}

fn bad(msg: &str) -> Error {
    Error::Image(format!("OCI layout: {msg}"))
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).at(path)?;
    serde_json::from_slice(&bytes).map_err(|source| Error::Record {
        path: path.into(),
        source,
    })
}

/// Path of a blob, from a digest like `sha256:<hex>`.
fn blob(layout: &Path, digest: &str) -> Result<PathBuf> {
    let (algo, hex) = digest
        .split_once(':')
        .ok_or_else(|| bad("malformed digest"))?;
    let ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
    if !ok(algo) || !ok(hex) {
        return Err(bad("malformed digest"));
    }
    Ok(layout.join("blobs").join(algo).join(hex))
}

/// Unpacks one layer (see [`unpack::unpack_layer`]).
fn unpack_layer(path: &Path, root: &Path, whiteouts: bool) -> Result<()> {
    unpack::unpack_layer(path, root, whiteouts).map_err(|source| Error::Layer {
        layer: path.into(),
        source,
    })
}
