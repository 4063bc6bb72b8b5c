//! File operations inside the sandbox, streamed and bounded.

mod read;
mod watch;
mod write;

use std::fs::{self, Metadata};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

use proto::agent::{AgentError, DirEntry, ErrorKind, FileKind, FileStat, Message};
use tokio::sync::mpsc;

use super::errors::{check_path, invalid, io_error};
use super::wire::Writer;

pub use read::read_file;
pub use watch::watch_dir;
pub use write::{write_file, WriteHow};

/// Entries per `DirEntries` frame.
const DIR_BATCH: usize = 256;

pub fn file_stat(m: &Metadata) -> FileStat {
    let ft = m.file_type();
    let kind = match () {
        _ if ft.is_symlink() => FileKind::Symlink,
        _ if ft.is_dir() => FileKind::Dir,
        _ if ft.is_file() => FileKind::File,
        _ => FileKind::Other,
    };
    let mtime_unix_ms = m
        .mtime()
        .saturating_mul(1000)
        .saturating_add(m.mtime_nsec() / 1_000_000);
    FileStat {
        kind,
        size: m.size(),
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        mtime_unix_ms,
    }
}

pub(super) fn too_large(path: &str, max: u64) -> AgentError {
    AgentError::new(
        ErrorKind::TooLarge,
        format!("{path}: larger than the transfer limit of {max} bytes"),
    )
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(AgentError::new(ErrorKind::Other, e.to_string())))
}

pub async fn stat(path: String) -> Result<Message, AgentError> {
    blocking(move || {
        let m = fs::symlink_metadata(check_path(&path)?).map_err(|e| io_error(&path, &e))?;
        Ok(Message::Stat(file_stat(&m)))
    })
    .await
}

pub async fn remove(path: String, recursive: bool) -> Result<Message, AgentError> {
    blocking(move || {
        let p = check_path(&path)?;
        if p == Path::new("/") {
            return Err(invalid("refusing to remove /"));
        }
        let m = fs::symlink_metadata(p).map_err(|e| io_error(&path, &e))?;
        let r = match (m.is_dir(), recursive) {
            (true, true) => fs::remove_dir_all(p),
            (true, false) => fs::remove_dir(p),
            (false, _) => fs::remove_file(p),
        };
        r.map_err(|e| io_error(&path, &e))?;
        Ok(Message::Done)
    })
    .await
}

pub async fn mkdir(path: String, parents: bool, mode: Option<u32>) -> Result<Message, AgentError> {
    blocking(move || {
        let p = check_path(&path)?;
        let mut b = fs::DirBuilder::new();
        b.recursive(parents).mode(mode.unwrap_or(0o755) & 0o7777);
        b.create(p).map_err(|e| io_error(&path, &e))?;
        if parents && !p.is_dir() {
            return Err(AgentError::new(
                ErrorKind::AlreadyExists,
                format!("{path}: exists and is not a directory"),
            ));
        }
        Ok(Message::Done)
    })
    .await
}

/// Streams a directory listing in batches; the blocking walk runs off the event loop
/// and stops when the connection does.
pub async fn list_dir(path: String, writer: &mut Writer) -> Result<(), AgentError> {
    let (tx, mut rx) = mpsc::channel::<Result<Vec<DirEntry>, AgentError>>(2);
    let walk = tokio::task::spawn_blocking(move || walk_dir(&path, &tx));
    while let Some(batch) = rx.recv().await {
        let msg = match batch {
            Ok(entries) => Message::DirEntries(entries),
            Err(e) => return Err(e),
        };
        if writer.send(&msg).await.is_err() {
            walk.abort();
            return Ok(());
        }
    }
    let _ = writer.send(&Message::Eof).await;
    Ok(())
}

fn walk_dir(path: &str, tx: &mpsc::Sender<Result<Vec<DirEntry>, AgentError>>) {
    let dir = match check_path(path).and_then(|p| fs::read_dir(p).map_err(|e| io_error(path, &e))) {
        Ok(d) => d,
        Err(e) => return drop(tx.blocking_send(Err(e))),
    };
    let mut batch = Vec::with_capacity(DIR_BATCH);
    for entry in dir.flatten() {
        let Ok(m) = entry.metadata() else { continue };
        batch.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            stat: file_stat(&m),
        });
        if batch.len() == DIR_BATCH && tx.blocking_send(Ok(std::mem::take(&mut batch))).is_err() {
            return;
        }
    }
    if !batch.is_empty() {
        let _ = tx.blocking_send(Ok(batch));
    }
}
