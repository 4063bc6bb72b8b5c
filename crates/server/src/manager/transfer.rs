//! Export and import of snapshots as one file (see [`crate::snapfile`]).

use std::path::{Path, PathBuf};

use api_types::{CreateSandbox, Snapshot};
use model::ids::{new_snapshot_id, valid_snapshot_id};
use model::SnapshotType;

use super::Manager;
use crate::backend::BootSpec;
use crate::error::{Error, Result};
use crate::snapfile;
use crate::snapkey;
use crate::snapshots::SnapshotRecord;

const MANIFEST: &str = "manifest.json";
const ARTIFACT: &str = "layers.artifact";

fn host(e: impl std::fmt::Display) -> Error {
    Error::Backend(crate::backend::BackendError::Host(e.to_string()))
}

fn unique(prefix: &str) -> Result<String> {
    Ok(model::ids::random_id::<6>(prefix)?)
}

/// Removes a scratch directory when dropped.
pub(super) struct Scratch(pub(super) PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Manager {
    /// Scratch space for exports and imports (emptied at start-up).
    pub(super) fn transfer_dir(&self) -> PathBuf {
        self.config.data_dir.join("tmp").join("snapshot-transfer")
    }

    pub(super) fn scratch(&self, prefix: &str) -> Result<Scratch> {
        let dir = self.transfer_dir().join(unique(prefix)?);
        std::fs::create_dir_all(&dir).map_err(host)?;
        Ok(Scratch(dir))
    }

    /// Writes snapshot `id` as one file; returns its path (the caller removes it).
    pub async fn export_snapshot(&self, id: &str) -> Result<PathBuf> {
        let rec = self.usable_snapshot(id).await?;
        let work = self.scratch("export")?;
        let artifact = work.0.join(ARTIFACT);
        self.backend
            .export_layer(&rec.layer_id, artifact.clone())
            .await?;
        let mut manifest = rec.clone();
        manifest.memory_dir = None;
        let manifest_path = work.0.join(MANIFEST);
        let json = serde_json::to_vec_pretty(&manifest).map_err(host)?;
        std::fs::write(&manifest_path, json).map_err(host)?;
        let mut entries = vec![
            (MANIFEST.to_string(), manifest_path),
            (ARTIFACT.to_string(), artifact),
        ];
        if let Some(mem) = &rec.memory_dir {
            // Pages read from parent snapshots travel too: the file stands alone.
            let flat = work.0.join("memory");
            std::fs::create_dir(&flat).map_err(host)?;
            self.backend.flatten_memory(mem, &flat).await?;
            entries.extend(memory_entries(&flat)?);
        }
        let out = self.transfer_dir().join(unique(&format!("{id}.sfs"))?);
        let out2 = out.clone();
        let key = self.read_secret_key()?;
        tokio::task::spawn_blocking(move || snapfile::write(&out2, &entries, &|d| key.sign(d)))
            .await
            .map_err(host)?
            .map_err(host)?;
        drop(work);
        Ok(out)
    }

    /// Verifies and imports a snapshot file. Keeps the file's snapshot id unless taken.
    /// `trust_unsigned` accepts a filesystem snapshot not signed with this daemon's key.
    pub async fn import_snapshot(&self, file: &Path, trust_unsigned: bool) -> Result<Snapshot> {
        self.check_open()?;
        let work = self.scratch("import")?;
        let (file, dir) = (file.to_path_buf(), work.0.clone());
        let got = tokio::task::spawn_blocking(move || snapfile::read(&file, &dir))
            .await
            .map_err(host)?
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let bad = |m: String| Error::InvalidArgument(format!("Not a valid snapshot file: {m}"));
        let manifest = std::fs::read(work.0.join(MANIFEST)).map_err(|e| bad(e.to_string()))?;
        let mut rec: SnapshotRecord =
            serde_json::from_slice(&manifest).map_err(|e| bad(e.to_string()))?;
        let signed = self.check_signed(&got, rec.view.kind, trust_unsigned)?;
        // What the file asks for is checked as given (a bad record is refused, naming
        // what is wrong), then, unsigned, its policy is replaced by the defaults.
        check_boot(&rec.boot).map_err(|e| bad(e.message()))?;
        if !signed {
            strip_policy(&mut rec);
        }
        let artifact = work.0.join(ARTIFACT);
        if !artifact.is_file() {
            return Err(bad(format!("it carries no {ARTIFACT} entry")));
        }
        let layer = self.backend.import_layer(artifact).await?;
        if layer != rec.layer_id {
            // The layers just read are pinned by nothing: free them now.
            if let Err(e) = self.backend.collect_garbage().await {
                tracing::warn!(error = %e, "freeing the layers of a refused import");
            }
            return Err(bad(format!(
                "its layers end at {layer}, not {}",
                rec.layer_id
            )));
        }
        let taken = self.store.snapshot(rec.view.id.clone()).await?.is_some();
        if taken || !valid_snapshot_id(&rec.view.id) || rec.internal {
            rec.view.id = new_snapshot_id()?;
        }
        rec.internal = false;
        // A host path from the file is never trusted: only the images it carries count.
        rec.memory_dir = None;
        let dir = self.claim_snapshot_dir(&mut rec.view.id)?;
        let placed = self.place_import(&mut rec, &work.0, &dir).await;
        if let Err(e) = placed {
            let _ = self.backend.unpin_layer(&rec.pin()).await;
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        tracing::info!(snapshot = %rec.view.id, "snapshot imported");
        Ok(rec.view)
    }

    /// The import's own snapshot directory ([`Manager::new_snapshot_dir`]): under `id`,
    /// or a fresh id when `id`'s is someone else's.
    fn claim_snapshot_dir(&self, id: &mut String) -> Result<PathBuf> {
        for _ in 0..8 {
            match self.new_snapshot_dir(id) {
                Ok(dir) => return Ok(dir),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    *id = new_snapshot_id()?;
                }
                Err(e) => return Err(host(e)),
            }
        }
        Err(host("no free snapshot id after 8 tries"))
    }

    /// Every file must be signed with this daemon's key, except a filesystem snapshot the
    /// caller chose to trust. Memory images are restored by CRIU as root: a file that
    /// declares a memory snapshot, or carries anything named like memory images, needs
    /// the key whatever the caller says. Ok(true) for a signed file, Ok(false) for a
    /// trusted unsigned one.
    fn check_signed(
        &self,
        got: &snapfile::Extracted,
        kind: SnapshotType,
        trust: bool,
    ) -> Result<bool> {
        let key = self.read_secret_key()?;
        if got.signature.is_some_and(|s| key.signed(&got.digest, &s)) {
            return Ok(true);
        }
        let memory = kind == SnapshotType::Memory
            || got
                .names
                .iter()
                .any(|n| n == "memory" || n.starts_with("memory/"));
        let key_file = self.config.data_dir.join(snapkey::FILE);
        if memory {
            return Err(Error::InvalidArgument(format!(
                "Snapshot file refused: it holds memory images and is not signed with this \
                 daemon's snapshot key ({}); memory snapshots are accepted only from hosts \
                 that share that key file",
                key_file.display()
            )));
        }
        if trust {
            return Ok(false);
        }
        Err(Error::InvalidArgument(format!(
            "Snapshot file refused: it is unsigned or signed with another host's key (not {}); \
             import it with trust_unsigned=true to accept its filesystem anyway",
            key_file.display()
        )))
    }

    async fn place_import(&self, rec: &mut SnapshotRecord, work: &Path, dir: &Path) -> Result<()> {
        if rec.view.kind == SnapshotType::Memory {
            let mem = dir.join("memory");
            std::fs::rename(work.join("memory"), &mem)
                .map_err(|e| Error::InvalidArgument(format!("Memory images missing: {e}")))?;
            // What the file says it maps is not trusted: the images it carries are counted.
            rec.restore_bytes = std::fs::read_dir(&mem)
                .map_err(host)?
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum();
            rec.memory_dir = Some(mem);
        }
        self.backend.pin_layer(&rec.pin(), &rec.layer_id).await?;
        self.store.put_snapshot(rec.clone()).await?;
        Ok(())
    }
}

/// What an unsigned file may not choose: trusting it trusts its filesystem, not its
/// policy. Its network (egress lists included), volumes and limits become a create's
/// defaults; a restore from it takes others as a create would (`network`, `cpus`, ...).
fn strip_policy(rec: &mut SnapshotRecord) {
    let defaults = crate::backend::NetworkSpec {
        internet: api_types::NetworkModeName::default() == api_types::NetworkModeName::Internet,
        allow_out: Vec::new(),
        deny_out: Vec::new(),
    };
    if rec.boot.network != defaults || !rec.boot.volumes.is_empty() {
        tracing::info!(snapshot = %rec.view.id, "an unsigned snapshot file's network and volumes dropped: the defaults apply");
    }
    rec.boot.network = defaults;
    rec.boot.volumes.clear();
    rec.boot.secrets.clear();
    rec.boot.cpus = api_types::DEFAULT_CPUS;
    rec.boot.memory_mb = api_types::DEFAULT_MEMORY_MB;
    rec.view.cpus = rec.boot.cpus;
    rec.view.memory_mb = rec.boot.memory_mb;
}

/// An imported record's resources and environment must pass what a create passes.
pub(super) fn check_boot(b: &BootSpec) -> Result<()> {
    super::create::validate(&CreateSandbox {
        cpus: Some(b.cpus),
        memory_mb: Some(b.memory_mb),
        disk_mb: Some(b.disk_mb),
        env: b.env.clone(),
        ..Default::default()
    })
}

fn memory_entries(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(host)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let entry = format!("memory/{name}");
        if e.file_type().is_ok_and(|t| t.is_file()) && snapfile::valid_name(&entry) {
            out.push((entry, e.path()));
        }
    }
    out.sort();
    Ok(out)
}
