//! Files of a sandbox as the tools and the resources read them: a stat, a listing, and a
//! read capped at a number of bytes (the rest of the body left unread).

use api_types::{FileEntry, FileList};
use hyper::Method;

use crate::daemon::{query, sandbox_path, Daemon};
use crate::error::{Error, Result};
use crate::limits::Capped;

/// A path inside a sandbox must be absolute.
pub(crate) fn absolute(path: &str) -> Result<()> {
    if !path.starts_with('/') {
        return Err(Error::invalid(format!(
            "path {path:?} is not absolute (paths in a sandbox start with /)"
        )));
    }
    Ok(())
}

/// A file's metadata and its first bytes.
pub(crate) struct FileRead {
    pub entry: FileEntry,
    pub data: Capped,
}

/// Stats `path`, then reads at most `cap` bytes of it (the rest of the body is left
/// unread: the connection is dropped).
pub(crate) async fn read_file(
    daemon: &Daemon,
    sandbox: &str,
    path: &str,
    cap: usize,
) -> Result<FileRead> {
    let entry = stat(daemon, sandbox, path).await?;
    if entry.kind == "dir" {
        return Err(Error::invalid(format!(
            "{path} is a directory: list it with list_files"
        )));
    }
    let resp = daemon
        .get(
            Method::GET,
            &format!("{}?path={}", sandbox_path(sandbox, "/files")?, query(path)),
        )
        .await?;
    let mut body = resp.into_body();
    let mut data = Capped::new(cap);
    use http_body_util::BodyExt as _;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Error::Unreachable(e.to_string()))?;
        if let Ok(bytes) = frame.into_data() {
            data.push(&bytes);
        }
        if data.is_full() && data.total() > cap as u64 {
            break;
        }
    }
    // A body cut short still knows the file's size from its stat.
    data.set_total(data.total().max(entry.size));
    Ok(FileRead { entry, data })
}

pub(crate) async fn stat(daemon: &Daemon, sandbox: &str, path: &str) -> Result<FileEntry> {
    absolute(path)?;
    daemon
        .json(
            Method::GET,
            &format!(
                "{}?path={}",
                sandbox_path(sandbox, "/files/stat")?,
                query(path)
            ),
            None::<&()>,
        )
        .await
}

pub(crate) async fn list_dir(daemon: &Daemon, sandbox: &str, dir: &str) -> Result<Vec<FileEntry>> {
    absolute(dir)?;
    let list: FileList = daemon
        .json(
            Method::GET,
            &format!(
                "{}?path={}",
                sandbox_path(sandbox, "/files/list")?,
                query(dir)
            ),
            None::<&()>,
        )
        .await?;
    Ok(list.entries)
}
