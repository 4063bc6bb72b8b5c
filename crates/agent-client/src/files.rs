//! File operations, executed by the agent inside the sandbox.

use proto::agent::{DirEntry, FileStat, Message, Request, CHUNK_SIZE};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{unexpected, AgentClient, ClientError, Conn, Result};

/// A listing larger than this is refused (the agent is not trusted to bound it): in
/// entries, and in bytes held for them.
const MAX_DIR_ENTRIES: usize = 1 << 20;
const MAX_DIR_BYTES: usize = 64 << 20;
/// What an entry costs besides its name (its `FileStat` and the vector slot).
const DIR_ENTRY_OVERHEAD: usize = 64;

/// Options of [`AgentClient::write_file`].
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteOptions {
    /// Permission bits; default: those of the file replaced, else 0644.
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub create_parents: bool,
    /// The account (`uid`, `gid`) the file and the directories the write creates belong
    /// to; `None`: the replaced file's owner. An agent that predates it refuses the write
    /// before any data ([`ClientError::predates_request`]).
    pub owner: Option<(u32, u32)>,
}

/// A file being read: its metadata, then its contents chunk by chunk.
pub struct FileDownload {
    pub stat: FileStat,
    conn: Conn,
    done: bool,
}

impl FileDownload {
    /// The next chunk, or `None` at the end of the file.
    pub async fn chunk(&mut self) -> Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        match self.conn.recv_prompt().await? {
            Message::Data(d) => crate::check_chunk(&d).map(|()| Some(d)),
            Message::Eof => {
                self.done = true;
                Ok(None)
            }
            m => Err(unexpected(&m)),
        }
    }

    /// Copies the rest of the file to `out`; returns the bytes copied.
    pub async fn copy_to(mut self, out: &mut (impl AsyncWrite + Unpin)) -> Result<u64> {
        let mut total = 0u64;
        while let Some(d) = self.chunk().await? {
            out.write_all(&d).await?;
            total += d.len() as u64;
        }
        Ok(total)
    }
}

impl AgentClient {
    /// Reads `limit` bytes (all if `None`) of `path` from `offset`.
    pub async fn read_file_range(
        &self,
        path: &str,
        offset: u64,
        limit: Option<u64>,
    ) -> Result<FileDownload> {
        let mut conn = self
            .request(Request::ReadFile {
                path: path.into(),
                offset,
                limit,
            })
            .await?;
        match conn.recv_prompt().await? {
            Message::Stat(stat) => Ok(FileDownload {
                stat,
                conn,
                done: false,
            }),
            m => Err(unexpected(&m)),
        }
    }

    pub async fn read_file(&self, path: &str) -> Result<FileDownload> {
        self.read_file_range(path, 0, None).await
    }

    /// Reads a whole file into memory, refusing more than `max` bytes.
    pub async fn read_file_bytes(&self, path: &str, max: u64) -> Result<Vec<u8>> {
        let mut dl = self
            .read_file_range(path, 0, Some(max.saturating_add(1)))
            .await?;
        let mut out = Vec::new();
        while let Some(d) = dl.chunk().await? {
            out.extend_from_slice(&d);
            if out.len() as u64 > max {
                return Err(ClientError::TooLarge(max));
            }
        }
        Ok(out)
    }

    /// Writes `path` from `data` (atomically: readers see the old or the new file).
    /// Returns the bytes written.
    pub async fn write_file(
        &self,
        path: &str,
        opts: WriteOptions,
        data: &mut (impl AsyncRead + Unpin),
    ) -> Result<u64> {
        let req = match opts.owner {
            None => Request::WriteFile {
                path: path.into(),
                mode: opts.mode,
                create_parents: opts.create_parents,
            },
            Some((uid, gid)) => Request::WriteFileAs {
                path: path.into(),
                mode: opts.mode,
                create_parents: opts.create_parents,
                uid,
                gid,
            },
        };
        let mut conn = self.request(req).await?;
        match conn.recv_prompt().await? {
            Message::Done => {}
            m => return Err(unexpected(&m)),
        }
        if let Err(e) = send_body(&mut conn, data).await {
            // The agent may have stopped reading to report why (e.g. TooLarge).
            return Err(match conn.recv_prompt().await {
                Err(agent @ ClientError::Agent(_)) => agent,
                _ => e,
            });
        }
        match conn.recv_prompt().await? {
            Message::Written { bytes } => Ok(bytes),
            m => Err(unexpected(&m)),
        }
    }

    pub async fn write_file_bytes(
        &self,
        path: &str,
        opts: WriteOptions,
        data: &[u8],
    ) -> Result<u64> {
        self.write_file(path, opts, &mut &data[..]).await
    }

    pub async fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let mut conn = self.request(Request::ListDir { path: path.into() }).await?;
        let (mut entries, mut bytes) = (Vec::new(), 0usize);
        loop {
            let frame = conn.recv_prompt().await?;
            match frame {
                Message::DirEntries(batch) => {
                    bytes += batch
                        .iter()
                        .map(|e| e.name.len() + DIR_ENTRY_OVERHEAD)
                        .sum::<usize>();
                    entries.extend(batch);
                }
                Message::Eof => return Ok(entries),
                m => return Err(unexpected(&m)),
            }
            if entries.len() > MAX_DIR_ENTRIES || bytes > MAX_DIR_BYTES {
                return Err(ClientError::TooLarge(MAX_DIR_BYTES as u64));
            }
        }
    }

    /// Metadata of `path` (symlinks are not followed).
    pub async fn stat(&self, path: &str) -> Result<FileStat> {
        match self.call(Request::Stat { path: path.into() }).await? {
            Message::Stat(s) => Ok(s),
            m => Err(unexpected(&m)),
        }
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        self.call_done(Request::Remove {
            path: path.into(),
            recursive,
        })
        .await
    }

    pub async fn mkdir(&self, path: &str, parents: bool, mode: Option<u32>) -> Result<()> {
        self.call_done(Request::Mkdir {
            path: path.into(),
            parents,
            mode,
        })
        .await
    }
}

async fn send_body(conn: &mut Conn, data: &mut (impl AsyncRead + Unpin)) -> Result<()> {
    let mut buf = vec![0u8; CHUNK_SIZE];
    loop {
        let n = data.read(&mut buf).await?;
        if n == 0 {
            return conn.send_prompt(&Message::Eof).await;
        }
        conn.send_prompt(&Message::Data(buf[..n].to_vec())).await?;
    }
}

/// Changes under a watched directory, as the agent reports them; dropping it ends the
/// watch.
pub struct WatchStream {
    conn: Conn,
}

/// Events in one batch at most (a guest flooding the watch is cut off, not buffered).
const MAX_WATCH_BATCH: usize = 65_536;

impl WatchStream {
    /// The next batch of events; `None` when the agent ends the watch.
    pub async fn next(&mut self) -> Result<Option<Vec<proto::agent::FsEvent>>> {
        match self.conn.recv().await {
            Ok(Message::FsEvents(batch)) if batch.len() <= MAX_WATCH_BATCH => Ok(Some(batch)),
            Ok(Message::FsEvents(_)) => Err(ClientError::TooLarge(MAX_WATCH_BATCH as u64)),
            Ok(m) => Err(unexpected(&m)),
            Err(ClientError::Closed) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The sandbox log, as the agent sends it.
pub struct LogStream {
    conn: Conn,
}

impl LogStream {
    /// The next batch of lines; `None` at the end (caught up without `follow`, or the
    /// agent closed the connection).
    pub async fn next(&mut self) -> Result<Option<Vec<proto::agent::LogLine>>> {
        match self.conn.recv().await {
            Ok(Message::LogLines(batch)) if batch.len() <= MAX_WATCH_BATCH => Ok(Some(batch)),
            Ok(Message::LogLines(_)) => Err(ClientError::TooLarge(MAX_WATCH_BATCH as u64)),
            Ok(Message::Eof) | Err(ClientError::Closed) => Ok(None),
            Ok(m) => Err(unexpected(&m)),
            Err(e) => Err(e),
        }
    }
}

impl AgentClient {
    /// The sandbox log from line `since` on; with `follow`, new lines as they come.
    pub async fn logs(&self, since: u64, follow: bool) -> Result<LogStream> {
        let conn = self.request(Request::Logs { since, follow }).await?;
        Ok(LogStream { conn })
    }

    /// Watches directory `path` (and the directories under it with `recursive`); returns
    /// once the watch is in place.
    pub async fn watch_dir(&self, path: &str, recursive: bool) -> Result<WatchStream> {
        let mut conn = self
            .request(Request::WatchDir {
                path: path.into(),
                recursive,
            })
            .await?;
        match conn.recv_prompt().await? {
            Message::Done => Ok(WatchStream { conn }),
            m => Err(unexpected(&m)),
        }
    }
}
