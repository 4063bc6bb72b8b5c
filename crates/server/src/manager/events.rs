//! The events feed: what happens to sandboxes (created, forked, started, checkpointed,
//! suspended, resumed, terminated, failed, OOM kills), numbered, kept for a while and
//! streamed to whoever follows `GET /v1/events`. Emitting never waits: a follower that
//! falls behind is told how many events it missed.

use std::collections::VecDeque;
use std::sync::Mutex;

use api_types::{EventKind, Sandbox, SandboxEvent};
use model::State;
use tokio::sync::{broadcast, mpsc, watch};

/// Events kept for replay (`since`).
pub const KEEP_EVENTS: usize = 1000;

pub struct Events {
    tx: broadcast::Sender<SandboxEvent>,
    /// The last [`KEEP_EVENTS`], and the next sequence number.
    kept: Mutex<(VecDeque<SandboxEvent>, u64)>,
    /// Set at shutdown: followers end their streams.
    closed: watch::Sender<bool>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            tx: broadcast::channel(KEEP_EVENTS).0,
            kept: Mutex::new((VecDeque::new(), 1)),
            closed: watch::channel(false).0,
        }
    }
}

/// What a follower asks for.
#[derive(Debug, Clone, Default)]
pub struct Follow {
    /// Only this sandbox's events.
    pub sandbox: Option<String>,
    /// Replay the kept events after this sequence number first.
    pub since: Option<u64>,
    /// Keep streaming new events after the replay.
    pub follow: bool,
}

impl Events {
    /// Records and sends one event about `view`.
    pub fn emit(
        &self,
        kind: EventKind,
        view: &Sandbox,
        snapshot_id: Option<String>,
        message: Option<String>,
    ) {
        let mut kept = super::lock(&self.kept);
        let event = SandboxEvent {
            seq: kept.1,
            at: super::now_rfc3339(),
            kind,
            sandbox_id: view.id.clone(),
            name: view.name.clone(),
            snapshot_id,
            message,
        };
        kept.1 += 1;
        if kept.0.len() == KEEP_EVENTS {
            kept.0.pop_front();
        }
        kept.0.push_back(event.clone());
        // Sent under the lock, so a subscriber sees each event once: kept or sent.
        let _ = self.tx.send(event);
    }

    /// Ends every follower's stream (the daemon is shutting down).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// A stream of the events `f` asks for; it ends when the receiver is dropped, at
    /// shutdown, or after the replay unless `f.follow`.
    pub fn stream(&self, f: Follow) -> mpsc::Receiver<SandboxEvent> {
        let (replay, mut rx) = self.subscribe(f.since);
        let mut closed = self.closed.subscribe();
        let (tx, out) = mpsc::channel(64);
        let wanted = move |e: &SandboxEvent| f.sandbox.as_ref().is_none_or(|s| *s == e.sandbox_id);
        tokio::spawn(async move {
            for e in replay.into_iter().filter(|e| wanted(e)) {
                if tx.send(e).await.is_err() {
                    return;
                }
            }
            if !f.follow {
                return;
            }
            loop {
                let next = tokio::select! {
                    next = rx.recv() => next,
                    _ = closed.wait_for(|c| *c) => return,
                    () = tx.closed() => return,
                };
                let event = match next {
                    Ok(e) if wanted(&e) => e,
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(n)) => lagged(n),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        });
        out
    }

    /// The kept events after `since`, and a receiver of every later one.
    fn subscribe(
        &self,
        since: Option<u64>,
    ) -> (Vec<SandboxEvent>, broadcast::Receiver<SandboxEvent>) {
        let kept = super::lock(&self.kept);
        let rx = self.tx.subscribe();
        let replay = match since {
            Some(after) => kept.0.iter().filter(|e| e.seq > after).cloned().collect(),
            None => Vec::new(),
        };
        (replay, rx)
    }
}

/// Tells a follower that fell behind how many events it missed.
fn lagged(missed: u64) -> SandboxEvent {
    SandboxEvent {
        seq: 0,
        at: super::now_rfc3339(),
        kind: EventKind::Lagged,
        sandbox_id: String::new(),
        name: None,
        snapshot_id: None,
        message: Some(format!("{missed} events were missed")),
    }
}

/// The event a state change is, if any (checkpoints and creates are told where they
/// happen, with their snapshot).
pub fn of_transition(before: State, after: State) -> Option<EventKind> {
    match (before, after) {
        (State::Creating, State::Running) => Some(EventKind::Started),
        (State::Resuming, State::Running) => Some(EventKind::Resumed),
        (_, State::Suspended) if before != State::Suspended => Some(EventKind::Suspended),
        (_, State::Terminated) if before != State::Terminated => Some(EventKind::Terminated),
        (_, State::Failed) if before != State::Failed => Some(EventKind::Failed),
        _ => None,
    }
}
