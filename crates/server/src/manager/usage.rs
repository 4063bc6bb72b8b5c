//! What running sandboxes use (CPU, memory, disk, network), read when asked: for
//! `GET /v1/sandboxes/{id}/stats` and the per-sandbox series of `/metrics`. Reading is not
//! activity: it neither moves an idle timeout nor resumes a suspended sandbox.

use api_types::{Sandbox, SandboxStats};
use model::State;

use super::Manager;
use crate::backend::ResourceUse;
use crate::error::{Error, Result};

impl Manager {
    /// A running sandbox's resource use now.
    pub async fn stats(&self, id_or_name: &str) -> Result<SandboxStats> {
        self.check_open()?;
        let view = self.find(id_or_name)?.view();
        if view.state != State::Running {
            return Err(Error::WrongState {
                id: view.id,
                state: view.state,
            });
        }
        let used = self.backend.stats(&view.id).await?;
        Ok(stats_of(&view, used))
    }

    /// Every running sandbox with what it uses (one that cannot be read now, e.g. it is
    /// being checkpointed, is left out).
    pub async fn all_stats(&self) -> Vec<(Sandbox, SandboxStats)> {
        let running: Vec<Sandbox> = self
            .registry()
            .entries
            .values()
            .map(|e| e.view())
            .filter(|v| v.state == State::Running)
            .collect();
        let mut out = Vec::with_capacity(running.len());
        for view in running {
            if let Ok(used) = self.backend.stats(&view.id).await {
                let stats = stats_of(&view, used);
                out.push((view, stats));
            }
        }
        out
    }
}

fn stats_of(view: &Sandbox, u: ResourceUse) -> SandboxStats {
    SandboxStats {
        id: view.id.clone(),
        sampled_at: super::now_rfc3339(),
        cpus: view.cpus,
        usage: u,
    }
}
