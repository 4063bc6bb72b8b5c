//! Atomic, bounded file writes: a temporary file renamed over the target.

use std::fs::{self, Metadata};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use proto::agent::{AgentError, ErrorKind, Message};

use super::{blocking, too_large};
use crate::server::conn::{send_error, Reader, Writer};
use crate::server::errors::{check_path, invalid, io_error};

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
