//! Checkpoints, restores and snapshot layers on the container runtime and block store.

use std::path::PathBuf;

use runtime::{CheckpointKind, RestoreOptions, SnapshotSource};

use super::{booted, host_err, RuncBackend};
use crate::backend::{BackendError, BackendResult, BootSpec, Booted};
use crate::backend::{Checkpointed, RestoreFrom};
use model::SnapshotType;

fn store_err(e: blockstore::Error) -> BackendError {
    match e {
        blockstore::Error::InvalidArtifact { .. }
        | blockstore::Error::Corrupt { .. }
        | blockstore::Error::MissingParent { .. } => {
            BackendError::InvalidInput(format!("Snapshot file refused: {}", super::error_chain(&e)))
        }
        blockstore::Error::NotAncestor { base, top } => BackendError::InvalidInput(format!(
            "disk layer {top} does not stack on the base's layer {base}"
        )),
        other => BackendError::Host(super::error_chain(&other)),
    }
}

/// A memory dump fails when the sandbox's agent still holds a connection from the host (a
/// running exec, a process wait, an output stream): CRIU cannot dump a Unix socket whose
/// peer is outside. That is the caller's timing, not a daemon failure.
fn checkpoint_err(id: &str, e: BackendError) -> BackendError {
    match e {
        BackendError::Host(m) if m.contains("unix: Unix socket") && m.contains("not found") => {
            tracing::info!(sandbox = %id, error = %m, "memory checkpoint refused: agent connection open");
            BackendError::Conflict(format!(
                "Sandbox {id} has a request in progress (exec, process wait or output \
                 stream); a memory checkpoint needs it to end first"
            ))
        }
        other => other,
    }
}

fn layer_id(layer: &str) -> BackendResult<blockstore::LayerId> {
    layer
        .parse()
        .map_err(|_| BackendError::InvalidInput(format!("Bad layer id {layer:?}")))
}

impl RuncBackend {
    pub(super) async fn checkpoint_sandbox(
        &self,
        id: &str,
        kind: SnapshotType,
        memory_dir: Option<PathBuf>,
    ) -> BackendResult<Checkpointed> {
        let kind = match kind {
            SnapshotType::Filesystem => CheckpointKind::Filesystem,
            SnapshotType::Memory => CheckpointKind::Memory,
        };
        let info = self
            .runtime
            .checkpoint(id, kind, memory_dir)
            .await
            .map_err(|e| checkpoint_err(id, host_err(e)))?;
        tracing::info!(sandbox = %id, ?kind, times = ?info.times, "checkpoint");
        Ok(Checkpointed {
            layer_id: info.layer,
            memory_dir: info.memory_dir,
            size_bytes: info.disk_bytes + info.memory_bytes,
        })
    }

    pub(super) async fn restore_sandbox(
        &self,
        spec: &BootSpec,
        from: RestoreFrom,
    ) -> BackendResult<Booted> {
        let (source, opts) = split(from);
        let h = self
            .runtime
            .restore(self.spec(spec)?, source, opts)
            .await
            .map_err(host_err)?;
        self.started(spec, &h).await?;
        Ok(booted(&h))
    }

    pub(super) async fn park_sandbox(
        &self,
        spec: &BootSpec,
        from: RestoreFrom,
    ) -> BackendResult<Booted> {
        let (source, _bare) = split(from);
        let h = self
            .runtime
            .park(self.spec(spec)?, source)
            .await
            .map_err(host_err)?;
        self.started(spec, &h).await?;
        Ok(booted(&h))
    }

    fn store(&self) -> blockstore::Store {
        self.images.store().clone()
    }

    pub(super) async fn pin(&self, name: &str, layer: &str) -> BackendResult<()> {
        let (store, name, layer) = (self.store(), name.to_string(), layer_id(layer)?);
        blocking(move || store.set_ref(&name, &layer).map_err(store_err)).await
    }

    pub(super) async fn unpin(&self, name: &str) -> BackendResult<()> {
        let (store, name) = (self.store(), name.to_string());
        blocking(move || match store.delete_ref(&name) {
            Ok(()) | Err(blockstore::Error::RefNotFound(_)) => Ok(()),
            Err(e) => Err(store_err(e)),
        })
        .await?;
        self.gc().await
    }

    pub(super) async fn gc(&self) -> BackendResult<()> {
        let store = self.store();
        blocking(move || {
            let stats = store.gc().map_err(store_err)?;
            if stats.layers_deleted > 0 {
                tracing::info!(?stats, "unused layers freed");
            }
            Ok(())
        })
        .await
    }

    pub(super) async fn export(
        &self,
        layer: &str,
        base: Option<&str>,
        out: PathBuf,
    ) -> BackendResult<()> {
        let (store, layer) = (self.store(), layer_id(layer)?);
        let base = base.map(layer_id).transpose()?;
        blocking(move || {
            let file = std::fs::File::create(&out)
                .map_err(|e| BackendError::Host(format!("{}: {e}", out.display())))?;
            store
                .export_file(&layer, base.as_ref(), &file)
                .map_err(store_err)?;
            Ok(())
        })
        .await
    }

    pub(super) async fn import(&self, input: PathBuf) -> BackendResult<String> {
        let store = self.store();
        blocking(move || {
            let mut file = std::fs::File::open(&input)
                .map_err(|e| BackendError::Host(format!("{}: {e}", input.display())))?;
            let top = store.import(&mut file).map_err(store_err)?;
            // The layers came from elsewhere: their filesystem is checked in user space
            // before the kernel mounts it (and then dropped again if it is not clean).
            let scratch = input.parent().unwrap_or(std::path::Path::new("/tmp"));
            if let Err(e) = runtime::image::check_layer(&store, &top, scratch) {
                let _ = store.gc();
                return Err(BackendError::InvalidInput(format!(
                    "Snapshot file refused: {}",
                    super::error_chain(&e)
                )));
            }
            Ok(top.to_string())
        })
        .await
    }
}

/// What the runtime restores from, and what it applies after.
fn split(from: RestoreFrom) -> (SnapshotSource, RestoreOptions) {
    let source = SnapshotSource {
        layer: from.layer_id,
        memory_dir: from.memory_dir,
    };
    let opts = RestoreOptions {
        identity: from.identity,
        hooks: from.hooks,
    };
    (source, opts)
}

/// See [`crate::backend::Backend::share_memory`].
pub(super) async fn share_images(
    dir: &std::path::Path,
    parent: &std::path::Path,
) -> BackendResult<u64> {
    let (dir, parent) = (dir.to_path_buf(), parent.to_path_buf());
    blocking(move || {
        runtime::memory_images::share_with_parent(&dir, &parent)
            .map(|s| s.bytes_saved())
            .map_err(|e| BackendError::Host(super::error_chain(&e)))
    })
    .await
}

/// See [`crate::backend::Backend::flatten_memory`].
pub(super) async fn flatten_images(
    dir: &std::path::Path,
    out: &std::path::Path,
) -> BackendResult<()> {
    let (dir, out) = (dir.to_path_buf(), out.to_path_buf());
    blocking(move || {
        runtime::memory_images::flatten_into(&dir, &out)
            .map_err(|e| BackendError::Host(super::error_chain(&e)))
    })
    .await
}

/// See [`crate::backend::Backend::memory_digest`].
pub(super) async fn memory_digest(dir: &std::path::Path) -> BackendResult<[u8; 32]> {
    let dir = dir.to_path_buf();
    blocking(move || {
        runtime::memory_images::pages_digest(&dir)
            .map_err(|e| BackendError::Host(super::error_chain(&e)))
    })
    .await
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> BackendResult<T> + Send + 'static,
) -> BackendResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BackendError::Host(format!("Block store task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_agent_connection_is_a_conflict() {
        let criu = "Command runc checkpoint failed: CRIU: (00.051508) Error \
                    (criu/sk-unix.c:351): unix: Unix socket 4215285 not found";
        let e = checkpoint_err("sb-1", BackendError::Host(criu.into()));
        assert!(matches!(e, BackendError::Conflict(m) if m.contains("in progress")));
        let other = checkpoint_err("sb-1", BackendError::Host("disk gone".into()));
        assert!(matches!(other, BackendError::Host(_)));
    }
}
