//! Images pulled from OCI registries: `registry` fetches and verifies every blob into the
//! data directory's blob store, then the runtime unpacks the layers (hostile input: no
//! path leaves the root) and publishes the image under its canonical reference.

use registry::{Credentials, PullError, Pulled};
use tokio::sync::mpsc;

use super::RuncBackend;
use crate::backend::{BackendError, BackendResult, BuiltImage};

impl RuncBackend {
    pub(super) async fn pull(
        &self,
        reference: &str,
        credentials: Option<(String, String)>,
        progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        let collected = self.pull_leased(reference, credentials, progress).await;
        self.collect_blobs().await;
        collected
    }

    /// Removes the registry blobs no image names (none while a pull runs).
    pub(super) async fn collect_blobs(&self) {
        let (images, blobs) = (self.images.clone(), self.puller.blobs().clone());
        let removed = tokio::task::spawn_blocking(move || {
            let keep = images
                .list()
                .ok()?
                .into_iter()
                .flat_map(|m| m.blobs)
                .collect();
            Some(blobs.collect(&keep))
        })
        .await;
        if let Ok(Some(n @ 1..)) = removed {
            tracing::info!(count = n, "removed registry blobs no image names");
        }
    }

    async fn pull_leased(
        &self,
        reference: &str,
        credentials: Option<(String, String)>,
        progress: mpsc::Sender<String>,
    ) -> BackendResult<BuiltImage> {
        // The blobs stay until the unpack below is done.
        let _lease = self.puller.blobs().lease();
        let credentials =
            credentials.map(|(username, password)| Credentials { username, password });
        let report = progress.clone();
        let say = move |line: String| {
            let _ = report.try_send(line);
        };
        let pulled = self
            .puller
            .pull(reference, credentials.as_ref(), &say)
            .await
            .map_err(pull_err)?;
        let images = self.images.clone();
        let report = progress.clone();
        let meta = tokio::task::spawn_blocking(move || publish(&images, pulled, &report))
            .await
            .map_err(|e| BackendError::Host(e.to_string()))??;
        let _ = progress.send(format!("done: {}", meta.layer)).await;
        Ok(BuiltImage {
            layer_id: meta.layer,
            size_bytes: meta.size,
        })
    }
}

impl RuncBackend {
    pub(super) async fn export_archive(
        &self,
        name: &str,
        out: &std::path::Path,
        docker: bool,
    ) -> BackendResult<()> {
        let images = self.images.clone();
        let (name, out) = (name.to_string(), out.to_path_buf());
        tokio::task::spawn_blocking(move || -> BackendResult<()> {
            let exported = images.export(&name).map_err(super::host_err)?;
            let dir = out.with_extension("layout");
            let tree = if docker {
                exported.write_docker_archive(&dir, &name)
            } else {
                exported.write_layout(&dir, &name)
            };
            let written = tree
                .map_err(super::host_err)
                .and_then(|()| tar_dir(&dir, &out));
            let _ = std::fs::remove_dir_all(&dir);
            written
        })
        .await
        .map_err(|e| BackendError::Host(e.to_string()))?
    }

    pub(super) async fn push(
        &self,
        name: &str,
        reference: &str,
        credentials: Option<(String, String)>,
    ) -> BackendResult<String> {
        let images = self.images.clone();
        let n = name.to_string();
        let (layer, config) = tokio::task::spawn_blocking(move || -> BackendResult<_> {
            let exported = images.export(&n).map_err(super::host_err)?;
            let layer = std::fs::read(&exported.layer)
                .map_err(|e| BackendError::Host(format!("exported layer: {e}")))?;
            Ok((layer, exported.config.clone()))
        })
        .await
        .map_err(|e| BackendError::Host(e.to_string()))??;
        let credentials =
            credentials.map(|(username, password)| Credentials { username, password });
        self.puller
            .push(reference, layer, config, credentials.as_ref())
            .await
            .map_err(pull_err)
    }
}

/// Writes the directory `dir` as a tar at `out` (names relative to it).
fn tar_dir(dir: &std::path::Path, out: &std::path::Path) -> BackendResult<()> {
    let io = |e: std::io::Error| BackendError::Host(format!("writing the archive: {e}"));
    let file = std::fs::File::create(out).map_err(io)?;
    let mut tar = tar::Builder::new(file);
    tar.follow_symlinks(false);
    tar.append_dir_all(".", dir).map_err(io)?;
    tar.into_inner().map_err(io)?.sync_all().map_err(io)
}

fn publish(
    images: &runtime::image::Images,
    pulled: Pulled,
    progress: &mpsc::Sender<String>,
) -> BackendResult<runtime::image::ImageMeta> {
    let mut defaults = runtime::image::defaults_of(&pulled.config);
    defaults.source = Some(pulled.reference.clone());
    defaults.digest = Some(pulled.digest.to_string());
    defaults.blobs = pulled.layers.iter().map(|l| l.digest.to_string()).collect();
    let layers: Vec<_> = pulled
        .layers
        .iter()
        .map(|l| (l.path.clone(), l.media_type.clone()))
        .collect();
    let report = |p: runtime::image::Progress| {
        let _ = progress.blocking_send(format!("{}: {}", p.stage, p.detail));
    };
    images
        .import_layers(&pulled.reference, &layers, defaults, &report)
        .map_err(|e| match e {
            runtime::Error::Layer { .. } => BackendError::InvalidInput(model::error_chain(&e)),
            runtime::Error::TooLarge(m) => BackendError::TooLarge(m),
            other => super::host_err(other),
        })
}

fn pull_err(e: PullError) -> BackendError {
    let msg = model::error_chain(&e);
    match e {
        PullError::BadReference { .. } | PullError::UnsupportedMediaType { .. } => {
            BackendError::InvalidInput(msg)
        }
        PullError::BadConfig { .. } | PullError::NoPlatform { .. } => {
            BackendError::Unsupported(msg)
        }
        PullError::NotFound(_) => BackendError::NotFound(msg),
        PullError::TooLarge { .. } => BackendError::TooLarge(msg),
        e if e.is_disk_full() => BackendError::StorageFull(msg),
        _ => BackendError::Registry(msg),
    }
}
