//! Atomic, bounded file writes: a temporary file renamed over the target.

use std::fs::{self, File, Metadata};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use proto::agent::{AgentError, ErrorKind, Message};
use tokio::io::AsyncWriteExt;

use super::{blocking, too_large};
use crate::server::errors::{check_path, invalid, io_error};
use crate::server::wire::{send_error, Reader, Writer};

/// A temporary file next to the target: removed on drop unless it was renamed over the
/// target.
struct TempFile {
    path: PathBuf,
    target: PathBuf,
    done: bool,
}

impl TempFile {
    fn commit(mut self) -> std::io::Result<()> {
        self.done = true;
        fs::rename(&self.path, &self.target).inspect_err(|_| {
            let _ = fs::remove_file(&self.path);
        })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The file being replaced, if any; a directory there is an error.
fn existing(target: &Path, path: &str) -> Result<Option<Metadata>, AgentError> {
    match fs::metadata(target) {
        Ok(m) if m.is_dir() => Err(AgentError::new(
            ErrorKind::IsADirectory,
            format!("{path}: is a directory"),
        )),
        Ok(m) => Ok(Some(m)),
        Err(_) => Ok(None),
    }
}

/// How a file is written.
#[derive(Debug, Clone, Copy)]
pub struct WriteHow {
    /// Permission bits; default: the replaced file's, else 0644.
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub create_parents: bool,
    /// The account (`uid`, `gid`) the file and the directories the write creates belong
    /// to; `None`: the replaced file's owner (else the agent's, root).
    pub owner: Option<(u32, u32)>,
}

/// Creates the missing directories down to `dir`, each owned by `owner` when given.
fn make_parents(dir: &Path, owner: Option<(u32, u32)>) -> Result<(), AgentError> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    fs::create_dir_all(dir).map_err(|e| io_error(&dir.to_string_lossy(), &e))?;
    let Some((uid, gid)) = owner else {
        return Ok(());
    };
    for d in missing.into_iter().rev() {
        // lchown: a directory a sandbox process replaced with a link meanwhile is not followed.
        std::os::unix::fs::lchown(d, Some(uid), Some(gid))
            .map_err(|e| io_error(&d.to_string_lossy(), &e))?;
    }
    Ok(())
}

/// Creates the temporary file with the final mode (the given one, else the replaced
/// file's, else 0644) and owner (the given one, else the replaced file's).
fn create_temp(path: &str, how: WriteHow) -> Result<(TempFile, File), AgentError> {
    let target = check_path(path)?.to_path_buf();
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(invalid(format!("{path}: not a file path")));
    };
    if how.create_parents {
        make_parents(parent, how.owner)?;
    }
    let old = existing(&target, path)?;
    let name = format!(".{}{TEMP_MARK}{}", name.to_string_lossy(), random_suffix());
    let tmp_path = parent.join(name);
    let file = File::options()
        .write(true)
        .create_new(true)
        .open(&tmp_path)
        .map_err(|e| io_error(path, &e))?;
    let tmp = TempFile {
        path: tmp_path,
        target,
        done: false,
    };
    let mode = how
        .mode
        .or(old.as_ref().map(MetadataExt::mode))
        .unwrap_or(0o644)
        & 0o7777;
    match (how.owner, old) {
        (Some((uid, gid)), _) => std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
            .map_err(|e| io_error(path, &e))?,
        (None, Some(m)) => {
            let _ = std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()));
        }
        (None, None) => {}
    }
    // After the owner: a change of owner clears the set-id bits.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| io_error(path, &e))?;
    Ok((tmp, file))
}

/// What the name of a write's temporary file holds (`.<name>.sandfork-<suffix>`).
const TEMP_MARK: &str = ".sandfork-";

/// Whether `name` is the temporary file of a write in progress (a watch reports the
/// write as a create of the target, not the temporary file's life).
pub(super) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.')
        && name.rsplit_once(TEMP_MARK).is_some_and(|(head, tail)| {
            head.len() > 1 && !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_hexdigit())
        })
}

fn random_suffix() -> String {
    let mut b = [0u8; 6];
    let _ = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{hex}{nanos:08x}")
}

/// `Done` once the file is open, then `Data`* / `Eof` from the host, then `Written`.
pub async fn write_file(
    path: String,
    how: WriteHow,
    max: u64,
    reader: &mut Reader,
    writer: &mut Writer,
) {
    let p = path.clone();
    let (tmp, file) = match blocking(move || create_temp(&p, how)).await {
        Ok(t) => t,
        Err(e) => return send_error(writer, e).await,
    };
    if writer.send(&Message::Done).await.is_err() {
        return;
    }
    let mut file = tokio::fs::File::from_std(file);
    let result = match receive(&mut file, &path, max, reader).await {
        Ok(Some(bytes)) => {
            drop(file);
            tmp.commit()
                .map(|()| bytes)
                .map_err(|e| io_error(&path, &e))
        }
        Ok(None) => return,
        Err(e) => Err(e),
    };
    match result {
        Ok(bytes) => drop(writer.send(&Message::Written { bytes }).await),
        Err(e) => send_error(writer, e).await,
    }
}

/// Copies `Data` frames into the file; `None` when the host went away.
async fn receive(
    file: &mut tokio::fs::File,
    path: &str,
    max: u64,
    reader: &mut Reader,
) -> Result<Option<u64>, AgentError> {
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
