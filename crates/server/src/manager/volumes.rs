//! Named volumes: created, listed and deleted here; the backend holds their data, and the
//! sandboxes' rows say which mount which.

use std::collections::BTreeMap;

use super::Manager;
use crate::backend::VolumeData;
use crate::error::{Error, Result};
use api_types::{CreateVolume, Volume};

/// Size of a volume created without one, in MiB.
pub const DEFAULT_VOLUME_MB: u64 = 1024;

impl Manager {
    pub async fn create_volume(&self, req: CreateVolume) -> Result<Volume> {
        self.check_open()?;
        let size = req.size_mb.unwrap_or(DEFAULT_VOLUME_MB);
        // A volume is sparse, but one larger than the host disk can give would fail its
        // writes once filled: refused up front, as a sandbox's disk is.
        let reserve_mb = self.registry().admission.policy().disk_reserve_mb;
        let what = format!("Volume {}: size_mb", req.name);
        super::create::check_room(&what, size, self.backend.host_disk(), reserve_mb)?;
        let v = self.backend.create_volume(&req.name, size).await?;
        tracing::info!(volume = %v.name, size_mb = v.size_mb, "volume created");
        Ok(view(v, Vec::new()))
    }

    /// Every volume, with the live sandboxes that mount it.
    pub async fn volumes(&self) -> Result<Vec<Volume>> {
        let mut users = self.volume_users().await?;
        Ok(self
            .backend
            .volumes()
            .await?
            .into_iter()
            .map(|v| {
                let by = users.remove(&v.name).unwrap_or_default();
                view(v, by)
            })
            .collect())
    }

    pub async fn volume(&self, name: &str) -> Result<Volume> {
        self.volumes()
            .await?
            .into_iter()
            .find(|v| v.name == name)
            .ok_or_else(|| Error::NotFound(format!("Volume {name} not found")))
    }

    /// Deletes a volume and its data; refused while a live sandbox mounts it.
    pub async fn delete_volume(&self, name: &str) -> Result<()> {
        let v = self.volume(name).await?;
        if !v.mounted_by.is_empty() {
            return Err(Error::Conflict(format!(
                "Volume {name} is mounted by {}; delete those sandboxes first",
                v.mounted_by.join(", ")
            )));
        }
        self.backend.delete_volume(name).await?;
        tracing::info!(volume = %name, "volume deleted");
        Ok(())
    }

    /// At shutdown: unmounts from the host the volumes no live sandbox mounts (the next
    /// daemon mounts a volume again when a sandbox needs it).
    pub(super) async fn release_volumes(&self) {
        let Ok(volumes) = self.volumes().await else {
            return;
        };
        for v in volumes.into_iter().filter(|v| v.mounted_by.is_empty()) {
            if let Err(e) = self.backend.release_volume(&v.name).await {
                tracing::warn!(volume = %v.name, error = %e, "unmounting a volume failed");
            }
        }
    }

    /// A create naming a volume that does not exist is a 404 before anything is made.
    pub(super) async fn check_volumes_exist(&self, req: &api_types::CreateSandbox) -> Result<()> {
        if req.volumes.is_empty() {
            return Ok(());
        }
        let have = self.backend.volumes().await?;
        match req
            .volumes
            .iter()
            .find(|m| !have.iter().any(|v| v.name == m.name))
        {
            Some(m) => Err(Error::NotFound(format!("Volume {} not found", m.name))),
            None => Ok(()),
        }
    }

    /// Live sandboxes by the volumes they mount.
    async fn volume_users(&self) -> Result<BTreeMap<String, Vec<String>>> {
        let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for row in self.store.sandboxes().await? {
            if !row.view.state.is_live() {
                continue;
            }
            for v in &row.boot.volumes {
                users
                    .entry(v.name.clone())
                    .or_default()
                    .push(row.view.id.clone());
            }
        }
        Ok(users)
    }
}

fn view(v: VolumeData, mounted_by: Vec<String>) -> Volume {
    Volume {
        name: v.name,
        size_mb: v.size_mb,
        used_bytes: v.used_bytes,
        created_at: model::timestamp::from_unix_millis(v.created as i64 * 1000),
        mounted_by,
    }
}
