//! Watching a directory for changes: inotify, the directories under it too on request
//! (those made later included), each read of the kernel's queue sent as one batch until
//! the host closes the connection.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use proto::agent::{AgentError, FsEvent, FsEventKind, Message};
use tokio::io::unix::AsyncFd;

use super::super::errors::{check_path, invalid, io_error};
use super::super::wire::{Reader, Writer};

/// Directories one watch covers at most (the kernel's per-user watch limit is the other
/// bound); deeper or wider trees are watched up to it.
const MAX_DIRS: usize = 8192;

/// The inotify descriptor as tokio waits on it.
struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

struct Watch {
    fd: AsyncFd<Fd>,
    dirs: HashMap<WatchDescriptor, PathBuf>,
    recursive: bool,
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DONT_FOLLOW
        | AddWatchFlags::IN_ONLYDIR
}

impl Watch {
    fn new(recursive: bool) -> io::Result<Watch> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        // SAFETY: `Fd` owns the inotify descriptor (an `OwnedFd` inside `Inotify`), which
        // stays open and the same for as long as the `AsyncFd` holds it, and `as_raw_fd`
        // always returns that descriptor.
        let fd = unsafe { AsyncFd::register(Fd(ino)) }.map_err(io::Error::from)?;
        Ok(Watch {
            fd,
            dirs: HashMap::new(),
            recursive,
        })
    }

    /// Watches `dir`, and with `recursive` the directories under it (symlinks not
    /// followed), up to [`MAX_DIRS`]. With `found`, every entry already inside the newly
    /// watched directories is reported there as created: a directory made under the watch
    /// may be filled before its own watch is in place, and those entries would otherwise
    /// go unseen.
    fn add(&mut self, dir: &Path, mut found: Option<&mut Vec<FsEvent>>) -> io::Result<()> {
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            if self.dirs.len() >= MAX_DIRS {
                break;
            }
            let wd = self.fd.get_ref().0.add_watch(&d, mask())?;
            if self.recursive {
                for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                    if let Some(found) = found.as_deref_mut() {
                        let path = entry.path().to_string_lossy().into_owned();
                        found.push(event(FsEventKind::Create, path, is_dir));
                    }
                    if is_dir {
                        todo.push(entry.path());
                    }
                }
            }
            self.dirs.insert(wd, d);
        }
        Ok(())
    }

    /// The kernel's events as the protocol's: a move within the watch (both halves in one
    /// read) is a rename, a move in a create, a move out a delete.
    fn translate(&mut self, events: Vec<InotifyEvent>) -> Vec<FsEvent> {
        let mut out = Vec::new();
        let mut moved_from: HashMap<u32, usize> = HashMap::new();
        for e in events {
            if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                out.push(event(FsEventKind::Overflow, String::new(), false));
                continue;
            }
            if e.mask.contains(AddWatchFlags::IN_IGNORED) {
                self.dirs.remove(&e.wd);
                continue;
            }
            let Some(dir) = self.dirs.get(&e.wd) else {
                continue;
            };
            let path = match &e.name {
                Some(name) => dir.join(name),
                None => dir.clone(),
            };
            let is_dir = e.mask.contains(AddWatchFlags::IN_ISDIR);
            let text = path.to_string_lossy().into_owned();
            // A write through the API in progress: only its rename into place counts.
            let temp = !is_dir && is_temp(&text);
            if temp && !e.mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                continue;
            }
            let kind = match e.mask {
                m if m.contains(AddWatchFlags::IN_CREATE) => FsEventKind::Create,
                m if m.contains(AddWatchFlags::IN_MODIFY) => FsEventKind::Modify,
                m if m.contains(AddWatchFlags::IN_ATTRIB) => FsEventKind::Chmod,
                m if m.contains(AddWatchFlags::IN_DELETE) => FsEventKind::Delete,
                m if m.contains(AddWatchFlags::IN_MOVED_FROM) => {
                    moved_from.insert(e.cookie, out.len());
                    if temp {
                        // Held until its MOVED_TO; dropped below when none comes.
                        out.push(event(FsEventKind::Create, text, is_dir));
                        continue;
                    }
                    FsEventKind::Delete
                }
                m if m.contains(AddWatchFlags::IN_MOVED_TO) => {
                    if let Some(i) = moved_from.remove(&e.cookie) {
                        let from = out.remove(i);
                        moved_from
                            .values_mut()
                            .filter(|j| **j > i)
                            .for_each(|j| *j -= 1);
                        if is_temp(&from.path) {
                            // The temporary file of a write through the API renamed into
                            // place: the file at `path` was written (made or replaced).
                            out.push(event(FsEventKind::Create, text, is_dir));
                            continue;
                        }
                        let mut renamed = event(FsEventKind::Rename, text, is_dir);
                        renamed.old_path = Some(from.path);
                        out.push(renamed);
                        // Renamed within the watch: its entries were seen already.
                        self.follow_new_dir(&path, is_dir, None);
                        continue;
                    }
                    FsEventKind::Create
                }
                _ => continue,
            };
            out.push(event(kind, text, is_dir));
            if kind == FsEventKind::Create {
                self.follow_new_dir(&path, is_dir, Some(&mut out));
            }
        }
        out.retain(|e| !is_temp(&e.path));
        out
    }

    /// A directory made (or moved in) under a recursive watch is watched too; with `out`,
    /// what it already holds is reported there as created (an entry made in the moment
    /// before the watch was in place may so be reported twice, never missed).
    fn follow_new_dir(&mut self, path: &Path, is_dir: bool, out: Option<&mut Vec<FsEvent>>) {
        if self.recursive && is_dir {
            if let Err(e) = self.add(path, out) {
                tracing::debug!(path = %path.display(), "cannot watch a new directory: {e}");
            }
        }
    }
}

/// Whether `path` names the temporary file of a write through the API.
fn is_temp(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(super::write::is_temp_name)
}

fn event(kind: FsEventKind, path: String, is_dir: bool) -> FsEvent {
    FsEvent {
        kind,
        path,
        old_path: None,
        is_dir,
    }
}

/// `WatchDir`: `Done` once watching, then `FsEvents` batches until the host leaves.
pub async fn watch_dir(
    path: String,
    recursive: bool,
    reader: &mut Reader,
    writer: &mut Writer,
) -> Result<(), AgentError> {
    let root = check_path(&path)?;
    match std::fs::symlink_metadata(root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(invalid(format!("{path}: not a directory"))),
        Err(e) => return Err(io_error(&path, &e)),
    }
    let mut watch = Watch::new(recursive).map_err(|e| io_error("inotify", &e))?;
    watch.add(root, None).map_err(|e| io_error(&path, &e))?;
    if writer.send(&Message::Done).await.is_err() {
        return Ok(());
    }
    loop {
        tokio::select! {
            ready = watch.fd.readable() => {
                let mut guard = ready.map_err(|e| io_error("inotify", &e))?;
                let read = guard.try_io(|fd| fd.get_ref().0.read_events().map_err(io::Error::from));
                let events = match read {
                    Ok(Ok(events)) => events,
                    Ok(Err(e)) => return Err(io_error("inotify", &e)),
                    Err(_would_block) => continue,
                };
                let batch = watch.translate(events);
                if !batch.is_empty() && writer.send(&Message::FsEvents(batch)).await.is_err() {
                    return Ok(());
                }
            }
            // The host closed the connection (or sent something it should not): done.
            _ = reader.read() => return Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn drain(watch: &mut Watch) -> Vec<FsEvent> {
        let events = watch.fd.get_ref().0.read_events().unwrap_or_default();
        watch.translate(events)
    }

    #[tokio::test]
    async fn a_new_directory_filled_before_its_watch_is_reported_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let mut watch = Watch::new(true).unwrap();
        watch.add(tmp.path(), None).unwrap();
        // Made and filled before the watch reads the directory's creation, so the kernel
        // holds no event for what is inside it.
        std::fs::create_dir_all(tmp.path().join("new/inner")).unwrap();
        std::fs::write(tmp.path().join("new/deep"), b"x").unwrap();
        std::fs::write(tmp.path().join("new/inner/deeper"), b"x").unwrap();
        let seen = drain(&mut watch);
        let created = |rel: &str| {
            let path = tmp.path().join(rel).to_string_lossy().into_owned();
            seen.iter()
                .any(|e| e.kind == FsEventKind::Create && e.path == path)
        };
        assert!(created("new") && created("new/deep"), "{seen:?}");
        assert!(
            created("new/inner") && created("new/inner/deeper"),
            "{seen:?}"
        );
        // The new directories are watched from now on.
        std::fs::write(tmp.path().join("new/inner/later"), b"x").unwrap();
        assert!(drain(&mut watch)
            .iter()
            .any(|e| e.path.ends_with("new/inner/later")));
    }

    #[tokio::test]
    async fn a_write_through_the_api_is_one_create_of_its_file() {
        let tmp = tempfile::tempdir().unwrap();
        let mut watch = Watch::new(false).unwrap();
        watch.add(tmp.path(), None).unwrap();
        let temp = tmp.path().join(".data.json.sandfork-0a1b2c3d4e5f00000000");
        std::fs::write(&temp, b"{}").unwrap();
        std::fs::rename(&temp, tmp.path().join("data.json")).unwrap();
        let seen = drain(&mut watch);
        let path = tmp.path().join("data.json").to_string_lossy().into_owned();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].kind == FsEventKind::Create && seen[0].path == path,
            "{seen:?}"
        );
        // A dot file that only looks alike is reported as any file.
        std::fs::write(tmp.path().join(".x.sandfork-notes"), b"x").unwrap();
        assert!(!drain(&mut watch).is_empty());
    }

    #[tokio::test]
    async fn a_directory_renamed_within_the_watch_reports_no_creates_for_its_entries() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("a")).unwrap();
        std::fs::write(tmp.path().join("a/f"), b"x").unwrap();
        let mut watch = Watch::new(true).unwrap();
        watch.add(tmp.path(), None).unwrap();
        std::fs::rename(tmp.path().join("a"), tmp.path().join("b")).unwrap();
        let seen = drain(&mut watch);
        assert!(
            seen.iter().all(|e| e.kind == FsEventKind::Rename),
            "{seen:?}"
        );
        std::fs::write(tmp.path().join("b/g"), b"x").unwrap();
        let later = drain(&mut watch);
        let path = tmp.path().join("b/g").to_string_lossy().into_owned();
        assert!(later.iter().any(|e| e.path == path), "{later:?}");
    }
}
