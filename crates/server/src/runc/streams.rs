//! Agent streams pumped into bounded channels (the daemon's only buffers on the data path).

use agent_client::{AttachEvent, ExecEvent as AgentEvent};
use bytes::Bytes;
use proto::agent::OutputStream;
use tokio::sync::mpsc;

use super::errors::agent_err;
use crate::backend::{BackendError, BackendResult, ExecEvent, PtyInput, Stream, STREAM_DEPTH};

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

/// Moves an agent stream into a bounded channel until it ends, fails (the error is its
/// last item) or the receiver goes (then at once: the agent connection is released).
/// `convert` maps each item to what the channel carries and whether it is the last, or
/// `None` to end without it.
fn pump<S: AgentSource, T: Send + 'static>(
    mut stream: S,
    convert: fn(S::Item) -> Option<(T, bool)>,
) -> Stream<T> {
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = stream.next() => next,
                () = tx.closed() => return,
            };
            let (item, last) = match next {
                Ok(Some(raw)) => match convert(raw) {
                    Some((item, last)) => (Ok(item), last),
                    None => return,
                },
                Ok(None) => return,
                Err(e) => (Err(agent_err(e)), true),
            };
            if tx.send(item).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

/// A directory watch's batches, until the agent ends it or the reader leaves.
pub fn pump_watch(stream: agent_client::WatchStream) -> Stream<Vec<proto::agent::FsEvent>> {
    pump(stream, |batch| Some((batch, false)))
}

/// The sandbox log's batches, until caught up (or, followed, the reader leaves).
pub fn pump_logs(stream: agent_client::LogStream) -> Stream<Vec<proto::agent::LogLine>> {
    pump(stream, |batch| Some((batch, false)))
}

/// A background process's output (an attach or a terminal session), until its exit.
pub fn pump_attach<S: AgentSource<Item = AttachEvent>>(stream: S) -> Stream<ExecEvent> {
    pump(stream, |ev| match ev {
        AttachEvent::Output {
            stream,
            offset,
            data,
        } => Some((
            ExecEvent::Output {
                stream,
                offset,
                data: Bytes::from(data),
            },
            false,
        )),
        AttachEvent::Dropped { stream, from, to } => {
            Some((ExecEvent::Dropped { stream, from, to }, false))
        }
        AttachEvent::Exit(x) => Some((ExecEvent::Exit(x), true)),
        AttachEvent::CaughtUp => None,
    })
}

/// Forwards a terminal client's input to the agent until the sender side is dropped or
/// the agent stops reading; dropping the agent's end then detaches the session.
pub fn pump_pty_input(mut input: agent_client::PtyInput) -> mpsc::Sender<PtyInput> {
    let (tx, mut rx) = mpsc::channel::<PtyInput>(STREAM_DEPTH);
    tokio::spawn(async move {
        while let Some(item) = rx.recv().await {
            let sent = match item {
                PtyInput::Data(data) => input.write(&data).await,
                PtyInput::Resize(size) => input.resize(size).await,
            };
            if sent.is_err() {
                return;
            }
        }
    });
    tx
}

/// A stream of the agent's: items until `None`.
pub trait AgentSource: Send + 'static {
    type Item: Send;
    fn next(
        &mut self,
    ) -> impl std::future::Future<Output = agent_client::Result<Option<Self::Item>>> + Send;
}

macro_rules! agent_source {
    ($($ty:ty => $item:ty),* $(,)?) => {$(
        impl AgentSource for $ty {
            type Item = $item;
            fn next(
                &mut self,
            ) -> impl std::future::Future<Output = agent_client::Result<Option<$item>>> + Send {
                <$ty>::next(self)
            }
        }
    )*};
}

agent_source! {
    agent_client::AttachStream => AttachEvent,
    agent_client::PtyOutput => AttachEvent,
    agent_client::WatchStream => Vec<proto::agent::FsEvent>,
    agent_client::LogStream => Vec<proto::agent::LogLine>,
}
