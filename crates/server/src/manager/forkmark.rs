//! Fork calls in flight, each a file `<data>/forks/<fork id>` from its start until it
//! answers. A call cut short before answering — its client went away, or the daemon
//! stopped or died — leaves children its caller never heard of, which would run and
//! count against admission for nobody: they are terminated, at once when the daemon is
//! still up and by the next daemon's recovery otherwise.

use std::path::PathBuf;
use std::sync::Weak;
use std::time::Duration;

use super::Manager;
use crate::error::Result;
use model::State;

/// How long a rollback waits for children still being restored to settle.
const SETTLE: Duration = Duration::from_secs(60);

/// One fork call in flight; see the module doc.
pub(super) struct ForkMark {
    pub(super) id: String,
    path: PathBuf,
    manager: Weak<Manager>,
    answered: bool,
}

impl ForkMark {
    /// The call answered its caller: its children are the caller's.
    pub(super) fn answered(mut self) {
        self.answered = true;
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for ForkMark {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let (id, manager) = (self.id.clone(), self.manager.clone());
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            if let Some(m) = manager.upgrade() {
                m.roll_back_fork(&id, SETTLE).await;
            }
        });
    }
}

impl Manager {
    fn forks_dir(&self) -> PathBuf {
        self.config.data_dir.join("forks")
    }

    /// Marks a new fork call in flight.
    pub(super) fn fork_mark(&self) -> Result<ForkMark> {
        let id = model::ids::random_id::<8>("fork")?;
        let dir = self.forks_dir();
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(&id);
        std::fs::write(&path, b"")?;
        Ok(ForkMark {
            id,
            path,
            manager: self.weak_self(),
            answered: false,
        })
    }

    /// After a restart: rolls back the children of every fork call that never answered.
    pub(super) async fn roll_back_cut_forks(&self) {
        let Ok(entries) = std::fs::read_dir(self.forks_dir()) else {
            return;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            self.roll_back_fork(&id, Duration::ZERO).await;
        }
    }

    /// Terminates the children of fork call `id` (waiting up to `settle` for those still
    /// being made), then forgets the call.
    pub(super) async fn roll_back_fork(&self, id: &str, settle: Duration) {
        let deadline = tokio::time::Instant::now() + settle;
        loop {
            let creating = self
                .children_of(id)
                .iter()
                .any(|(_, s)| *s == State::Creating);
            if !creating || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let children = self.children_of(id);
        if !children.is_empty() {
            tracing::warn!(fork = %id, children = children.len(), "a fork call was cut short before it answered: terminating the children its caller never heard of");
        }
        for (child, state) in children {
            if matches!(state, State::Terminated | State::Failed) {
                continue;
            }
            if let Err(e) = self.terminate(&child).await {
                tracing::warn!(sandbox = %child, error = %e.message(), "terminating a child of a cut-short fork failed");
            }
        }
        let _ = std::fs::remove_file(self.forks_dir().join(id));
    }

    /// The sandboxes made by fork call `id`, with their states.
    fn children_of(&self, id: &str) -> Vec<(String, State)> {
        self.registry()
            .entries
            .values()
            .map(|e| e.view())
            .filter(|v| v.fork.as_ref().and_then(|f| f.fork_id.as_deref()) == Some(id))
            .map(|v| (v.id, v.state))
            .collect()
    }
}
