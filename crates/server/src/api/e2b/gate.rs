//! Long E2B streams (a command's output, a directory watch) step aside for a memory
//! checkpoint asked for through E2B (pause, fork, snapshot).
//!
//! The daemon's memory checkpoint waits for the sandbox's data-plane requests to end, and
//! an E2B client keeps a background command's stream open for as long as it holds the
//! handle. So each such stream holds its sandbox's gate while attached; an E2B call that
//! checkpoints memory first closes the gate: every stream drops its attachment (the
//! process or watch goes on in the sandbox), the checkpoint runs, and the streams attach
//! again from where they were.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// How long a checkpoint waits for the streams to step aside.
const STEP_ASIDE: Duration = Duration::from_secs(5);

/// Gates are forgotten once this many exist and nobody holds them.
const PRUNE_ABOVE: usize = 256;

#[derive(Default)]
pub struct Gates {
    map: Mutex<HashMap<String, Arc<Gate>>>,
}

pub struct Gate {
    lock: Arc<RwLock<()>>,
    epoch: watch::Sender<u64>,
}

/// A stream's hold on its sandbox's gate.
pub struct Pass {
    _read: OwnedRwLockReadGuard<()>,
    epoch: watch::Receiver<u64>,
}

impl Pass {
    /// Resolves when a checkpoint asks the stream to step aside.
    pub async fn asked_to_yield(&mut self) {
        if self.epoch.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A checkpoint's hold: no stream is attached until it is dropped.
pub struct Closed {
    _write: Option<OwnedRwLockWriteGuard<()>>,
}

impl Gates {
    fn gate(&self, id: &str) -> Arc<Gate> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > PRUNE_ABOVE {
            map.retain(|_, g| Arc::strong_count(g) > 1);
        }
        map.entry(id.to_string())
            .or_insert_with(|| {
                Arc::new(Gate {
                    lock: Arc::new(RwLock::new(())),
                    epoch: watch::Sender::new(0),
                })
            })
            .clone()
    }

    /// Enters sandbox `id`'s gate (waits while a checkpoint holds it closed).
    pub async fn enter(&self, id: &str) -> Pass {
        let gate = self.gate(id);
        let read = gate.lock.clone().read_owned().await;
        let mut epoch = gate.epoch.subscribe();
        epoch.borrow_and_update();
        Pass { _read: read, epoch }
    }

    /// Asks sandbox `id`'s streams to step aside and holds them off until the result is
    /// dropped (after [`STEP_ASIDE`] the checkpoint goes on anyway, and the daemon says
    /// what still holds the sandbox).
    pub async fn close(&self, id: &str) -> Closed {
        let gate = self.gate(id);
        gate.epoch.send_modify(|e| *e = e.wrapping_add(1));
        let write = tokio::time::timeout(STEP_ASIDE, gate.lock.clone().write_owned()).await;
        Closed { _write: write.ok() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closing_gate_asks_its_streams_to_yield_and_waits_for_them() {
        let gates = Arc::new(Gates::default());
        let mut pass = gates.enter("sb").await;
        let g = gates.clone();
        let closer = tokio::spawn(async move {
            let _closed = g.close("sb").await;
            "checkpointed"
        });
        tokio::time::timeout(Duration::from_secs(2), pass.asked_to_yield())
            .await
            .expect("asked to yield");
        drop(pass);
        assert_eq!(closer.await.unwrap(), "checkpointed");
        // another sandbox's gate is independent
        let _other = gates.enter("other").await;
        let _again = gates.enter("sb").await;
    }
}
