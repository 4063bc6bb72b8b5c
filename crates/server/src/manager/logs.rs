//! The sandbox log: what a sandbox's background processes write, line by line, as its
//! agent keeps it (see the agent's `logbook`), filtered and labelled for the API.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use api_types::{LogEntry, LogsQuery};
use proto::agent::{LogLine, OutputStream};
use tokio::sync::mpsc;

use super::Manager;
use crate::backend::{Stream, STREAM_DEPTH};
use crate::error::{Error, Result};

/// Most lines `tail` takes (the agent keeps no more).
const MAX_TAIL: usize = 20_000;

impl Manager {
    /// The log lines `q` asks for; a followed log goes on until the reader leaves or a
    /// memory checkpoint interrupts it (the client asks again from the next `seq`).
    pub async fn logs(&self, id_or_name: &str, q: LogsQuery) -> Result<mpsc::Receiver<LogEntry>> {
        let stream = match q.stream.as_deref() {
            None => None,
            Some("stdout") => Some(OutputStream::Stdout),
            Some("stderr") => Some(OutputStream::Stderr),
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "Invalid stream {other:?}: use stdout or stderr"
                )))
            }
        };
        if q.tail.is_some_and(|t| t > MAX_TAIL) {
            return Err(Error::InvalidArgument(format!(
                "tail is at most {MAX_TAIL}"
            )));
        }
        // Before taking the plane: resolving a name takes it too.
        let only = match &q.process {
            Some(p) => Some(self.resolve_pid(id_or_name, p).await?),
            None => None,
        };
        let (id, plane) = self.using(id_or_name).await?;
        let entry = self.find(&id)?;
        let labels = self.process_labels(&id).await?;
        let filter = Filter {
            only,
            only_name: q.process.clone().filter(|p| p.parse::<u64>().is_err()),
            stream,
            labels,
        };
        let since = q.since.unwrap_or(0);
        let backlog = self.backend.logs(&id, since, false).await?;
        let me = self.me.upgrade();
        let (tx, rx) = mpsc::channel(STREAM_DEPTH);
        tokio::spawn(async move {
            let Some(m) = me else { return };
            let mut filter = filter;
            // The plane is held while the agent connection is open: through the backlog,
            // and for a followed log until a checkpoint interrupts it.
            let Some(last) = send_backlog(backlog, since, q.tail, &mut filter, &m, &id, &tx).await
            else {
                return;
            };
            if !q.follow {
                return;
            }
            let Ok(live) = m.backend.logs(&id, last + 1, true).await else {
                return;
            };
            let mut live = super::pty::interruptible(&entry, Arc::new(plane), live);
            loop {
                let batch = tokio::select! {
                    b = live.recv() => b,
                    () = tx.closed() => None,
                };
                let Some(Ok(batch)) = batch else { return };
                for line in batch {
                    if let Some(e) = filter.entry(&m, &id, line).await {
                        if tx.send(e).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(rx)
    }

    /// Each process's label: its name, else its command line.
    async fn process_labels(&self, id: &str) -> Result<HashMap<u64, String>> {
        Ok(self
            .backend
            .processes(id)
            .await?
            .into_iter()
            .map(|p| (p.id, p.name.clone().unwrap_or_else(|| p.command.join(" "))))
            .collect())
    }
}

struct Filter {
    only: Option<u64>,
    /// A supervised process is every run of its name.
    only_name: Option<String>,
    stream: Option<OutputStream>,
    labels: HashMap<u64, String>,
}

impl Filter {
    async fn entry(&mut self, m: &Manager, id: &str, line: LogLine) -> Option<LogEntry> {
        if !self.labels.contains_key(&line.process) {
            if let Ok(labels) = m.process_labels(id).await {
                self.labels = labels;
            }
        }
        let label = self.labels.get(&line.process).cloned().unwrap_or_default();
        let by_name = self.only_name.as_ref().is_some_and(|n| *n == label);
        if self.only.is_some_and(|p| p != line.process) && !by_name {
            return None;
        }
        if self.stream.is_some_and(|s| s != line.stream) {
            return None;
        }
        let (stream, level) = match line.stream {
            OutputStream::Stdout => ("stdout", "info"),
            OutputStream::Stderr => ("stderr", "error"),
        };
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(line.unix_ms);
        Some(LogEntry {
            seq: line.seq,
            timestamp: model::timestamp::rfc3339_millis(at),
            pid: line.process,
            process: label,
            stream: stream.into(),
            level: level.into(),
            message: String::from_utf8_lossy(&line.text).into_owned(),
        })
    }
}

/// Sends the log up to now (its last `tail` lines that pass the filter); returns the
/// `seq` of the last line read, or the one before `since` when there was none (so a follow
/// from a line not written yet starts there, not at the beginning).
async fn send_backlog(
    mut backlog: Stream<Vec<LogLine>>,
    since: u64,
    tail: Option<usize>,
    filter: &mut Filter,
    m: &Manager,
    id: &str,
    tx: &mpsc::Sender<LogEntry>,
) -> Option<u64> {
    let mut kept: VecDeque<LogEntry> = VecDeque::new();
    let mut last = None;
    while let Some(Ok(batch)) = backlog.recv().await {
        for line in batch {
            last = Some(line.seq);
            let Some(e) = filter.entry(m, id, line).await else {
                continue;
            };
            match tail {
                Some(n) => {
                    kept.push_back(e);
                    if kept.len() > n {
                        kept.pop_front();
                    }
                }
                None => {
                    if tx.send(e).await.is_err() {
                        return None;
                    }
                }
            }
        }
    }
    for e in kept {
        if tx.send(e).await.is_err() {
            return None;
        }
    }
    last.or(Some(since.saturating_sub(1)))
}
