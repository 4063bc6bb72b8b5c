//! Importing root filesystems from a tarball (`docker export`) or an OCI image layout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oci_spec::image::ImageConfiguration;
use serde::Deserialize;

use super::budget::{unpack_within, Budget};
use super::{report, Defaults, ProgressFn, UnpackLimits};
use crate::error::{Error, IoContext, Result};

/// Unpacks a (possibly gzip-compressed) root filesystem tarball into `root`, within
/// `limits` (the stream is counted as it inflates: a gzip bomb stops at the cap).
pub fn import_tarball(
    tarball: &Path,
    root: &Path,
    limits: UnpackLimits,
    progress: ProgressFn<'_>,
) -> Result<()> {
    report(progress, "unpack", tarball.display().to_string());
    let budget = Budget::of(limits, root, 1)?;
    unpack_within(tarball, root, false, budget, root, limits)
}

/// Largest index, manifest or config read from an OCI layout.
const MAX_LAYOUT_JSON: u64 = 8 << 20;

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

/// Applies the layers of the first image in an OCI image layout directory to `root`, in
/// order, honouring whiteouts, each within `limits`. Returns what the image's config gives
/// its sandboxes.
pub fn import_oci_layout(
    layout: &Path,
    root: &Path,
    limits: UnpackLimits,
    progress: ProgressFn<'_>,
) -> Result<Defaults> {
    let index: Index = read_json(&layout.join("index.json"))?;
    let first = index
        .manifests
        .first()
        .ok_or_else(|| bad("index.json lists no manifest"))?;
    let manifest: Manifest = read_json(&blob(layout, &first.digest)?)?;
    let layers = manifest
        .layers
        .iter()
        .map(|l| {
            Ok((
                blob(layout, &l.digest)?,
                l.media_type.clone().unwrap_or_default(),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    unpack_layers(&layers, root, limits, progress)?;
    let config: ImageConfiguration = read_json(&blob(layout, &manifest.config.digest)?)?;
    Ok(defaults_of(&config))
}

/// Applies image layers (a tar blob and its media type each, bottom first) to `root`,
/// honouring whiteouts. Each is held to `limits`, with room left for the ext4 image the
/// root is made into afterwards.
pub fn unpack_layers(
    layers: &[(PathBuf, String)],
    root: &Path,
    limits: UnpackLimits,
    progress: ProgressFn<'_>,
) -> Result<()> {
    let n = layers.len();
    for (i, (path, media)) in layers.iter().enumerate() {
        report(progress, "layer", format!("{}/{n} unpacking", i + 1));
        if media.contains("zstd") {
            return Err(bad("zstd-compressed layers are not supported"));
        }
        let budget = Budget::of(limits, root, 2)?;
        unpack_within(path, root, true, budget, root, limits)?;
    }
    Ok(())
}

/// What an OCI image config gives the sandboxes of the image: environment, working
/// directory, user, entrypoint and command, declared ports and labels.
pub fn defaults_of(config: &ImageConfiguration) -> Defaults {
    let Some(c) = config.config() else {
        return Defaults::default();
    };
    let env = c
        .env()
        .clone()
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<BTreeMap<_, _>>();
    let mut ports = c.exposed_ports().clone().unwrap_or_default();
    ports.sort();
    Defaults {
        env,
        cwd: c.working_dir().clone().filter(|w| w.starts_with('/')),
        user: c.user().clone().filter(|u| !u.is_empty()),
        entrypoint: c.entrypoint().clone().unwrap_or_default(),
        cmd: c.cmd().clone().unwrap_or_default(),
        exposed_ports: ports,
        labels: c.labels().clone().unwrap_or_default().into_iter().collect(),
        source: None,
        digest: None,
        blobs: Vec::new(),
    }
}

fn bad(msg: &str) -> Error {
    Error::Image(format!("OCI layout: {msg}"))
}

/// Reads a JSON file of the layout, refusing one over [`MAX_LAYOUT_JSON`].
fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_LAYOUT_JSON + 1).read_to_end(&mut bytes))
        .at(path)?;
    if bytes.len() as u64 > MAX_LAYOUT_JSON {
        return Err(Error::TooLarge(format!(
            "OCI layout: {} is over {} MiB",
            path.display(),
            MAX_LAYOUT_JSON >> 20
        )));
    }
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
