//! NDJSON output streams: each backend event becomes one JSON line, pulled by the HTTP
//! body from a bounded channel (the client's pace is the agent's pace).

use std::time::Instant;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use proto::agent::{ExitInfo, ExitStatus, OutputStream};
use tokio_stream::wrappers::ReceiverStream;

use crate::backend::{ExecEvent, Stream};
use crate::error::Error;
use api_types::StreamEvent;

/// Content type of NDJSON streams.
pub const NDJSON: &str = "application/x-ndjson";

/// Splits a byte stream into UTF-8 text, carrying a multi-byte character cut by a chunk
/// boundary over to the next chunk; chunks holding invalid UTF-8 go out as base64.
#[derive(Default)]
pub struct Utf8Chunker {
    carry: Vec<u8>,
}

/// One decoded chunk: text, or base64 of bytes that are not UTF-8.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk {
    Text(String),
    Binary(String),
}

impl Utf8Chunker {
    /// Decodes the next chunk (`None` when everything is carried over).
    pub fn push(&mut self, data: &[u8]) -> Option<Chunk> {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(data);
        match std::str::from_utf8(&buf) {
            Ok(_) => Some(Chunk::Text(String::from_utf8(buf).unwrap_or_default())),
            Err(e) if e.error_len().is_none() && buf.len() - e.valid_up_to() < 4 => {
                self.carry = buf.split_off(e.valid_up_to());
                (!buf.is_empty()).then(|| Chunk::Text(String::from_utf8(buf).unwrap_or_default()))
            }
            Err(_) => Some(Chunk::Binary(
                base64::engine::general_purpose::STANDARD.encode(&buf),
            )),
        }
    }

    /// What is left at the end of the stream.
    pub fn finish(&mut self) -> Option<Chunk> {
        let rest = std::mem::take(&mut self.carry);
        (!rest.is_empty())
            .then(|| Chunk::Binary(base64::engine::general_purpose::STANDARD.encode(&rest)))
    }
}

/// Exit code and signal of an exit.
pub fn exit_parts(exit: &ExitInfo) -> (Option<i32>, Option<i32>) {
    match exit.status {
        ExitStatus::Code(c) => (Some(c), None),
        ExitStatus::Signal { signal, .. } => (None, Some(signal)),
    }
}

fn output_event(stream: OutputStream, offset: u64, chunk: Chunk) -> StreamEvent {
    let (data, data_b64) = match chunk {
        Chunk::Text(t) => (Some(t), None),
        Chunk::Binary(b) => (None, Some(b)),
    };
    match stream {
        OutputStream::Stdout => StreamEvent::Stdout {
            data,
            data_b64,
            offset,
        },
        OutputStream::Stderr => StreamEvent::Stderr {
            data,
            data_b64,
            offset,
        },
    }
}

/// Turns backend events into stream events, tracking UTF-8 state per stream.
struct Converter {
    started: Instant,
    out: Utf8Chunker,
    err: Utf8Chunker,
}

impl Converter {
    /// Bytes of cut characters still carried at the end of the streams.
    fn flush(&mut self) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        for (stream, chunker) in [
            (OutputStream::Stdout, &mut self.out),
            (OutputStream::Stderr, &mut self.err),
        ] {
            if let Some(c) = chunker.finish() {
                events.push(output_event(stream, 0, c));
            }
        }
        events
    }

    fn convert(
        &mut self,
        item: Result<ExecEvent, crate::backend::BackendError>,
    ) -> Vec<StreamEvent> {
        match item {
            Ok(ExecEvent::Output {
                stream,
                offset,
                data,
            }) => {
                let chunker = match stream {
                    OutputStream::Stdout => &mut self.out,
                    OutputStream::Stderr => &mut self.err,
                };
                let carried = chunker.carry.len() as u64;
                chunker
                    .push(&data)
                    .map(|c| output_event(stream, offset.saturating_sub(carried), c))
                    .into_iter()
                    .collect()
            }
            Ok(ExecEvent::Dropped { stream, from, to }) => {
                let stream = if stream == OutputStream::Stdout {
                    "stdout"
                } else {
                    "stderr"
                };
                vec![StreamEvent::Dropped {
                    stream: stream.into(),
                    from,
                    to,
                }]
            }
            Ok(ExecEvent::Exit(exit)) => {
                let (exit_code, signal) = exit_parts(&exit);
                let duration_ms = self.started.elapsed().as_millis() as u64;
                let mut events = self.flush();
                events.push(StreamEvent::Exit {
                    exit_code,
                    signal,
                    timed_out: exit.timed_out,
                    duration_ms,
                });
                events
            }
            Err(e) => {
                let e = Error::from(e);
                vec![StreamEvent::Error {
                    code: e.kind().into(),
                    message: e.message(),
                }]
            }
        }
    }
}

fn line(ev: &StreamEvent) -> Bytes {
    let mut v = serde_json::to_vec(ev).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// An NDJSON response streaming `events`.
pub fn stream_response(events: Stream<ExecEvent>, started: Instant) -> Response {
    let mut conv = Converter {
        started,
        out: Utf8Chunker::default(),
        err: Utf8Chunker::default(),
    };
    let body = ReceiverStream::new(events).flat_map(move |item| {
        let lines: Vec<Result<Bytes, std::io::Error>> =
            conv.convert(item).iter().map(|ev| Ok(line(ev))).collect();
        futures::stream::iter(lines)
    });
    ([(header::CONTENT_TYPE, NDJSON)], Body::from_stream(body)).into_response()
}

/// An NDJSON response of serializable items from a channel.
pub fn json_lines<T: serde::Serialize + Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> Response {
    let body = ReceiverStream::new(rx).map(|item| {
        let mut v = serde_json::to_vec(&item).unwrap_or_default();
        v.push(b'\n');
        Ok::<_, std::io::Error>(Bytes::from(v))
    });
    ([(header::CONTENT_TYPE, NDJSON)], Body::from_stream(body)).into_response()
}

/// How often a long-lived stream with nothing to say sends an empty line: writing is how
/// the server learns that its client has gone (and lets go of what the stream holds).
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// As [`json_lines`], for streams that may stay quiet for long (a directory watch, the
/// events feed): an empty line every [`HEARTBEAT`] while nothing else is sent. NDJSON
/// readers skip empty lines.
pub fn json_lines_with_heartbeat<T: serde::Serialize + Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> Response {
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(crate::backend::STREAM_DEPTH);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let line = tokio::select! {
                item = rx.recv() => match item {
                    Some(item) => {
                        let mut v = serde_json::to_vec(&item).unwrap_or_default();
                        v.push(b'\n');
                        Bytes::from(v)
                    }
                    None => return,
                },
                _ = tick.tick() => Bytes::from_static(b"\n"),
            };
            if tx.send(line).await.is_err() {
                return;
            }
        }
    });
    let body = ReceiverStream::new(out).map(Ok::<_, std::io::Error>);
    ([(header::CONTENT_TYPE, NDJSON)], Body::from_stream(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multibyte_characters_survive_chunk_boundaries() {
        let text = "héllo €".as_bytes();
        let mut c = Utf8Chunker::default();
        let mut out = String::new();
        for b in text.chunks(1) {
            if let Some(Chunk::Text(t)) = c.push(b) {
                out.push_str(&t);
            }
        }
        assert_eq!(out, "héllo €");
        assert_eq!(c.finish(), None);
    }

    #[test]
    fn invalid_bytes_go_out_as_base64() {
        let mut c = Utf8Chunker::default();
        assert_eq!(c.push(&[0xff, b'a']), Some(Chunk::Binary("/2E=".into())));
        assert_eq!(c.push(&[0xe2, 0x82]), None);
        assert_eq!(c.finish(), Some(Chunk::Binary("4oI=".into())));
    }
}
