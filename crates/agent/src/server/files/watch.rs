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
    /// followed), up to [`MAX_DIRS`].
    fn add(&mut self, dir: &Path) -> io::Result<()> {
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            if self.dirs.len() >= MAX_DIRS {
                break;
            }
            let wd = self.fd.get_ref().0.add_watch(&d, mask())?;
            if self.recursive {
                let subdirs = std::fs::read_dir(&d).into_iter().flatten().flatten();
                todo.extend(
                    subdirs
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
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
            let kind = match e.mask {
                m if m.contains(AddWatchFlags::IN_CREATE) => FsEventKind::Create,
                m if m.contains(AddWatchFlags::IN_MODIFY) => FsEventKind::Modify,
                m if m.contains(AddWatchFlags::IN_ATTRIB) => FsEventKind::Chmod,
                m if m.contains(AddWatchFlags::IN_DELETE) => FsEventKind::Delete,
                m if m.contains(AddWatchFlags::IN_MOVED_FROM) => {
                    moved_from.insert(e.cookie, out.len());
                    FsEventKind::Delete
                }
                m if m.contains(AddWatchFlags::IN_MOVED_TO) => {
                    if let Some(i) = moved_from.remove(&e.cookie) {
                        let from = out.remove(i);
                        moved_from
                            .values_mut()
                            .filter(|j| **j > i)
                            .for_each(|j| *j -= 1);
                        let mut renamed = event(FsEventKind::Rename, text, is_dir);
                        renamed.old_path = Some(from.path);
                        out.push(renamed);
                        self.follow_new_dir(&path, is_dir);
                        continue;
                    }
                    FsEventKind::Create
                }
                _ => continue,
            };
            if kind == FsEventKind::Create {
                self.follow_new_dir(&path, is_dir);
            }
            out.push(event(kind, text, is_dir));
        }
        out
    }

    /// A directory made (or moved in) under a recursive watch is watched too.
    fn follow_new_dir(&mut self, path: &Path, is_dir: bool) {
        if self.recursive && is_dir {
            if let Err(e) = self.add(path) {
                tracing::debug!(path = %path.display(), "cannot watch a new directory: {e}");
            }
        }
    }
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
    watch.add(root).map_err(|e| io_error(&path, &e))?;
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
