//! Agent streams pumped into bounded channels (the daemon's only buffers on the data path).

use agent_client::{AttachEvent, ExecEvent as AgentEvent};
use bytes::Bytes;
use proto::agent::OutputStream;
use tokio::sync::mpsc;

use super::errors::agent_err;
use crate::backend::{BackendError, BackendResult, ExecEvent, Stream, STREAM_DEPTH};

/// Pumps an agent exec stream into a bounded channel, adding stream offsets.
pub fn pump_exec(mut stream: agent_client::ExecStream) -> Stream<ExecEvent> {
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        let (mut out, mut err) = (0u64, 0u64);
        loop {
            // A client that goes away releases the agent connection at once, not at the
            // next chunk: an idle connection would otherwise stay open (and, for one, block
            // memory checkpoints, which cannot dump a connection to the host).
            let next = tokio::select! {
                next = stream.next() => next,
                () = tx.closed() => return,
            };
            let ev = match next {
                Ok(Some(AgentEvent::Stdout(d))) => output(OutputStream::Stdout, &mut out, d),
                Ok(Some(AgentEvent::Stderr(d))) => output(OutputStream::Stderr, &mut err, d),
                Ok(Some(AgentEvent::Exit(x))) => Ok(ExecEvent::Exit(x)),
                Ok(None) => return,
                Err(e) => Err(agent_err(e)),
            };
            let last = !matches!(ev, Ok(ExecEvent::Output { .. }));
            if tx.send(ev).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

fn output(stream: OutputStream, pos: &mut u64, data: Vec<u8>) -> BackendResult<ExecEvent> {
    let offset = *pos;
    *pos += data.len() as u64;
    Ok(ExecEvent::Output {
        stream,
        offset,
        data: Bytes::from(data),
    })
}

/// The data chunks of `data` as an I/O stream. At the first error it hands the error to
/// `abort` and never ends, so the agent is not told the file is complete.
pub fn until_error(
    data: Stream<Bytes>,
    abort: tokio::sync::oneshot::Sender<BackendError>,
) -> impl futures::Stream<Item = std::io::Result<Bytes>> {
    futures::stream::unfold((data, Some(abort)), |(mut data, mut abort)| async move {
        match data.recv().await {
            Some(Ok(b)) => Some((Ok(b), (data, abort))),
            Some(Err(e)) => {
                if let Some(a) = abort.take() {
                    let _ = a.send(e);
                }
                std::future::pending().await
            }
            None => None,
        }
    })
}

/// Forwards a directory watch's batches until the agent ends it or the reader leaves.
pub fn pump_watch(mut stream: agent_client::WatchStream) -> Stream<Vec<proto::agent::FsEvent>> {
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = stream.next() => next,
                () = tx.closed() => return,
            };
            let batch = match next {
                Ok(Some(batch)) => Ok(batch),
                Ok(None) => return,
                Err(e) => Err(agent_err(e)),
            };
            let last = batch.is_err();
            if tx.send(batch).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

pub fn pump_attach(mut stream: agent_client::AttachStream) -> Stream<ExecEvent> {
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = stream.next() => next,
                () = tx.closed() => return,
            };
            let ev = match next {
                Ok(Some(AttachEvent::Output {
                    stream,
                    offset,
                    data,
                })) => Ok(ExecEvent::Output {
                    stream,
                    offset,
                    data: Bytes::from(data),
                }),
                Ok(Some(AttachEvent::Dropped { stream, from, to })) => {
                    Ok(ExecEvent::Dropped { stream, from, to })
                }
                Ok(Some(AttachEvent::Exit(x))) => Ok(ExecEvent::Exit(x)),
                Ok(Some(AttachEvent::CaughtUp)) | Ok(None) => return,
                Err(e) => Err(agent_err(e)),
            };
            let last = matches!(ev, Ok(ExecEvent::Exit(_)) | Err(_));
            if tx.send(ev).await.is_err() || last {
                return;
            }
        }
    });
    rx
}
