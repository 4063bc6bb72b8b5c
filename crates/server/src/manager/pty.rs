//! Terminal sessions: background processes on a terminal, attached over a long-lived
//! channel. A memory checkpoint (or a suspend) interrupts an attached channel instead of
//! waiting for it; the process goes on and the client reconnects by pid and offset.

use std::sync::Arc;

use proto::agent::{ProcessInfo, PtySize, SpawnRequest};
use tokio::sync::mpsc;

use super::data::{next_for, PlaneGuard};
use super::{Entry, Manager};
use crate::backend::{PtyChannel, PtyInput, Stream, STREAM_DEPTH};
use crate::error::{Error, Result};

impl Manager {
    /// Starts `req` on a new terminal of `size` in the sandbox.
    pub async fn spawn_pty(
        &self,
        id_or_name: &str,
        req: SpawnRequest,
        size: PtySize,
    ) -> Result<ProcessInfo> {
        let size = size.check().map_err(Error::InvalidArgument)?;
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.spawn_pty(&id, req, size).await?)
    }

    pub async fn resize_pty(&self, id_or_name: &str, pid: u64, size: PtySize) -> Result<()> {
        let size = size.check().map_err(Error::InvalidArgument)?;
        let (id, _plane) = self.using(id_or_name).await?;
        Ok(self.backend.resize_pty(&id, pid, size).await?)
    }

    /// Attaches to terminal process `pid` from output `offset`. Input counts as activity
    /// (an idle timeout does not suspend a sandbox someone is typing into).
    pub async fn pty_connect(&self, id_or_name: &str, pid: u64, offset: u64) -> Result<PtyChannel> {
        let (id, plane) = self.using(id_or_name).await?;
        let entry = self.find(&id)?;
        let inner = self.backend.pty_connect(&id, pid, offset).await?;
        let plane = Arc::new(plane);
        Ok(PtyChannel {
            output: interruptible(&entry, plane.clone(), inner.output),
            input: interruptible_input(entry, plane, inner.input),
        })
    }
}

/// Forwards a long-lived stream until it ends, its reader goes, or a checkpoint
/// interrupts it (then it just ends: a terminal's output without an exit).
pub(super) fn interruptible<T: Send + 'static>(
    entry: &Entry,
    plane: Arc<PlaneGuard>,
    mut inner: Stream<T>,
) -> Stream<T> {
    let mut preempt = entry.preempt.subscribe();
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        let _plane = plane;
        loop {
            let item = tokio::select! {
                item = next_for(&tx, &mut inner) => item,
                _ = preempt.changed() => None,
            };
            let Some(item) = item else { return };
            if tx.send(item).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// Forwards a session's input, touching the sandbox, until the client or the agent goes
/// or a checkpoint interrupts the session.
fn interruptible_input(
    entry: Arc<Entry>,
    plane: Arc<PlaneGuard>,
    inner: mpsc::Sender<PtyInput>,
) -> mpsc::Sender<PtyInput> {
    let mut preempt = entry.preempt.subscribe();
    let (tx, mut rx) = mpsc::channel::<PtyInput>(STREAM_DEPTH);
    tokio::spawn(async move {
        let _plane = plane;
        loop {
            let item = tokio::select! {
                item = rx.recv() => item,
                _ = preempt.changed() => None,
            };
            let Some(item) = item else { return };
            entry.touch();
            if inner.send(item).await.is_err() {
                return;
            }
        }
    });
    tx
}
