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
/// In a file exported relative to a base snapshot: what the importer must already have.
const BASE: &str = "base.json";

/// The snapshot a relative export leans on, as its file records it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Base {
    /// Its id on the exporting daemon (an import under another id is found by content).
    id: String,
    /// Its top disk layer: the file's layers stack on it (ids are content hashes).
    layer_id: String,
    /// `pages_digest` of its memory when the file's memory pages lean on it (hex).
    memory_digest: Option<String>,
    /// Where its images are, on the exporting side only.
    #[serde(skip)]
    memory_dir: Option<PathBuf>,
}

/// The local snapshot a relative import leans on.
struct Local {
    id: String,
    layer_id: String,
    memory_dir: Option<PathBuf>,
    restore_bytes: u64,
}

/// Writes `value` as `name` in `dir`: one entry of a snapshot file.
fn write_json(dir: &Path, name: &str, value: &impl serde::Serialize) -> Result<(String, PathBuf)> {
    let path = dir.join(name);
    let json = serde_json::to_vec_pretty(value).map_err(host)?;
    std::fs::write(&path, json).map_err(host)?;
    Ok((name.to_string(), path))
}

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

    /// Writes snapshot `id` as one file; returns its path (the caller removes it). With
    /// `base` (a snapshot `id` descends from, which the receiver already has) the file
    /// carries only what differs from it: the disk layers above the base's and the memory
    /// pages not equal to the base's; its import needs the base, checked by content.
    pub async fn export_snapshot(&self, id: &str, base: Option<&str>) -> Result<PathBuf> {
        let rec = self.usable_snapshot(id).await?;
        let base = match base {
            Some(b) => Some(self.export_base(&rec, b).await?),
            None => None,
        };
        let work = self.scratch("export")?;
        let mut entries = Vec::new();
        let mut manifest = rec.clone();
        manifest.memory_dir = None;
        entries.push(write_json(&work.0, MANIFEST, &manifest)?);
        let base_layer = base.as_ref().map(|b| b.layer_id.as_str());
        if base_layer != Some(rec.layer_id.as_str()) {
            let artifact = work.0.join(ARTIFACT);
            self.backend
                .export_layer(&rec.layer_id, base_layer, artifact.clone())
                .await
                .map_err(|e| match (e, &base) {
                    (crate::backend::BackendError::InvalidInput(m), Some(b)) => {
                        Error::InvalidArgument(format!(
                            "Snapshot {id} cannot be exported relative to {}: {m}",
                            b.id
                        ))
                    }
                    (e, _) => e.into(),
                })?;
            entries.push((ARTIFACT.to_string(), artifact));
        }
        if let Some(mem) = &rec.memory_dir {
            // Pages read from parent snapshots travel too: the file stands alone, or
            // leans on the base's pages alone.
            let flat = work.0.join("memory");
            std::fs::create_dir(&flat).map_err(host)?;
            self.backend.flatten_memory(mem, &flat).await?;
            if let Some(base_mem) = base.as_ref().and_then(|b| b.memory_dir.as_ref()) {
                self.backend.share_memory(&flat, base_mem).await?;
            }
            entries.extend(memory_entries(&flat)?);
        }
        if let Some(b) = &base {
            entries.push(write_json(&work.0, BASE, b)?);
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

    /// What a file exported relative to snapshot `base_id` records of it; the snapshot
    /// being exported must come from it (its own, or a memory snapshot it was taken from).
    async fn export_base(&self, rec: &SnapshotRecord, base_id: &str) -> Result<Base> {
        let base = self.usable_snapshot(base_id).await?;
        if base.view.id == rec.view.id {
            return Err(Error::InvalidArgument(format!(
                "Snapshot {base_id} cannot be the base of its own export"
            )));
        }
        let memory_dir = match (&rec.memory_dir, &base.memory_dir) {
            (Some(_), Some(dir)) => Some(dir.clone()),
            _ => None,
        };
        let memory_digest = match &memory_dir {
            Some(dir) => Some(super::ports::hex(&self.backend.memory_digest(dir).await?)),
            None => None,
        };
        Ok(Base {
            id: base.view.id,
            layer_id: base.layer_id,
            memory_digest,
            memory_dir,
        })
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
        let base = self.import_base(&work.0, &rec).await?;
        let artifact = work.0.join(ARTIFACT);
        let layer = match &base {
            _ if artifact.is_file() => self.backend.import_layer(artifact).await?,
            Some(b) => b.layer_id.clone(),
            None => return Err(bad(format!("it carries no {ARTIFACT} entry"))),
        };
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
        let placed = self
            .place_import(&mut rec, &work.0, &dir, base.as_ref())
            .await;
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

    async fn place_import(
        &self,
        rec: &mut SnapshotRecord,
        work: &Path,
        dir: &Path,
        base: Option<&Local>,
    ) -> Result<()> {
        // Linking to the base and recording this snapshot happen under the lineage lock:
        // the base's directory cannot be dropped in between.
        let _order = self.lineage.lock().await;
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
            if let Some((b, parent)) = base.and_then(|b| Some((b, b.memory_dir.as_ref()?))) {
                let still = self.usable_snapshot(&b.id).await;
                if !matches!(still, Ok(r) if r.memory_dir.as_ref() == Some(parent)) {
                    return Err(Error::Conflict(format!(
                        "Snapshot {}, the base of this file, went away during the import",
                        b.id
                    )));
                }
                runtime::memory_images::link_parent(&mem, parent).map_err(host)?;
                rec.restore_bytes += b.restore_bytes;
            }
            rec.memory_dir = Some(mem);
        }
        self.backend.pin_layer(&rec.pin(), &rec.layer_id).await?;
        self.store.put_snapshot(rec.clone()).await?;
        Ok(())
    }

    /// For a file exported relative to a base: the local snapshot that is that base (by
    /// its id, else any with the same content), which the file's layers and pages need.
    async fn import_base(&self, work: &Path, rec: &SnapshotRecord) -> Result<Option<Local>> {
        let path = work.join(BASE);
        if !path.exists() {
            return Ok(None);
        }
        let bad = |m: String| Error::InvalidArgument(format!("Not a valid snapshot file: {m}"));
        let bytes = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let want: Base = serde_json::from_slice(&bytes).map_err(|e| bad(format!("{BASE}: {e}")))?;
        if want.memory_digest.is_some() != (rec.view.kind == SnapshotType::Memory) {
            return Err(bad(format!(
                "{BASE} does not fit a {:?} snapshot",
                rec.view.kind
            )));
        }
        let mut all = self.store.snapshots().await?;
        // The same id first; then any other candidate with the same disk.
        all.sort_by_key(|r| r.view.id != want.id);
        for r in all {
            if r.layer_id != want.layer_id || r.pulled || r.internal {
                continue;
            }
            let memory_dir = match (&want.memory_digest, &r.memory_dir) {
                (None, _) => None,
                (Some(digest), Some(dir)) if dir.is_dir() => {
                    let got = self.backend.memory_digest(dir).await?;
                    if super::ports::hex(&got) != *digest {
                        continue;
                    }
                    Some(dir.clone())
                }
                (Some(_), _) => continue,
            };
            return Ok(Some(Local {
                id: r.view.id,
                layer_id: r.layer_id,
                memory_dir,
                restore_bytes: r.restore_bytes,
            }));
        }
        Err(Error::NotFound(format!(
            "This snapshot file was exported relative to snapshot {}, and no snapshot here \
             has its content: import that snapshot's own file first (or export without a base)",
            want.id
        )))
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
