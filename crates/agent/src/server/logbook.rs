//! The sandbox log: every line the sandbox's background processes write (stdout and
//! stderr; terminal sessions are not logged), in the order the agent reads them, each
//! with when it was read. The newest [`MAX_LINES`] lines within [`MAX_BYTES`] are kept;
//! any number of readers read or follow it from any line. It lives in the agent's memory,
//! so it is in every memory checkpoint and fork.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use proto::agent::{LogLine, Message, OutputStream};
use proto::codec::CodecError;
use tokio::sync::watch;

use super::clock::unix_ms;
use super::wire::{Reader, Writer};

/// Lines kept.
pub const MAX_LINES: usize = 20_000;
/// Bytes of text kept.
pub const MAX_BYTES: usize = 4 << 20;
/// A longer line is cut into pieces (a process that never writes a newline still shows).
const MAX_LINE: usize = 16 << 10;
/// Lines per frame.
const BATCH: usize = 256;

#[derive(Default)]
struct Inner {
    lines: VecDeque<LogLine>,
    bytes: usize,
    /// The `seq` of the next line (lines count from 1).
    next_seq: u64,
    /// What each process's stream wrote after its last newline.
    partial: HashMap<(u64, OutputStream), Vec<u8>>,
}

impl Inner {
    fn append(&mut self, process: u64, stream: OutputStream, text: Vec<u8>) {
        self.next_seq = self.next_seq.max(1);
        self.bytes += text.len();
        self.lines.push_back(LogLine {
            seq: self.next_seq,
            unix_ms: unix_ms(),
            process,
            stream,
            text,
        });
        self.next_seq += 1;
        while self.lines.len() > MAX_LINES || self.bytes > MAX_BYTES {
            match self.lines.pop_front() {
                Some(old) => self.bytes -= old.text.len(),
                None => break,
            }
        }
    }
}

#[derive(Default)]
pub struct LogBook {
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
}

impl LogBook {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes output of `process`: complete lines (and pieces of overlong ones) go in.
    pub fn push(&self, process: u64, stream: OutputStream, data: &[u8]) {
        let mut inner = self.lock();
        let buf = inner.partial.entry((process, stream)).or_default();
        buf.extend_from_slice(data);
        let mut lines = Vec::new();
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let mut line: Vec<u8> = buf.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            lines.push(line);
        }
        while buf.len() >= MAX_LINE {
            lines.push(buf.drain(..MAX_LINE).collect());
        }
        if lines.is_empty() {
            return;
        }
        for line in lines {
            inner.append(process, stream, line);
        }
        drop(inner);
        self.changed.send_modify(|v| *v += 1);
    }

    /// The process ended: what it wrote after its last newline goes in too.
    pub fn finish(&self, process: u64) {
        let mut inner = self.lock();
        let mut any = false;
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            if let Some(rest) = inner.partial.remove(&(process, stream)) {
                if !rest.is_empty() {
                    inner.append(process, stream, rest);
                    any = true;
                }
            }
        }
        drop(inner);
        if any {
            self.changed.send_modify(|v| *v += 1);
        }
    }

    /// Up to [`BATCH`] lines from `since` on (from the oldest kept when `since` is older).
    fn batch(&self, since: u64) -> Vec<LogLine> {
        let inner = self.lock();
        let first = inner.lines.front().map_or(0, |l| l.seq);
        let skip = since.saturating_sub(first) as usize;
        inner.lines.iter().skip(skip).take(BATCH).cloned().collect()
    }

    /// Sends the log from line `since` on, then `Eof`; with `follow`, new lines as they
    /// come until the client goes away.
    pub async fn serve(
        &self,
        mut since: u64,
        follow: bool,
        reader: &mut Reader,
        writer: &mut Writer,
    ) -> Result<(), CodecError> {
        let mut changed = self.changed.subscribe();
        loop {
            changed.borrow_and_update();
            let batch = self.batch(since);
            if let Some(last) = batch.last() {
                since = last.seq + 1;
                writer.send(&Message::LogLines(batch)).await?;
                continue;
            }
            if !follow {
                return writer.send(&Message::Eof).await;
            }
            tokio::select! {
                r = changed.changed() => r.map_err(|_| CodecError::Truncated)?,
                _ = reader.read() => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn texts(book: &LogBook, since: u64) -> Vec<(u64, String)> {
        book.batch(since)
            .into_iter()
            .map(|l| (l.seq, String::from_utf8(l.text).unwrap()))
            .collect()
    }

    #[test]
    fn lines_are_split_joined_and_numbered() {
        let book = LogBook::default();
        book.push(1, OutputStream::Stdout, b"one\r\ntw");
        book.push(2, OutputStream::Stderr, b"err\n");
        book.push(1, OutputStream::Stdout, b"o\nthree");
        book.finish(1);
        assert_eq!(
            texts(&book, 0),
            [
                (1, "one".into()),
                (2, "err".into()),
                (3, "two".into()),
                (4, "three".into())
            ]
        );
        assert_eq!(texts(&book, 3), [(3, "two".into()), (4, "three".into())]);
        assert!(texts(&book, 9).is_empty());
    }

    #[test]
    fn it_keeps_the_newest_within_its_bounds() {
        let book = LogBook::default();
        for i in 0..MAX_LINES + 10 {
            book.push(1, OutputStream::Stdout, format!("{i}\n").as_bytes());
        }
        let first = book.batch(0)[0].clone();
        assert_eq!(first.seq, 11);
        book.push(3, OutputStream::Stdout, &vec![b'x'; MAX_LINE * 2 + 5]);
        let long = book.batch(MAX_LINES as u64 + 11);
        assert_eq!(
            long.iter().map(|l| l.text.len()).collect::<Vec<_>>(),
            [MAX_LINE, MAX_LINE]
        );
    }
}
