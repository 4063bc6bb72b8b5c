//! Images out: an image's root file system as one OCI layer, with its config, as an OCI
//! image layout (written as an oci-archive, or pushed to a registry by the caller).
//!
//! The root file system is read from a throwaway disk forked from the image's layer and
//! mounted on the host (`nosuid`, `nodev`) only while it is read; the fork costs nothing
//! and is deleted afterwards, so the image's own layer is never touched. Symlinks are
//! stored as links, never followed.

use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{BuildDir, ImageMeta, Images, NAME_ANNOTATION};
use crate::error::{Error, IoContext, Result};

/// An exported image: its layer (a gzip tar) and config as blobs, ready to write as an
/// OCI layout or to push.
pub struct Exported {
    /// Gzip-compressed tar of the root file system.
    pub layer: PathBuf,
    pub layer_digest: String,
    pub layer_size: u64,
    /// Digest of the uncompressed tar.
    pub diff_id: String,
    pub config: Vec<u8>,
    /// Keeps the files until dropped.
    _work: BuildDir,
}

/// Writes that hash what passes through.
struct Hashing<W: Write> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl Images {
    /// Exports image `name`: its root file system as one layer, and its config.
    pub fn export(&self, name: &str) -> Result<Exported> {
        let meta = self.get(name)?;
        let work = BuildDir::new(self.dir(), "export")?;
        let layer_path = work.path().join("layer.tar.gz");
        let disk = format!("export-{}-{}", std::process::id(), work.serial());
        let (diff_id, layer_digest, layer_size) =
            self.with_rootfs(&meta, &disk, work.path(), |root| {
                let file = std::fs::File::create(&layer_path).at(&layer_path)?;
                let outer = Hashing {
                    inner: file,
                    hash: Sha256::new(),
                    bytes: 0,
                };
                let gz = GzEncoder::new(outer, flate2::Compression::fast());
                let inner = Hashing {
                    inner: gz,
                    hash: Sha256::new(),
                    bytes: 0,
                };
                let mut tar = tar::Builder::new(inner);
                tar.follow_symlinks(false);
                append_tree(&mut tar, root)?;
                let inner = tar.into_inner().at(&layer_path)?;
                let diff = format!("sha256:{:x}", inner.hash.finalize());
                let outer = inner.inner.finish().at(&layer_path)?;
                outer.inner.sync_all().at(&layer_path)?;
                Ok((
                    diff,
                    format!("sha256:{:x}", outer.hash.finalize()),
                    outer.bytes,
                ))
            })?;
        let config = config_json(&meta, &diff_id);
        Ok(Exported {
            layer: layer_path,
            layer_digest,
            layer_size,
            diff_id,
            config,
            _work: work,
        })
    }

    /// Runs `f` on the image's root file system, mounted read-only from a throwaway fork.
    fn with_rootfs<T>(
        &self,
        meta: &ImageMeta,
        disk: &str,
        work: &Path,
        f: impl FnOnce(&Path) -> Result<T>,
    ) -> Result<T> {
        let layer: blockstore::LayerId = meta
            .layer
            .parse()
            .map_err(|_| Error::Image(format!("image {} has a bad layer id", meta.name)))?;
        let store = self.store();
        let size = store
            .layer_info(&layer)
            .map_err(|e| Error::Disk(Box::new(e)))?
            .size;
        store
            .create_disk(disk, size, Some(&layer))
            .map_err(|e| Error::Disk(Box::new(e)))?;
        let mnt = work.join("rootfs");
        let run_dir = work.join("disk");
        let result = (|| {
            std::fs::create_dir_all(&mnt).at(&mnt)?;
            std::fs::create_dir_all(&run_dir).at(&run_dir)?;
            let spec = disk::DiskSpec {
                store: store.root().to_path_buf(),
                disk: disk.to_string(),
                run_dir: run_dir.clone(),
            };
            let mounted = disk::MountedDisk::mount(&spec, &mnt, disk::MountOptions::default())
                .map_err(|e| Error::Disk(Box::new(e)))?;
            let out = f(&mnt);
            let down = mounted.teardown().map_err(|e| Error::Disk(Box::new(e)));
            let out = out?;
            down?;
            Ok(out)
        })();
        let _ = disk::cleanup_stale(&run_dir);
        let _ = store.delete_disk(disk);
        result
    }
}

/// Appends the tree at `root` (not following symlinks; `lost+found` left out), names
/// relative to it, with owners and modes.
fn append_tree<W: Write>(tar: &mut tar::Builder<W>, root: &Path) -> Result<()> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir).at(&dir)?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = rel.join(e.file_name());
            if rel.as_os_str().is_empty() && e.file_name() == "lost+found" {
                continue;
            }
            let path = e.path();
            let ft = e.file_type().at(&path)?;
            if ft.is_dir() {
                tar.append_dir(&name, &path).at(&path)?;
                stack.push(name);
            } else if ft.is_file() || ft.is_symlink() {
                tar.append_path_with_name(&path, &name).at(&path)?;
            }
            // Device nodes, FIFOs and sockets are not carried.
        }
    }
    Ok(())
}

/// The OCI image config of `meta` with one layer.
fn config_json(meta: &ImageMeta, diff_id: &str) -> Vec<u8> {
    let arch = oci_spec::image::Arch::default().to_string();
    let env: Vec<String> = meta.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let ports: serde_json::Map<String, serde_json::Value> = meta
        .exposed_ports
        .iter()
        .map(|p| (p.clone(), json!({})))
        .collect();
    let mut config = json!({
        "Env": env,
        "WorkingDir": meta.cwd,
        "Labels": meta.labels,
        "ExposedPorts": ports,
    });
    if let Some(u) = &meta.user {
        config["User"] = json!(u);
    }
    if !meta.entrypoint.is_empty() {
        config["Entrypoint"] = json!(meta.entrypoint);
    }
    if !meta.cmd.is_empty() {
        config["Cmd"] = json!(meta.cmd);
    }
    serde_json::to_vec(&json!({
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        // One history entry per layer: builders (buildah, podman build) count on it.
        "history": [{"created_by": "sandfork image export"}],
    }))
    .expect("a config serialises")
}

impl Exported {
    /// Writes the image as a docker-archive tree in `dir` (what `docker save` writes:
    /// `manifest.json`, the config, an uncompressed layer tar), tagged `tag`.
    pub fn write_docker_archive(&self, dir: &Path, tag: &str) -> Result<()> {
        let config_hex = format!("{:x}", Sha256::digest(&self.config));
        let layer_hex = self.diff_id.trim_start_matches("sha256:");
        let layer_dir = dir.join(layer_hex);
        std::fs::create_dir_all(&layer_dir).at(&layer_dir)?;
        let tar = layer_dir.join("layer.tar");
        let gz = std::fs::File::open(&self.layer).at(&self.layer)?;
        let mut out = std::fs::File::create(&tar).at(&tar)?;
        std::io::copy(&mut flate2::read::GzDecoder::new(gz), &mut out).at(&tar)?;
        let config = dir.join(format!("{config_hex}.json"));
        std::fs::write(&config, &self.config).at(&config)?;
        let tag = if tag
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':'))
            || tag.contains('@')
        {
            tag.to_string()
        } else {
            format!("{tag}:latest")
        };
        let manifest = json!([{
            "Config": format!("{config_hex}.json"),
            "RepoTags": [tag],
            "Layers": [format!("{layer_hex}/layer.tar")],
        }]);
        let p = dir.join("manifest.json");
        std::fs::write(&p, serde_json::to_vec(&manifest).expect("serialises")).at(&p)
    }

    /// Writes the image as an OCI layout in `dir`, its index naming it `reference`.
    pub fn write_layout(&self, dir: &Path, reference: &str) -> Result<()> {
        let blobs = dir.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs).at(&blobs)?;
        let put = |bytes: &[u8]| -> Result<String> {
            let d = format!("{:x}", Sha256::digest(bytes));
            let p = blobs.join(&d);
            std::fs::write(&p, bytes).at(&p)?;
            Ok(format!("sha256:{d}"))
        };
        let layer_hex = self.layer_digest.trim_start_matches("sha256:");
        let target = blobs.join(layer_hex);
        std::fs::copy(&self.layer, &target).at(&target)?;
        let config_digest = put(&self.config)?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": self.config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": self.layer_digest, "size": self.layer_size}],
        }))
        .expect("a manifest serialises");
        let manifest_digest = put(&manifest)?;
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": manifest_digest, "size": manifest.len(),
                           "annotations": {"org.opencontainers.image.ref.name": reference,
                                           NAME_ANNOTATION: reference}}],
        });
        let p = dir.join("index.json");
        std::fs::write(&p, serde_json::to_vec(&index).expect("serialises")).at(&p)?;
        let p = dir.join("oci-layout");
        std::fs::write(&p, br#"{"imageLayoutVersion":"1.0.0"}"#).at(&p)
    }
}
