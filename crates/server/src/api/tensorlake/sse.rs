//! Process output as the Tensorlake SDKs read it (WIRE.md §7): whole lines, one
//! server-sent event each (`data: {"line", "timestamp", "stream"}`), and for a run the exit
//! event last. The stream's end is the end of the run or follow, so an exit is the last
//! thing sent; while a process is quiet, a comment line goes out every second (writing is
//! how the daemon learns the client left, and lets go of the sandbox's agent).

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use proto::agent::{ExitInfo, OutputStream};
use serde_json::{json, Value};
use tokio_stream::wrappers::{IntervalStream, ReceiverStream};

use super::super::ndjson::{exit_parts, HEARTBEAT};
use crate::backend::{BackendResult, ExecEvent, Stream};

/// Longest line kept whole; a longer one goes out in pieces of this size.
pub const MAX_LINE: usize = 1 << 20;

/// Which streams a reader wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    pub stdout: bool,
    pub stderr: bool,
}

impl Filter {
    pub const BOTH: Filter = Filter {
        stdout: true,
        stderr: true,
    };

    /// `stdout`, `stderr` or `output` (both), as the routes name them.
    pub fn named(name: &str) -> Option<Filter> {
        match name {
            "stdout" => Some(Filter {
                stdout: true,
                stderr: false,
            }),
            "stderr" => Some(Filter {
                stdout: false,
                stderr: true,
            }),
            "output" => Some(Filter::BOTH),
            _ => None,
        }
    }

    fn wants(self, s: OutputStream) -> bool {
        match s {
            OutputStream::Stdout => self.stdout,
            OutputStream::Stderr => self.stderr,
        }
    }
}

/// Splits each stream's bytes into lines (without their newline).
#[derive(Default)]
pub struct Lines {
    out: Vec<u8>,
    err: Vec<u8>,
}

impl Lines {
    fn buf(&mut self, s: OutputStream) -> &mut Vec<u8> {
        match s {
            OutputStream::Stdout => &mut self.out,
            OutputStream::Stderr => &mut self.err,
        }
    }

    /// The lines `data` completes.
    pub fn push(&mut self, s: OutputStream, data: &[u8]) -> Vec<String> {
        let buf = self.buf(s);
        buf.extend_from_slice(data);
        let mut lines = Vec::new();
        let mut start = 0;
        while let Some(i) = buf[start..].iter().position(|&b| b == b'\n') {
            lines.push(String::from_utf8_lossy(&buf[start..start + i]).into_owned());
            start += i + 1;
        }
        while buf.len() - start > MAX_LINE {
            lines.push(String::from_utf8_lossy(&buf[start..start + MAX_LINE]).into_owned());
            start += MAX_LINE;
        }
        buf.drain(..start);
        lines
    }

    /// What is left of both streams at the end: a last line without a newline.
    pub fn finish(&mut self) -> Vec<(OutputStream, String)> {
        let mut rest = Vec::new();
        for s in [OutputStream::Stdout, OutputStream::Stderr] {
            let buf = std::mem::take(self.buf(s));
            if !buf.is_empty() {
                rest.push((s, String::from_utf8_lossy(&buf).into_owned()));
            }
        }
        rest
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn stream_name(s: OutputStream) -> &'static str {
    match s {
        OutputStream::Stdout => "stdout",
        OutputStream::Stderr => "stderr",
    }
}

/// An output event.
pub fn line_event(s: OutputStream, line: String) -> Value {
    json!({"line": line, "timestamp": now_ms(), "stream": stream_name(s)})
}

/// The exit event of a run.
pub fn exit_event(exit: &ExitInfo) -> Value {
    let (exit_code, signal) = exit_parts(exit);
    let reason = if exit.timed_out {
        "timed_out"
    } else if signal.is_some() {
        "signaled"
    } else {
        "exited"
    };
    json!({"exit_code": exit_code, "signal": signal, "oom_killed": false, "reason": reason})
}

fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Converts backend events into SSE frames.
struct Converter {
    lines: Lines,
    filter: Filter,
    with_exit: bool,
}

impl Converter {
    /// The frames for one event, and whether the stream is done.
    fn convert(&mut self, ev: ExecEvent) -> (Vec<Bytes>, bool) {
        match ev {
            ExecEvent::Output { stream, data, .. } if self.filter.wants(stream) => {
                let lines = self.lines.push(stream, &data);
                let frames = lines
                    .into_iter()
                    .map(|l| frame(&line_event(stream, l)))
                    .collect();
                (frames, false)
            }
            ExecEvent::Output { .. } | ExecEvent::Dropped { .. } => (Vec::new(), false),
            ExecEvent::Exit(exit) => {
                let mut frames = self.flush();
                if self.with_exit {
                    frames.push(frame(&exit_event(&exit)));
                }
                (frames, true)
            }
        }
    }

    fn flush(&mut self) -> Vec<Bytes> {
        self.lines
            .finish()
            .into_iter()
            .map(|(s, l)| frame(&line_event(s, l)))
            .collect()
    }
}

/// What the body of an SSE response waits on.
enum Item {
    Event(BackendResult<ExecEvent>),
    /// The backend's stream ended.
    Closed,
    Tick,
}

impl Converter {
    /// The frames for one item, and whether the stream is done.
    fn step(&mut self, item: Item) -> (Vec<Bytes>, bool) {
        match item {
            Item::Event(Ok(ev)) => self.convert(ev),
            Item::Event(Err(e)) => {
                // Not a shape the SDKs know: they skip it and report the missing exit.
                let note = json!({"error": crate::error::Error::from(e).message()});
                (
                    vec![Bytes::from(format!("event: error\ndata: {note}\n\n"))],
                    true,
                )
            }
            Item::Closed => (self.flush(), true),
            Item::Tick => (vec![Bytes::from_static(b": keep-alive\n\n")], false),
        }
    }
}

/// An SSE response of `events`' lines (and, with `with_exit`, the exit event). The body
/// pulls the backend's stream itself: a client that leaves drops both at once.
pub fn response(events: Stream<ExecEvent>, filter: Filter, with_exit: bool) -> Response {
    let conv = Converter {
        lines: Lines::default(),
        filter,
        with_exit,
    };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let events = ReceiverStream::new(events)
        .map(Item::Event)
        .chain(futures::stream::once(async { Item::Closed }));
    let ticks = IntervalStream::new(tick).map(|_| Item::Tick);
    let items = futures::stream::select(events, ticks).boxed();
    let body = futures::stream::unfold(
        (items, conv, false),
        |(mut items, mut conv, done)| async move {
            if done {
                return None;
            }
            let (frames, done) = conv.step(items.next().await?);
            Some((frames, (items, conv, done)))
        },
    )
    .flat_map(|frames| futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>)));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// The lines of `events` (no follow), at most `cap` bytes of them.
pub async fn collect(mut events: Stream<ExecEvent>, filter: Filter, cap: usize) -> Vec<String> {
    let mut lines = Lines::default();
    let (mut out, mut size) = (Vec::new(), 0usize);
    while let Some(Ok(ev)) = events.recv().await {
        let ExecEvent::Output { stream, data, .. } = ev else {
            continue;
        };
        if !filter.wants(stream) {
            continue;
        }
        size += data.len();
        if size > cap {
            break;
        }
        out.extend(lines.push(stream, &data));
    }
    out.extend(lines.finish().into_iter().map(|(_, l)| l));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::agent::ExitStatus;

    #[test]
    fn lines_are_whole_and_per_stream() {
        let mut l = Lines::default();
        assert!(l.push(OutputStream::Stdout, b"hel").is_empty());
        assert_eq!(l.push(OutputStream::Stderr, b"err\n"), vec!["err"]);
        assert_eq!(l.push(OutputStream::Stdout, b"lo\nwor"), vec!["hello"]);
        assert_eq!(l.finish(), vec![(OutputStream::Stdout, "wor".to_string())]);
        let long = vec![b'x'; MAX_LINE + 5];
        assert_eq!(l.push(OutputStream::Stdout, &long).len(), 1);
        assert_eq!(l.finish()[0].1.len(), 5);
    }

    #[test]
    fn exit_events_say_why() {
        let signaled = ExitInfo {
            status: ExitStatus::Signal {
                signal: 9,
                core_dumped: false,
            },
            timed_out: false,
        };
        let e = exit_event(&signaled);
        assert_eq!(
            (e["exit_code"].is_null(), e["signal"].as_i64()),
            (true, Some(9))
        );
        assert_eq!(e["reason"], "signaled");
        let timed_out = ExitInfo {
            timed_out: true,
            ..signaled
        };
        assert_eq!(exit_event(&timed_out)["reason"], "timed_out");
        let code = ExitInfo {
            status: ExitStatus::Code(3),
            timed_out: false,
        };
        assert_eq!(exit_event(&code)["exit_code"], 3);
    }

    #[test]
    fn a_run_ends_with_its_exit_after_the_last_partial_line() {
        let mut c = Converter {
            lines: Lines::default(),
            filter: Filter::BOTH,
            with_exit: true,
        };
        let (frames, done) = c.convert(ExecEvent::Output {
            stream: OutputStream::Stdout,
            offset: 0,
            data: Bytes::from_static(b"a\nb"),
        });
        assert_eq!((frames.len(), done), (1, false));
        let (frames, done) = c.convert(ExecEvent::Exit(ExitInfo {
            status: ExitStatus::Code(0),
            timed_out: false,
        }));
        assert!(done);
        assert_eq!(frames.len(), 2);
        assert!(String::from_utf8_lossy(&frames[1]).contains("\"exit_code\":0"));
    }
}
