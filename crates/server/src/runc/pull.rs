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

fn publish(
    images: &runtime::image::Images,
    pulled: Pulled,
    progress: &mpsc::Sender<String>,
) -> BackendResult<runtime::image::ImageMeta> {
    let mut defaults = runtime::image::defaults_of(&pulled.config);
    defaults.source = Some(pulled.reference.clone());
    defaults.digest = Some(pulled.digest.to_string());
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
        e if e.is_disk_full() => BackendError::StorageFull(msg),
        _ => BackendError::Registry(msg),
    }
}
