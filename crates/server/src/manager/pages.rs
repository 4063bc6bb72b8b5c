//! The pages files of pulled memory snapshots, served lazily (docs/scale-out.md).
//!
//! A memory snapshot's pages files (`pages-<n>.img`, nearly all of its size) are
//! published as block-store layers. A node that pulls the snapshot adds them as partial
//! layers, forks a disk from each and serves it as one file (a disk server without loop
//! device or filesystem). The image directory holds a symlink to that file. CRIU, and the
//! lazy-pages daemon reading in the background, read the pages through it; each read of a
//! chunk not yet here waits for its fetch (and its checks). A restore so starts before
//! the pages have come, and they come as they are read.
//!
//! The servers are processes of their own, as sandbox disks' are: a restart of the daemon
//! leaves them serving, and the next daemon adopts them. A graceful stop ends them unless
//! a lazy restore may still read from them.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use blockstore::{LayerId, Store};
use disk::{DiskSpec, MountOptions, ServedFile};

use crate::backend::BackendError;
use crate::error::{Error, Result};
use crate::snapshots::{ServedPages, SnapshotRecord};

fn host(e: impl std::fmt::Display) -> Error {
    Error::Backend(BackendError::Host(e.to_string()))
}

/// The pages files served on this node, by disk.
pub(super) struct PagesServers {
    store: Store,
    run_root: PathBuf,
    served: Mutex<HashMap<String, ServedFile>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PagesServers {
    pub(super) fn new(store: Store, data_dir: &Path) -> PagesServers {
        PagesServers {
            store,
            run_root: data_dir.join("pages"),
            served: Mutex::new(HashMap::new()),
        }
    }

    fn spec(&self, disk: &str) -> DiskSpec {
        DiskSpec {
            store: self.store.root().to_path_buf(),
            disk: disk.to_string(),
            run_dir: self.run_root.join(disk),
        }
    }

    /// Serves `p` (its disk forked from its layer when it does not exist yet), taking over
    /// a server that still runs; returns the served file. Blocking.
    pub(super) fn serve(&self, p: &ServedPages) -> Result<PathBuf> {
        if let Some(s) = lock(&self.served).get(&p.disk) {
            return Ok(s.path());
        }
        let spec = self.spec(&p.disk);
        let served = match ServedFile::adopt(&spec) {
            Some(s) => s,
            None => {
                let _ = disk::cleanup_stale(&spec.run_dir);
                let layer: LayerId = p
                    .layer
                    .parse()
                    .map_err(|_| host(format!("bad layer id {:?}", p.layer)))?;
                match self.store.create_disk(&p.disk, p.size, Some(&layer)) {
                    Ok(()) | Err(blockstore::Error::DiskExists(_)) => {}
                    Err(e) => return Err(host(e)),
                }
                let opts = MountOptions {
                    grow_fs: false,
                    ..MountOptions::default()
                };
                ServedFile::start(&spec, &opts).map_err(host)?
            }
        };
        let path = served.path();
        lock(&self.served).insert(p.disk.clone(), served);
        Ok(path)
    }

    /// Stops serving `disk`, deletes it and unpins its layer. Blocking.
    pub(super) fn release(&self, disk: &str) {
        let spec = self.spec(disk);
        let served = lock(&self.served)
            .remove(disk)
            .or_else(|| ServedFile::adopt(&spec));
        if let Some(s) = served {
            s.stop();
        }
        let _ = disk::cleanup_stale(&spec.run_dir);
        let _ = self.store.delete_disk(disk);
        let _ = self.store.delete_ref(&pin_of(disk));
        let _ = std::fs::remove_dir_all(&spec.run_dir);
    }

    /// Releases every pages disk, served or not, that `named` does not list, and the pins
    /// of publishes cut short. Blocking; at start-up, before any pull.
    pub(super) fn sweep(&self, named: &HashSet<String>) {
        let mut disks: HashSet<String> = std::fs::read_dir(&self.run_root)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        let refs = self.store.list_refs().unwrap_or_default();
        for (name, _) in &refs {
            if let Some(disk) = name.strip_prefix(PIN_PREFIX) {
                disks.insert(disk.to_string());
            } else if name.starts_with(PUBLISH_PREFIX) {
                let _ = self.store.delete_ref(name);
            }
        }
        for disk in disks.difference(named) {
            tracing::info!(disk = %disk, "removing the pages disk of a pull cut short");
            self.release(disk);
        }
    }

    /// At a graceful stop: ends every server, unless a lazy restore may still read.
    pub(super) fn stop_all_if_unread(&self) {
        if runtime::host::lazy::any_serving() {
            tracing::info!("leaving the pages servers up: a lazy restore still reads memory");
            return;
        }
        let disks: Vec<String> = lock(&self.served).keys().cloned().collect();
        for d in disks {
            if let Some(s) = lock(&self.served).remove(&d) {
                s.stop();
            }
        }
    }
}

/// Block-store refs pinning a pages disk's layer: this and the disk's name.
const PIN_PREFIX: &str = "pages-";
/// Block-store refs pinning a pages file being published (`publish-<snapshot>.<file>`).
pub(super) const PUBLISH_PREFIX: &str = "publish-";

/// A new name for the disk serving the `index`th pages file of snapshot `id`: unique to
/// this pull, so a release of an earlier pull never takes it.
pub(super) fn disk_name(id: &str, index: usize) -> Result<String> {
    let nonce = model::ids::random_id::<4>("mem").map_err(host)?;
    Ok(format!("{nonce}-{id}-{index}"))
}

/// The ref pinning the layer of pages disk `disk`.
pub(super) fn pin_of(disk: &str) -> String {
    format!("{PIN_PREFIX}{disk}")
}

/// How long a release waits for a lazy restore still reading the pages.
const READ_WAIT: Duration = Duration::from_secs(300);

/// Waits until no lazy-pages daemon reads `images` (at most [`READ_WAIT`]). Blocking.
pub(super) fn wait_unread(images: &Path) {
    let started = Instant::now();
    while runtime::host::lazy::reading(images) {
        if started.elapsed() > READ_WAIT {
            tracing::warn!(images = %images.display(), "a lazy restore still reads pulled pages after 300 s: releasing them");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Links `link` (in an image directory) to the served file `target`, relatively: CRIU
/// opens images from inside the restored sandbox's root, where an absolute path names
/// nothing, but a relative one still walks from the image directory.
pub(super) fn link_pages(target: &Path, link: &Path) -> std::io::Result<()> {
    let from = link.parent().unwrap_or(Path::new("/"));
    let rel = relative(from, target);
    match std::fs::read_link(link) {
        Ok(existing) if existing == rel => return Ok(()),
        Ok(_) => std::fs::remove_file(link)?,
        Err(_) => {}
    }
    std::os::unix::fs::symlink(&rel, link)
}

/// `to` as a path relative to directory `from` (both absolute).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (f, t): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

/// Serves the pages files of pulled snapshot `rec` again (after a restart). Blocking.
pub(super) fn reserve(servers: &PagesServers, rec: &SnapshotRecord) -> Result<()> {
    let Some(dir) = &rec.memory_dir else {
        return Ok(());
    };
    for p in &rec.pages {
        let path = servers.serve(p)?;
        link_pages(&path, &dir.join(&p.file)).map_err(host)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_to_the_image_directory() {
        let rel = relative(
            Path::new("/d/snapshots/s/memory"),
            Path::new("/d/pages/m-0/fuse/disk"),
        );
        assert_eq!(rel, PathBuf::from("../../../pages/m-0/fuse/disk"));
        let dir = tempfile::tempdir().unwrap();
        let mem = dir.path().join("snapshots/s/memory");
        let target = dir.path().join("pages/m/fuse/disk");
        std::fs::create_dir_all(&mem).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, b"pages").unwrap();
        link_pages(&target, &mem.join("pages-1.img")).unwrap();
        link_pages(&target, &mem.join("pages-1.img")).unwrap();
        assert_eq!(std::fs::read(mem.join("pages-1.img")).unwrap(), b"pages");
    }
}
