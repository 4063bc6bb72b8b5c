//! Streamed, bounded file reads.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

use nix::fcntl::{fcntl, FcntlArg, OFlag};

use proto::agent::{AgentError, ErrorKind, FileStat, Message, CHUNK_SIZE};
use tokio::sync::mpsc;

use super::{blocking, file_stat, too_large};
use crate::server::errors::{check_path, io_error};
use crate::server::wire::Writer;

/// Opens a file for reading and positions it: `Stat` goes first, then the data.
fn open_for_read(
    path: &str,
    offset: u64,
    want: u64,
    max: u64,
) -> Result<(fs::File, FileStat), AgentError> {
    let p = check_path(path)?;
    // Non-blocking open: a FIFO without a writer must not hang the request.
    let mut f = fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
        .map_err(|e| io_error(path, &e))?;
    let m = f.metadata().map_err(|e| io_error(path, &e))?;
    let ft = m.file_type();
    if m.is_dir() {
        return Err(AgentError::new(
            ErrorKind::IsADirectory,
            format!("{path}: is a directory"),
        ));
    }
    if ft.is_fifo() || ft.is_socket() {
        return Err(AgentError::new(
            ErrorKind::InvalidInput,
            format!("{path}: not a regular file"),
        ));
    }
    let flags = OFlag::from_bits_truncate(fcntl(&f, FcntlArg::F_GETFL).unwrap_or(0));
    let _ = fcntl(&f, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK));
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
