//! Moves a child's stdout and stderr to a sink until it has exited and its pipes are
//! drained. One chunk at a time: a slow sink stops the reading, so the child blocks on a
//! full pipe instead of the agent buffering without bound.

use std::future::Future;
use std::time::Duration;

use proto::agent::{ExitStatus, OutputStream, CHUNK_SIZE};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use super::reaper::ExitReceiver;
use super::spawn::Source;

/// After the child exits, output that descendants still holding the pipes write is kept
/// until they close them or stay silent this long...
const DRAIN_IDLE: Duration = Duration::from_millis(250);
/// ...but no longer than this after the exit (a daemon left writing would hold it forever).
const DRAIN_MAX: Duration = Duration::from_secs(2);

/// Where output goes; an error means nobody is listening any more.
pub trait OutputSink {
    fn output(&mut self, stream: OutputStream, data: &[u8])
        -> impl Future<Output = Result<(), ()>>;
}

async fn read_some(pipe: &mut Option<Source>, buf: &mut [u8]) -> usize {
    match pipe {
        Some(p) => p.read(buf).await.unwrap_or(0),
        None => std::future::pending().await,
    }
}

/// Waits for the reaper's status. The reaper always sends before dropping its end; a
/// closed channel means the status is lost, reported as -1.
pub async fn exited(exit: &mut ExitReceiver) -> ExitStatus {
    let lost = ExitStatus::Code(-1);
    exit.wait_for(Option::is_some)
        .await
        .map_or(lost, |s| s.unwrap_or(lost))
}

/// Returns the exit status once the child ended and its output was delivered, or `Err`
/// as soon as the sink fails.
pub async fn pump<S: OutputSink>(
    stdout: Source,
    stderr: Source,
    mut exit: ExitReceiver,
    sink: &mut S,
) -> Result<ExitStatus, ()> {
    let (mut out, mut err) = (Some(stdout), Some(stderr));
    let (mut out_buf, mut err_buf) = (vec![0u8; CHUNK_SIZE], vec![0u8; CHUNK_SIZE]);
    let mut status: Option<ExitStatus> = None;
    let (mut deadline, mut drain_end) = (Instant::now(), Instant::now());
    loop {
        if let (Some(s), None, None) = (status, &out, &err) {
            return Ok(s);
        }
        tokio::select! {
            n = read_some(&mut out, &mut out_buf) => match n {
                0 => out = None,
                n => sink.output(OutputStream::Stdout, &out_buf[..n]).await?,
            },
            n = read_some(&mut err, &mut err_buf) => match n {
                0 => err = None,
                n => sink.output(OutputStream::Stderr, &err_buf[..n]).await?,
            },
            s = exited(&mut exit), if status.is_none() => {
                status = Some(s);
                drain_end = Instant::now() + DRAIN_MAX;
            }
            _ = tokio::time::sleep_until(deadline), if status.is_some() => {
                return Ok(status.unwrap_or(ExitStatus::Code(-1)));
            }
        }
        deadline = drain_end.min(Instant::now() + DRAIN_IDLE);
    }
}
