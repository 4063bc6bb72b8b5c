//! File operations inside the sandbox, streamed and bounded.

use std::fs::{self, Metadata};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use proto::agent::{AgentError, DirEntry, ErrorKind, FileKind, FileStat, Message, CHUNK_SIZE};
use tokio::sync::mpsc;

use super::conn::{send_error, Reader, Writer};
use super::errors::{check_path, invalid, io_error};

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

fn too_large(path: &str, max: u64) -> AgentError {
    AgentError::new(
        ErrorKind::TooLarge,
        format!("{path}: larger than the transfer limit of {max} bytes"),
    )
}

async fn blocking<T: Send + 'static>(
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

/// Opens a file for reading and positions it: `Stat` goes first, then the data.
fn open_for_read(
    path: &str,
    offset: u64,
    want: u64,
    max: u64,
) -> Result<(fs::File, FileStat), AgentError> {
    let p = check_path(path)?;
    let mut f = fs::File::open(p).map_err(|e| io_error(path, &e))?;
    let m = f.metadata().map_err(|e| io_error(path, &e))?;
    if m.is_dir() {
        return Err(AgentError::new(
            ErrorKind::IsADirectory,
            format!("{path}: is a directory"),
        ));
    }
    if m.is_file() && m.len().saturating_sub(offset).min(want) > max {
        return Err(too_large(path, max));
    }
    if offset > 0 {
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| io_error(path, &e))?;
    }
    Ok((f, file_stat(&m)))
}

/// `Stat`, `Data`*, `Eof`; at most `limit` bytes, and more than `max` is an error.
pub async fn read_file(
    path: String,
    offset: u64,
    limit: Option<u64>,
    max: u64,
    writer: &mut Writer,
) -> Result<(), AgentError> {
    let want = limit.unwrap_or(u64::MAX);
    let p = path.clone();
    let (file, st) = blocking(move || open_for_read(&p, offset, want, max)).await?;
    if writer.send(&Message::Stat(st)).await.is_err() {
        return Ok(());
    }
    let (tx, mut rx) = mpsc::channel::<Result<Vec<u8>, AgentError>>(4);
    let reader = tokio::task::spawn_blocking(move || read_chunks(file, &path, want, max, &tx));
    while let Some(chunk) = rx.recv().await {
        if writer.send(&Message::Data(chunk?)).await.is_err() {
            reader.abort();
            return Ok(());
        }
    }
    let _ = writer.send(&Message::Eof).await;
    Ok(())
}

fn read_chunks(
    mut f: fs::File,
    path: &str,
    want: u64,
    max: u64,
    tx: &mpsc::Sender<Result<Vec<u8>, AgentError>>,
) {
    let mut sent = 0u64;
    while sent < want {
        let n = (want - sent).min(CHUNK_SIZE as u64) as usize;
        let mut buf = vec![0u8; n];
        let chunk = match f.read(&mut buf) {
            Ok(0) => return,
            Ok(n) if sent + n as u64 > max => Err(too_large(path, max)),
            Ok(n) => {
                buf.truncate(n);
                sent += n as u64;
                Ok(buf)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => Err(io_error(path, &e)),
        };
        let stop = chunk.is_err();
        if tx.blocking_send(chunk).is_err() || stop {
            return;
        }
    }
}

/// A temporary file next to the target, renamed over it when complete and removed if not.
struct TempFile {
    path: PathBuf,
    file: Option<tokio::fs::File>,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn create_temp(
    path: &str,
    mode: Option<u32>,
    create_parents: bool,
) -> Result<(TempFile, PathBuf), AgentError> {
    let target = check_path(path)?.to_path_buf();
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(invalid(format!("{path}: not a file path")));
    };
    if create_parents {
        fs::create_dir_all(parent).map_err(|e| io_error(&parent.to_string_lossy(), &e))?;
    }
    let existing = fs::metadata(&target).ok();
    if existing.as_ref().is_some_and(Metadata::is_dir) {
        return Err(AgentError::new(
            ErrorKind::IsADirectory,
            format!("{path}: is a directory"),
        ));
    }
    let tmp = parent.join(format!(
        ".{}.sandfork-{}",
        name.to_string_lossy(),
        random_suffix()
    ));
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| io_error(path, &e))?;
    let guard = TempFile {
        path: tmp,
        file: Some(tokio::fs::File::from_std(
            file.try_clone().map_err(|e| io_error(path, &e))?,
        )),
    };
    let mode = mode
        .or(existing.as_ref().map(|m| m.mode()))
        .unwrap_or(0o644)
        & 0o7777;
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| io_error(path, &e))?;
    if let Some(m) = existing {
        let _ = std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()));
    }
    Ok((guard, target))
}

fn random_suffix() -> String {
    let mut b = [0u8; 6];
    let _ = fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{}{nanos:08x}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

/// `Done` once the file is open, then `Data`* / `Eof` from the host, then `Written`.
pub async fn write_file(
    path: String,
    mode: Option<u32>,
    create_parents: bool,
    max: u64,
    reader: &mut Reader,
    writer: &mut Writer,
) {
    let p = path.clone();
    let (mut tmp, target) = match blocking(move || create_temp(&p, mode, create_parents)).await {
        Ok(t) => t,
        Err(e) => return send_error(writer, e).await,
    };
    if writer.send(&Message::Done).await.is_err() {
        return;
    }
    match receive(&mut tmp, &path, max, reader).await {
        Ok(Some(bytes)) => {
            tmp.file = None;
            if let Err(e) = fs::rename(&tmp.path, &target) {
                let _ = fs::remove_file(&tmp.path);
                return send_error(writer, io_error(&path, &e)).await;
            }
            let _ = writer.send(&Message::Written { bytes }).await;
        }
        Ok(None) => {}
        Err(e) => send_error(writer, e).await,
    }
}

/// Copies `Data` frames into the temporary file; `None` when the host went away.
async fn receive(
    tmp: &mut TempFile,
    path: &str,
    max: u64,
    reader: &mut Reader,
) -> Result<Option<u64>, AgentError> {
    use tokio::io::AsyncWriteExt;
    let Some(file) = tmp.file.as_mut() else {
        return Ok(None);
    };
    let mut total = 0u64;
    loop {
        match reader.read().await {
            Ok(Some(Message::Data(d))) => {
                total += d.len() as u64;
                if total > max {
                    return Err(too_large(path, max));
                }
                file.write_all(&d).await.map_err(|e| io_error(path, &e))?;
            }
            Ok(Some(Message::Eof)) => {
                file.flush().await.map_err(|e| io_error(path, &e))?;
                return Ok(Some(total));
            }
            Ok(Some(_)) => return Err(invalid("expected file data")),
            Ok(None) | Err(_) => return Ok(None),
        }
    }
}
