//! Importing root filesystems from a tarball (`docker export`) or an OCI image layout.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::{report, Defaults, ProgressFn};
use crate::error::{Error, IoContext, Result};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

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

fn open_maybe_gzip(path: &Path) -> Result<Box<dyn Read>> {
    let mut file = File::open(path).at(path)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).at(path)?;
    let file = File::open(path).at(path)?;
    let reader = BufReader::new(file);
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(flate2::read::GzDecoder::new(reader)))
    } else {
        Ok(Box::new(reader))
    }
}

fn archive(path: &Path) -> Result<tar::Archive<Box<dyn Read>>> {
    let mut a = tar::Archive::new(open_maybe_gzip(path)?);
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(true);
    a.set_unpack_xattrs(true);
    a.set_overwrite(true);
    Ok(a)
}

/// Unpacks one layer. With `whiteouts`, a first pass applies the layer's deletions to
/// what lower layers left, a second pass unpacks everything else.
fn unpack_layer(path: &Path, root: &Path, whiteouts: bool) -> Result<()> {
    let tar_err = |e: std::io::Error| {
        let cause = std::error::Error::source(&e)
            .map(|s| format!(": {s}"))
            .unwrap_or_default();
        Error::Image(format!("{}: {e}{cause}", path.display()))
    };
    if whiteouts {
        for entry in archive(path)?.entries().map_err(tar_err)? {
            let entry = entry.map_err(tar_err)?;
            let rel = clean(&entry.path().map_err(tar_err)?)?;
            apply_whiteout(root, &rel)?;
        }
    }
    for entry in archive(path)?.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        let rel = clean(&entry.path().map_err(tar_err)?)?;
        let is_wh = rel
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(WHITEOUT));
        if whiteouts && is_wh {
            continue;
        }
        // `unpack_in` refuses paths that leave `root`, also through symlinks.
        entry.unpack_in(root).map_err(tar_err)?;
    }
    Ok(())
}

/// A tar path made relative, without `.` and refusing `..`.
fn clean(path: &Path) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            _ => {
                return Err(Error::Image(format!(
                    "unsafe path in layer: {}",
                    path.display()
                )))
            }
        }
    }
    Ok(out)
}

fn apply_whiteout(root: &Path, rel: &Path) -> Result<()> {
    let Some(name) = rel.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    let parent = rel.parent().unwrap_or(Path::new(""));
    if !safe_dir(root, parent) {
        return Ok(());
    }
    if name == OPAQUE {
        let dir = root.join(parent);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                remove_any(&e.path())?;
            }
        }
    } else if let Some(hidden) = name.strip_prefix(WHITEOUT) {
        remove_any(&root.join(parent).join(hidden))?;
    }
    Ok(())
}

/// Whether every component of `rel` under `root` is a real directory (no symlink that
/// could point a deletion outside `root`).
fn safe_dir(root: &Path, rel: &Path) -> bool {
    let mut p = root.to_path_buf();
    for c in rel.components() {
        p.push(c);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_dir() => {}
            _ => return false,
        }
    }
    true
}

fn remove_any(path: &Path) -> Result<()> {
    let r = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => return Ok(()),
    };
    r.at(path)
}
